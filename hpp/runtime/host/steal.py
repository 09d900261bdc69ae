"""Time a virtual machine's hypervisor takes from its cores while a CPU run computes.

A virtual host's cores are themselves shared: while a virtual CPU wants to run, the
hypervisor may run another guest instead. Linux counts that time as *steal* (the 8th field
of the ``cpu`` line of ``/proc/stat``, see ``man 5 proc``) and charges it to no thread: a
compute thread's ``time.thread_time`` does not advance while it is stolen, its wall clock
does. Measured on this project's 2-core VM (Dec 2 2026): three processes spinning for 6 s
got 1.87 CPU s per wall s in all while ``/proc/stat`` counted 0.13 cores stolen (the two
add up to the 2 cores); during ``experiments/runtime_validation.py``'s ten runs 10-54 % of
the time the cores wanted to run was stolen, and the host model missed by up to 30 % without
it and 14.7 % with it.

:func:`read_cpu_ticks` reads the host-wide counters, :func:`steal_fraction` turns two
readings into the stolen share of the time the cores wanted to run,

    ``p = d steal / (d busy + d steal)``,  busy = user + nice + system + irq + softirq

(idle and iowait are left out: a halted core is not stolen from). The host model
(:func:`hpp.runtime.host.time_model.simulate_host_run`, ``steal=p``) gives each computing rank
``(1 - p)`` of the core share it would get on a dedicated host. The workers of ``hpp run``
read the counters at the start and the end of every step (:func:`tick_delta`), so ``p`` is
the steal during the measured steps (:func:`run_steal`), an input measured like the host's
speed (:mod:`hpp.runtime.profile.host_speed`), not something the plan could know.

Counters are whole host ticks (``os.sysconf("SC_CLK_TCK")``, usually 100 per second per
core); off Linux (no ``/proc/stat``) everything here returns ``None`` and the host model
runs without steal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = ["CpuTicks", "read_cpu_ticks", "tick_delta", "steal_fraction", "run_steal", "background_cores"]

_PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class CpuTicks:
    """Host-wide CPU time since boot, in core-seconds, from the ``cpu`` line of ``/proc/stat``.

    Attributes
    ----------
    busy_s : float
        user + nice + system + irq + softirq [core-s].
    idle_s : float
        idle + iowait [core-s].
    steal_s : float
        Time the hypervisor ran something else while a virtual core wanted to run [core-s].
    """

    busy_s: float
    idle_s: float
    steal_s: float

    def __post_init__(self) -> None:
        if min(self.busy_s, self.idle_s, self.steal_s) < 0:
            raise ValueError(f"negative CPU time in {self}")


def parse_cpu_line(line: str, *, ticks_per_s: float) -> CpuTicks:
    """:class:`CpuTicks` of ``/proc/stat``'s first line (``cpu  user nice system idle iowait irq softirq steal ...``).

    Raises
    ------
    ValueError
        The line is not the aggregate ``cpu`` line or has fewer than 8 counters.
    """
    parts = line.split()
    if not parts or parts[0] != "cpu" or len(parts) < 9:
        raise ValueError(f"not /proc/stat's cpu line: {line!r}")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in parts[1:9])
    return CpuTicks((user + nice + system + irq + softirq) / ticks_per_s, (idle + iowait) / ticks_per_s,
                    steal / ticks_per_s)


def read_cpu_ticks() -> CpuTicks | None:
    """This host's counters now, or ``None`` where there is no ``/proc/stat`` (not Linux) or it cannot be read."""
    try:
        with _PROC_STAT.open() as f:
            line = f.readline()
        return parse_cpu_line(line, ticks_per_s=float(os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError):
        return None


def tick_delta(before: CpuTicks | None, after: CpuTicks | None) -> dict[str, float] | None:
    """``after - before`` as JSON data (``busy_s``, ``idle_s``, ``steal_s`` [core-s]), or ``None`` if either is."""
    if before is None or after is None:
        return None
    return {"busy_s": after.busy_s - before.busy_s, "idle_s": after.idle_s - before.idle_s,
            "steal_s": after.steal_s - before.steal_s}


def steal_fraction(deltas: Iterable[Mapping[str, float] | None]) -> float | None:
    """Stolen share of the time the cores wanted to run over some windows: ``sum steal / sum (busy + steal)``.

    ``deltas`` are :func:`tick_delta` records; ``None`` when any is missing or nothing ran.
    A value in [0, 1).
    """
    busy = steal = 0.0
    for d in deltas:
        if d is None:
            return None
        busy += max(0.0, d["busy_s"])
        steal += max(0.0, d["steal_s"])
    if busy <= 0.0:
        return None
    return steal / (busy + steal)


def run_steal(rank_results: Iterable[Mapping[str, Any]], *, warmup_steps: int) -> dict[str, Any] | None:
    """The steal over a run's kept steps, from the first rank's per-step ``phases[i]["host"]`` records.

    Returns ``{"fraction": p, "steal_s": ..., "busy_s": ..., "steps": n}`` (core-seconds summed over
    the kept steps), or ``None`` when the ranks did not record counters (not Linux). On a run of
    several hosts the first rank's host stands for all (the host model is a one-host model).
    """
    results = [r for r in rank_results if r is not None]
    if not results:
        return None
    phases = sorted(results, key=lambda r: r["rank"])[0].get("phases") or []
    kept = phases[warmup_steps:] if len(phases) > warmup_steps else phases
    deltas = [ph.get("host") for ph in kept]
    p = steal_fraction(deltas)
    if p is None:
        return None
    return {"fraction": p, "steal_s": sum(d["steal_s"] for d in deltas), "busy_s": sum(d["busy_s"] for d in deltas),
            "steps": len(deltas)}


def background_cores(rank_results: Iterable[Mapping[str, Any]], *, warmup_steps: int) -> float | None:
    """Cores other processes kept busy during a one-host run's kept steps [cores]: the host's busy core-seconds
    (rank 0's per-step ``host`` records) less every rank's own CPU seconds (``proc_s``), over the steps' wall time.

    The launcher's own polling counts as other (about 0.01 core). ``None`` off Linux, or when a rank did not
    record its CPU time (a result from an older worker) or no step was kept.
    """
    results = sorted((r for r in rank_results if r is not None), key=lambda r: r["rank"])
    if not results:
        return None
    kept = [(r.get("phases") or [])[warmup_steps:] for r in results]
    first = results[0].get("step_times_s") or []
    wall = sum(first[warmup_steps:])
    host = [ph.get("host") for ph in kept[0]]
    own = [ph.get("proc_s") for k in kept for ph in k]
    if wall <= 0 or not host or any(h is None for h in host) or any(c is None for c in own):
        return None
    return max(0.0, sum(h["busy_s"] for h in host) - sum(own)) / wall
