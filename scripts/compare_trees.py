"""Draft trees against chains on this machine: one drafter, the same examples, every decoder interleaved.

  python scripts/compare_trees.py --target models/cpu_v2/target --drafter models/cpu_v2/f128 \
      --chains 1 2 3 4 --trees 2+1 2+2 3+1 2x2+1 --examples 24 --out results/trees/v2_f128_ende_t0

The drafter is a T5 network or a feature head (with its draft vocabulary).

The first --examples examples of the task's split, batch 1, inputs padded to one length (one compiled program per
decoder; compile time excluded by a warm-up). Per example, every decoder (the baseline, `speculative_sample` at each
chain γ, `tree_speculative_sample` on each tree, 'B1xB2+C' as `draft_tree.parse_tree`) runs in turn, --repeats
times, and each keeps its median. Reports per decoder: speedup (the baseline's total time over its own), tokens per
target call, the verify call's width (γ+1, or the tree's nodes) and what a call of that width costs on this machine
(`profiling.verify_cost_curve`, measured in the same run), and at temperature 0 the share of outputs identical to
the baseline's.

Beside them, the prediction: how often the target's greedy token is the drafter's 1st, 2nd, .. choice
(`evaluation.draft_rank_probabilities`, on the --calibration_examples examples after the measured ones), the
drafter's step cost c inside a compiled chain loop (`profiling.time_phases` at γ = 2, over the baseline's round; the
isolated call's c is recorded beside it), a T5 drafter's own cost of width (`profiling.verify_cost_curve` on the
drafter; a feature head's calls are charged at the target's curve), and per decoder the expected tokens a round
(`draft_tree.expected_tree_tokens`) and speedup (`draft_tree.tree_speedup`: each drafter call charged at its width,
both curves read through their monotone envelope). The tree `draft_tree.best_tree` picks from them ("auto") is
measured with the others. Writes <out>/compare.{md,json}.
"""

import argparse
import datetime
import functools
import os
import sys
import time
from typing import Any, Dict, List

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec.bench import benchmark  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import decoding
from specdec import draft_tree
from specdec import drafters
from specdec import evaluation
from specdec import fileio
from specdec import loading
from specdec import models
from specdec import network
from specdec import task_names
from specdec.bench import profiling
from specdec.bench import reporting
from specdec import tasks
from specdec import tree_decoding

LENGTHS = dict(task_names.LOCAL_FEATURE_LENGTHS)
# γ of the chain loop whose draft step gives the in-loop c (a draft step's cost does not depend on γ).
PROBE_GAMMA = 2
TASKS = dict(task_names.LOCAL_TASK_BY_NAME)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--target', required=True)
  parser.add_argument('--drafter', required=True, help='a T5 drafter or a feature head (n-gram tables do not draft trees)')
  parser.add_argument('--task', choices=sorted(TASKS), default='ende')
  parser.add_argument('--split', default='validation')
  parser.add_argument('--examples', type=int, default=24)
  parser.add_argument('--chains', type=int, nargs='*', default=[1, 2, 3, 4])
  parser.add_argument('--trees', nargs='*', default=['2+1', '2+2', '3+1', '2x2+1'])
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--rule', default='without_replacement', choices=draft_tree.RULES)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--calibration_examples', type=int, default=32)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', required=True)
  args = parser.parse_args(argv)
  if args.examples < 1 or args.repeats < 1 or args.calibration_examples < 1:
    parser.error('--examples, --repeats and --calibration_examples must be >= 1, got '
                 f'{args.examples}, {args.repeats}, {args.calibration_examples}')
  if any(g < 1 for g in args.chains):
    parser.error(f'--chains must be >= 1, got {args.chains}')
  if not args.chains and not args.trees:
    parser.error('give at least one of --chains and --trees')
  try:
    args.tree_shapes = {spec: draft_tree.parse_tree(spec) for spec in args.trees}
  except ValueError as e:
    parser.error(f'--trees: {e}')
  if args.temperature < 0:
    parser.error(f'--temperature must be >= 0, got {args.temperature}')
  for flag in ('target', 'drafter'):
    if not os.path.isdir(getattr(args, flag)):
      parser.error(f'--{flag} {getattr(args, flag)} is not a directory')
  return args


def decoder_specs(args, auto_tree=None) -> Dict[str, Dict[str, Any]]:
  """{name: {'kind', 'width' (tokens of its verify call), 'depth', 'shape', 'params' (decoder_params)}} in report
  order; `auto_tree` (branching, chain) adds 'tree auto …' unless it is one of --trees already."""
  base = {'temperature': args.temperature, 'topk': 0}
  specs = {'baseline': {'kind': 'baseline', 'width': 1, 'params': base}}
  for gamma in args.chains:
    specs[f'chain γ={gamma}'] = {'kind': 'chain', 'width': gamma + 1, 'shape': draft_tree.static_tree((), gamma),
                                 'params': dict(base, gamma=gamma, return_stats=True)}
  trees = dict(args.tree_shapes)
  names = {shape: f'tree {spec}' for spec, shape in trees.items()}
  if auto_tree is not None:
    auto_tree = (tuple(auto_tree[0]), int(auto_tree[1]))
    if auto_tree not in names:
      trees[draft_tree.tree_name(*auto_tree)] = auto_tree
      names[auto_tree] = f'tree auto {draft_tree.tree_name(*auto_tree)}'
  for branching, chain in trees.values():
    shape = draft_tree.static_tree(branching, chain)
    specs[names[(branching, chain)]] = {'kind': 'tree', 'width': shape.num_nodes, 'shape': shape,
                                        'params': dict(base, branching=branching, chain=chain, rule=args.rule,
                                                       return_stats=True)}
  return specs


def summarize(specs: Dict[str, Dict[str, Any]], records: List[Dict[str, Any]], curve: Dict[str, Any],
              rank_probs=None, c=None, draft_curve=None, draft_reads_features: bool = False
              ) -> Dict[str, Dict[str, Any]]:
  """Per decoder: total seconds, speedup over the baseline, tokens per target call, identical share; with
  `rank_probs` and `c` the predicted tokens a round and speedup (`draft_curve`, {'tokens', 'ratio'}: the drafter's
  cost of width, None for the target's; a chain's drafting is charged as a tree's, whose catch-up is always 2
  tokens wide, where the chain loop's is 1 or 2)."""
  base_total = sum(r['seconds']['baseline'] for r in records)
  out = {}
  for name, spec in specs.items():
    total = sum(r['seconds'][name] for r in records)
    row = {'kind': spec['kind'], 'width': spec['width'], 'seconds': total, 'speedup': base_total / total}
    width = spec['width']
    row['verify_ratio'] = curve['ratio'][width - 1] if width <= len(curve['ratio']) else None
    if spec['kind'] != 'baseline':
      calls = sum(r['target_calls'][name] for r in records)
      row['tokens_per_call'] = sum(r['emitted'][name] for r in records) / calls if calls else None
      row['identical'] = float(np.mean([r['identical'][name] for r in records]))
      if rank_probs is not None:
        row['predicted_tokens_per_call'] = draft_tree.expected_tree_tokens(spec['shape'], rank_probs)
        ratios = dict(zip(curve['tokens'], curve['ratio']))
        draft_ratios = None if draft_curve is None else dict(zip(draft_curve['tokens'], draft_curve['ratio']))
        try:
          row['predicted_speedup'] = draft_tree.tree_speedup(spec['shape'], rank_probs, c, ratios, draft_ratios,
                                                             draft_reads_features)
        except ValueError:  # a width no curve holds
          row['predicted_speedup'] = None
    out[name] = row
  return out


def markdown(summary: Dict[str, Dict[str, Any]], args, header: str, num_examples: int, greedy: bool,
             calibration=None) -> str:
  lines = ['# Draft trees against chains, side by side', '', header, '',
           f'`{args.drafter}` drafting for `{args.target}`, {num_examples} {args.task} {args.split} examples, batch 1, '
           f'temperature {args.temperature:g}{"" if greedy else f", sibling rule {args.rule}"}; every decoder in turn '
           f'on each example, median of {args.repeats}. Width: the tokens of a verify call (γ+1, or the tree\'s '
           'nodes); verify cost: a call of that width over a one-token call, on this machine '
           '(`profiling.verify_cost_curve`). Predicted: from the rank probabilities and c below '
           '(`draft_tree.expected_tree_tokens`, `draft_tree.tree_speedup`: c in the loop, each drafter call at its '
           'width, the curves\' monotone envelopes). It leaves out what a tree round costs beyond its calls (the '
           'tree layout\'s attention masks, moving the accepted path\'s keys and values).', '',
           '| decoder | speedup | predicted | tokens / target call | predicted | width | verify cost | identical |',
           '|---|---|---|---|---|---|---|---|']
  best_chain = max((n for n, r in summary.items() if r['kind'] == 'chain'), key=lambda n: summary[n]['speedup'],
                   default=None)
  best_tree = max((n for n, r in summary.items() if r['kind'] == 'tree'), key=lambda n: summary[n]['speedup'],
                  default=None)
  for name, r in summary.items():
    mark = '**' if name in (best_chain, best_tree) else ''
    identical = '-' if r['kind'] == 'baseline' or not greedy else f"{100 * r['identical']:.0f}%"
    predicted = r.get('predicted_speedup')
    lines.append(f"| {mark}{name}{mark} | {r['speedup']:.3f}× | "
                 f"{'-' if predicted is None else format(predicted, '.3f') + '×'} | "
                 f"{reporting.fmt(r.get('tokens_per_call'), '.2f')} | "
                 f"{reporting.fmt(r.get('predicted_tokens_per_call'), '.2f')} | "
                 f"{r['width']} | {reporting.fmt(r['verify_ratio'], '.2f')} | {identical} |")
  if best_chain and best_tree:
    ratio = summary[best_tree]['speedup'] / summary[best_chain]['speedup']
    lines += ['', f'Best tree ({best_tree}) / best chain ({best_chain}): **{ratio:.3f}×**.']
  if calibration:
    probs = ', '.join(f'{p:.3f}' for p in calibration['rank_probs'])
    lines += ['', f"Calibration ({calibration['examples']} examples after the measured ones, "
              f"{calibration['positions']} positions): the target's greedy token is the drafter's 1st, 2nd, .. "
              f"choice with probabilities {probs}; c in the loop = {calibration['c']:.3f}"
              f"{_isolated_note(calibration)}; "
              f"`draft_tree.best_tree` picks {draft_tree.tree_name(*calibration['best_tree'])} "
              f"(predicted {calibration['best_tree_speedup']:.3f}×)."]
  return '\n'.join(lines) + '\n'


def _isolated_note(calibration) -> str:
  isolated = calibration.get('c_isolated')
  return '' if isolated is None else f' (isolated {isolated:.3f})'


def main(argv=None):
  args = parse_args(argv)
  tasks.register_tasks()
  command = reporting.run_command(['scripts/compare_trees.py'] + list(sys.argv[1:] if argv is None else argv))
  machine = reporting.machine_info()
  header = (f"`{command}` · {datetime.datetime.now().isoformat(timespec='seconds')} · {machine['processor']}, "
            f"{machine['cpu_count']} CPUs, jax {machine['jax']}")
  target_module, target_params = loading.load_module_and_params(args.target)
  drafter_module, drafter_params, vocab_ids = loading.load_drafter(args.drafter, target_params)
  is_head = drafters.kind_of(drafter_module).reads_features
  if not is_head and not isinstance(drafter_module, network.Transformer):
    raise SystemExit(f'--drafter {args.drafter} is neither a T5 network nor a feature head: it drafts no trees.')
  all_examples = evaluation.task_examples(TASKS[args.task], args.split, LENGTHS,
                                         args.examples + args.calibration_examples)
  examples, held = all_examples[:args.examples], all_examples[args.examples:]
  if not held:
    raise SystemExit(f'the {args.split} split has no examples past the first {args.examples} to calibrate on.')
  batches = [batch for _, batch in evaluation.batches(examples, LENGTHS, 1, use_buckets=False)]
  max_rank = max([4] + [max(b) for b, _ in args.tree_shapes.values() if b])
  print(f'calibrating on {len(held)} examples: ranks, c, the verify-cost curve', flush=True)
  calibration = evaluation.draft_rank_probabilities(target_module, target_params, drafter_module, drafter_params,
                                                    held, LENGTHS, max_rank=max_rank, draft_vocab_ids=vocab_ids)
  enc = batches[0]['encoder_input_tokens']
  if is_head:
    draft_s = profiling.time_head_calls(target_module, target_params, drafter_module, drafter_params, enc,
                                        LENGTHS['targets'], draft_vocab_ids=vocab_ids)
  else:
    draft_s = profiling.time_decode_calls(drafter_module, drafter_params, enc, LENGTHS['targets'], 1,
                                          vocab_ids=vocab_ids)
  calibration['c_isolated'] = draft_s / profiling.time_decode_calls(target_module, target_params, enc,
                                                                    LENGTHS['targets'], 1)
  widest = max([16] + [g + 1 for g in args.chains] +
               [draft_tree.static_tree(*shape).num_nodes for shape in args.tree_shapes.values()])
  curve = profiling.verify_cost_curve(target_module, target_params, enc, LENGTHS['targets'], widest)
  # A T5 drafter's own cost of width (its full vocabulary: the curve's ratios, not its absolute cost, are read);
  # a feature head has no such curve here, and the target's stands in.
  draft_curve = (None if is_head else
                 profiling.verify_cost_curve(drafter_module, drafter_params, enc, LENGTHS['targets'], widest))
  params = {'target': target_params, 'drafter': drafter_params}
  predict = {'baseline': functools.partial(models.SpeculativeEncoderDecoderModel(
      target_module, None, decode_fn=decoding.temperature_sample).compile_predict(
          {'temperature': args.temperature, 'topk': 0}), {'target': target_params})}
  # c inside a compiled chain loop, as `auto_gamma` measures it: the draft step with its sampling and bookkeeping,
  # over the baseline's round (the isolated call leaves both out).
  decoded_l = np.asarray(predict['baseline'](batches[0], jax.random.PRNGKey(args.seed))[0])[0]
  phases = profiling.time_phases(target_module, target_params, drafter_module, drafter_params, np.asarray(enc),
                                 decoded_l, LENGTHS['targets'], PROBE_GAMMA, temperature=args.temperature,
                                 parts=('draft', 'baseline_round'), draft_vocab_ids=vocab_ids)
  calibration['c'] = phases.draft / PROBE_GAMMA / phases.baseline_round
  calibration['draft_curve'] = draft_curve
  branching, chain, speedup = draft_tree.best_tree(
      calibration['rank_probs'], calibration['c'], dict(zip(curve['tokens'], curve['ratio'])),
      draft_cost_ratios=None if draft_curve is None else dict(zip(draft_curve['tokens'], draft_curve['ratio'])),
      draft_reads_features=is_head)
  calibration.update(best_tree=[list(branching), chain], best_tree_speedup=speedup)
  specs = decoder_specs(args, (branching, chain))
  for name, spec in specs.items():
    if name in predict:
      continue
    decode_fn = {'baseline': decoding.temperature_sample, 'chain': decoding.speculative_sample,
                 'tree': tree_decoding.tree_speculative_sample}[spec['kind']]
    if spec['kind'] == 'baseline':
      model = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decode_fn)
      call_params = {'target': target_params}
    else:
      model = models.SpeculativeEncoderDecoderModel(target_module, drafter_module, decode_fn=decode_fn,
                                                    draft_vocab_ids=vocab_ids)
      call_params = model.with_draft_projection(params)  # prepared once, as a benchmark does
    predict[name] = functools.partial(model.compile_predict(spec['params']), call_params)
  print(f'compiling {len(predict)} decoders', flush=True)
  for fn in predict.values():  # compile time is not measured
    jax.block_until_ready(fn(batches[0], jax.random.PRNGKey(args.seed)))
  records, start = [], time.perf_counter()
  names = list(predict)
  for i, batch in enumerate(batches):
    rng = jax.random.PRNGKey(args.seed + i)
    seconds = {n: [] for n in names}
    outputs = {}
    for rep in range(args.repeats):
      for n in names[rep % len(names):] + names[:rep % len(names)]:  # each repeat starts one decoder later
        t, outputs[n] = benchmark.timed(predict[n], batch, rng)
        seconds[n].append(t)
    base_l = np.asarray(outputs['baseline'][0])[0]
    rec = {'index': i, 'seconds': {n: float(np.median(s)) for n, s in seconds.items()},
           'target_calls': {}, 'emitted': {}, 'identical': {}}
    for n in names[1:]:
      decoded, aux = outputs[n]
      stats = jax.tree_util.tree_map(np.asarray, aux['stats'])
      rec['target_calls'][n] = int(stats['target_calls'][0])
      rec['emitted'][n] = int(stats['emitted'][0])
      rec['identical'][n] = bool(np.array_equal(np.asarray(decoded)[0], base_l))
    records.append(rec)
    so_far = summarize(specs, records, curve)
    best = max(names[1:], key=lambda n: so_far[n]['speedup'])
    print(f'[{i + 1}/{len(batches)}] {time.perf_counter() - start:.0f}s; best so far {best} '
          f"{so_far[best]['speedup']:.3f}×", flush=True)
  summary = summarize(specs, records, curve, calibration['rank_probs'], calibration['c'], draft_curve, is_head)
  greedy = args.temperature == 0
  os.makedirs(args.out, exist_ok=True)
  fileio.write_json(os.path.join(args.out, 'compare.json'), {
      'command': command, 'machine': machine, 'settings': {k: v for k, v in vars(args).items() if k != 'tree_shapes'},
      'verify_curve': curve, 'calibration': calibration, 'summary': summary, 'examples': records})
  text = markdown(summary, args, header, len(records), greedy, calibration)
  fileio.atomic_write(os.path.join(args.out, 'compare.md'), text.encode())
  print(text, flush=True)
  return summary


if __name__ == '__main__':
  main()
