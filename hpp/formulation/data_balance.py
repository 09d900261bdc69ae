"""Data balance: split the global batch across pipelines so that all finish together.

Pipeline p with bottleneck tau_p, fill phi_p and micro-batch size b_p takes
``T_p(m) = phi_p + (m - 1) tau_p`` for m >= 1 micro-batches (0 for m = 0) and
processes up to ``b_p * m`` samples (the last micro-batch may be partial, and costs a
full one). We choose integers n_p >= 0 with ``sum n_p = G`` EXACTLY (no divisibility
asked of G) minimising ``max_p T_p(ceil(n_p / b_p))`` (HPP.md, search step 2).

Method: the samples pipeline p can finish by time T are
``cap_p(T) = b_p (floor((T - phi_p) / tau_p) + 1)`` (0 if T < phi_p), monotone in T;
bisection finds the least T with ``sum_p cap_p(T) >= G``; then the excess samples
are taken back from the pipelines whose last micro-batch ends latest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

__all__ = ["DataSplit", "balance_data", "least_time_s"]


@dataclass(frozen=True, slots=True)
class DataSplit:
    """Result of :func:`balance_data`.

    Attributes
    ----------
    num_samples : tuple[int, ...]
        (P,) samples per pipeline; sums to G.
    num_micro_batches : tuple[int, ...]
        (P,) ceil(n_p / b_p).
    time_s : float
        max_p T_p [s].
    """

    num_samples: tuple[int, ...]
    num_micro_batches: tuple[int, ...]
    time_s: float


def least_time_s(groups: Sequence[tuple[float, float, int, int]], global_batch_size: int) -> float:
    """Least T by which groups of identical pipelines can finish ``global_batch_size`` samples [s].

    Parameters
    ----------
    groups : sequence of (tau_s, phi_s, micro_batch_size, copies)
        Pipelines with bottleneck tau, fill phi and micro-batch size b, ``copies`` of each.

    Returns
    -------
    float
        The least T with ``sum copies * cap(T) >= G`` (bisection on the monotone capacity),
        snapped down to the breakpoint ``phi + (m - 1) tau`` actually reached.
    """
    G = global_batch_size
    if len(groups) == 1:   # closed form: x copies of one pipeline, ceil(G / (x b)) micro-batches each
        tau, phi, b, x = groups[0]
        return phi + (-(-G // (x * b)) - 1) * tau

    # cap(T) >= G; when every started group adds > 0 samples, the same terms summed in order of fill,
    # stopping once the answer is known
    by_fill = None
    if all(tau > 0 and x * b > 0 and phi == phi for tau, phi, b, x in groups):
        by_fill = sorted(((phi, tau, x * b) for tau, phi, b, x in groups), key=lambda g: g[0])

        def covers(T: float) -> bool:
            total = 0
            for phi, tau, xb in by_fill:
                if T < phi:
                    return False       # this and every later group not started
                total += xb * (math.floor((T - phi) / tau + 1e-12) + 1)
                if total >= G:
                    return True
            return False
    else:
        def covers(T: float) -> bool:
            return sum(x * b * (math.floor((T - phi) / tau + 1e-12) + 1) for tau, phi, b, x in groups
                       if T >= phi) >= G

    # covers is monotone in T: knowing the least float where it holds, the bisection needs no more calls
    first = _first_covering(by_fill, G, covers) if by_fill is not None else None
    hi = min(phi + (-(-G // b) - 1) * tau for tau, phi, b, _ in groups)
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if (mid >= first) if first is not None else covers(mid):
            hi = mid
        else:
            lo = mid
    # snap down to the breakpoint actually reached (the slowest pipeline's last micro-batch)
    return max(phi + (min(math.floor((hi - phi) / tau + 1e-12) + 1, -(-G // b)) - 1) * tau
               for tau, phi, b, _ in groups if hi >= phi)


def _first_covering(by_fill: list[tuple[float, float, int]], G: int, covers: Callable[[float], bool],
                    *, max_steps: int = 64) -> float | None:
    """The least float T with ``covers(T)`` (capacity >= G) [s]; None where it is not found quickly.

    ``by_fill``: (phi, tau > 0, samples per micro-batch x b > 0) per group, by fill. An estimate in
    real arithmetic (from the root of the capacity's linear lower bound, down the groups' micro-batch
    starts while the capacity stays >= G) is moved float by float to where ``covers`` turns true;
    ``covers`` is monotone in T, so the answer is exact: ``covers(T)`` holds and ``covers`` of the
    next float below does not.
    """
    try:
        # least T with sum over started groups of xb (T - phi) / tau >= G: the capacity exceeds G there
        slope = offset = 0.0
        for k, (phi, tau, xb) in enumerate(by_fill):
            slope += xb / tau
            offset += xb * phi / tau
            top = (G + offset) / slope
            if k + 1 == len(by_fill) or top < by_fill[k + 1][0]:
                top = max(top, phi)
                break
        # micro-batches per group there; take back the latest-starting ones while the rest still cover G
        count = [math.floor((top - phi) / tau + 1e-12) + 1 if top >= phi else 0 for phi, tau, _ in by_fill]
        total = sum(xb * m for (_, _, xb), m in zip(by_fill, count))
        for _ in range(max_steps):
            starts = [(phi + (m - 1 - 1e-12) * tau if m > 1 else phi) if m > 0 else -math.inf
                      for (phi, tau, _), m in zip(by_fill, count)]
            est = max(starts)
            drop = sum(xb for (_, _, xb), t in zip(by_fill, starts) if t == est)
            if total - drop < G or not math.isfinite(est):
                break
            total -= drop
            count = [m - 1 if t == est else m for m, t in zip(count, starts)]
        else:
            return None
        T = est
        for _ in range(max_steps):
            if not math.isfinite(T):
                return None
            if covers(T):
                below = math.nextafter(T, -math.inf)
                if not covers(below):
                    return T
                T = below
            else:
                T = math.nextafter(T, math.inf)
    except (ArithmeticError, ValueError):
        pass
    return None


def _time(phi: float, tau: float, m: int) -> float:
    return 0.0 if m <= 0 else phi + (m - 1) * tau


def balance_data(bottleneck_s: Sequence[float], fill_s: Sequence[float], micro_batch_size: Sequence[int],
                 global_batch_size: int) -> DataSplit:
    """Optimal integer split of ``global_batch_size`` samples over P pipelines.

    Parameters
    ----------
    bottleneck_s, fill_s : (P,) float
        tau_p > 0 and phi_p >= tau_p [s].
    micro_batch_size : (P,) int
        b_p >= 1.
    global_batch_size : int
        G >= 1.

    Returns
    -------
    DataSplit

    Raises
    ------
    ValueError
        Empty input, G < 1, or a non-positive tau or b.

    Examples
    --------
    >>> balance_data([1.0, 2.0], [1.0, 2.0], [1, 1], 3)
    DataSplit(num_samples=(2, 1), num_micro_batches=(2, 1), time_s=2.0)
    """
    P = len(bottleneck_s)
    if P == 0 or global_batch_size < 1:
        raise ValueError(f"need >= 1 pipeline and G >= 1, got {P} pipelines and G={global_batch_size}")
    if min(bottleneck_s) <= 0 or min(micro_batch_size) < 1:
        raise ValueError("every bottleneck must be > 0 s and every micro-batch size >= 1")
    G = global_batch_size

    T = least_time_s([(tau, phi, b, 1) for tau, phi, b in zip(bottleneck_s, fill_s, micro_batch_size)], G)
    m = [0] * P
    n = [0] * P
    for p, (tau, phi, b) in enumerate(zip(bottleneck_s, fill_s, micro_batch_size)):
        if T >= phi:
            m[p] = min(math.floor((T - phi) / tau + 1e-12) + 1, -(-G // b))
            n[p] = b * m[p]
    excess = sum(n) - G
    while excess > 0:
        # take samples back from the pipeline whose last micro-batch ends latest
        p = max((q for q in range(P) if n[q] > 0),
                key=lambda q: (_time(fill_s[q], bottleneck_s[q], m[q]), micro_batch_size[q]))
        in_last = n[p] - micro_batch_size[p] * (m[p] - 1)
        r = min(excess, in_last)
        n[p] -= r
        excess -= r
        if r == in_last:
            m[p] -= 1
    time_s = max(_time(fill_s[p], bottleneck_s[p], m[p]) for p in range(P))
    assert sum(n) == G
    return DataSplit(tuple(n), tuple(m), time_s)
