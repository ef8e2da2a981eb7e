"""Chooses trimmed draft vocabularies (the K tokens the target emits most often) and measures their coverage.

  python scripts/draft_vocab.py --corpus data/distill_greedy_v2 --model models/cpu_v2/target \
      --k 512 1024 2048 4096 --heldout 512 --out_dir results/draft_vocab --ids_dir models/cpu_v2/draft_vocab

A drafter may compute its logits over K ids only (FR-Spec, arXiv 2502.14856;
`specdec/draft_vocab.py`): q = 0 elsewhere, and the target still verifies over
its whole vocabulary, so decoding stays exact. The ids are the K most frequent
tokens of the target's own decodes: the `targets` of `<corpus>/<task>/train.jsonl`
of a distillation corpus (scripts/build_distill_corpus.py), both tasks pooled,
tokenized with the task's vocabulary, plus EOS once per decode (always kept).
One id list serves both tasks, as one drafter does (`--tasks` counts one task's
decodes only, e.g. of a corpus that holds only that task's).

Held-out coverage: the target decodes the first `--heldout` validation inputs
of each task greedily; for each K, the share of those decodes' tokens (EOS
included, padding not) that lie in the K ids. A K-token drafter can propose
no other token, so this is the ceiling of its first-draft acceptance (greedy).
The share of the corpus's own tokens is reported beside it (in-sample).

Writes `<ids_dir>/top<K>.json` (a JSON list of sorted ids: the
`draft_vocab_file` of train_config.FeatureHeadTrainConfig, or `draft_vocab_ids`
of models.SpeculativeEncoderDecoderModel), and `<out_dir>/draft_vocab.json`
(the records) and `<out_dir>/draft_vocab.md` (the table), all atomically.
The id files are written before the held-out decoding starts.
"""

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))

import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import draft_vocab  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import fileio  # pylint: disable=g-import-not-at-top,wrong-import-position

TASK_DIRS = bdc.TASK_DIRS  # {seqio task name: corpus folder}
TASK_LABELS = {'translate_en_de': 'En→De', 'summarize_ddtp': 'summarization'}


def relative(path):
  """`path` relative to the repository root when it lies inside it; as given otherwise."""
  if not path or fileio.is_url(path):
    return path
  full = os.path.abspath(path)
  if os.path.commonpath([full, ROOT]) == ROOT:
    return os.path.relpath(full, ROOT)
  return path


def command_line(argv):
  """The command as run, absolute paths inside the repository made relative."""
  words = []
  for word in argv:
    if word.startswith('--') and '=' in word:
      flag, value = word.split('=', 1)
      words.append(f'{flag}={relative(value) if os.path.isabs(value) else value}')
    else:
      words.append(relative(word) if os.path.isabs(word) else word)
  return ' '.join(['python scripts/draft_vocab.py'] + words)


# -----------------------------------------------------------------------------
# Counting and measuring (pure).
# -----------------------------------------------------------------------------


def decode_ids(row):
  """A decode's ids up to its first EOS (kept), padding dropped."""
  row = np.asarray(row).reshape(-1)
  ends = np.flatnonzero(row == draft_vocab.EOS_ID)
  if ends.size:
    row = row[:ends[0] + 1]
  return row[row != draft_vocab.PAD_ID].astype(np.int32)


def corpus_sequences(texts, encode):
  """Each text's ids (`encode`) followed by EOS: the token sequence the target emitted."""
  return [np.asarray(list(encode(text)) + [draft_vocab.EOS_ID], np.int32) for text in texts]


def measure(ks, task_counts, heldout):
  """One row per K: the ids and their coverage.

  Args:
    ks: vocabulary sizes.
    task_counts: {task dir: token counts [V] of the corpus's decodes}.
    heldout: {task dir: list of held-out decodes (id arrays)}; may be empty.
  Returns:
    [(ids, row)] with row = {'k', 'coverage': {task: held-out share},
    'coverage_all' (held-out, both tasks pooled), 'corpus_coverage': {task:
    in-sample share}, 'corpus_coverage_all'}.
  """
  total = sum(task_counts.values())
  out = []
  for k in ks:
    ids = draft_vocab.top_ids(total, k)
    row = {'k': int(k),
           'corpus_coverage': {task: float(c[ids].sum() / c.sum()) if c.sum() else None
                               for task, c in task_counts.items()},
           'corpus_coverage_all': float(total[ids].sum() / total.sum()) if total.sum() else None}
    if heldout:
      row['coverage'] = {task: draft_vocab.coverage(ids, seqs) for task, seqs in heldout.items()}
      row['coverage_all'] = draft_vocab.coverage(ids, [s for seqs in heldout.values() for s in seqs])
    out.append((ids, row))
  return out


def _pct(x):
  return '–' if x is None else f'{100 * x:.1f}%'


def markdown(record):
  """The report: a table of K against held-out and in-sample coverage."""
  tasks = list(record['counts']['decodes'])
  heldout = bool(record.get('heldout'))
  pooled = ('both tasks pooled' if len(tasks) > 1
            else f'{TASK_LABELS.get(tasks[0], tasks[0])} decodes only')
  # A pooled column only where there is more than one task to pool.
  both = lambda label: [label] if len(tasks) > 1 else []  # pylint: disable=unnecessary-lambda-assignment
  lines = ['# Trimmed draft vocabularies: coverage of the target\'s decodes', '',
           f'Corpus `{record["corpus"]}` ({record["corpus_decoding"]}), target `{record["model"]}` '
           f'(vocabulary {record["vocab_size"]}). Ids: the K most frequent tokens of the corpus\'s '
           f'{record["counts"]["decodes_all"]} train decodes ({record["counts"]["tokens_all"]} tokens '
           f'with EOS, {record["counts"]["distinct_all"]} distinct ids), EOS always kept, {pooled}.', '']
  if heldout:
    n = ', '.join(f'{TASK_LABELS.get(t, t)} {record["heldout"][t]["decodes"]} decodes / '
                  f'{record["heldout"][t]["tokens"]} tokens' for t in tasks)
    lines += ['Held-out coverage: the share of the target\'s greedy decodes of the first validation inputs '
              f'({n}; EOS counted, padding not) whose token lies in the K ids: the ceiling of a K-token '
              'drafter\'s first-draft acceptance. In-sample: the same share of the corpus\'s own tokens.', '']
    head = (['K'] + [f'held-out {TASK_LABELS.get(t, t)}' for t in tasks] + both('held-out both')
            + [f'in-sample {TASK_LABELS.get(t, t)}' for t in tasks] + ['ids file'])
  else:
    lines += ['No held-out decodes (`--heldout 0`): in-sample coverage only (the share of the corpus\'s '
              'own tokens in the K ids).', '']
    head = ['K'] + [f'in-sample {TASK_LABELS.get(t, t)}' for t in tasks] + both('in-sample both') + ['ids file']
  lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for row in record['rows']:
    if heldout:
      cells = ([str(row['k'])] + [_pct(row['coverage'][t]) for t in tasks] + both(_pct(row['coverage_all']))
               + [_pct(row['corpus_coverage'][t]) for t in tasks])
    else:
      cells = ([str(row['k'])] + [_pct(row['corpus_coverage'][t]) for t in tasks]
               + both(_pct(row['corpus_coverage_all'])))
    lines.append('| ' + ' | '.join(cells + [f'`{row["ids_file"]}`']) + ' |')
  unseen = [row['k'] for row in record['rows'] if row['k'] > record['counts']['distinct_all']]
  if unseen:
    lines += ['', f'K = {", ".join(map(str, unseen))} exceeds the {record["counts"]["distinct_all"]} ids seen: '
              'the rest of those lists are unseen ids (smallest first).']
  lines += ['', f'Command: `{record["command"]}`', '']
  return '\n'.join(lines)


# -----------------------------------------------------------------------------
# Reading the corpus and decoding with the target (seqio, JAX).
# -----------------------------------------------------------------------------


def read_targets(corpus_dir, task_dir):
  path = os.path.join(corpus_dir, task_dir, 'train.jsonl')
  return [row.get('targets') or '' for row in fileio.read_jsonl(path)]


def corpus_decoding(corpus_dir, model_dir, log):
  """What the corpus's targets are (from its manifest.json), with a warning when they are not this target's."""
  path = os.path.join(corpus_dir, 'manifest.json')
  manifest = fileio.read_json_object(path, 'corpus manifest') if fileio.exists(path) else {}
  if 'fingerprint' not in manifest:
    log(f'WARNING: {corpus_dir} has no distillation manifest (scripts/build_distill_corpus.py): its targets '
        'may be references, not the target\'s decodes.')
    return 'not a distillation corpus'
  made_by = manifest.get('model')
  if made_by and os.path.normpath(relative(made_by)) != os.path.normpath(relative(model_dir)):
    log(f'WARNING: {corpus_dir} holds decodes of {made_by}, not of --model {model_dir}.')
  return f'{manifest.get("decoding", "decodes")} of {made_by}'


def decode_heldout(task_name, label, predict, params, lengths, max_examples, batch_size, log):
  """The target's greedy decodes (id arrays, to the first EOS) of the first `max_examples` validation inputs."""
  from specdec import evaluation  # pylint: disable=g-import-not-at-top
  examples = evaluation.task_examples(task_name, 'validation', lengths, max_examples)
  decodes = [None] * len(examples)
  batches = bdc.plan_batches([len(ex['inputs']) for ex in examples], batch_size)
  start, done = time.perf_counter(), 0
  for idx in batches:
    out, _ = predict(params, bdc.model_batch(examples, idx, batch_size, lengths))
    out = np.asarray(out)
    for row, i in enumerate(idx):
      decodes[int(i)] = decode_ids(out[row])
    done += len(idx)
    elapsed = time.perf_counter() - start
    log(f'  {label}: {done}/{len(examples)} held-out inputs decoded, {done / elapsed:.1f} ex/s, '
        f'ETA {(len(examples) - done) * elapsed / done / 60:.1f} min')
  return decodes


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--corpus', required=True, help='a distillation corpus (scripts/build_distill_corpus.py)')
  parser.add_argument('--model', required=True, help='the target model directory')
  parser.add_argument('--k', type=int, nargs='+', default=[512, 1024, 2048, 4096],
                      help='draft vocabulary sizes')
  parser.add_argument('--heldout', type=int, default=512,
                      help='validation inputs per task decoded for held-out coverage (0: none)')
  parser.add_argument('--out_dir', default='results/draft_vocab')
  parser.add_argument('--ids_dir', required=True, help='where top<K>.json are written')
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--inputs_length', type=int, default=96)
  parser.add_argument('--targets_length', type=int, default=48)
  parser.add_argument('--tasks', nargs='+', choices=sorted(TASK_DIRS.values()),
                      default=list(TASK_DIRS.values()),
                      help='the corpus folders counted and held out (default: both tasks)')
  args = parser.parse_args(argv)
  if any(k < 1 for k in args.k):
    parser.error(f'--k must be >= 1, got {args.k}.')
  if args.heldout < 0 or args.batch_size < 1:
    parser.error('--heldout must be >= 0 and --batch_size >= 1.')
  args.k = sorted(set(args.k))
  return args


def main(argv=None):
  args = parse_args(argv)
  argv = sys.argv[1:] if argv is None else list(argv)
  log = lambda msg: print(msg, flush=True)  # pylint: disable=unnecessary-lambda-assignment
  task_dirs = {name: d for name, d in TASK_DIRS.items() if d in args.tasks}
  for task_dir in task_dirs.values():
    for split in ('train',) + (('validation',) if args.heldout else ()):
      path = os.path.join(args.corpus, task_dir, f'{split}.jsonl')
      if not fileio.exists(path):
        raise SystemExit(f'No {path}: --corpus must be a corpus directory (scripts/build_distill_corpus.py).')
  from specdec import checkpoints  # pylint: disable=g-import-not-at-top
  vocab_size = checkpoints.load_config(args.model).vocab_size
  if args.k[-1] > vocab_size:
    raise SystemExit(f'--k {args.k[-1]} exceeds the target\'s vocabulary ({vocab_size}).')
  decoding_kind = corpus_decoding(args.corpus, args.model, log)

  from specdec import tasks  # pylint: disable=g-import-not-at-top  (seqio, TensorFlow)
  tasks.register_local_tasks(args.corpus)
  task_counts, decodes, tokens = {}, {}, {}
  t0 = time.perf_counter()
  for task_name, task_dir in task_dirs.items():
    vocab = bdc.seqio_vocab(task_name)
    seqs = corpus_sequences(read_targets(args.corpus, task_dir), vocab.encode)
    task_counts[task_dir] = draft_vocab.token_counts(seqs, vocab_size)
    decodes[task_dir], tokens[task_dir] = len(seqs), int(task_counts[task_dir].sum())
    log(f'{task_dir}: {len(seqs)} decodes, {tokens[task_dir]} tokens counted')
  log(f'corpus tokenized in {time.perf_counter() - t0:.0f}s')
  total = sum(task_counts.values())
  ids_files = {k: os.path.join(args.ids_dir, f'top{k}.json') for k in args.k}
  for k in args.k:  # before the (long) held-out decoding
    draft_vocab.save_ids(ids_files[k], draft_vocab.top_ids(total, k))
  log(f'wrote {", ".join(ids_files.values())}')

  heldout, lengths = {}, {'inputs': args.inputs_length, 'targets': args.targets_length}
  if args.heldout:
    from specdec import decoding, loading, models  # pylint: disable=g-import-not-at-top
    module, params = loading.load_module_and_params(args.model)
    model = models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample)
    predict = model.compile_predict({'temperature': 0.0})
    for task_name, task_dir in task_dirs.items():
      heldout[task_dir] = decode_heldout(task_name, task_dir, predict, {'target': params}, lengths,
                                         args.heldout, args.batch_size, log)

  rows = []
  for ids, row in measure(args.k, task_counts, heldout):
    row['ids_file'] = relative(ids_files[row['k']])
    rows.append(row)
  record = {
      'corpus': relative(args.corpus), 'corpus_decoding': decoding_kind, 'model': relative(args.model),
      'vocab_size': int(vocab_size), 'always': [draft_vocab.EOS_ID],
      'counts': {'decodes': decodes, 'tokens': tokens,
                 'distinct': {t: int(np.count_nonzero(c)) for t, c in task_counts.items()},
                 'decodes_all': int(sum(decodes.values())), 'tokens_all': int(total.sum()),
                 'distinct_all': int(np.count_nonzero(total))},
      'heldout': {t: {'split': 'validation', 'decodes': len(s), 'tokens': int(sum(len(x) for x in s)),
                      'decoding': 'greedy'} for t, s in heldout.items()},
      'lengths': lengths, 'rows': rows, 'command': command_line(argv)}
  fileio.write_json(os.path.join(args.out_dir, 'draft_vocab.json'), record)
  fileio.atomic_write(os.path.join(args.out_dir, 'draft_vocab.md'), markdown(record).encode('utf-8'))
  for row in rows:
    cov = ', '.join(f'{t} {_pct(c)}' for t, c in row.get('coverage', row['corpus_coverage']).items())
    log(f'K={row["k"]}: {"held-out" if heldout else "in-sample"} coverage {cov}')
  log(f'wrote {os.path.join(args.out_dir, "draft_vocab.json")} and draft_vocab.md')
  return record


if __name__ == '__main__':
  main()
