"""Time the runtime's step spends outside the per-layer forward/backward (issue 17, time side).

A per-layer profile (:mod:`hpp.runtime.profiler`) times each layer alone. The runtime's
step also runs the loss, the bookkeeping of ``torch.distributed.pipelining`` for every
micro-batch, and point-to-point transfers through the backend. This module measures
those, on this host, with the runtime's own code:

- :func:`measure_loss_s`: forward and backward of the runtime's loss
  (:func:`hpp.runtime.training.lm_loss`) on ``(b, s, V)`` logits, per micro-batch size;
  CPU time of the calling thread (one compute thread);
- :func:`measure_schedule_overhead`: a pipeline of identity-like stages (a few floats per
  micro-batch, so compute is negligible) run by the worker's own
  :func:`hpp.runtime.worker.make_stage_schedule` / ``run_schedule_step`` on gloo, for
  several micro-batch counts ``m``; the main thread's CPU time per step is fitted as
  ``a + m b`` (least squares): ``b`` the per-micro-batch fixed cost of one stage (one
  forward and one backward, their p2p posting included), ``a`` the per-step cost;
  ``in_op`` is the share of ``b`` spent inside ``forward_one_chunk``/``backward_one_chunk``
  (what :mod:`hpp.runtime.emulation` pads);
- :func:`measure_p2p`: one-way time of a send/recv pair between two ranks of the backend
  (round trip / 2), fitted as ``latency + bytes / bandwidth``;
- :func:`measure_contention`: CPU time of a fixed matmul op with ``n`` processes running it
  at once / with one (``kappa(n)``), and this host's cores: how much slower a compute
  thread gets per CPU second when its neighbours compute too (SMT siblings, caches).

Clocks: CPU time (``time.thread_time``) wherever the quantity is CPU work, since on a
shared host wall time grows with other processes' load; transfers are waits, timed by the
wall clock, and the quantile ``p2p_quantile`` of the repeats is kept (default 0.25: a low
quantile estimates the uncontended latency; the median includes waits for a core).

The results become optional time terms of a profile (:mod:`hpp.profiles.step_time`):
:func:`add_time_terms`. Every multi-rank measurement runs in forked child processes, so
the caller's process-group state is untouched (torch must be imported, as for the fork
launcher).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import statistics
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from hpp.errors import HppInputError
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.step_time import HostTimeTerms, StepTimeTerms

__all__ = ["ScheduleOverheadFit", "P2PFit", "measure_loss_s", "measure_schedule_overhead", "measure_p2p",
           "measure_contention", "fit_line", "add_time_terms", "measure_time_terms"]

logger = logging.getLogger(__name__)

#: Tiny stage shapes of the overhead pipeline: micro-batch, sequence, hidden, vocabulary.
_TINY = (1, 2, 8, 8)


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``; returns ``(a, b)``.

    >>> fit_line([1, 2, 4], [3.0, 5.0, 9.0])
    (1.0, 2.0)
    """
    n = len(x)
    if n < 2 or len(y) != n:
        raise ValueError(f"need >= 2 points of (x, y), got {n} and {len(y)}")
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((v - mx) ** 2 for v in x)
    if sxx == 0:
        raise ValueError("x values are all equal")
    b = sum((u - mx) * (v - my) for u, v in zip(x, y)) / sxx
    return my - b * mx, b


def _quantile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


# ------------------------------------------------------------------ loss


def measure_loss_s(model: Any, micro_batch_sizes: Sequence[int], *, warmup: int = 3, repeats: int = 10,
                   dtype: torch.dtype = torch.float32, seed: int = 0) -> dict[int, tuple[float, float]]:
    """``{b: (forward_s, backward_s)}`` of the runtime's loss on one micro-batch of ``b`` samples.

    ``lm_loss`` on random ``(b, s, V)`` logits (``dtype``) and targets, backward from the
    scalar; medians of ``repeats`` after ``warmup``, CPU time of this thread (set
    ``torch.set_num_threads(1)`` as the ranks do).
    """
    from hpp.runtime.profiler import resolve_model
    from hpp.runtime.training import lm_loss
    spec = resolve_model(model)[0].spec
    gen = torch.Generator().manual_seed(seed)
    out: dict[int, tuple[float, float]] = {}
    for b in sorted(set(micro_batch_sizes)):
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
        out[b] = (statistics.median(fwd), statistics.median(bwd))
    return out


# ------------------------------------------------------------------ forked children


def _run_forked(fn: Callable[..., Any], world_size: int, args: tuple, *, timeout_s: float) -> list[Any]:
    """Run ``fn(rank, world_size, port, *args)`` in ``world_size`` forked children; their return values."""
    from hpp.runtime.launch import free_port
    ctx = mp.get_context("fork")
    port = free_port()
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, port, args, queue), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"time measurement did not finish within {timeout_s:g} s")
            try:
                rank, ok, value = queue.get(timeout=min(left, 1.0))
            except Exception:  # noqa: BLE001 - queue.Empty: check the children
                if any(p.exitcode not in (None, 0) for p in procs) or not any(p.is_alive() for p in procs):
                    if queue.empty():
                        raise RuntimeError("a time-measurement child died without a result") from None
                continue
            if not ok:
                raise RuntimeError(f"time measurement rank {rank} failed: {value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]


def _child(fn, rank, world_size, port, args, queue) -> None:
    try:
        torch.set_num_threads(1)
        queue.put((rank, True, fn(rank, world_size, port, *args)))
    except BaseException:  # noqa: BLE001 - report, whatever happened
        queue.put((rank, False, traceback.format_exc(limit=3)))
    queue.close()
    queue.join_thread()                 # flush before the hard exit
    os._exit(0)


def _init_gloo(rank: int, world_size: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))


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
    """

    schedule: str
    num_stages: int
    micro_batches: tuple[int, ...]
    cpu_s: tuple[float, ...]
    wall_s: tuple[float, ...]
    per_step_s: float
    per_micro_batch_s: float
    in_op_fraction: float


def _tiny_stage(index: int, num_stages: int) -> torch.nn.Module:
    _b, _s, h, v = _TINY
    layers: list[torch.nn.Module] = []
    if index == 0:
        layers.append(torch.nn.Embedding(v, h))
    layers.append(torch.nn.Linear(h, h))
    if index == num_stages - 1:
        layers.append(torch.nn.Linear(h, v))
    return torch.nn.Sequential(*layers)


def _overhead_rank(rank: int, world_size: int, port: int, schedule: str, micro_batches: Sequence[int],
                   warmup: int, repeats: int) -> dict[int, tuple[float, float, float]]:
    from hpp.runtime.emulation import Instrument
    from hpp.runtime.training import TrainingConfig, lm_loss
    from hpp.runtime.worker import make_stage_schedule, run_schedule_step
    _init_gloo(rank, world_size, port)
    b, s, h, v = _TINY
    first, last = rank == 0, rank == world_size - 1
    gen = torch.Generator().manual_seed(0)
    out = {}
    try:
        for m in micro_batches:
            module = _tiny_stage(rank, world_size)
            stage, sched = make_stage_schedule(
                module, stage_index=rank, num_stages=world_size, num_micro_batches=m, micro_batch_size=b,
                seq_len=s, hidden_size=h, vocab_size=v, training=TrainingConfig(), device=torch.device("cpu"),
                group=dist.group.WORLD, schedule=schedule, loss_fn=lambda o, t: lm_loss(o, t, denominator=m * b * s))
            inst = Instrument()
            inst.attach(stage)
            x = torch.randint(0, v, (m * b, s), generator=gen)
            cpu, wall, in_op = [], [], []
            for i in range(warmup + repeats):
                dist.barrier()
                inst.reset()
                c0, w0 = time.thread_time(), time.perf_counter()
                run_schedule_step(sched, x if first else None, x if last else None, is_first=first, is_last=last)
                c1, w1 = time.thread_time(), time.perf_counter()
                if i >= warmup:
                    cpu.append(c1 - c0)
                    wall.append(w1 - w0)
                    in_op.append(inst.cpu_s)
            out[m] = (statistics.median(cpu), statistics.median(wall), statistics.median(in_op))
    finally:
        dist.destroy_process_group()
    return out


def measure_schedule_overhead(*, schedule: str = "1F1B", num_stages: int = 2,
                              micro_batches: Sequence[int] = (1, 2, 4, 8, 16), warmup: int = 3, repeats: int = 15,
                              timeout_s: float = 300.0) -> ScheduleOverheadFit:
    """Fit the schedule's fixed costs on a ``num_stages``-rank pipeline of identity-like stages (gloo).

    Raises
    ------
    HppInputError
        Fewer than two distinct micro-batch counts, or an unknown schedule.
    RuntimeError
        A child process failed or timed out.
    """
    ms = sorted(set(micro_batches))
    if len(ms) < 2 or ms[0] < 1:
        raise HppInputError(f"micro-batch counts {list(micro_batches)}", field="micro_batches",
                            fix="give at least two distinct counts >= 1, e.g. 1,2,4,8")
    if schedule not in ("1F1B", "GPipe"):
        raise HppInputError(f"schedule {schedule!r}", field="schedule", fix="use 1F1B or GPipe")
    per_rank = _run_forked(_overhead_rank, num_stages, (schedule, ms, warmup, repeats), timeout_s=timeout_s)
    cpu = tuple(max(r[m][0] for r in per_rank) for m in ms)
    wall = tuple(per_rank[0][m][1] for m in ms)
    a, b = fit_line(ms, cpu)
    _a_in, b_in = fit_line(ms, [max(r[m][2] for r in per_rank) for m in ms])
    frac = min(1.0, max(0.0, b_in / b)) if b > 0 else 0.0
    logger.info("schedule %s, %d stages: %.1f us per step + %.1f us per micro-batch (CPU), %.0f %% inside the ops",
                schedule, num_stages, a * 1e6, b * 1e6, 100 * frac)
    return ScheduleOverheadFit(schedule, num_stages, tuple(ms), cpu, wall, max(a, 0.0), max(b, 0.0), frac)


# ------------------------------------------------------------------ point-to-point


@dataclass(frozen=True, slots=True)
class P2PFit:
    """One-way send/recv time of the backend: ``latency_s + bytes / bandwidth_bytes_per_s``.

    ``sizes`` [bytes] and ``one_way_s`` (the ``quantile`` of the repeats' round trip / 2) are the data.
    """

    backend: str
    sizes: tuple[int, ...]
    one_way_s: tuple[float, ...]
    latency_s: float
    bandwidth_bytes_per_s: float
    quantile: float


def _p2p_rank(rank: int, world_size: int, port: int, sizes: Sequence[int], warmup: int,
              repeats: int) -> dict[int, list[float]]:
    _init_gloo(rank, world_size, port)
    out: dict[int, list[float]] = {}
    try:
        for n in sizes:
            buf = torch.zeros(max(1, n // 4), dtype=torch.float32)
            times = []
            for i in range(warmup + repeats):
                dist.barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    dist.isend(buf, 1).wait()
                    dist.irecv(buf, 1).wait()
                else:
                    dist.irecv(buf, 0).wait()
                    dist.isend(buf, 0).wait()
                if i >= warmup:
                    times.append((time.perf_counter() - t0) / 2)
            out[n] = times
    finally:
        dist.destroy_process_group()
    return out


def measure_p2p(*, sizes: Sequence[int] = (4096, 65536, 262144, 1048576, 4194304), warmup: int = 5,
                repeats: int = 30, quantile: float = 0.25, timeout_s: float = 120.0) -> P2PFit:
    """Ping-pong between two gloo ranks (``isend``/``irecv`` + ``wait``, as the schedules post them).

    Raises
    ------
    HppInputError
        Fewer than two sizes or a quantile outside [0, 1].
    """
    ss = sorted(set(int(x) for x in sizes))
    if len(ss) < 2 or ss[0] < 4:
        raise HppInputError(f"message sizes {list(sizes)}", field="sizes", fix="give at least two sizes >= 4 bytes")
    if not 0.0 <= quantile <= 1.0:
        raise HppInputError(f"quantile {quantile}", field="quantile", fix="use a value in [0, 1]")
    times = _run_forked(_p2p_rank, 2, (ss, warmup, repeats), timeout_s=timeout_s)[0]
    one_way = tuple(_quantile(times[n], quantile) for n in ss)
    lat, per_byte = fit_line(ss, one_way)
    bw = 1.0 / per_byte if per_byte > 0 else float("inf")
    lat = max(lat, min(one_way[0], 1e-6))
    logger.info("gloo p2p: %.1f us + bytes / %.2f GB/s (quantile %.2f)", lat * 1e6, bw / 1e9, quantile)
    return P2PFit("gloo", tuple(ss), one_way, lat, bw, quantile)


# ------------------------------------------------------------------ contention


def _contention_rank(_rank: int, _world: int, _port: int, start: float, repeats: int) -> float:
    a = torch.randn(256, 256)
    w = torch.randn(256, 256)
    while time.time() < start:          # start together
        time.sleep(0.001)
    cpu = []
    for _ in range(repeats):
        c0 = time.thread_time()
        for _ in range(10):
            a @ w
        cpu.append(time.thread_time() - c0)
    return statistics.median(cpu)


def measure_contention(*, max_processes: int | None = None, repeats: int = 40,
                       timeout_s: float = 120.0) -> tuple[float, ...]:
    """``kappa(n)`` for ``n = 1 .. max_processes`` (default: this host's cores): CPU time per op, ``n`` at once / alone.

    ``kappa(1) = 1``. The op is ten 256 x 256 float32 matmuls (one thread per process).
    """
    n_max = max_processes or os.cpu_count() or 1
    alone = None
    out = []
    for n in range(1, n_max + 1):
        start = time.time() + 0.5
        per = _run_forked(_contention_rank, n, (start, repeats), timeout_s=timeout_s)
        med = statistics.median(per)
        alone = med if alone is None else alone
        out.append(med / alone)
    return tuple(out)


# ------------------------------------------------------------------ into a profile


def measure_time_terms(model: Any, micro_batch_sizes: Sequence[int], *, warmup: int = 3, repeats: int = 10,
                       dtype: torch.dtype = torch.float32,
                       quick: bool = False) -> tuple[dict[int, StepTimeTerms], HostTimeTerms]:
    """Everything above, for one model on this host: per micro-batch size step terms, and host terms."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loss = measure_loss_s(model, micro_batch_sizes, warmup=warmup, repeats=repeats, dtype=dtype)
    finally:
        torch.set_num_threads(old)
    ms = (1, 2, 4, 8) if quick else (1, 2, 4, 8, 16)
    sched = measure_schedule_overhead(micro_batches=ms, repeats=8 if quick else 15)
    p2p = measure_p2p(repeats=15 if quick else 30)
    kappa = measure_contention(repeats=20 if quick else 40)
    terms = {b: StepTimeTerms(loss_forward_s=f, loss_backward_s=g, micro_batch_overhead_s=sched.per_micro_batch_s,
                              micro_batch_overhead_in_op=sched.in_op_fraction, step_overhead_s=sched.per_step_s,
                              p2p_latency_s=p2p.latency_s, p2p_bandwidth_bytes_per_s=p2p.bandwidth_bytes_per_s)
             for b, (f, g) in loss.items()}
    host = HostTimeTerms(cores=os.cpu_count() or 1, contention=kappa,
                         load_average=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None)
    return terms, host


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
