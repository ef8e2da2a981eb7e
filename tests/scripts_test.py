"""Tests of the pure helpers in scripts/ (the ablation summaries)."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts'))
import ablate  # pylint: disable=g-import-not-at-top,wrong-import-position


def _run(gamma, t_iter, calls=10, t_tok=0.002, tokens=30, accepted=5, judged=10):
  return {'setting': {'gamma': gamma}, 'speculative_seconds': t_iter * calls, 'target_calls': calls,
          'baseline_seconds': t_tok * tokens, 'baseline_tokens': tokens, 'accepted': accepted, 'judged': judged}


def test_in_loop_costs_recovers_a_line():
  runs = [_run(g, 0.003 + 0.0004 * g) for g in (1, 3, 6, 10)]
  fit = ablate.in_loop_costs(runs)
  assert fit['a'] == pytest.approx(0.003) and fit['b'] == pytest.approx(0.0004)
  assert fit['c_in_situ'] == pytest.approx(0.2) and fit['a_over_t_tok'] == pytest.approx(1.5)


def test_in_loop_costs_single_gamma_has_no_slope():
  fit = ablate.in_loop_costs([_run(4, 0.005)])
  assert np.isnan(fit['b']) and fit['a'] == pytest.approx(0.005)


def test_pooled_alpha_weights_by_judged_drafts():
  runs = [_run(1, 0.004, accepted=1, judged=10), _run(2, 0.004, accepted=30, judged=40)]
  assert ablate._pooled_alpha(runs) == pytest.approx(31 / 50)  # not the mean of 0.1 and 0.75
  assert ablate._pooled_alpha([]) == 0.0


def test_needed_alpha_takes_the_best_gamma_and_says_unreachable():
  fit = {'c_in_situ': 0.1, 'a_over_t_tok': 1.2}
  alpha, gamma = ablate.needed_alpha(fit, 2.0, 10)
  from specdec import theory
  reachable = [a for a in (theory.required_alpha(2.0, g, 0.1, 1.2) for g in range(1, 11)) if np.isfinite(a)]
  assert alpha == pytest.approx(min(reachable))
  assert 1 <= gamma <= 10
  assert ablate.needed_alpha({'c_in_situ': 0.9, 'a_over_t_tok': 5.0}, 2.0, 3) == (None, None)
