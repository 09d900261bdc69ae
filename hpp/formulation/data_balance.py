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
from typing import Sequence

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

    def cap(T: float) -> int:
        return sum(x * b * (math.floor((T - phi) / tau + 1e-12) + 1) for tau, phi, b, x in groups if T >= phi)

    hi = min(phi + (-(-G // b) - 1) * tau for tau, phi, b, _ in groups)
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if cap(mid) >= G:
            hi = mid
        else:
            lo = mid
    # snap down to the breakpoint actually reached (the slowest pipeline's last micro-batch)
    return max(phi + (min(math.floor((hi - phi) / tau + 1e-12) + 1, -(-G // b)) - 1) * tau
               for tau, phi, b, _ in groups if hi >= phi)


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
