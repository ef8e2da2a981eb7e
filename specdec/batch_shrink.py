"""A decode loop whose batch shrinks as its rows finish.

A `lax.while_loop` over a batch runs until its slowest row ends, and every
iteration computes every row: rows that ended early keep paying for the
others. On hardware where a call's cost grows with its rows (a CPU, or any
device past its memory-bound regime) that is most of a large batch's time
when rows end at different steps — and speculative decoding, whose rows take
different numbers of rounds, suffers from it more than the baseline.

`shrinking_while_loop` runs the loop in stages of B, B/2, B/4, ... rows (each
a `lax.while_loop` with static shapes): a stage stops as soon as no more than
half of its rows are active, the active rows are gathered into the next
stage's smaller batch (ended rows pad it), and every row's outputs are
scattered back to its original position at the end. Rows are independent in
both decoders, so the outputs are the same as the plain loop's (greedy:
token for token; sampled: the same distribution, with other random draws).
Every stage is compiled, so the decoders stop halving at B/8 (`MAX_STAGES`).
"""

from typing import Any, Callable, List, Optional

import jax
from jax import lax
import jax.numpy as jnp

PyTree = Any
# The axis marker of a carry leaf that is not per row (a PRNG key, a step counter).
SHARED = -1
# Each stage compiles the loop body once more; the decoders stop halving after this many stages (B .. B/8).
MAX_STAGES = 4


def min_rows_for(rows: int, max_stages: int = MAX_STAGES) -> int:
  """The `min_rows` that gives a batch of `rows` at most `max_stages` stages (B, B/2, ...)."""
  return max(1, -(-rows // 2 ** (max_stages - 1)))


def stage_sizes(rows: int, min_rows: Optional[int] = None) -> List[int]:
  """The batch sizes a shrinking loop of `rows` rows runs at: B, B//2, ... while a half keeps at least
  `min_rows` (default `min_rows_for(rows)`, the decoders' choice)."""
  min_rows = max(min_rows_for(rows) if min_rows is None else min_rows, 1)
  sizes = [rows]
  while sizes[-1] // 2 >= min_rows:
    sizes.append(sizes[-1] // 2)
  return sizes


def same_axis(tree: PyTree, axis: int) -> PyTree:
  """An `axes` tree giving every leaf of `tree` the row axis `axis`."""
  return jax.tree.map(lambda _: axis, tree)


def take_rows(tree: PyTree, rows_r: jax.Array, axes: PyTree) -> PyTree:
  """Rows `rows_r` of every per-row leaf (along its axis in `axes`); shared leaves as they are."""
  return jax.tree.map(lambda x, ax: x if ax == SHARED else jnp.take(x, rows_r, axis=ax), tree, axes)


def put_rows(dst: PyTree, src: PyTree, rows_r: jax.Array, axes: PyTree) -> PyTree:
  """`dst` with rows `rows_r` of every per-row leaf replaced by `src`'s (in order); shared leaves from `src`."""

  def put(d, s, ax):
    if ax == SHARED:
      return s
    d_moved = jnp.moveaxis(d, ax, 0).at[rows_r].set(jnp.moveaxis(s, ax, 0))
    return jnp.moveaxis(d_moved, 0, ax)

  return jax.tree.map(put, dst, src, axes)


def shrinking_while_loop(step_fn: Callable[[PyTree], PyTree], carry: PyTree, axes: PyTree,
                         ended_fn: Callable[[PyTree], jax.Array],
                         outputs_fn: Callable[[PyTree], PyTree],
                         output_axes: Optional[PyTree] = None, min_rows: Optional[int] = None) -> PyTree:
  """`step_fn` until every row has ended; the outputs of every row, in the input's order.

  Args:
    step_fn: carry -> carry for any number of rows (one decode step or round).
    carry: the loop's initial state with B rows.
    axes: a pytree of `carry`'s structure holding each leaf's row axis, or
      `SHARED` for leaves that are not per row.
    ended_fn: carry -> [rows] bool; an ended row must stay ended and leave its
      outputs unchanged under `step_fn`.
    outputs_fn: carry -> the part of it to return (e.g. tokens and scores,
      not the caches: only these are scattered back).
    output_axes: the row axes of `outputs_fn`'s result (default: 0 for every
      leaf).
    min_rows: the smallest stage (e.g. a data-parallel mesh's size, so every
      stage's batch still divides over it); default `min_rows_for(B)`, at most
      `MAX_STAGES` stages (`stage_sizes`). The last stage runs to the end.

  Returns:
    `outputs_fn` of the final state of every row, rows in the input's order.
  """
  rows = jax.tree.leaves(ended_fn(carry))[0].shape[0]
  out = outputs_fn(carry)
  if output_axes is None:
    output_axes = same_axis(out, 0)
  row_ids_r = jnp.arange(rows)
  sizes = stage_sizes(rows, min_rows)
  for next_rows in sizes[1:]:  # Python: one compiled stage per batch size
    carry = lax.while_loop(lambda c, n=next_rows: jnp.sum(~ended_fn(c)) > n, step_fn, carry)
    out = put_rows(out, outputs_fn(carry), row_ids_r, output_axes)
    # Active rows first (in their order), then ended ones as padding.
    keep_n = jnp.argsort(ended_fn(carry), stable=True)[:next_rows]
    carry = take_rows(carry, keep_n, axes)
    row_ids_r = row_ids_r[keep_n]
  carry = lax.while_loop(lambda c: ~jnp.all(ended_fn(c)), step_fn, carry)
  return put_rows(out, outputs_fn(carry), row_ids_r, output_axes)
