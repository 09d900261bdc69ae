"""What running a real layer op costs on this host when ranks share its cores.

Measured (:func:`hpp.runtime.profile.host_probe.measure_host_ops`) by running the model's own
layer op (forward + backward of one gpt-tiny block, one compute thread) in ``n = 1 .. N``
forked processes at once, ``N`` above the host's cores:

- ``kappa[n - 1]``: CPU time per op while ``n`` processes compute without pause / alone
  (shared caches, SMT siblings, and past ``cores`` the time slicing: a process preempted
  every few ms finds its caches refilled by the others). Unlike the profile's older
  ``contention`` (a 256 x 256 matmul, ``n <= cores``) it covers oversubscription.
- ``wake_s[n - 1]``: extra CPU seconds of one op that starts after the process waited
  (slept, or blocked on a receive) while ``n`` processes cycle through the op as the speed
  emulation runs them (op, then a sleep until it lasted ``max(2, n / cores)`` x its CPU
  time). Measured as the cycling op's CPU time minus the back-to-back op's at the
  contention of the ``n / max(2, n / cores)`` processes that compute at a time. In the
  quiet-host validation run of Dec 1, 15:53, the ranks used 1.13-1.60 x the profiled CPU
  seconds, 1.0-2.1 ms more per op (emulated, 4-6 ranks on 2 cores) nearly whatever the
  op's mean size (3.5-12 ms): an absolute time per op, not a factor (part of it is the
  contention of the ranks that computed together, ``kappa``).

- ``recv_wake_s[k]``: how much longer a receive takes to wake its rank while ``k`` other
  processes compute than the backend's uncontended send/recv (the profile's ``p2p``
  terms, a 0.1 quantile on idle cores): two gloo ranks ping-pong, computing 3 ms between
  exchanges, beside ``k`` busy processes; median one-way time minus the idle pair's 0.1
  quantile. The data arrive on a gloo thread that must get a core, then the rank must:
  on Dec 1 (2 cores, boosted beside other jobs) 0.35 ms with ``k = 0``, 1.6-1.9 ms with
  ``k >= 1``.

All are monotone in ``n`` (or ``k``) (the isotonic least-squares fit of the readings, ``kappa >= 1``,
``wake_s >= 0``): more processes never make an op cheaper, so a lower reading is noise.
The terms travel in ``profile.meta["host_time"]["op_probe"]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.profiles.step_time import HostTimeTerms

__all__ = ["OpProbe", "MeasuredHost", "op_probe_of", "cycle_factor"]


def cycle_factor(n: int, cores: int) -> float:
    """How long the probe's cycling op lasts / its CPU time with ``n`` processes on ``cores``: ``max(2, n / cores)``."""
    return max(2.0, n / cores)


def _monotone(values: Sequence[float], floor: float) -> tuple[float, ...]:
    """Non-decreasing least-squares fit of ``values`` (pool adjacent violators), each at least ``floor``.

    A running maximum would keep every upward noise spike; the isotonic fit averages them out.

    >>> _monotone([1.0, 1.4, 1.2, 2.0], 1.0)
    (1.0, 1.3, 1.3, 2.0)
    """
    blocks: list[list[float]] = []                     # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            tot, cnt = blocks.pop()
            blocks[-1][0] += tot
            blocks[-1][1] += cnt
    out: list[float] = []
    for tot, cnt in blocks:
        out += [max(floor, round(tot / cnt, 12))] * int(cnt)
    return tuple(out)


@dataclass(frozen=True)
class OpProbe:
    """CPU cost of a real layer op on this host vs the number of processes running it (see the module docstring).

    Attributes
    ----------
    op : str
        What ran, e.g. ``"gpt-tiny block, micro-batch 1, forward + backward"``.
    hot_s : float
        CPU seconds of one op, back to back, one process [s] (the host's speed when probed).
    kappa : tuple of float
        ``(N,)``; ``kappa[n - 1]`` for ``n`` busy processes; ``kappa[0] = 1``.
    wake_s : tuple of float
        ``(N,)``; ``wake_s[n - 1]`` [s] per op after a wait, ``n`` processes cycling.
    cores : int
    recv_wake_s : tuple of float
        ``(K,)``; ``recv_wake_s[k]`` [s] added to a receive that wakes its rank while ``k``
        other processes compute (empty: 0).
    """

    op: str
    hot_s: float
    kappa: tuple[float, ...]
    wake_s: tuple[float, ...]
    cores: int
    recv_wake_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        ok = (self.kappa and len(self.kappa) == len(self.wake_s) and self.cores >= 1
              and math.isfinite(self.hot_s) and self.hot_s > 0
              and all(math.isfinite(k) and k >= 1.0 for k in self.kappa)
              and all(math.isfinite(w) and w >= 0.0 for w in self.wake_s + self.recv_wake_s))
        if not ok:
            raise HppInputError(f"op probe kappa {self.kappa}, wake_s {self.wake_s}, hot_s {self.hot_s}, "
                                f"cores {self.cores}", field="meta.host_time.op_probe",
                                fix="kappa >= 1 and wake_s >= 0, one value per process count; hot_s > 0")

    @classmethod
    def from_measured(cls, op: str, ref_s: Sequence[float], busy_s: Sequence[float], cycle_s: Sequence[float], *,
                      cores: int, recv_wake_s: Sequence[float] = ()) -> "OpProbe":
        """From CPU seconds per op, per ``n``: ``ref_s[n - 1]`` one process alone (run just before),
        ``busy_s[n - 1]`` n busy, ``cycle_s[n - 1]`` n cycling. Each ``n`` is compared with its own
        reference (the host's speed drifts by 10-30 % within seconds); ``hot_s`` is their median.

        >>> OpProbe.from_measured("toy", [1.0, 1.0, 2.0], [1.0, 0.9, 3.0], [1.2, 1.1, 2.2], cores=2).kappa
        (1.0, 1.0, 1.5)
        """
        if not len(ref_s) == len(busy_s) == len(cycle_s) or any(r <= 0 for r in ref_s):
            raise HppInputError(f"{len(ref_s)} references, {len(busy_s)} busy, {len(cycle_s)} cycling readings",
                                field="op_probe", fix="one positive reading of each kind per process count")
        kappa = (1.0,) + _monotone([b / r for b, r in zip(busy_s, ref_s)], 1.0)[1:]
        hot = sorted(ref_s)[len(ref_s) // 2]
        # n cycling processes compute n / cycle at a time on average: their contention is kappa's part, not the wake's
        busy_part = cls(op, hot, kappa, (0.0,) * len(kappa), cores)
        wake = _monotone([max(0.0, c - r * busy_part.kappa_at(n / cycle_factor(n, cores)))
                          for n, (c, r) in enumerate(zip(cycle_s, ref_s), start=1)], 0.0)
        return cls(op, hot, kappa, wake, cores, _monotone([max(0.0, w) for w in recv_wake_s], 0.0))

    def kappa_at(self, n: float) -> float:
        """CPU-time factor while ``n`` (>= 0, may be fractional) processes compute; linear between, flat past N.

        >>> OpProbe("toy", 1.0, (1.0, 1.2, 1.6), (0.0, 0.0, 0.0), 2).kappa_at(2.5)
        1.4
        """
        if n <= 1.0:
            return 1.0
        x = min(n, float(len(self.kappa)))
        i = min(int(math.floor(x)), len(self.kappa)) - 1
        if i >= len(self.kappa) - 1:
            return self.kappa[-1]
        return self.kappa[i] + (x - 1 - i) * (self.kappa[i + 1] - self.kappa[i])

    def wake_at(self, n: int) -> float:
        """Extra CPU seconds of an op after a wait, ``n`` ranks on the host (flat past N; 0 for ``n < 1``)."""
        if n < 1:
            return 0.0
        return self.wake_s[min(n, len(self.wake_s)) - 1]

    def recv_wake_at(self, k: float) -> float:
        """Extra seconds of a receive that wakes its rank while ``k`` (>= 0) others compute; linear, flat past K.

        >>> OpProbe("toy", 1.0, (1.0,), (0.0,), 2, (0.0, 2.0, 3.0)).recv_wake_at(1.5)
        2.5
        """
        w = self.recv_wake_s
        if not w or k <= 0:
            return w[0] if w else 0.0
        x = min(k, float(len(w) - 1))
        i = min(int(math.floor(x)), len(w) - 1)
        return w[i] if i >= len(w) - 1 else w[i] + (x - i) * (w[i + 1] - w[i])

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "hot_s": self.hot_s, "kappa": list(self.kappa), "wake_s": list(self.wake_s),
                "cores": self.cores, "recv_wake_s": list(self.recv_wake_s)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OpProbe":
        """Read ``meta["host_time"]["op_probe"]``.

        Raises
        ------
        HppInputError
            A missing field or values out of range.
        """
        try:
            return cls(str(d["op"]), float(d["hot_s"]), tuple(float(x) for x in d["kappa"]),
                       tuple(float(x) for x in d["wake_s"]), int(d["cores"]),
                       tuple(float(x) for x in d.get("recv_wake_s", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise HppInputError(f"bad op probe ({exc})", field="meta.host_time.op_probe",
                                fix="give op, hot_s, kappa, wake_s and cores") from None


@dataclass(frozen=True)
class MeasuredHost(HostTimeTerms):
    """:class:`HostTimeTerms` plus the real-op probe; ``to_dict`` adds ``"op_probe"`` (what the profile stores)."""

    ops: OpProbe | None = None

    def to_dict(self) -> dict[str, Any]:
        d = HostTimeTerms.to_dict(self)
        if self.ops is not None:
            d["op_probe"] = self.ops.to_dict()
        return d


def op_probe_of(meta: Mapping[str, Any]) -> OpProbe | None:
    """The op probe stored in a profile's ``meta`` (``meta["host_time"]["op_probe"]``), or None."""
    d = (meta.get("host_time") or {}).get("op_probe")
    return OpProbe.from_dict(d) if d else None
