"""One rank's step machinery: the stage's pipeline schedule, its records, its parameters.

:func:`make_stage_schedule` wraps a (TP-sharded) stage in :class:`StageForward` (autocast,
a fixed output dtype) and builds the lane's ``torch.distributed.pipelining`` schedule with
shape-only placeholders; :func:`run_schedule_step` runs one step of it without keeping
outputs. :mod:`hpp.runtime.exec.worker` trains with these, and :mod:`hpp.runtime.profile.stage_memory` and
:mod:`hpp.runtime.profile.time_terms` measure this very step. The record helpers turn a step's
timings, collectives and instrumented events into the JSON of ``rank<r>.json``.
"""

from __future__ import annotations

import logging
import resource
from typing import Any, Callable

import torch

from hpp.runtime.host.emulation import Instrument
from hpp.runtime.exec.gradsync import CollectiveStats
from hpp.runtime.exec.layout import RankRole
from hpp.runtime.models.api import RuntimeModel
from hpp.runtime.models.stage import split_global_name
from hpp.runtime.exec.training import TrainingConfig, autocast_context, measure_stage_flops

__all__ = ["StageForward", "make_stage_schedule", "run_schedule_step", "peak_memory_bytes", "full_params",
           "stage_flops_per_step", "phase_record", "collective_record", "event_records"]

logger = logging.getLogger(__name__)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process on ``device`` [bytes]: CUDA's allocator peak, else the peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


class StageForward(torch.nn.Module):
    """The stage under autocast, its output cast to one fixed dtype (pipelining checks dtypes)."""

    def __init__(self, stage: torch.nn.Module, *, training: TrainingConfig, device: torch.device, is_last: bool):
        super().__init__()
        self.stage = stage
        self.training_cfg = training
        self.device_type = device.type
        self.out_dtype = training.logits_dtype if is_last else training.activation_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with autocast_context(self.training_cfg, self.device_type):
            y = self.stage(x)
        return y.to(self.out_dtype)


def make_stage_schedule(module: torch.nn.Module, *, stage_index: int, num_stages: int, num_micro_batches: int,
                        micro_batch_size: int, seq_len: int, hidden_size: int, vocab_size: int,
                        training: TrainingConfig, device: torch.device, group, schedule: str = "1F1B",
                        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """``(PipelineStage, schedule)`` of one lane's stage; placeholders are shape-only (meta).

    ``module`` is the (sharded) stage; it is wrapped in :class:`StageForward`. Works on
    fake tensors too (:mod:`hpp.runtime.profile.stage_memory` measures this very step).
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    is_first, is_last = stage_index == 0, stage_index == num_stages - 1
    b, s = micro_batch_size, seq_len
    meta = torch.device("meta")
    in_arg = (torch.empty(b, s, dtype=torch.long, device=meta) if is_first       # requires_grad: gradients flow
              else torch.empty(b, s, hidden_size, dtype=training.activation_dtype, device=meta, requires_grad=True))
    out_arg = (torch.empty(b, s, vocab_size, dtype=training.logits_dtype, device=meta, requires_grad=True) if is_last
               else torch.empty(b, s, hidden_size, dtype=training.activation_dtype, device=meta, requires_grad=True))
    wrapped = StageForward(module, training=training, device=device, is_last=is_last)
    stage = PipelineStage(wrapped, stage_index, num_stages, device, input_args=in_arg, output_args=out_arg,
                          group=group)
    cls = Schedule1F1B if schedule == "1F1B" else ScheduleGPipe
    return stage, cls(stage, num_micro_batches, loss_fn=loss_fn, scale_grads=False)


def run_schedule_step(schedule, inputs: torch.Tensor | None, targets: torch.Tensor | None, *, is_first: bool,
                      is_last: bool) -> list[torch.Tensor]:
    """One schedule step (outputs not kept); returns the last stage's per-micro-batch losses (else [])."""
    losses: list[torch.Tensor] = []
    args = (inputs,) if is_first else ()
    kwargs = {"target": targets, "losses": losses} if is_last else {}
    schedule.step(*args, return_outputs=False, **kwargs)
    return losses


def full_params(stage, model: RuntimeModel) -> dict[str, torch.Tensor]:
    """Every parameter the stage holds, unsharded, on the CPU; a tied pair held twice under both names."""
    from torch.distributed.tensor import DTensor

    out = {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().clone()
           for _l, name, p in stage.layer_parameters()}
    held = {int(k) for k in stage.layers}
    for a, b in model.tied_parameters():
        if a in out and split_global_name(b)[0] in held:
            out[b] = out[a]
    return out


def stage_flops_per_step(module: torch.nn.Module, role: RankRole, *, seq_len: int, hidden_size: int,
                         training: TrainingConfig) -> float | None:
    """Model FLOPs of this rank's share of a step (its micro-batches, divided by its TP degree), or None
    when the stage cannot be counted (a model FakeTensorMode cannot run: it still trains)."""
    try:
        mb_flops = measure_stage_flops(module, is_first=role.is_first, is_last=role.is_last,
                                       micro_batch_size=role.micro_batch_size, seq_len=seq_len,
                                       hidden_size=hidden_size, dtype=training.activation_dtype)
        return mb_flops * role.num_micro_batches / role.tp_degree
    except Exception as exc:  # noqa: BLE001 - a model FakeTensorMode cannot run: no FLOPs, still train
        logger.warning("rank %d: FLOPs not counted (%s: %s)", role.rank, type(exc).__name__, exc)
        return None


def phase_record(t0: float, t_sched: float, t_sync: float, t_opt: float, t_end: float,
                 instrument: Instrument, *, host: dict[str, float] | None = None,
                 proc_s: float | None = None) -> dict[str, Any]:
    """One step's phases [s]: wall time of the batch, the schedule, the sync wait and the optimizer step
    (from the perf-counter marks ``t0 <= t_sched <= t_sync <= t_opt <= t_end``), and the stage's
    instrumented ``compute_s``/``cpu_s``/``padding_s``; with ``host`` (the host's CPU counters over
    the step, :func:`hpp.runtime.host.steal.tick_delta`) also ``host`` (None off Linux); ``proc_s``: the
    CPU seconds of the whole rank process over the step (all its threads: ``time.process_time``)."""
    return {"batch_s": t_sched - t0, "schedule_s": t_sync - t_sched, "sync_wait_s": t_opt - t_sync,
            "optimizer_s": t_end - t_opt, "compute_s": instrument.compute_s,
            "cpu_s": instrument.cpu_s, "padding_s": instrument.padding_s, "host": host, "proc_s": proc_s}


def collective_record(st: CollectiveStats) -> dict[str, Any]:
    """One step's gradient collectives (:class:`hpp.runtime.exec.gradsync.CollectiveStats`) as JSON data."""
    return {"count": st.count, "bytes": st.bytes, "joined_count": st.joined_count,
            "joined_bytes": st.joined_bytes, "launched_in_backward": st.launched_in_backward,
            "records": [[label, list(ranks), nbytes] for label, ranks, nbytes in st.records]}


def event_records(instrument: Instrument, t0: float) -> list[dict[str, Any]]:
    """The stage's forward/backward events of one step, their times [s] relative to ``t0``."""
    return [{"kind": e.kind, "micro_batch": e.micro_batch, "start_s": e.start_s - t0,
             "stop_s": e.stop_s - t0} for e in instrument.events]
