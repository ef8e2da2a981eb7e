"""Token-level divergences for distilling a drafter from its target (DistillSpec, Zhou et al. 2024).

Each function takes the teacher's (target's) and the student's (drafter's) log-probabilities over the
vocabulary, `[..., V]` float32, and returns the per-position divergence `[...]`. The teacher side is
treated as a constant (the caller stops its gradient).

* `forward_kl`  KL(p ‖ q): mass-covering; the classic word-level knowledge distillation loss.
* `reverse_kl`  KL(q ‖ p): mode-seeking; puts the student's mass where the teacher is confident.
* `total_variation`  TVD(p, q) = ½ Σ|p − q|. Speculative sampling accepts a draft with probability
  Σ min(p, q) = 1 − TVD(p, q) (PAPER.md, Def. 3.1), so TVD is exactly what the acceptance rate rewards.
* `greedy_ce`  −log q(argmax p): cross-entropy on the teacher's greedy token, the surrogate of greedy
  agreement (α at temperature 0 is the probability that the student's argmax is the teacher's).
"""

from typing import Callable, Dict

import jax
import jax.numpy as jnp

Array = jax.Array


def forward_kl(teacher_logp: Array, student_logp: Array) -> Array:
  return jnp.sum(jnp.exp(teacher_logp) * (teacher_logp - student_logp), axis=-1)


def reverse_kl(teacher_logp: Array, student_logp: Array) -> Array:
  return jnp.sum(jnp.exp(student_logp) * (student_logp - teacher_logp), axis=-1)


def total_variation(teacher_logp: Array, student_logp: Array) -> Array:
  return 0.5 * jnp.sum(jnp.abs(jnp.exp(teacher_logp) - jnp.exp(student_logp)), axis=-1)


def greedy_ce(teacher_logp: Array, student_logp: Array) -> Array:
  greedy = jnp.argmax(teacher_logp, axis=-1)
  return -jnp.take_along_axis(student_logp, greedy[..., None], axis=-1)[..., 0]


DIVERGENCES: Dict[str, Callable[[Array, Array], Array]] = {
    'fkl': forward_kl, 'rkl': reverse_kl, 'tvd': total_variation, 'greedy_ce': greedy_ce}


def get_divergence(name: str) -> Callable[[Array, Array], Array]:
  """The divergence called `name` in DIVERGENCES; ValueError naming the known ones otherwise."""
  if name not in DIVERGENCES:
    raise ValueError(f'divergence must be one of {sorted(DIVERGENCES)}, got {name!r}.')
  return DIVERGENCES[name]


def token_divergence(name: str, teacher_logits: Array, student_logits: Array) -> Array:
  """Per-position divergence `name` between the teacher's and the student's logits, float32, [...]."""
  teacher_logp = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32))
  student_logp = jax.nn.log_softmax(student_logits.astype(jnp.float32))
  return get_divergence(name)(teacher_logp, student_logp)
