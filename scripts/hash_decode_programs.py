"""Fingerprints of the lowered decode programs: a refactoring that must not change what runs is checked by them.

  python scripts/hash_decode_programs.py --models models/cpu_v2 --out runs/decode_hashes.json
  ... (change the code) ...
  python scripts/hash_decode_programs.py --models models/cpu_v2 --compare runs/decode_hashes.json

Each program is the jitted `predict_batch_with_aux` a benchmark runs, lowered for one batch shape (StableHLO text
without source locations, so moving a function between files changes nothing, renaming a jitted one does): the
baseline and speculative decoding with a T5 drafter (its own and a trimmed vocabulary), a feature head (with its
draft vocabulary) and an n-gram drafter, and draft trees with the T5 drafter and the feature head, each greedy and
at temperature 1. Nothing is compiled or run. Prints one line per program; with --compare, exit status 1 when any
hash differs from the stored ones (each named).
"""

import argparse
import functools
import hashlib
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec import decoding  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import draft_vocab
from specdec import fileio
from specdec import loading
from specdec import models
from specdec import tree_decoding

BATCH, INPUT_LENGTH, TARGET_LENGTH, GAMMA = 4, 96, 48, 4
# name -> (drafter directory under --models or None for the baseline, a draft vocabulary file or None, the
# speculative loop: 'chain' (γ drafts) or 'tree' (a draft tree: TREE))
PROGRAMS = {
    'baseline': (None, None, None),
    't5_drafter': ('d1kd', None, 'chain'),
    't5_drafter_trimmed': ('d1kd', 'draft_vocab/top2048.json', 'chain'),
    'feature_head': ('f128', None, 'chain'),
    'ngram': ('bigram', None, 'chain'),
    't5_drafter_tree': ('d1kd', None, 'tree'),
    'feature_head_tree': ('f128', None, 'tree'),
}
TREE = {'branching': (2,), 'chain': 2}
TEMPERATURES = (0.0, 1.0)


def program_text(model: models.SpeculativeEncoderDecoderModel, params, decoder_params) -> str:
  """The StableHLO of the jitted predict for a [BATCH, *] batch (no source locations)."""
  batch = {'encoder_input_tokens': np.ones((BATCH, INPUT_LENGTH), np.int32),
           'decoder_input_tokens': np.zeros((BATCH, TARGET_LENGTH), np.int32)}
  jitted = jax.jit(functools.partial(model.predict_batch_with_aux, decoder_params=decoder_params),
                   static_argnames=('check_traced_ids',))
  return jitted.lower(params, batch, jax.random.PRNGKey(0), check_traced_ids=False).as_text()


def hashes(models_dir: str) -> dict:
  target_module, target_params = loading.load_module_and_params(os.path.join(models_dir, 'target'))
  out = {}
  for name, (drafter, vocab_file, loop) in PROGRAMS.items():
    for temperature in TEMPERATURES:
      decoder_params = {'temperature': temperature, 'topk': 0, 'topp': 0.0}
      if drafter is None:
        model = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decoding.temperature_sample)
        params = {'target': target_params}
      else:
        drafter_module, drafter_params, vocab_ids = loading.load_drafter(os.path.join(models_dir, drafter),
                                                                         target_params)
        if vocab_file:
          vocab_ids = draft_vocab.load_ids(os.path.join(models_dir, vocab_file), target_module.config.vocab_size)
        decode_fn = tree_decoding.tree_speculative_sample if loop == 'tree' else decoding.speculative_sample
        model = models.SpeculativeEncoderDecoderModel(target_module, drafter_module, decode_fn=decode_fn,
                                                      draft_vocab_ids=vocab_ids)
        params = model.with_draft_projection({'target': target_params, 'drafter': drafter_params})
        decoder_params = dict(decoder_params, **(TREE if loop == 'tree' else {'gamma': GAMMA}), return_stats=True)
      text = program_text(model, params, decoder_params)
      key = f'{name}_t{temperature:g}'
      out[key] = hashlib.sha256(text.encode()).hexdigest()
      print(f'{key:28s} {out[key][:16]}  ({len(text):,} characters)', flush=True)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='models/cpu_v2', help='a model family directory (target, d1kd, f128, '
                      'bigram, draft_vocab/top2048.json)')
  parser.add_argument('--out', help='write the hashes here (JSON)')
  parser.add_argument('--compare', help='hashes written by an earlier --out: exit 1 when any differs')
  args = parser.parse_args(argv)
  stored = None
  if args.compare:  # read first: a missing file fails before anything is lowered
    with open(args.compare, encoding='utf-8') as f:
      stored = json.load(f)
  found = hashes(args.models)
  if args.out:
    fileio.atomic_write(args.out, json.dumps(found, indent=2).encode())
  if stored is None:
    return 0
  differ = sorted(k for k in set(stored) | set(found) if stored.get(k) != found.get(k))
  print('identical: all ' + str(len(found)) if not differ else 'differ: ' + ', '.join(differ))
  return 1 if differ else 0


if __name__ == '__main__':
  sys.exit(main())
