"""Bad callback arguments are refused when the callback is built (issue 10): one line naming the
argument and the value, before any training."""
from __future__ import annotations

import pytest

from robusttrain.callbacks import (
    BalancedCheckpoint,
    FailureMiningCallback,
    MetamorphicCallback,
    RobustnessReporter,
)
from robusttrain.metamorphic.batch import BatchHooks
from robusttrain.metamorphic.suite import MRSuite

CASES = [
    # (id, build, exception, message regex)
    ("severity-0", lambda: MRSuite(["blur"], severities=(0,)), ValueError, r"severities=\[0\].*int in 1\.\.5.*got 0"),
    ("severity-6", lambda: MRSuite(["blur"], severities=(2, 6)), ValueError, r"severities=\[2, 6\].*got 6"),
    ("severity-empty", lambda: MRSuite(["blur"], severities=()), ValueError, r"severities= must not be empty"),
    ("unknown-perturbation", lambda: MRSuite(["blur", "nope"]), ValueError, r"unknown perturbation 'nope'"),
    ("unknown-suite", lambda: MRSuite("nope"), ValueError, r"unknown perturbation suite 'nope'"),
    ("kwargs-for-absent-family", lambda: MRSuite(["blur"], perturbation_kwargs={"text": {}}), ValueError,
     r"perturbation_kwargs has 'text'"),
    ("suite-not-a-suite", lambda: MetamorphicCallback(suite=["blur"]), ValueError, r"suite must be an MRSuite"),
    ("hooks-not-hooks", lambda: MetamorphicCallback(hooks={"get_images": None}), ValueError,
     r"hooks must be a BatchHooks"),
    ("bad-to-probabilities", lambda: MetamorphicCallback(hooks=BatchHooks(to_probabilities="softmaxx")), ValueError,
     r"to_probabilities='softmaxx'"),
    ("violation-threshold", lambda: MetamorphicCallback(violation_threshold=1.5), ValueError,
     r"violation_threshold=1\.5: expected a number in \[0, 1\]"),
    ("every-n-negative", lambda: MetamorphicCallback(every_n_epochs=-1), ValueError, r"every_n_epochs=-1"),
    ("max-cases-zero", lambda: MetamorphicCallback(max_cases=0), ValueError, r"max_cases=0: expected an integer >= 1"),
    ("batch-size-zero", lambda: MetamorphicCallback(batch_size=0), ValueError, r"batch_size=0"),
    ("path", lambda: MetamorphicCallback(path="gpu"), ValueError, r"path='gpu': expected one of 'auto', 'torch'"),
    ("budget", lambda: MetamorphicCallback(budget=2.0), ValueError, r"budget"),
    ("replay-ratio-1", lambda: FailureMiningCallback(replay_ratio=1.0), ValueError,
     r"replay_ratio=1\.0: expected a number in \[0, 0\.9\]"),
    ("replay-ratio-negative", lambda: FailureMiningCallback(replay_ratio=-0.1), ValueError, r"replay_ratio=-0\.1"),
    ("train-probe-zero", lambda: FailureMiningCallback(train_probe_size=0), ValueError,
     r"train_probe_size=0: expected an integer >= 1"),
    ("jitter", lambda: FailureMiningCallback(jitter=2), ValueError, r"jitter=2"),
    ("mix-sum", lambda: FailureMiningCallback(clean_mix=0.6, fresh_image=0.6), ValueError,
     r"clean_mix=0\.6 \+ fresh_image=0\.6: expected a sum <= 1"),
    ("max-size", lambda: FailureMiningCallback(max_size=1), ValueError, r"max_size=1"),
    ("momentum", lambda: FailureMiningCallback(momentum=1.0), ValueError, r"momentum=1\.0: expected a number in \[0, 1\)"),
    ("floor", lambda: FailureMiningCallback(floor=2), ValueError, r"floor=2: expected a number in \[0, 1\]"),
    ("contamination-0.9", lambda: BalancedCheckpoint(contamination=0.9), ValueError,
     r"contamination=0\.9: expected a number in \(0, 0\.5\]"),
    ("contamination-0", lambda: BalancedCheckpoint(contamination=0), ValueError, r"contamination=0: .*\(0, 0\.5\]"),
    ("policy", lambda: BalancedCheckpoint(policy="best"), ValueError, r"policy='best': expected one of 'last_inlier'"),
    ("mode", lambda: BalancedCheckpoint(mode="up"), ValueError, r"mode='up'"),
    ("tail", lambda: BalancedCheckpoint(tail="left"), ValueError, r"tail='left'"),
    ("retention", lambda: BalancedCheckpoint(retention=0), ValueError, r"retention=0"),
    ("min-epoch", lambda: BalancedCheckpoint(min_epoch=-2), ValueError, r"min_epoch=-2"),
    ("worst-fraction", lambda: BalancedCheckpoint(worst_fraction=0), ValueError, r"worst_fraction"),
    ("reporter-every", lambda: RobustnessReporter(every_n_epochs=0), ValueError, r"every_n_epochs=0"),
]


@pytest.mark.parametrize("build,exc,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_callback_argument_is_refused_at_construction(build, exc, pattern):
    with pytest.raises(exc, match=pattern) as err:
        build()
    assert "\n" not in str(err.value)  # one line
