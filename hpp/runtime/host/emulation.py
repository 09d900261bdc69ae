"""Emulated device speed and per-micro-batch event recording for a pipeline stage.

A CPU process stands in for a device ``slowdown`` times slower than the CPU the
profile was measured on: each forward and each backward of a micro-batch is
padded with a sleep so that it lasts ``time_scale x slowdown x`` the CPU time its
compute consumed (``time.thread_time``: with one compute thread per rank, CPU
backward runs on the calling thread). Padding to a multiple of the *CPU* time,
not of the wall time, makes the emulated op length independent of how often the
OS took the core away: an op that waited for a core while another rank computed
just gets less padding.

``time_scale`` (>= 1, "time dilation") slows every emulated device by the same
factor so that the ranks never ask for more cores than the host has: with
``time_scale >= ranks / cores`` even all ranks computing at once get their
target length (each is busy at most ``1 / time_scale`` of its op's wall time).
Without it, 4 ranks on 2 cores run their un-padded (1x) ops up to 2x slower than
profiled, which no per-op padding can undo. A run at time scale ``D`` is
predicted with every forward/backward time x ``D`` (:func:`hpp.runtime.run`).

Measured on this project's 2-core host, sleep padding tracks the intended ratio
within a few percent once one op lasts >= 5 ms.

The same wrapper records ``(kind, micro_batch, start_s, stop_s)`` events on a
monotonic clock, the raw material of the measured timeline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["StageEvent", "Instrument"]


@dataclass(frozen=True, slots=True)
class StageEvent:
    """One forward (``"F"``) or backward (``"B"``) of micro-batch ``micro_batch``; times [s]."""

    kind: str
    micro_batch: int
    start_s: float
    stop_s: float


class Instrument:
    """Wraps a stage's ``forward_one_chunk``/``backward_one_chunk`` (or any callables).

    Parameters
    ----------
    slowdown : float
        >= 1; the emulated device's speed relative to the profiled CPU.
    time_scale : float
        >= 1; common dilation of every emulated device (1 = none). With
        ``slowdown == time_scale == 1`` nothing is padded.
    clock : callable
        Wall clock [s] (default ``time.perf_counter``).
    cpu_clock : callable
        CPU time of the calling thread [s] (default ``time.thread_time``).
    """

    def __init__(self, *, slowdown: float = 1.0, time_scale: float = 1.0,
                 clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        if not slowdown >= 1.0:
            raise ValueError(f"slowdown must be >= 1, got {slowdown}")
        if not time_scale >= 1.0:
            raise ValueError(f"time_scale must be >= 1, got {time_scale}")
        self.slowdown = slowdown
        self.time_scale = time_scale
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.events: list[StageEvent] = []
        self.compute_s = 0.0
        self.cpu_s = 0.0
        self.padding_s = 0.0

    @property
    def factor(self) -> float:
        """Target op length / its CPU time (``slowdown x time_scale``)."""
        return self.slowdown * self.time_scale

    def wrap(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        """``fn(micro_batch, ...)`` timed, padded and recorded as ``kind``."""

        def wrapped(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            t0, c0 = self.clock(), self.cpu_clock()
            out = fn(chunk_id, *args, **kwargs)
            t1, c1 = self.clock(), self.cpu_clock()
            pad = self.factor * (c1 - c0) - (t1 - t0) if self.factor > 1.0 else 0.0
            if pad > 0:
                time.sleep(pad)
            else:
                pad = 0.0
            self.compute_s += t1 - t0
            self.cpu_s += c1 - c0
            self.padding_s += pad
            self.events.append(StageEvent(kind, chunk_id, t0, self.clock()))
            return out

        return wrapped

    def attach(self, stage: Any) -> None:
        """Replace ``stage.forward_one_chunk`` and ``stage.backward_one_chunk`` by padded, recorded ones."""
        stage.forward_one_chunk = self.wrap(stage.forward_one_chunk, "F")
        stage.backward_one_chunk = self.wrap(stage.backward_one_chunk, "B")

    def reset(self) -> None:
        self.events = []
        self.compute_s = 0.0
        self.cpu_s = 0.0
        self.padding_s = 0.0
