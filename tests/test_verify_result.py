"""``--verify``'s verdict (:func:`hpp.runtime.exec.reference.verify_against`) on hand-made differences: the per-step
check decides, the free-running difference is reported beside it, unchecked steps and missing parameters fail."""

from __future__ import annotations

import math

import torch

from hpp.runtime.cli import _verify_line
from hpp.runtime.exec.reference import verify_against

REF = {"a": torch.tensor([1.0, 2.0], dtype=torch.float64), "b": torch.tensor([3.0], dtype=torch.float64)}
RUN = {"a": torch.tensor([1.0, 2.5], dtype=torch.float64), "b": torch.tensor([3.0], dtype=torch.float64)}


def test_free_running_drift_is_reported_and_the_steps_decide():
    v = verify_against([RUN, RUN], REF, steps=3, step_differences=[1e-15, 4e-13, 2e-14], first_step=0,
                       init_difference=0.0)
    assert v.free_running_difference == 0.5 and v.num_parameters == 2 and v.num_copies == 4
    assert v.max_abs_difference == 4e-13 and v.worst_step == 2 and v.first_failed_step is None
    assert v.passed and v.steps_checked == 3


def test_first_step_above_the_tolerance_is_named_with_global_step_numbers():
    """A resumed run (first step 10): steps 11, 12, 13; the replicas that diverged at 12 stay apart at 13."""
    v = verify_against([REF], REF, steps=3, step_differences=[1e-15, 3e-9, 2e-8], first_step=10)
    assert v.first_failed_step == 12 and v.worst_step == 13 and v.max_abs_difference == 2e-8 and not v.passed
    line = _verify_line(v.to_dict())
    assert "FAILED" in line and "worst: step 13" in line and "first above the tolerance: step 12" in line


def test_initial_parameters_that_differ_fail_as_step_0():
    v = verify_against([REF], REF, steps=1, step_differences=[0.0], init_difference=1e-3)
    assert v.worst_step == 0 and v.first_failed_step == 0 and not v.passed
    assert "the initial parameters" in _verify_line(v.to_dict())


def test_unchecked_steps_missing_parameters_and_nan_fail():
    assert not verify_against([REF], REF, steps=3, step_differences=[0.0, 0.0]).passed          # one step unchecked
    assert not verify_against([{"a": REF["a"]}], REF, steps=1, step_differences=[0.0]).passed   # b saved by no rank
    v = verify_against([REF], REF, steps=2, step_differences=[0.0, math.inf])                  # NaN counts as inf
    assert v.first_failed_step == 2 and not v.passed
    assert verify_against([REF], REF, steps=0, step_differences=[]).max_abs_difference == math.inf
