"""Memory of the runtime's real stage step, measured with no GPU and at real model size.

:func:`measure_stage_step` builds one pipeline stage of a runtime model under
``torch._subclasses.fake_tensor.FakeTensorMode`` (tensors carry shapes and dtypes,
no data: an 8-billion-parameter stage costs no memory), joins a fake process group
(``torch.testing._internal.distributed.fake_pg``, backend ``"fake"``, world = the
pipeline's ranks, this rank = the stage's position) and runs what a rank of
``hpp run`` runs in one training step: ``PipelineStage`` + ``Schedule1F1B`` (or
``ScheduleGPipe``) over all micro-batches, the loss on the last stage, the
optimizer step, under :class:`torch.distributed._tools.MemTracker`. Sends and
receives of a fake process group do nothing, so the stage runs its own schedule
alone: its in-flight micro-batches, its library buffers, its peak.

The optimizer's states are created before the tracked step (one step on zero
gradients), so the measured step is a steady-state one (step >= 2), as on a GPU
after the first iteration. ``device="cuda"`` emulates what the runtime does on a
GPU where it differs on CPU: optimizers use their ``foreach`` implementation (whose
temporaries are part of the peak). Attention runs torch's CPU kernels (a CUDA
build is not needed); their saved tensors match the CUDA flash/efficient kernels
in size (output + log-sum-exp), not the math fallback.

Measured (:class:`StepMemory`): the peak [bytes] (what ``torch.cuda.max_memory_allocated``
reports, less the CUDA context and allocator rounding), MemTracker's breakdown at
the peak (parameters, gradients, optimizer states, activations, temporaries,
other), and per schedule action (forward / loss / backward of a micro-batch, the
optimizer step) the bytes before, the peak during and the bytes after.

Not measured: gradient clipping (its norm is read back as a number, which a fake
tensor has not; its temporaries are one gradient at a time in float64), and the
block-wise gradient sync of multi-pipeline plans (one pipeline here).

Preconditions: no process group may be initialised in this process (the fake one
is created and destroyed here); the model follows :mod:`hpp.runtime.models.api`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from hpp.errors import HppInputError
from hpp.runtime.profile.fake_env import StepTracker, build_fake_stage, fake_world, isolated, warm_up_sharding
from hpp.runtime.models.api import RuntimeModel
from hpp.runtime.exec.tensor_parallel import parallelize_stage
from hpp.runtime.exec.training import TrainingConfig, lm_loss, make_optimizer
from hpp.runtime.exec.step import make_stage_schedule, run_schedule_step

__all__ = ["StepSpec", "StepEvent", "StepMemory", "measure_stage_step", "OPTIMIZERS", "MEMORY_DTYPES"]

logger = logging.getLogger(__name__)

#: Optimizers of the runtime (their state tensors per parameter: ``cost_model.OPTIMIZER_STATES``).
OPTIMIZERS = ("adamw", "sgd")
#: Training dtypes: ``bfloat16`` is autocast mixed precision with fp32 parameters, gradients and states.
MEMORY_DTYPES = ("float32", "bfloat16")
_CATEGORIES = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients", "Optstate": "optimizer_states",
               "Activation": "activations", "Temp": "temporaries", "Other": "other"}


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One stage of one pipeline, as a rank of ``hpp run`` executes it.

    Attributes
    ----------
    layer_start, layer_stop : int
        Layers ``[layer_start, layer_stop)`` of the model.
    position, num_stages : int
        0-based stage index and the pipeline's stage count.
    micro_batch_size, num_micro_batches : int
        b samples per micro-batch, m micro-batches per step (1F1B needs m >= num_stages).
    recompute : ``"none"`` or ``"full"``
    optimizer : ``"adamw"`` or ``"sgd"``
    dtype : ``"float32"`` or ``"bfloat16"`` (autocast, fp32 masters)
    schedule : ``"1F1B"`` or ``"GPipe"``
    device : ``"cuda"`` or ``"cpu"``
        The device whose runtime behaviour is emulated (optimizer implementation).
    tp_degree : int
        The stage's TP degree (the measured device is TP rank 0 of the stage).
    """

    layer_start: int
    layer_stop: int
    position: int = 0
    num_stages: int = 1
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    recompute: str = "none"
    optimizer: str = "adamw"
    dtype: str = "float32"
    schedule: str = "1F1B"
    device: str = "cuda"
    tp_degree: int = 1

    def validate(self, num_layers: int) -> None:
        """Raise :class:`HppInputError` naming the bad field."""
        if not 0 <= self.layer_start < self.layer_stop <= num_layers:
            raise HppInputError(f"layers [{self.layer_start}, {self.layer_stop}) outside [0, {num_layers})",
                                field="layers", fix=f"the model has {num_layers} layers")
        if not 0 <= self.position < self.num_stages:
            raise HppInputError(f"position {self.position} of {self.num_stages} stages", field="position",
                                fix="use 0 <= position < num_stages")
        if (self.position == 0) != (self.layer_start == 0) or \
                (self.position == self.num_stages - 1) != (self.layer_stop == num_layers):
            raise HppInputError(f"stage {self.position} of {self.num_stages} holds layers [{self.layer_start}, "
                                f"{self.layer_stop}) of {num_layers}", field="layers",
                                fix="the first stage starts at layer 0 and only the last one ends at the head")
        if self.tp_degree < 1:
            raise HppInputError(f"TP degree {self.tp_degree}", field="tp_degree", fix="use 1, 2, 4 or 8")
        if self.micro_batch_size < 1 or self.num_micro_batches < 1:
            raise HppInputError(f"micro-batch size {self.micro_batch_size}, {self.num_micro_batches} micro-batches",
                                field="micro_batch_size", fix="both must be >= 1")
        if self.schedule == "1F1B" and self.num_micro_batches < self.num_stages:
            raise HppInputError(f"1F1B with {self.num_micro_batches} micro-batches on {self.num_stages} stages",
                                field="num_micro_batches", fix="use at least as many micro-batches as stages")
        for name, allowed in (("optimizer", OPTIMIZERS), ("dtype", MEMORY_DTYPES),
                              ("schedule", ("1F1B", "GPipe")), ("device", ("cuda", "cpu")),
                              ("recompute", ("none", "full"))):
            if getattr(self, name) not in allowed:
                raise HppInputError(f"{name} {getattr(self, name)!r}", field=name, fix=f"use one of {list(allowed)}")


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One schedule action: ``kind`` in forward / loss / backward / optimizer, its micro-batch (-1: none), bytes."""

    kind: str
    micro_batch: int
    before_bytes: int
    peak_bytes: int
    after_bytes: int


@dataclass(frozen=True)
class StepMemory:
    """Measured memory of one stage step (bytes of one device).

    Attributes
    ----------
    peak_bytes : int
        Highest total of live tensors during the step (optimizer step included).
    breakdown : dict[str, int]
        MemTracker's categories at the peak: parameters, buffers, gradients,
        optimizer_states, activations, temporaries, other.
    events : tuple of StepEvent
        The schedule's actions in order.
    start_bytes : int
        Live bytes when the step starts (parameters, gradients, states, library buffers).
    wall_s : float
        Seconds the measurement took.
    """

    spec: StepSpec
    peak_bytes: int
    breakdown: dict[str, int]
    events: tuple[StepEvent, ...]
    start_bytes: int
    wall_s: float

    def peak_of(self, kind: str) -> int:
        """Highest peak of the events of ``kind`` (0 if none)."""
        return max((e.peak_bytes for e in self.events if e.kind == kind), default=0)


def _make_optimizer(name: str, params: list[torch.nn.Parameter], *, foreach: bool) -> torch.optim.Optimizer:
    """The runtime's optimizer (:func:`hpp.runtime.exec.training.make_optimizer`), ``foreach`` as on the device."""
    opt = make_optimizer(params, TrainingConfig(optimizer=name))
    for group in opt.param_groups:
        group["foreach"] = foreach                  # torch's default: True on CUDA, False on CPU
    return opt


def _static_vote(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:  # noqa: ARG001
    """The outcome of the schedule's warm-up vote when every stage has static shapes: STATIC.

    The real vote sends a tensor along the pipeline and reads it (``.item()``),
    which neither a fake process group (receives nothing) nor a fake tensor (has
    no value) can do; the runtime gives every stage static input/output shapes, so
    the vote's result is known.
    """
    from torch.distributed.pipelining.stage import InferenceMode

    for stage in stages:
        stage._inference_mode = InferenceMode.STATIC


def _instrument(tracker: StepTracker, events: list[StepEvent], kind: str,
                fn: Callable[..., Any], chunk_arg: bool = True) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before = tracker.current_bytes()
        tracker.window_peak = before
        out = fn(*args, **kwargs)
        mb = args[0] if chunk_arg and args and isinstance(args[0], int) else -1
        events.append(StepEvent(kind, mb, before, tracker.window_peak, tracker.current_bytes()))
        return out
    return wrapped


def _legacy_schedule(module: torch.nn.Module, spec: StepSpec, model: RuntimeModel, loss_fn: Callable[..., Any]):
    """The stage and schedule with real placeholders and kept outputs (what a naive build holds), for comparison."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    ms, b = model.spec, spec.micro_batch_size
    is_first, is_last = spec.position == 0, spec.position == spec.num_stages - 1
    in_arg = (torch.zeros(b, ms.seq_len, dtype=torch.long) if is_first
              else torch.zeros(b, ms.seq_len, ms.hidden_size, requires_grad=True))
    out_arg = torch.zeros(b, ms.seq_len, ms.vocab_size if is_last else ms.hidden_size, requires_grad=True)
    stage = PipelineStage(module, spec.position, spec.num_stages, torch.device("cpu"), input_args=in_arg,
                          output_args=out_arg)
    cls = Schedule1F1B if spec.schedule == "1F1B" else ScheduleGPipe
    return stage, cls(stage, spec.num_micro_batches, loss_fn=loss_fn, scale_grads=False), (in_arg, out_arg)


def measure_stage_step(model: RuntimeModel, spec: StepSpec, *, seed: int = 0, legacy_waste: bool = False,
                       isolate: bool = True) -> StepMemory:
    """Measure the memory of one training step of one stage (see the module docstring).

    The stage and its schedule come from the runtime itself
    (:func:`hpp.runtime.exec.step.make_stage_schedule`, :func:`hpp.runtime.exec.step.run_schedule_step`).

    Parameters
    ----------
    model : RuntimeModel
    spec : StepSpec
    seed : int
        Initialisation seed (fake tensors: only shapes matter).
    legacy_waste : bool
        Run the step with a real ``(b, s, V)`` output placeholder and ``return_outputs=True`` (fp32 only), the
        memory a naive build wastes: reproduces the H200 measurement of that build.
    isolate : bool
        Measure in a forked child process (:func:`isolated`), so that nothing of the fake
        world stays in this process.

    Returns
    -------
    StepMemory

    Raises
    ------
    HppInputError
        A bad spec, or (``isolate=False``) a process group already initialised.
    """
    if isolate:
        return isolated(measure_stage_step, model, spec, seed=seed, legacy_waste=legacy_waste, isolate=False)

    spec.validate(model.spec.num_layers)
    t0 = time.perf_counter()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    events: list[StepEvent] = []
    t = spec.tp_degree
    if t > 1 and legacy_waste:
        raise HppInputError("legacy_waste with TP > 1", field="tp_degree", fix="measure the naive build at TP 1")
    with fake_world(spec.num_stages * t, spec.position * t):     # rank = TP rank 0 of the stage
        lane = tp_group = None                                    # TP 1: the world is the pipeline
        if t > 1:
            tp_group = dist.new_group(list(range(spec.position * t, (spec.position + 1) * t)))
            lane = dist.new_group([j * t for j in range(spec.num_stages)])
        module = build_fake_stage(model, spec.layer_start, spec.layer_stop, fake_mode=fake_mode, seed=seed,
                                  recompute=spec.recompute)
        if t > 1:                   # outside the fake mode: the device mesh holds real rank numbers
            parallelize_stage(module, model, tp_group=tp_group, tp_degree=t, device=torch.device("cpu"))
        with fake_mode:
            start, peak_snap = _tracked_step(model, spec, module, lane=lane, events=events,
                                             legacy_waste=legacy_waste)
    peak = sum(snap.get("Total", 0) for snap in peak_snap.values())
    breakdown = {name: 0 for name in _CATEGORIES.values()}
    for snap in peak_snap.values():
        for key, value in snap.items():
            if key != "Total":
                breakdown[_CATEGORIES[str(getattr(key, "value", key))]] += int(value)
    wall = time.perf_counter() - t0
    logger.info("stage [%d, %d) at %d/%d, b=%d, m=%d: peak %.3f GiB (%.1f s)", spec.layer_start, spec.layer_stop,
                spec.position, spec.num_stages, spec.micro_batch_size, spec.num_micro_batches, peak / 2**30, wall)
    return StepMemory(spec, int(peak), breakdown, tuple(events), int(start), wall)


def _tracked_step(model: RuntimeModel, spec: StepSpec, module: torch.nn.Module, *, lane: Any,
                  events: list[StepEvent], legacy_waste: bool) -> tuple[int, dict]:
    """Inside the fake mode: the optimizer in its steady state, the stage's schedule, one tracked step;
    ``(bytes at the step's start, the tracker's peak snapshot)``."""
    ms = model.spec
    b, s, m = spec.micro_batch_size, ms.seq_len, spec.num_micro_batches
    is_first, is_last = spec.position == 0, spec.position == spec.num_stages - 1
    loss_fn = lambda out, tgt: lm_loss(out, tgt, denominator=b * m * s)   # noqa: E731 - the worker's
    params = [p for _l, _n, p in module.layer_parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)             # the runtime's gradients live all step (sync buckets)
    optimizer = _make_optimizer(spec.optimizer, params, foreach=spec.device == "cuda")
    optimizer.step()                              # creates the states: measure a steady-state step
    if spec.tp_degree > 1:
        warm_up_sharding(module, model, micro_batch_size=b, is_first=is_first, is_last=is_last, dtype=spec.dtype)
    extra: tuple[torch.Tensor, ...] = ()
    if legacy_waste:
        stage, schedule, extra = _legacy_schedule(module, spec, model, loss_fn)
    else:
        stage, schedule = make_stage_schedule(
            module, stage_index=spec.position, num_stages=spec.num_stages, num_micro_batches=m,
            micro_batch_size=b, seq_len=s, hidden_size=ms.hidden_size, vocab_size=ms.vocab_size,
            training=TrainingConfig(optimizer=spec.optimizer, dtype=spec.dtype), device=torch.device("cpu"),
            group=lane, schedule=spec.schedule, loss_fn=loss_fn)
    schedule._warmup_p2p = _static_vote                # see _static_vote
    inputs = torch.zeros(b * m, s, dtype=torch.long)
    targets = torch.zeros(b * m, s, dtype=torch.long)
    tracker = StepTracker()
    tracker.track_external(module, optimizer, inputs, targets, *extra)
    stage.forward_one_chunk = _instrument(tracker, events, "forward", stage.forward_one_chunk)
    stage.backward_one_chunk = _instrument(tracker, events, "backward", stage.backward_one_chunk)
    schedule._maybe_compute_loss = _instrument(tracker, events, "loss", schedule._maybe_compute_loss,
                                               chunk_arg=False)
    with tracker:
        start = tracker.current_bytes()
        optimizer.zero_grad(set_to_none=False)
        if legacy_waste:
            schedule.step(*((inputs,) if is_first else ()), **({"target": targets} if is_last else {}))
        else:
            run_schedule_step(schedule, inputs, targets, is_first=is_first, is_last=is_last)
        _instrument(tracker, events, "optimizer", optimizer.step, chunk_arg=False)()
    return start, tracker.get_tracker_snapshot("peak")
