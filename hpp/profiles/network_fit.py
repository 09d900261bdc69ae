"""Links fitted to measured transfer times: what ``hpp profile-network`` writes into a cluster file.

Pure functions (no I/O, no torch): the measurement is :mod:`hpp.runtime.network.measure`'s.

Input: for one pair of nodes (or two devices of one node), the one-way time of one message of ``x``
bytes, for each message size and each number of concurrent flows ``k`` (``k`` devices of one node
sending to ``k`` of the other at once; one time per flow), as :class:`FlowTimes`.

Output: a :class:`~hpp.profiles.cluster.Link` in the cluster file's fit form, such that
``Link.transfer_s(x) = latency_s + x / bandwidth(x)`` reproduces the measured one-flow times:

- ``latency_s``: the intercept of the least-squares line ``time = latency + bytes / bw`` through the
  one-flow times of tiny messages (the latency probes, bytes to kilobytes, where the time is nearly all
  latency), clipped to ``[0, the least of those times]``. Without probes, the smallest
  :data:`LATENCY_SIZES` sizes of the samples stand in; where the bandwidth still grows with the size
  there (1 MB messages on most links), that intercept takes part of the bandwidth's growth for latency;
- the effective bandwidth of each size, ``x / (t(x) - latency_s)``, and its least-squares quadratic
  ``fit_gb_per_s`` ``[a, b, c]``: ``a L^2 + b L + c`` GB/s at ``L = log2(x / 1e6)`` (Sailor's form,
  ``numpy.polyfit``; a line or a constant with 2 or 1 sizes); ``max_bytes_per_s``: the largest effective
  bandwidth measured (the cap of the fit);
- per ``k >= 2``, an :class:`~hpp.profiles.cluster.AggregateFit` of the TOTAL bandwidth of the ``k``
  flows, ``sum_i x / (t_i(x) - latency_s)``, fitted the same way (the message size is one flow's).

The fit holds over the measured sizes; outside them the quadratic is extrapolated (a link prices
a message below the smallest measured size with it, capped at the peak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hpp.profiles.cluster import AggregateFit, Link

__all__ = ["FlowTimes", "LinkFit", "LATENCY_SIZES", "LATENCY_PROBE_BYTES", "fit_latency_s", "fit_bandwidth", "fit_link"]

#: The message sizes [bytes] of the latency probes (one flow, point to point).
LATENCY_PROBE_BYTES = (4, 256, 1024, 4096)
#: Without latency probes, the number of smallest message sizes whose one-flow times give the latency.
LATENCY_SIZES = 3
_BYTES_PER_GB = 1e9


@dataclass(frozen=True, slots=True)
class FlowTimes:
    """The measured one-way time of one message with ``flows`` concurrent flows.

    Attributes
    ----------
    message_bytes : int
        Bytes of one message of one flow, > 0.
    flows : int
        Concurrent flows, >= 1.
    seconds : tuple of float, (flows,)
        Each flow's one-way time of one message [s] (e.g. the median over repeats), > 0.
    """

    message_bytes: int
    flows: int
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.message_bytes > 0:
            raise ValueError(f"message_bytes must be > 0, got {self.message_bytes}")
        if not (isinstance(self.flows, int) and self.flows >= 1):
            raise ValueError(f"flows must be an int >= 1, got {self.flows!r}")
        if len(self.seconds) != self.flows:
            raise ValueError(f"{self.flows} flows but {len(self.seconds)} times")
        if not all(t > 0 and math.isfinite(t) for t in self.seconds):
            raise ValueError(f"times must be finite and > 0 s, got {self.seconds}")


@dataclass(frozen=True)
class LinkFit:
    """A fitted link and what it was fitted to.

    Attributes
    ----------
    link : Link
        The one-flow figures, with an :class:`AggregateFit` per measured ``k >= 2``.
    points : tuple of (flows, message_bytes, measured_bytes_per_s, fitted_bytes_per_s)
        Per flow count and size, the effective bandwidth measured (the total of the flows for ``k >= 2``)
        and the fitted one (capped at the peak), for the summary.
    """

    link: Link
    points: tuple[tuple[int, int, float, float], ...]

    @property
    def largest_error(self) -> float:
        """The largest ``|fitted / measured - 1|`` over :attr:`points` (0 without points)."""
        return max((abs(f / m - 1.0) for _k, _x, m, f in self.points), default=0.0)


def fit_latency_s(message_bytes: Sequence[float], seconds: Sequence[float], *, sizes: int | None = None) -> float:
    """The per-message latency [s]: the intercept of the least-squares line of time vs bytes, clipped to
    ``[0, least time]`` (module docstring); over the ``sizes`` smallest distinct message sizes (None: all).

    Parameters
    ----------
    message_bytes, seconds : (n,) with n >= 1
        One-flow times [s] of messages of those sizes [bytes] (repeated sizes allowed).

    Examples
    --------
    >>> round(fit_latency_s([1e3, 2e3, 4e3], [2e-5, 3e-5, 5e-5]) * 1e6, 6)    # 10 us + x / 1e8
    10.0
    """
    x = np.asarray(message_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    small = np.sort(np.unique(x))[:sizes] if sizes is not None else np.unique(x)
    keep = np.isin(x, small)
    xs, ts = x[keep], t[keep]
    if len(small) < 2:                  # one size: no slope to separate; its time bounds the latency
        return 0.0
    _slope, intercept = np.polyfit(xs, ts, 1)
    return float(min(max(intercept, 0.0), ts.min()))


def fit_bandwidth(message_bytes: Sequence[float], bytes_per_s: Sequence[float]
                  ) -> tuple[tuple[float, float, float], float]:
    """``((a, b, c), peak)``: the least-squares quadratic in ``L = log2(x / 1e6)`` of the bandwidths [GB/s]
    (a line with 2 distinct sizes, a constant with 1) and the largest bandwidth [bytes/s].

    Examples
    --------
    >>> L = [0.0, 1.0, 2.0]
    >>> (a, b, c), peak = fit_bandwidth([1e6 * 2 ** l for l in L], [1e9 * (0.5 * l * l + l + 2) for l in L])
    >>> [round(v, 9) for v in (a, b, c)], peak
    ([0.5, 1.0, 2.0], 6000000000.0)
    """
    x = np.asarray(message_bytes, dtype=float)
    bw = np.asarray(bytes_per_s, dtype=float)
    L = np.log2(x / 1e6)
    deg = min(2, len(np.unique(x)) - 1)
    coef = np.polyfit(L, bw / _BYTES_PER_GB, deg) if deg > 0 else np.array([bw.mean() / _BYTES_PER_GB])
    a, b, c = (0.0,) * (3 - len(coef)) + tuple(float(v) for v in coef)
    return (a, b, c), float(bw.max())


def _effective(samples: Sequence[FlowTimes], latency_s: float) -> tuple[list[float], list[float]]:
    """(sizes, total effective bandwidth of the flows) of the samples a bandwidth can be read from: each flow's
    time must exceed the latency (a time at the latency is all latency and says nothing of the bandwidth)."""
    xs, bws = [], []
    for s in samples:
        if all(t > latency_s * 1.001 for t in s.seconds):
            xs.append(float(s.message_bytes))
            bws.append(sum(s.message_bytes / (t - latency_s) for t in s.seconds))
    return xs, bws


def fit_link(samples: Sequence[FlowTimes], *, latency_samples: Sequence[FlowTimes] = ()) -> LinkFit:
    """The link of a pair of nodes (or of two devices of one node) from its measured times (module docstring).

    Parameters
    ----------
    samples : sequence of FlowTimes
        At least one one-flow sample; any number of samples with ``flows >= 2`` (one aggregate per count).
    latency_samples : sequence of FlowTimes
        One-flow times of tiny messages (the latency probes); empty: the smallest :data:`LATENCY_SIZES`
        sizes of ``samples`` give the latency.

    Returns
    -------
    LinkFit

    Raises
    ------
    ValueError
        No one-flow sample, or no sample whose time exceeds the latency.

    Examples
    --------
    A 1 GB/s link with 10 us latency, 2 flows sharing 1.5 GB/s:

    >>> one = [FlowTimes(x, 1, (1e-5 + x / 1e9,)) for x in (1e3, 1e6, 1e8)]
    >>> two = [FlowTimes(x, 2, (1e-5 + x / 0.75e9,) * 2) for x in (1e3, 1e6, 1e8)]
    >>> f = fit_link(one + two)
    >>> round(f.link.latency_s * 1e6, 3), round(f.link.max_bytes_per_s / 1e9, 3)
    (10.0, 1.0)
    >>> [(a.flows, round(a.max_bytes_per_s / 1e9, 3)) for a in f.link.aggregate]
    [(2, 1.5)]
    """
    single = [s for s in samples if s.flows == 1]
    if not single:
        raise ValueError("no one-flow sample: a link needs the times of one flow")
    probes = [s for s in latency_samples if s.flows == 1]
    if probes:
        latency = fit_latency_s([s.message_bytes for s in probes], [s.seconds[0] for s in probes])
    else:
        latency = fit_latency_s([s.message_bytes for s in single], [s.seconds[0] for s in single],
                                sizes=LATENCY_SIZES)
    points: list[tuple[int, int, float, float]] = []

    def fitted(group: Sequence[FlowTimes], k: int) -> tuple[tuple[float, float, float], float]:
        xs, bws = _effective(group, latency)
        if not xs:
            raise ValueError(f"every {k}-flow time is at the latency {latency:.3g} s: no bandwidth to fit "
                             "(measure larger messages)")
        fit, peak = fit_bandwidth(xs, bws)
        one = Link(peak, 0.0, fit)
        points.extend((k, int(x), bw, one.bandwidth_bytes_per_s(x)) for x, bw in zip(xs, bws))
        return fit, peak

    fit, peak = fitted(single, 1)
    aggregate = []
    for k in sorted({s.flows for s in samples if s.flows >= 2}):
        agg_fit, agg_peak = fitted([s for s in samples if s.flows == k], k)
        aggregate.append(AggregateFit(k, agg_peak, agg_fit))
    return LinkFit(Link(peak, latency, fit, tuple(aggregate)), tuple(points))
