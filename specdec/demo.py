"""CPU demo: speculative vs baseline decoding on small random T5 1.1 networks.

Until trained models ship, this is the project's main job: it builds a random
target and three drafters (the target itself, a perturbed copy, an unrelated
smaller network), decodes one batch with `temperature_sample` and with
`speculative_sample`, checks that greedy outputs are identical, and prints
the acceptance statistics and timings (median of repeated runs, compile
excluded). Random networks say nothing about real acceptance rates; the
numbers show the mechanics.

  python -m specdec.demo [--gamma 4] [--batch 4] [--repeats 3] [--json out.json]
"""

import argparse
import json
import time

import jax
import numpy as np

from specdec import decoding
from specdec import fileio
from specdec import models
from specdec import network

VOCAB = 512


def _perturbed(params, rng, scale):
  """params + scale * N(0, std(leaf)) per leaf: a drafter that often agrees."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(rng, len(leaves))
  noisy = [x + scale * np.std(x) * jax.random.normal(k, x.shape)
           for x, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(treedef, noisy)


def _median_time(fn, repeats):
  """Median wall time of fn() over `repeats` runs, after one compile/warm-up run."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def run(gamma=4, batch=4, input_len=16, decode_len=32, repeats=3, seed=0):
  """Runs the demo; returns a list of result rows (dicts)."""
  target_cfg = network.T5Config(vocab_size=VOCAB, emb_dim=128, num_heads=4,
                                head_dim=32, num_encoder_layers=3,
                                num_decoder_layers=6, mlp_dim=512)
  small_cfg = network.T5Config(vocab_size=VOCAB, emb_dim=64, num_heads=2,
                               head_dim=32, num_encoder_layers=1,
                               num_decoder_layers=1, mlp_dim=128)
  rngs = jax.random.split(jax.random.PRNGKey(seed), 4)
  target_params = network.init_params(target_cfg, rngs[0])
  drafters = {
      'target itself': (target_cfg, target_params),
      'perturbed target': (target_cfg, _perturbed(target_params, rngs[1], 0.5)),
      'unrelated small': (small_cfg, network.init_params(small_cfg, rngs[2])),
  }
  enc = np.array(jax.random.randint(rngs[3], (batch, input_len), 2, VOCAB))
  enc[:, input_len * 3 // 4:] = 0
  data = {'encoder_input_tokens': enc,
          'decoder_input_tokens': np.zeros((batch, decode_len), np.int32)}

  baseline = models.SpeculativeEncoderDecoderModel(
      network.Transformer(target_cfg), None,
      decode_fn=decoding.temperature_sample)
  rows = []
  for temperature in (0.0, 1.0):
    sampling_params = {'temperature': temperature, 'topk': 0}
    base_predict = baseline.compile_predict(sampling_params)
    base_params = {'target': target_params}
    rng = jax.random.PRNGKey(1)
    base_decodes, _ = base_predict(base_params, data, rng)
    base_time = _median_time(lambda: base_predict(base_params, data, rng), repeats)
    for name, (cfg, drafter_params) in drafters.items():
      model = models.SpeculativeEncoderDecoderModel(
          network.Transformer(target_cfg), network.Transformer(cfg))
      params = {'target': target_params, 'drafter': drafter_params}
      predict = model.compile_predict(dict(sampling_params, gamma=gamma,
                                           return_stats=True))
      decodes, aux = predict(params, data, rng)
      spec_time = _median_time(lambda: predict(params, data, rng), repeats)
      s = jax.tree_util.tree_map(lambda x: np.asarray(x).sum(0), aux['stats'])
      row = {
          'temperature': temperature, 'drafter': name, 'gamma': gamma,
          'alpha_accepted_over_judged': float(s['accepted'] / max(s['judged'], 1)),
          'alpha_sum_min_pq': float(s['overlap_sum'] / max(s['overlap_count'], 1)),
          'tokens_per_target_call': float(s['emitted'] / max(s['target_calls'], 1)),
          'target_calls': int(s['target_calls']),
          'baseline_s': base_time, 'speculative_s': spec_time,
          'speedup': base_time / spec_time,
      }
      if temperature == 0.0:
        row['identical_outputs'] = bool(np.array_equal(decodes, base_decodes))
      rows.append(row)
      if temperature == 0.0:
        print(f'\n[{name}] greedy, first row:\n  baseline    {np.asarray(base_decodes)[0].tolist()}'
              f'\n  speculative {np.asarray(decodes)[0].tolist()}')
  return rows


def _print_table(rows):
  header = (f"{'temp':>4} {'drafter':<17} {'γ':>2} {'α acc/judged':>12} "
            f"{'α Σmin(p,q)':>11} {'tok/call':>8} {'base s':>7} {'spec s':>7} "
            f"{'speedup':>7} {'identical':>9}")
  print('\n' + header)
  print('-' * len(header))
  for r in rows:
    identical = r.get('identical_outputs')
    print(f"{r['temperature']:>4.1f} {r['drafter']:<17} {r['gamma']:>2} "
          f"{r['alpha_accepted_over_judged']:>12.3f} {r['alpha_sum_min_pq']:>11.3f} "
          f"{r['tokens_per_target_call']:>8.2f} {r['baseline_s']:>7.3f} "
          f"{r['speculative_s']:>7.3f} {r['speedup']:>6.2f}x "
          f"{'' if identical is None else ('yes' if identical else 'NO'):>9}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--gamma', type=int, default=4)
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--input_len', type=int, default=16)
  parser.add_argument('--decode_len', type=int, default=32)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--json', default=None, help='also write the rows here')
  args = parser.parse_args(argv)
  print(f'jax {jax.__version__} on {jax.devices()[0].platform}; random T5 1.1 '
        f'networks, batch {args.batch}, decode length {args.decode_len}')
  rows = run(args.gamma, args.batch, args.input_len, args.decode_len,
             args.repeats, args.seed)
  _print_table(rows)
  if args.json:
    fileio.atomic_write(
        args.json, json.dumps({'args': vars(args), 'rows': rows}, indent=2).encode())
  if not all(r.get('identical_outputs', True) for r in rows):
    raise SystemExit('Greedy speculative outputs differ from the baseline.')


if __name__ == '__main__':
  main()
