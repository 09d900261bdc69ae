"""Emulated device speed and per-micro-batch event recording for a pipeline stage.

A CPU process stands in for a device ``slowdown`` times slower by padding each
forward and each backward of a micro-batch with a sleep of ``(slowdown - 1) x``
its measured compute time. Measured on this project's 2-core host, sleep padding
tracks the intended ratio within a few percent once one op lasts >= 5 ms;
repeating the compute or changing thread counts does not (see issue 5).

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
        >= 1; 1 = no padding.
    clock : callable
        Returns seconds (default ``time.perf_counter``).
    """

    def __init__(self, *, slowdown: float = 1.0, clock: Callable[[], float] = time.perf_counter) -> None:
        if not slowdown >= 1.0:
            raise ValueError(f"slowdown must be >= 1, got {slowdown}")
        self.slowdown = slowdown
        self.clock = clock
        self.events: list[StageEvent] = []
        self.compute_s = 0.0
        self.padding_s = 0.0

    def wrap(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        """``fn(micro_batch, ...)`` timed, padded and recorded as ``kind``."""

        def wrapped(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            t0 = self.clock()
            out = fn(chunk_id, *args, **kwargs)
            t1 = self.clock()
            pad = (self.slowdown - 1.0) * (t1 - t0)
            if pad > 0:
                time.sleep(pad)
            self.compute_s += t1 - t0
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
        self.padding_s = 0.0
