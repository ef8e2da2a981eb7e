"""Which target size? Decode-call costs against training cost for candidate CPU targets.

  python scripts/target_sizes.py --run cpu_targets

For each candidate T5 1.1 target (random weights: call costs do not depend on the values) this measures, on
this machine, inside one jitted scan (`profiling.time_decode_calls`, batch 1, fp32):

* the 1-token decode step and the γ+1-token verify call (γ = 2, 4), and their ratio: the verify cost that
  bounds speculative decoding (the paper's TPU regime has it near 1);
* the step of each shipped drafter, as c = drafter step / target step;
* one training step (batch 32, inputs 96 / targets 48, Adafactor, as `train/cpu_family.gin` trains), the
  price of each size on 2 cores;

and the ceiling speedup at γ = 4 for α = 0.8 implied by the measured ratio and c. Writes
results/target_sizes/<run>.{md,json} atomically.
"""

import argparse
import json
import os
import platform
import sys
import time

import jax
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, installed or not
from specdec import fileio
from specdec import loading
from specdec import network
from specdec.bench import profiling
from specdec import theory

# name -> (label, emb_dim, num_heads, encoder layers, decoder layers, mlp_dim); 'shipped' is the
# shipped 13.6M target's shape. `--candidates` picks which to measure.
CANDIDATES = {
    'shipped': ('13.6M (256x4, shipped)', 256, 4, 4, 4, 1024),
    '384x4m1024': ('23M (384x4, mlp 1024)', 384, 6, 4, 4, 1024),
    '384x4': ('27.5M (384x4, mlp 1536)', 384, 6, 4, 4, 1536),
    '384x6': ('38M (384x6)', 384, 6, 6, 6, 1536),
    '512x6': ('65M (512x6)', 512, 8, 6, 6, 2048),
}
DEFAULT_CANDIDATES = ('shipped', '384x6', '512x6')
DRAFTERS = ('d1kd', 'd2', 'd3')


def candidate_config(emb, heads, enc_layers, dec_layers, mlp) -> network.T5Config:
  return network.T5Config(vocab_size=8192, emb_dim=emb, num_heads=heads, head_dim=64,
                          num_encoder_layers=enc_layers, num_decoder_layers=dec_layers, mlp_dim=mlp,
                          mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
                          dropout_rate=0.0)


def train_step_seconds(config, repeats: int) -> float:
  """Median seconds of one Adafactor step on a full batch of 32 x (96, 48) tokens."""
  from specdec.training import train  # pylint: disable=g-import-not-at-top
  module = network.Transformer(config)
  params = network.init_params(config, jax.random.PRNGKey(0))
  opt = optax.adafactor(learning_rate=1e-3, multiply_by_parameter_scale=True)
  rng = np.random.default_rng(0)
  batch = {'encoder_input_tokens': rng.integers(2, 8000, (32, 96)).astype(np.int32),
           'decoder_input_tokens': rng.integers(2, 8000, (32, 48)).astype(np.int32),
           'decoder_target_tokens': rng.integers(2, 8000, (32, 48)).astype(np.int32),
           'decoder_loss_weights': np.ones((32, 48), np.int32)}

  @jax.jit
  def step(params, opt_state):
    grads = jax.grad(lambda p: train.loss_fn(p, batch, jax.random.PRNGKey(0), module)[0])(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return profiling.median_seconds(step, params, opt.init(params), repeats=repeats)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--run', default='cpu_targets')
  parser.add_argument('--models', default='models/cpu')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--out', default='results/target_sizes')
  parser.add_argument('--candidates', nargs='+', default=list(DEFAULT_CANDIDATES),
                      choices=sorted(CANDIDATES), help='which shapes to measure')
  args = parser.parse_args(argv)
  enc = np.full((1, 32), 5, np.int32)  # a 32-token input, the En→De median length
  max_len = 48
  drafter_steps = {}
  for name in DRAFTERS:
    module, params = loading.load_module_and_params(os.path.join(args.models, name))
    drafter_steps[name] = profiling.time_decode_calls(module, params, enc, max_len, 1,
                                                      repeats=args.repeats)
  rows = []
  for name in args.candidates:
    label, emb, heads, enc_layers, dec_layers, mlp = CANDIDATES[name]
    config = candidate_config(emb, heads, enc_layers, dec_layers, mlp)
    module = network.Transformer(config)
    params = network.init_params(config, jax.random.PRNGKey(0))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    calls = {k: profiling.time_decode_calls(module, params, enc, max_len, k, repeats=args.repeats)
             for k in (1, 3, 5)}
    step_s = train_step_seconds(config, max(3, args.repeats // 2))
    c = {name: s / calls[1] for name, s in drafter_steps.items()}
    verify5 = calls[5] / calls[1]
    ceiling = {name: float(theory.expected_tokens(0.8, 4)) / (verify5 + 4 * cc)
               for name, cc in c.items()}
    rows.append({'target': label, 'params': int(n_params),
                 'decoder_weights_mb': 4 * sum(x.size for x in jax.tree_util.tree_leaves(
                     params['decoder'])) / 2**20,
                 'step_1_ms': 1e3 * calls[1], 'verify_3_ratio': calls[3] / calls[1],
                 'verify_5_ratio': verify5, 'c': c, 'ceiling_gamma4_alpha08': ceiling,
                 'train_step_s': step_s, 'steps_per_hour': 3600 / step_s})
    print(json.dumps(rows[-1]), flush=True)
  command = 'python scripts/target_sizes.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
  lines = [f'# Candidate target sizes ({args.run})', '',
           f'Made by `{command.strip()}` on {time.strftime("%Y-%m-%d")} ({platform.machine()}, '
           f'{os.cpu_count()} CPUs, jax {jax.__version__}). Random weights, batch 1, fp32, a 32-token input; '
           f'each call the median of {args.repeats} runs of 32 calls inside one jitted scan. '
           'c = a shipped drafter\'s 1-token step / the candidate\'s. Ceiling = (1 − 0.8⁵)/(1 − 0.8) / '
           '(verify₅ + 4c), the γ = 4 speedup at α = 0.8 if nothing else cost anything. Train step: '
           'batch 32 × (96, 48) tokens, Adafactor.', '',
           '| target | params | decoder weights | 1-token step | verify₃ / 1 | verify₅ / 1 | '
           + ' | '.join(f'c ({d})' for d in DRAFTERS) + ' | '
           + ' | '.join(f'ceiling ({d})' for d in DRAFTERS) + ' | train step | steps / CPU hour |',
           '|' + '---|' * (8 + 2 * len(DRAFTERS))]
  for r in rows:
    lines.append(
        f"| {r['target']} | {r['params'] / 1e6:.1f}M | {r['decoder_weights_mb']:.0f} MiB | "
        f"{r['step_1_ms']:.2f} ms | {r['verify_3_ratio']:.2f} | {r['verify_5_ratio']:.2f} | "
        + ' | '.join(f"{r['c'][d]:.3f}" for d in DRAFTERS) + ' | '
        + ' | '.join(f"{r['ceiling_gamma4_alpha08'][d]:.2f}×" for d in DRAFTERS)
        + f" | {r['train_step_s']:.2f} s | {r['steps_per_hour']:.0f} |")
  os.makedirs(args.out, exist_ok=True)
  record = {'command': command.strip(), 'date': time.strftime('%Y-%m-%d'), 'rows': rows,
            'drafter_step_ms': {k: 1e3 * v for k, v in drafter_steps.items()}}
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.json'),
                      json.dumps(record, indent=2).encode())
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.md'), ('\n'.join(lines) + '\n').encode())
  print('\n'.join(lines))
  return 0


if __name__ == '__main__':
  sys.exit(main())
