"""Time the runtime's step spends outside the per-layer forward/backward.

A per-layer profile (:mod:`hpp.runtime.profile.profiler`) times each layer alone. The runtime's
step also runs the loss, the bookkeeping of ``torch.distributed.pipelining`` for every
micro-batch, and point-to-point transfers through the backend. This module measures
those, on this host, with the runtime's own code:

- :func:`measure_loss_s`: forward and backward of the runtime's loss
  (:func:`hpp.runtime.exec.training.lm_loss`) on ``(b, s, V)`` logits, per micro-batch size;
  CPU time of the calling thread (one compute thread);
- :func:`measure_schedule_overhead`: a pipeline of identity-like stages (a few floats per
  micro-batch, so compute is negligible) run by the worker's own
  :func:`hpp.runtime.exec.step.make_stage_schedule` / ``run_schedule_step`` on gloo, for
  several micro-batch counts ``m``; the main thread's CPU time per step is fitted as
  ``a + m b`` (least squares): ``b`` the per-micro-batch fixed cost of one stage (one
  forward and one backward, their p2p posting included), ``a`` the per-step cost;
  ``in_op`` is the share of ``b`` spent inside ``forward_one_chunk``/``backward_one_chunk``
  (what :mod:`hpp.runtime.host.emulation` pads). The tiny stage's own forward + backward (+ loss),
  timed after every step outside the schedule, is subtracted from ``b``: a profile already
  counts a stage's compute;
- the backend's send/recv latency and bandwidth and the host's CPU contention come from
  :mod:`hpp.runtime.profile.host_probe`.

Clocks: CPU time (``time.thread_time``) for everything here, since these are CPU work and
on a shared host wall time grows with other processes' load.

The results become optional time terms of a profile (:mod:`hpp.profiles.step_time`):
:func:`add_time_terms`; ``python -m hpp.runtime.profile.time_terms PROFILE.json --out OUT.json``
adds them to a CPU profile measured on this host. Multi-rank measurements run in forked
children (:func:`hpp.runtime.profile.host_probe.run_forked`).
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
import torch.distributed as dist

from hpp.cliparse import Parser, run_command
from hpp.errors import HppInputError
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.profile_format import load_profile, save_profile
from hpp.profiles.step_time import HostTimeTerms, StepTimeTerms
from hpp.runtime.host.emulation import Instrument
from hpp.runtime.host.ops import MeasuredHost
from hpp.runtime.profile.host_probe import (fit_line, init_gloo, measure_contention, measure_host_ops, measure_p2p,
                                    run_forked)
from hpp.runtime.profile.profiler import resolve_model
from hpp.runtime.exec.training import TrainingConfig, lm_loss
from hpp.runtime.exec.step import make_stage_schedule, run_schedule_step

__all__ = ["ScheduleOverheadFit", "HostStepTerms", "measure_loss_s", "measure_schedule_overhead",
           "measure_host_step_terms", "measure_time_terms", "add_time_terms", "add_measured_time_terms", "main"]

#: The command's name in its usage and error lines.
PROG = "python -m hpp.runtime.profile.time_terms"

logger = logging.getLogger(__name__)

#: Tiny stage shapes of the overhead pipeline: micro-batch, sequence, hidden, vocabulary.
_TINY = (1, 2, 8, 8)


# ------------------------------------------------------------------ loss


def measure_loss_s(model: Any, micro_batch_sizes: Sequence[int], *, warmup: int = 3, repeats: int = 10,
                   dtype: torch.dtype = torch.float32, seed: int = 0) -> dict[int, tuple[float, float]]:
    """``{b: (forward_s, backward_s)}`` of the runtime's loss on one micro-batch of ``b`` samples.

    ``lm_loss`` on random ``(b, s, V)`` logits (``dtype``) and targets, backward from the
    scalar; medians of ``repeats`` after ``warmup``, CPU time of this thread, with one torch
    compute thread (as each rank runs; restored afterwards).
    """
    spec = resolve_model(model)[0].spec
    gen = torch.Generator().manual_seed(seed)
    out: dict[int, tuple[float, float]] = {}
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for b in sorted(set(micro_batch_sizes)):
            out[b] = _loss_once(lm_loss, spec, b, gen, warmup=warmup, repeats=repeats, dtype=dtype)
    finally:
        torch.set_num_threads(old)
    return out


def _loss_once(lm_loss, spec, b: int, gen: torch.Generator, *, warmup: int, repeats: int,
               dtype: torch.dtype) -> tuple[float, float]:
    logits = torch.randn(b, spec.seq_len, spec.vocab_size, generator=gen, dtype=dtype).requires_grad_(True)
    targets = torch.randint(0, spec.vocab_size, (b, spec.seq_len), generator=gen)
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        c0 = time.thread_time()
        loss = lm_loss(logits, targets, denominator=b * spec.seq_len)
        c1 = time.thread_time()
        loss.backward()
        c2 = time.thread_time()
        logits.grad = None
        if i >= warmup:
            fwd.append(c1 - c0)
            bwd.append(c2 - c1)
    return statistics.median(fwd), statistics.median(bwd)


# ------------------------------------------------------------------ schedule overhead


@dataclass(frozen=True, slots=True)
class ScheduleOverheadFit:
    """Per-step CPU time of one stage of a negligible-compute pipeline: ``per_step_s + m per_micro_batch_s``.

    Attributes
    ----------
    micro_batches : (n,) int
    cpu_s : (n,) float
        Per ``m``: the largest over stages of the median main-thread CPU seconds per step.
    wall_s : (n,) float
        Per ``m``: median wall seconds per step (rank 0), for reference.
    per_step_s, per_micro_batch_s : float
        The fit [s].
    in_op_fraction : float
        Share of the per-micro-batch cost inside ``forward_one_chunk``/``backward_one_chunk``.
    stage_compute_s : float
        The tiny stages' own forward + backward per micro-batch outside the schedule (the
        largest over stages), already taken out of ``per_micro_batch_s`` [s].
    """

    schedule: str
    num_stages: int
    micro_batches: tuple[int, ...]
    cpu_s: tuple[float, ...]
    wall_s: tuple[float, ...]
    per_step_s: float
    per_micro_batch_s: float
    in_op_fraction: float
    stage_compute_s: float = 0.0


def _tiny_stage(index: int, num_stages: int) -> torch.nn.Module:
    """Tokens -> (b, s, h) on a first stage, -> (b, s, V) logits on a last one, a Linear in between."""
    _b, _s, h, v = _TINY
    layers: list[torch.nn.Module] = [torch.nn.Embedding(v, h)] if index == 0 else []
    if index == num_stages - 1:
        layers.append(torch.nn.Linear(h, v))
    elif index > 0:
        layers.append(torch.nn.Linear(h, h))
    return torch.nn.Sequential(*layers)


def _overhead_rank(rank: int, world_size: int, port: int, schedule: str, micro_batches: Sequence[int],
                   warmup: int, repeats: int) -> dict[int, tuple[float, float, float, float]]:
    """Per m: median (step CPU, step wall, CPU inside the ops, the stage's own compute) [s].

    The micro-batch counts are interleaved (every repeat runs each m once), so a drift of
    the host's speed during the measurement affects every m alike.
    """
    init_gloo(rank, world_size, port)
    b, s, h, v = _TINY
    first, last = rank == 0, rank == world_size - 1
    gen = torch.Generator().manual_seed(0)
    runs = {}
    try:
        for m in micro_batches:
            module = _tiny_stage(rank, world_size)
            stage, sched = make_stage_schedule(
                module, stage_index=rank, num_stages=world_size, num_micro_batches=m, micro_batch_size=b,
                seq_len=s, hidden_size=h, vocab_size=v, training=TrainingConfig(), device=torch.device("cpu"),
                group=dist.group.WORLD, schedule=schedule,
                loss_fn=lambda o, t, m=m: lm_loss(o, t, denominator=m * b * s))
            inst = Instrument()
            inst.attach(stage)
            x = torch.randint(0, v, (m * b, s), generator=gen)
            bare_in = x[:b] if first else torch.randn(b, s, h, generator=gen).requires_grad_(True)
            runs[m] = (module, sched, inst, x, bare_in, ([], [], [], []))
        for i in range(warmup + repeats):
            for m, (module, sched, inst, x, bare_in, rec) in runs.items():
                dist.barrier()
                inst.reset()
                c0, w0 = time.thread_time(), time.perf_counter()
                run_schedule_step(sched, x if first else None, x if last else None, is_first=first, is_last=last)
                c1, w1 = time.thread_time(), time.perf_counter()
                y = module(bare_in)            # the same stage's own compute, outside the schedule
                (lm_loss(y, x[:b], denominator=b * s) if last else y).backward(
                    None if last else torch.ones_like(y))
                c2 = time.thread_time()
                if i >= warmup:
                    for lst, val in zip(rec, (c1 - c0, w1 - w0, inst.cpu_s, c2 - c1)):
                        lst.append(val)
    finally:
        dist.destroy_process_group()
    return {m: tuple(statistics.median(lst) for lst in run[5]) for m, run in runs.items()}  # type: ignore[misc]


def measure_schedule_overhead(*, schedule: str = "1F1B", num_stages: int = 2,
                              micro_batches: Sequence[int] = (1, 2, 4, 8, 16), warmup: int = 3, repeats: int = 15,
                              timeout_s: float = 300.0) -> ScheduleOverheadFit:
    """Fit the schedule's fixed costs on a ``num_stages``-rank pipeline of identity-like stages (gloo).

    Raises
    ------
    HppInputError
        Fewer than two distinct micro-batch counts >= ``num_stages``, or an unknown schedule.
    RuntimeError
        A child process failed or timed out.
    """
    ms = sorted({m for m in micro_batches if m >= num_stages})     # torch's schedules need m >= stages
    if len(ms) < 2:
        raise HppInputError(f"micro-batch counts {list(micro_batches)} for {num_stages} stages",
                            field="micro_batches", fix=f"give at least two distinct counts >= {num_stages}")
    if schedule not in ("1F1B", "GPipe"):
        raise HppInputError(f"schedule {schedule!r}", field="schedule", fix="use 1F1B or GPipe")
    per_rank = run_forked(_overhead_rank, num_stages, (schedule, ms, warmup, repeats), timeout_s=timeout_s)
    cpu = tuple(max(r[m][0] for r in per_rank) for m in ms)
    wall = tuple(per_rank[0][m][1] for m in ms)
    a, b = fit_line(ms, cpu)
    bare = max(statistics.median(r[m][3] for m in ms) for r in per_rank)
    _a_in, b_in = fit_line(ms, [max(r[m][2] for r in per_rank) for m in ms])
    frac = min(1.0, max(0.0, (b_in - bare) / (b - bare))) if b > bare else 0.0
    b = b - bare                           # the stage's own (tiny) compute is the profile's, not overhead
    logger.info("schedule %s, %d stages: %.1f us per step + %.1f us per micro-batch (CPU), %.0f %% inside the ops",
                schedule, num_stages, a * 1e6, b * 1e6, 100 * frac)
    return ScheduleOverheadFit(schedule, num_stages, tuple(ms), cpu, wall, max(a, 0.0), max(b, 0.0), frac, bare)


# ------------------------------------------------------------------ into a profile


@dataclass(frozen=True)
class HostStepTerms:
    """The model-independent measurements: the schedule on 1 and 2 stages, gloo send/recv, contention."""

    one_stage: ScheduleOverheadFit
    two_stages: ScheduleOverheadFit
    p2p: Any                           # hpp.runtime.profile.host_probe.P2PFit
    host: HostTimeTerms

    def step_terms(self, loss_forward_s: float, loss_backward_s: float) -> StepTimeTerms:
        """A profile entry's terms with this loss (per micro-batch) [s]."""
        one, two = self.one_stage, self.two_stages
        return StepTimeTerms(loss_forward_s=loss_forward_s, loss_backward_s=loss_backward_s,
                             micro_batch_overhead_s=one.per_micro_batch_s,
                             micro_batch_overhead_in_op=one.in_op_fraction,
                             step_overhead_s=max(one.per_step_s, two.per_step_s), p2p_latency_s=self.p2p.latency_s,
                             p2p_bandwidth_bytes_per_s=self.p2p.bandwidth_bytes_per_s,
                             p2p_overhead_s=max(0.0, two.per_micro_batch_s - one.per_micro_batch_s))


def measure_host_step_terms(*, quick: bool = False) -> HostStepTerms:
    """:func:`measure_schedule_overhead` on 1 and 2 stages, :func:`~hpp.runtime.profile.host_probe.measure_p2p`,
    contention.

    The per-neighbour cost ``p2p_overhead_s`` is the 2-stage fit's per-micro-batch cost minus
    the 1-stage one's (posting and completing a stage's transfers). About 60 s (``quick``: 35 s).
    """
    ms = (2, 4, 8) if quick else (2, 4, 8, 16)
    one = measure_schedule_overhead(num_stages=1, micro_batches=ms, repeats=8 if quick else 15)
    two = measure_schedule_overhead(num_stages=2, micro_batches=ms, repeats=8 if quick else 15)
    p2p = measure_p2p(repeats=20 if quick else 40)
    kappa = measure_contention(repeats=20 if quick else 40)
    ops = measure_host_ops(seconds=0.5 if quick else 1.0)      # the real op past the cores (hpp.runtime.host.ops)
    host = MeasuredHost(cores=os.cpu_count() or 1, contention=kappa,
                        load_average=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None, ops=ops)
    return HostStepTerms(one, two, p2p, host)


def measure_time_terms(model: Any, micro_batch_sizes: Sequence[int], *, warmup: int = 3, repeats: int = 10,
                       dtype: torch.dtype = torch.float32, quick: bool = False, shared: HostStepTerms | None = None
                       ) -> tuple[dict[int, StepTimeTerms], HostTimeTerms]:
    """Everything above, for one model on this host: per micro-batch size step terms, and host terms.

    ``shared``: model-independent measurements to reuse (:func:`measure_host_step_terms`).
    """
    loss = measure_loss_s(model, micro_batch_sizes, warmup=warmup, repeats=repeats, dtype=dtype)
    shared = shared or measure_host_step_terms(quick=quick)
    return {b: shared.step_terms(f, g) for b, (f, g) in loss.items()}, shared.host


def add_time_terms(profile: ModelProfile, terms: dict[int, StepTimeTerms], host: HostTimeTerms | None = None, *,
                   device_types: Sequence[str] | None = None) -> ModelProfile:
    """``profile`` with ``step_time`` set on the entries of ``device_types`` (default: all) by micro-batch size.

    Entries of emulated types (``profile.meta["emulated"]``: base type and slowdown ``k``)
    get the base's terms as the emulation runs them (:meth:`StepTimeTerms.emulated`).
    ``host`` goes to ``meta["host_time"]``.

    Raises
    ------
    HppInputError
        An entry's micro-batch size has no terms.
    """
    emulated = dict(profile.meta.get("emulated", {}))
    entries = dict(profile.entries)
    for key, e in profile.entries.items():
        if device_types is not None and e.device_type not in device_types:
            continue
        if e.micro_batch_size not in terms:
            raise HppInputError(f"no time terms for micro-batch size {e.micro_batch_size}", field="micro_batch_sizes",
                                fix=f"measure them for {sorted({k[2] for k in profile.entries})}")
        t = terms[e.micro_batch_size]
        k = float(emulated.get(e.device_type, {}).get("slowdown", 1.0))
        entries[key] = replace(e, step_time=t.emulated(k) if k != 1.0 else t)
    meta = dict(profile.meta)
    if host is not None:
        meta["host_time"] = host.to_dict()
    return replace(profile, entries=entries, meta=meta)


def add_measured_time_terms(profile: ModelProfile, *, model: Any | None = None, quick: bool = False,
                            shared: HostStepTerms | None = None) -> ModelProfile:
    """Measure the time terms on this host for ``profile``'s micro-batch sizes and add them (:func:`add_time_terms`).

    ``model`` defaults to ``profile.meta["runtime_model"]`` (else ``profile.model``); ``shared``
    as in :func:`measure_time_terms`.
    """
    model = model or profile.meta.get("runtime_model") or profile.model
    sizes = sorted({k[2] for k in profile.entries})
    terms, host = measure_time_terms(model, sizes, quick=quick, shared=shared)
    return add_time_terms(profile, terms, host)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpp.runtime.profile.time_terms PROFILE.json --out OUT.json``: a CPU profile plus its time terms."""
    ap = Parser(prog=PROG, description=main.__doc__)
    ap.add_argument("profile", help="native profile JSON measured on this host (hpp profile --device cpu)")
    ap.add_argument("--out", required=True, help="where to write the profile with step_time and meta.host_time")
    ap.add_argument("--model", help="runtime model (default: the profile's meta.runtime_model)")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (about 20 s instead of 60 s)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)

    def work() -> int:
        save_profile(add_measured_time_terms(load_profile(args.profile), model=args.model, quick=args.quick),
                     args.out)
        return 0
    return run_command(PROG, work)


if __name__ == "__main__":
    raise SystemExit(main())
