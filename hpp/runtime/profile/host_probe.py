"""Host-level time probes: the backend's send/recv, CPU contention, other processes' load.

- :func:`measure_p2p`: one-way time of a send/recv pair between two gloo ranks on this host
  (round trip / 2, ``isend``/``irecv`` + ``wait`` as torch's pipeline schedules post them),
  fitted as ``latency + bytes / bandwidth``. Transfers are waits, so this is wall time; the
  ``quantile`` (default 0.1) of the repeats is kept: a low quantile estimates the
  uncontended transfer (on a host with load 8 on 2 cores the median of 50 round trips was
  2-10x the 0.1 quantile, which stayed within 1.5x of the minimum);
- :func:`measure_contention`: ``kappa(n)``, the CPU time of a fixed matmul op while ``n``
  processes run it at once / alone (SMT siblings and shared caches make a CPU second buy
  less work when the neighbours compute); 1 everywhere on a host where it does not matter
  (and, caution, also on a host whose cores are already kept busy by other processes);
- :func:`measure_host_ops`: the same with the model's real layer op, ``n = 1 .. N`` processes
  past the host's cores, busy and cycling as the speed emulation runs them
  (:class:`hpp.runtime.host.ops.OpProbe`: oversubscription and the CPU an op pays after a wait);
- :func:`background_load`: how many other processes compute on this host right now.

:func:`run_forked` runs a function in forked children with a gloo process group each, so
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
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from hpp.errors import HppInputError
from hpp.runtime.host.ops import OpProbe, cycle_factor
from hpp.runtime.models.gpt import build_stage_module, get_model_config
from hpp.runtime.launch.processes import free_port

__all__ = ["P2PFit", "measure_p2p", "measure_contention", "measure_host_ops", "measure_recv_wake", "background_load",
           "run_forked", "init_gloo", "fit_line"]

logger = logging.getLogger(__name__)


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


# ------------------------------------------------------------------ forked children


def run_forked(fn: Callable[..., Any], world_size: int, args: tuple, *, timeout_s: float) -> list[Any]:
    """Run ``fn(rank, world_size, port, *args)`` in ``world_size`` forked children; their return values.

    Raises
    ------
    RuntimeError
        A child failed (its traceback's last lines), died without a result, or ``timeout_s`` passed.
    """
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


def init_gloo(rank: int, world_size: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))


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


def _exchange_s(rank: int, buf: torch.Tensor) -> float:
    """One round trip of ``buf`` between ranks 0 and 1 (0 sends first); returns half of it [s]."""
    t0 = time.perf_counter()
    if rank == 0:
        dist.isend(buf, 1).wait()
        dist.irecv(buf, 1).wait()
    else:
        dist.irecv(buf, 0).wait()
        dist.isend(buf, 0).wait()
    return (time.perf_counter() - t0) / 2


def _p2p_rank(rank: int, world_size: int, port: int, sizes: Sequence[int], warmup: int,
              repeats: int) -> dict[int, list[float]]:
    init_gloo(rank, world_size, port)
    out: dict[int, list[float]] = {}
    try:
        for n in sizes:
            buf = torch.zeros(max(1, n // 4), dtype=torch.float32)
            times = []
            for i in range(warmup + repeats):
                dist.barrier()
                one_way = _exchange_s(rank, buf)
                if i >= warmup:
                    times.append(one_way)
            out[n] = times
    finally:
        dist.destroy_process_group()
    return out


def measure_p2p(*, sizes: Sequence[int] = (4096, 65536, 262144, 1048576, 4194304), warmup: int = 5,
                repeats: int = 40, quantile: float = 0.1, timeout_s: float = 120.0) -> P2PFit:
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
    times = run_forked(_p2p_rank, 2, (ss, warmup, repeats), timeout_s=timeout_s)[0]
    one_way = tuple(_quantile(times[n], quantile) for n in ss)
    lat, per_byte = fit_line(ss, one_way)
    if per_byte <= 0 or lat <= 0:       # noise: latency from the smallest message, bandwidth from the largest
        lat = one_way[0]
        per_byte = max(one_way[-1] - lat, 1e-12) / ss[-1]
    bw = 1.0 / per_byte
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
        per = run_forked(_contention_rank, n, (start, repeats), timeout_s=timeout_s)
        med = statistics.median(per)
        alone = med if alone is None else alone
        out.append(med / alone)
    return tuple(out)


def _op_rank(_rank: int, _world: int, _port: int, start: float, seconds: float, cycle: float,
             micro_batch_size: int) -> float:
    """Median CPU seconds of one gpt-tiny block's forward + backward; ``cycle > 1``: sleep as the emulation pads."""
    cfg = get_model_config("gpt-tiny")
    block = build_stage_module(cfg, 1, 2, seed=0)
    x0 = torch.randn(micro_batch_size, cfg.seq_len, cfg.hidden_size)
    for _ in range(3):
        block(x0.clone().requires_grad_(True)).sum().backward()
    while time.time() < start:          # start together
        time.sleep(0.001)
    cpu = []
    while time.time() < start + seconds or len(cpu) < 3:
        x = x0.clone().requires_grad_(True)
        w0, c0 = time.perf_counter(), time.thread_time()
        block(x).sum().backward()
        c1, w1 = time.thread_time(), time.perf_counter()
        cpu.append(c1 - c0)
        if cycle > 1.0 and cycle * (c1 - c0) > w1 - w0:
            time.sleep(cycle * (c1 - c0) - (w1 - w0))
    return statistics.median(cpu)


def _pingpong_rank(rank: int, _world: int, port: int, iters: int, compute_s: float, spin_s: float) -> Any:
    """Ranks 0 and 1: one-way seconds of ``iters`` gloo exchanges, ``compute_s`` of CPU between; others: busy."""
    if rank >= 2:
        x = torch.randn(256, 256)
        t_end = time.perf_counter() + spin_s
        while time.perf_counter() < t_end:
            x @ x
        return None
    init_gloo(rank, 2, port)
    buf = torch.zeros(16384)
    times = []
    try:
        for _ in range(iters):
            times.append(_exchange_s(rank, buf))
            c0 = time.thread_time()
            while time.thread_time() - c0 < compute_s:
                pass
    finally:
        dist.destroy_process_group()
    return times


def measure_recv_wake(*, max_busy: int, iters: int = 150, compute_s: float = 0.003,
                      timeout_s: float = 120.0) -> tuple[float, ...]:
    """Extra one-way time of a gloo receive beside ``k = 0 .. max_busy`` busy processes [s] (``recv_wake_s``).

    Median of ``iters`` exchanges (64 KiB) of a pair computing ``compute_s`` between them,
    minus the 0.1 quantile of the pair alone. About ``(max_busy + 1) (iters (compute_s + 3 ms) + 1)`` s.
    """
    spin_s = iters * (compute_s + 0.006) + 1.0
    out, base = [], None
    for k in range(max_busy + 1):
        times = run_forked(_pingpong_rank, 2 + k, (iters, compute_s, spin_s), timeout_s=timeout_s)[0]
        base = _quantile(times, 0.1) if base is None else base
        out.append(max(0.0, statistics.median(times) - base))
    return tuple(out)


def measure_host_ops(*, max_processes: int | None = None, seconds: float = 1.0, micro_batch_size: int = 1,
                     timeout_s: float = 120.0):
    """:class:`~hpp.runtime.host.ops.OpProbe` of this host: ``n = 1 .. max_processes`` processes run a real op.

    The op is one gpt-tiny block's forward + backward (one thread); for each ``n`` the
    processes run it back to back for ``seconds`` (``kappa``), then cycling as the speed
    emulation does (op, sleep until it lasted ``max(2, n / cores)`` x its CPU time;
    ``wake_s``). Default ``max_processes``: 3 x the cores (the validation's clusters run up
    to 6 ranks on 2 cores). Before each ``n``, one process alone gives that ``n``'s reference.
    Then :func:`measure_recv_wake` with up to ``max_processes - 2`` busy processes.
    About ``3 max_processes (seconds + 0.5) + (max_processes - 1) (1.4 seconds + 1)`` s.

    Raises
    ------
    HppInputError
        ``max_processes < 1`` or ``seconds <= 0``.
    """
    cores = os.cpu_count() or 1
    n_max = max_processes or 3 * cores
    if n_max < 1 or not seconds > 0:
        raise HppInputError(f"max_processes {n_max}, seconds {seconds}", field="max_processes",
                            fix="max_processes >= 1 and seconds > 0")
    def median_op_s(n: int, cycle: float) -> float:
        per = run_forked(_op_rank, n, (time.time() + 0.3, seconds, cycle, micro_batch_size), timeout_s=timeout_s)
        return statistics.median(per)

    ref, busy, cycling = [], [], []
    for n in range(1, n_max + 1):           # each n right after its own one-process reference
        ref.append(median_op_s(1, 1.0))
        busy.append(median_op_s(n, 1.0) if n > 1 else ref[-1])
        cycling.append(median_op_s(n, cycle_factor(n, cores)))
    recv = measure_recv_wake(max_busy=max(0, n_max - 2), iters=max(20, int(150 * seconds)), timeout_s=timeout_s)
    probe = OpProbe.from_measured(f"gpt-tiny block, micro-batch {micro_batch_size}, forward + backward", ref,
                                  busy, cycling, cores=cores, recv_wake_s=recv)
    logger.info("real-op probe: %.2f ms alone; kappa %s; after a wait +%s ms (n = 1..%d); a receive beside k busy "
                "+%s ms (k = 0..%d)", probe.hot_s * 1e3, [round(k, 2) for k in probe.kappa],
                [round(w * 1e3, 2) for w in probe.wake_s], n_max, [round(w * 1e3, 2) for w in probe.recv_wake_s],
                len(probe.recv_wake_s) - 1)
    return probe


# ------------------------------------------------------------------ other processes


def _spin(_rank: int, _world: int, _port: int, seconds: float) -> float:
    c0, w0 = time.thread_time(), time.perf_counter()
    while time.perf_counter() - w0 < seconds:
        sum(range(1000))
    return (time.thread_time() - c0) / (time.perf_counter() - w0)


def background_load(seconds: float = 1.0) -> float:
    """Processes computing on this host besides the caller's: ``C / share - C`` (0 on a quiet host).

    ``C`` (the host's cores) forked probes spin for ``seconds``; ``share`` is the mean CPU
    time they got per wall second. With ``n`` other busy processes each probe gets
    ``min(1, C / (n + C))`` of a core.
    """
    cores = os.cpu_count() or 1
    share = statistics.mean(run_forked(_spin, cores, (seconds,), timeout_s=60 + 10 * seconds))
    return max(0.0, cores / share - cores) if share > 0 else float("nan")
