"""The copy bound's pipeline-count ranges and the exact-step capacity LP of one range
(:mod:`hpp.formulation.composition.copy_bound`): a small dense revised primal simplex, warm-started from the
previous basis (the same rows, only the objective moves).

>>> lp = StepLP(np.array([[1.0, 2.0]]), np.array([4.0]), 10)
>>> lp.solve(np.array([1.0, 3.0]))[0]
6.0
"""

from __future__ import annotations

import logging
import math

import numpy as np

__all__ = ["StepLP", "h_ranges"]

log = logging.getLogger(__name__)


def h_ranges(h_max: int, split_at: int) -> list[tuple[int, int]]:
    """Pipeline-count ranges [a, b] covering 1 .. h_max: single counts up to 16, then growing by half;
    no range straddles ``split_at`` (the largest node's devices: the sync link changes there).

    >>> h_ranges(30, 4)[14:]
    [(15, 15), (16, 16), (17, 25), (26, 30)]
    """
    out, a = [], 1
    while a <= h_max:
        b = a if a <= 16 else max(a, int(a * 1.5))
        if a <= split_at < b:
            b = split_at
        b = min(b, h_max)
        out.append((a, b))
        a = b + 1
    return out


class StepLP:
    """The exact-step capacity LP of one pipeline-count range: max obj.x s.t. A x <= u, x >= 0.

    A is (device types + 1) x (device-count vectors): devices per copy, and 1 per copy for the row
    ``sum x <= b``. A dense revised primal simplex (Dantzig pricing, Bland's rule after 50
    pivots): with 3-7 rows a solve is a few small dense solves, and the basis of the previous
    solve (the same A and u, only the objective changes as T moves) is kept as the start, so
    most solves take 0-2 pivots. GLOP took 1-2 ms a solve through the model builder.
    """

    def __init__(self, group_devices: np.ndarray, inventory: np.ndarray, h_hi: int) -> None:
        K, ng = group_devices.shape
        self.A = np.vstack([group_devices, np.ones((1, ng))])
        self.m, self.n = self.A.shape
        self.u = np.r_[inventory, float(h_hi)]
        self.full = np.hstack([self.A, np.eye(self.m)])        # structural columns, then slacks
        self.basis = list(range(ng, ng + self.m))              # the slack basis (x = 0) is feasible
        self.solves = 0

    def solve(self, obj: np.ndarray) -> tuple[float, np.ndarray | None]:
        """max obj.x over the polytope: (value, x), (0, None) when no objective coefficient is positive,
        (inf, None) when unbounded. Starts from the previous solve's basis and keeps the new one."""
        self.solves += 1
        if not np.any(obj > 0):
            return 0.0, None
        m, n = self.m, self.n
        cfull = np.concatenate((obj, np.zeros(m)))          # (np.r_ costs ~10 us a solve)
        scale = float(obj.max())
        B = list(self.basis)
        Binv = None                                # the basis inverse, updated per pivot, refactored every 16
        for it in range(200):
            if Binv is None or it % 16 == 0:
                try:
                    Binv = np.linalg.inv(self.full[:, B])
                except np.linalg.LinAlgError:
                    B, Binv = list(range(n, n + m)), None      # restart from the slack basis
                    continue
            xB = Binv @ self.u
            y = cfull[B] @ Binv
            red = cfull - y @ self.full
            red[B] = 0.0
            if it < 50:
                e = int(np.argmax(red))
                if red[e] <= 1e-12 * scale:
                    break
            else:                                  # Bland: the first improving column
                cand = np.flatnonzero(red > 1e-12 * scale)
                if not len(cand):
                    break
                e = int(cand[0])
            d = Binv @ self.full[:, e]
            pos = d > 1e-12
            if not pos.any():
                return math.inf, None              # unbounded (no device row limits the column)
            ratios = np.where(pos, np.maximum(xB, 0.0) / np.where(pos, d, 1.0), np.inf)
            r = float(ratios.min())
            leave = int(np.flatnonzero(ratios <= r + 1e-15)[0]) if it < 50 else \
                min(np.flatnonzero(ratios <= r + 1e-15).tolist(), key=lambda i: B[i])
            B[leave] = e
            pivot = Binv[leave] / d[leave]         # product-form update: row ops that turn column e into a unit
            Binv -= np.outer(d, pivot)
            Binv[leave] = pivot
        else:
            log.debug("step LP: no optimum after 200 pivots")
            xB = np.linalg.solve(self.full[:, B], self.u)
        self.basis = B
        x = np.zeros(n + m)
        x[B] = np.maximum(xB, 0.0)
        return float(obj @ x[:n]), x[:n]
