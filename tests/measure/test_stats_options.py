"""kvstats.stats.InferenceOptions: the confidence level, alpha, resamples and bootstrap seed of a measurement as one
frozen object, validated where it is made (every refusal names the field and the value)."""

from __future__ import annotations

import dataclasses

import pytest

from kvstats.measure.stats import InferenceOptions, inference_options


def test_defaults_and_what_none_means():
    opts = InferenceOptions()
    assert (opts.confidence_level, opts.alpha, opts.n_resamples, opts.seed) == (0.95, 0.05, None, None)
    assert opts.resamples(9999) == 9999 and opts.bootstrap_seed(7) == 7  # None: the interval's and the run's own
    given = InferenceOptions(n_resamples=999, seed=3)
    assert given.resamples(9999) == 999 and given.bootstrap_seed(7) == 3
    assert given.replace(alpha=0.01).alpha == 0.01 and given.to_dict()["seed"] == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.alpha = 0.1


@pytest.mark.parametrize("changes, error, message", [
    ({"confidence_level": 1.0}, ValueError, r"confidence_level must be in \(0, 1\), got 1.0"),
    ({"confidence_level": "0.9"}, TypeError, r"InferenceOptions.confidence_level must be a number"),
    ({"alpha": 0.0}, ValueError, r"InferenceOptions.alpha must be in \(0, 1\), got 0.0"),
    ({"alpha": True}, TypeError, r"InferenceOptions.alpha must be a number in \(0, 1\), got True"),
    ({"n_resamples": 10}, ValueError, r"n_resamples must be at least 40 for a 0.95 confidence interval"),
    ({"n_resamples": 2.5}, (TypeError, ValueError), r"n_resamples"),
    ({"seed": -1}, ValueError, r"InferenceOptions.seed"),
])
def test_bad_options_are_refused_naming_the_field(changes, error, message):
    with pytest.raises(error, match=message):
        InferenceOptions(**changes)


def test_only_options_or_none_are_taken():
    assert inference_options(None) == InferenceOptions()
    with pytest.raises(TypeError, match=r"inference must be a kvstats.stats.InferenceOptions"):
        inference_options({"alpha": 0.1})


def test_the_evaluation_reads_its_options():
    """Level and resamples reach every interval of an evaluation; the bootstrap seed defaults to the run's seed."""
    from kvstats.evaluation.evaluator import evaluate

    small = dict(bits=3, data="gaussian", units=6, dim=16, kv_heads=1, q_heads=1, seq=24, n_q=4)
    ev = evaluate("turbo_mse", inference=InferenceOptions(confidence_level=0.9, n_resamples=499), **small)
    r = ev.summary["attention_kl"]
    assert r.confidence_level == 0.9 and ev.config["confidence_level"] == 0.9 and r.n_resamples == 499
    assert ev.provenance["seeds"]["bootstrap"] == 0
    seeded = evaluate("turbo_mse", inference=InferenceOptions(confidence_level=0.9, n_resamples=499, seed=5), **small)
    assert seeded.provenance["seeds"]["bootstrap"] == 5 and seeded.summary["attention_kl"].statistic == r.statistic
