"""Single-device reference training: what ``hpp run --verify`` compares a run with.

:func:`train_single_device` trains the whole model (``build_stage(model, 0, L)``,
:func:`hpp.runtime.models.stage.build_stage`) on the whole global batch of every step, drawn
from the same :class:`hpp.runtime.exec.data.BatchSource` as the run's ranks, with the same
initialisation seed and the same training configuration
(:class:`hpp.runtime.exec.training.TrainingConfig`: optimizer, learning-rate schedule,
gradient clipping by the global norm), one :func:`hpp.runtime.exec.training.single_device_step`
per step. The loss is the summed next-token cross-entropy over the targets that are
not ``IGNORE_INDEX`` divided by their count in the global batch, which is what the
run's ranks sum to.

:func:`max_param_difference` compares every parameter every rank saved with the
reference (tied copies included); :func:`verify_against` puts that free-running comparison
beside the per-step check that decides ``--verify`` (:mod:`hpp.runtime.exec.verify_steps`: float64
training amplifies rounding over hundreds of steps, each step does not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from hpp.runtime.models.api import RuntimeModel
from hpp.runtime.models.stage import build_stage
from hpp.runtime.exec.training import make_lr_scheduler, make_optimizer, single_device_step
from hpp.runtime.exec.weights import load_weights_folder

__all__ = ["train_single_device", "max_param_difference",
           "VerifyResult", "verify_against", "verify_run", "VERIFY_TOLERANCE"]

#: ``--verify`` fails above this max absolute parameter difference (float64).
VERIFY_TOLERANCE = 1e-9


def train_single_device(model: RuntimeModel, *, source: Any, steps: int, seed: int, training: Any,
                        dtype: torch.dtype = torch.float64,
                        sample_order: Sequence[int] | None = None, weights: str | None = None
                        ) -> dict[str, torch.Tensor]:
    """Train ``model`` on one device for ``steps`` steps; every parameter by global name (tied: both names).

    Parameters
    ----------
    model : RuntimeModel
    source : hpp.runtime.exec.data.BatchSource
        ``source.batch(step)`` gives the step's global batch ``(G, s)`` inputs and targets.
    steps, seed : int
    training : hpp.runtime.exec.training.TrainingConfig
        Optimizer, learning rate and schedule, clipping; each step is
        :func:`hpp.runtime.exec.training.single_device_step`.
    dtype : torch.dtype
        The parameters' dtype (float64 for ``--verify``, whose ``training.dtype`` is float64 too).
    sample_order : sequence of int, optional
        A permutation of the ``G`` samples of every batch: the same training, summed in another
        order (what ``--verify`` measures float64 chaos with). Default: the batch's order.
    weights : str, optional
        A checked Hugging Face folder (``hpp run --weights``) the initial parameters are loaded from
        (:func:`hpp.runtime.exec.weights.load_stage_weights`) instead of the seed's draws.
    """
    module = build_stage(model, 0, model.spec.num_layers, seed=seed, dtype=dtype)
    if weights is not None:
        load_weights_folder(module, model, weights)
    named = [(name, p) for _l, name, p in module.layer_parameters()]
    opt = make_optimizer([p for _n, p in named], training)
    sched = make_lr_scheduler(opt, training)
    for step in range(steps):
        inputs, targets = source.batch(step)
        if sample_order is not None:
            inputs, targets = inputs[list(sample_order)], targets[list(sample_order)]
        single_device_step(module, opt, sched, inputs, targets, training)
    out = {name: p.detach().clone() for name, p in named}
    for first, second in model.tied_parameters():       # one parameter here; the ranks may hold two copies
        if first in out:
            out.setdefault(second, out[first])
    return out


def max_param_difference(rank_params: Sequence[Mapping[str, torch.Tensor]],
                         reference: Mapping[str, torch.Tensor]) -> tuple[float, bool, int]:
    """``(max abs difference, any NaN, parameters compared)`` over every rank's parameters.

    A NaN compares as a 0.0 difference in ``abs().max()`` arithmetic of some
    reductions, so NaN is reported separately and also forces the difference to inf.

    Raises
    ------
    KeyError
        A rank saved a parameter the reference does not have (a naming bug, not bad input).
    """
    worst, nan, n = 0.0, False, 0
    for params in rank_params:
        for name, value in params.items():
            ref = reference[name]
            if tuple(value.shape) != tuple(ref.shape):
                worst = math.inf
                n += 1
                continue
            if torch.isnan(value).any() or torch.isnan(ref).any():
                nan = True
                worst = math.inf
                continue
            worst = max(worst, (value.to(ref.dtype) - ref).abs().max().item())
            n += 1
    return worst, nan, n


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of ``--verify``.

    The pass/fail measure is per step (:mod:`hpp.runtime.exec.verify_steps`): each step of the run
    against one single-device step from the run's own state before it, and, for a run that
    starts fresh, the initial parameters against the single-device initialisation. The
    free-running comparison (the final parameters against single-device training of every
    step from the start) is reported beside it: float64 training amplifies rounding, so
    after a few hundred steps it can exceed the tolerance with every step exact; then
    ``reordered_difference`` says how far the same single-device training drifts when each
    batch is only summed in another order.

    Attributes
    ----------
    max_abs_difference : float
        Largest ``|run - single-device step|`` over every checked step (and the initial
        parameters), every value of every parameter every rank holds (inf on NaN or a
        shape mismatch).
    num_parameters : int
        Distinct parameters (global names) compared.
    num_copies : int
        (rank, parameter) pairs compared (a parameter held by k ranks counts k times).
    missing : tuple[str, ...]
        Reference parameters no rank saved (the run did not cover the model; fails).
    tolerance : float
    steps, steps_checked : int
        Steps the run took, and how many of them the per-step check covered (fails unless all).
    worst_step : int or None
        1-based global step of ``max_abs_difference`` (0: the initial parameters).
    first_failed_step : int or None
        1-based global step of the first difference above the tolerance (0: the initial parameters;
        None: none). Replicas that diverged there stay apart, so later steps fail too.
    free_running_difference : float or None
        Largest ``|run - single-device training|`` after the last step, without re-synchronising.
    reordered_difference : float or None
        Largest difference of single-device training from itself with every batch's samples in
        reverse order (computed when ``free_running_difference`` exceeds the tolerance).
    """

    max_abs_difference: float
    num_parameters: int
    num_copies: int
    missing: tuple[str, ...]
    tolerance: float = VERIFY_TOLERANCE
    steps: int = 0
    steps_checked: int = 0
    worst_step: int | None = None
    first_failed_step: int | None = None
    free_running_difference: float | None = None
    reordered_difference: float | None = None

    @property
    def passed(self) -> bool:
        return (not self.missing and self.steps_checked == self.steps
                and self.max_abs_difference <= self.tolerance)

    def to_dict(self) -> dict[str, Any]:
        return {"max_abs_difference": self.max_abs_difference, "num_parameters": self.num_parameters,
                "num_copies": self.num_copies, "missing": list(self.missing), "tolerance": self.tolerance,
                "steps": self.steps, "steps_checked": self.steps_checked, "worst_step": self.worst_step,
                "first_failed_step": self.first_failed_step,
                "free_running_difference": self.free_running_difference,
                "reordered_difference": self.reordered_difference, "passed": self.passed}


def verify_against(rank_params: Sequence[Mapping[str, torch.Tensor]], reference: Mapping[str, torch.Tensor], *,
                   steps: int, step_differences: Sequence[float], first_step: int = 0,
                   init_difference: float | None = None, tolerance: float = VERIFY_TOLERANCE) -> VerifyResult:
    """The :class:`VerifyResult` of a run.

    Parameters
    ----------
    rank_params : sequence of {global name: tensor}
        Every rank's parameters after the last step.
    reference : {global name: tensor}
        Free-running single-device training of every step (:func:`train_single_device`).
    steps : int
        Steps the run took.
    step_differences : sequence of float
        The per-step check (:mod:`hpp.runtime.exec.verify_steps`) of steps ``first_step, first_step + 1, ...``;
        fewer than ``steps`` fails.
    first_step : int
        0-based global index of the run's first step (a resumed run's checkpoint step).
    init_difference : float or None
        The initial parameters against the single-device initialisation (None: resumed).
    """
    free, _nan, copies = max_param_difference(rank_params, reference)
    seen = {name for params in rank_params for name in params}
    missing = tuple(sorted(set(reference) - seen))
    checked = {first_step + i + 1: float(d) for i, d in enumerate(step_differences)}
    if init_difference is not None:
        checked[0] = float(init_difference)
    worst = max(checked, key=lambda k: (checked[k], -k)) if checked else None
    failed = min((k for k, d in checked.items() if not d <= tolerance), default=None)
    return VerifyResult(checked[worst] if worst is not None else math.inf, len(seen), copies, missing, tolerance,
                        steps=steps, steps_checked=len(step_differences), worst_step=worst, first_failed_step=failed,
                        free_running_difference=free)


def verify_run(model: RuntimeModel, out_dir: Path, ranks: Sequence[int], results: Sequence[Mapping[str, Any] | None],
               *, source: Any, first_step: int, steps: int, seed: int, training: Any, whole: bool = True,
               num_threads: int = 1, weights: str | None = None) -> VerifyResult:
    """The verdict of ``hpp run --verify`` from the ranks' files.

    The per-step check the ranks recorded (every rank the same, :mod:`hpp.runtime.exec.verify_steps`) decides;
    beside it, the ranks' saved parameters (``out_dir/rank<r>.pt``) against free-running single-device
    float64 training of all ``first_step + steps`` steps and, when that drifts past the tolerance, the
    drift of single-device training from itself with every batch summed in reverse sample order.

    Parameters
    ----------
    results : sequence of dict or None
        The ranks' ``rank<r>.json`` (``verify_init``, ``verify_steps``).
    whole : bool
        False (one host of several): only the names these ranks hold are compared free-running.
    num_threads : int
        torch compute threads of the single-device training, the ranks' (on a busy host, more threads
        than free cores make a tiny model's step many times slower); restored afterwards.
    weights : str, optional
        The run's ``--weights`` folder: the single-device training starts from it too.
    """
    rank_params = [torch.load(out_dir / f"rank{r}.pt", map_location="cpu", weights_only=True) for r in ranks]
    recorded = next((r for r in results if r is not None and "verify_steps" in r), {})
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        ref = train_single_device(model, source=source, steps=first_step + steps, seed=seed, training=training,
                                  weights=weights)
        if not whole:
            held = {name for params in rank_params for name in params}
            ref = {k: v for k, v in ref.items() if k in held}
        result = verify_against(rank_params, ref, steps=steps, step_differences=recorded.get("verify_steps", []),
                                first_step=first_step, init_difference=recorded.get("verify_init"))
        if result.free_running_difference is not None and result.free_running_difference > result.tolerance:
            twin = train_single_device(model, source=source, steps=first_step + steps, seed=seed, training=training,
                                       sample_order=range(source.global_batch_size - 1, -1, -1), weights=weights)
            drift, _nan, _n = max_param_difference([{k: twin[k] for k in ref}], ref)
            result = replace(result, reordered_difference=drift)
    finally:
        torch.set_num_threads(before)
    return result
