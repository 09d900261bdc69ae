"""Lower bounds of the composition: an LP relaxation of the pipelines' capacity (GLOP), with sync classes.

:func:`composition_bounds` gives the planner's bound and gap over all candidates (by default the
larger of this LP and the branch and bound of :mod:`hpp.formulation.composition.copy_bound`, which keeps the
micro-batches per copy integer and prices sync per pipeline count); the CP-SAT model takes its
pipeline-time part as a redundant constraint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from ortools.linear_solver.python import model_builder_helper as mbh
from scipy.sparse import csr_matrix

from hpp.forkshare import can_fork, run_shares, usable_cores
from hpp.formulation.composition.copy_bound import CopyBound, copy_bound
from hpp.formulation.composition.problem import CompositionProblem

__all__ = ["lp_lower_bound_pipe_s", "composition_lower_bound_s", "composition_bounds"]


@dataclass(frozen=True)
class _ColumnTable:
    """LP columns as arrays: micro-batch size b [samples], fill phi [s], bottleneck tau [s], each (n,),
    and devices (K, n): devices of each inventory type per copy."""

    b: np.ndarray
    phi: np.ndarray
    tau: np.ndarray
    devices: np.ndarray

    @staticmethod
    def of(cands: Sequence, types: Sequence[str]) -> "_ColumnTable":
        row = {t: r for r, t in enumerate(types)}
        devices = np.zeros((len(types), len(cands)))
        for j, cand in enumerate(cands):
            for t, k in cand.devices.items():
                if t in row:
                    devices[row[t], j] = k
        return _ColumnTable(np.array([c.micro_batch_size for c in cands], dtype=np.float64),
                            np.array([c.partition.fill_s for c in cands], dtype=np.float64),
                            np.array([c.partition.bottleneck_s for c in cands], dtype=np.float64), devices)

    def take(self, idx: np.ndarray) -> "_ColumnTable":
        """The columns ``idx``, in that order."""
        return _ColumnTable(self.b[idx], self.phi[idx], self.tau[idx], self.devices[:, idx])


class _CapacityLP:
    """LP relaxation of the samples a set of candidates can finish by time T (GLOP, one model reused).

    Columns: candidate c finishes relaxed ``r_c(T) = b_c ((T - phi_c)/tau_c + 1)`` samples per copy
    for T >= phi_c (0 before). Only the device counts constrain the LP, so a candidate is left
    out when another with the same device counts has slope ``b/tau``, intercept
    ``b (1 - phi/tau)`` and fill phi all at least as good (its rate is then >= at every T):
    this changes no LP value.

    The model is built and its objective set from numpy arrays through OR-Tools' model builder
    (``fill_model_from_sparse_data``, ``set_objective_coefficients``), not one Python call per
    coefficient; each solve is GLOP on the whole model (K rows: one per device type).
    """

    def __init__(self, problem: CompositionProblem, allowed: Sequence[int], *, columns: list | None = None,
                 table: _ColumnTable | None = None) -> None:
        self.problem = problem
        # ``columns``: the caller's already reduced columns for ``allowed`` (see composition_bounds),
        # ``table``: their arrays, when the caller has them
        self.cands = columns if columns is not None else _lp_columns([problem.candidates[c] for c in allowed])
        if table is None:
            table = _ColumnTable.of(self.cands, list(problem.inventory))
        n = len(self.cands)
        types = list(problem.inventory)
        self._model = mbh.ModelBuilderHelper()
        self._model.fill_model_from_sparse_data(
            np.zeros(n), np.full(n, np.inf), np.zeros(n), np.zeros(len(types)),
            np.array([float(problem.inventory[t]) for t in types]), csr_matrix(table.devices))
        self._solver = mbh.ModelSolverHelper("glop")
        self._optimal = mbh.SolveStatus.OPTIMAL
        self.solves = 0
        self._b, self._phi, self._tau = table.b, table.phi, table.tau

    def _solve(self, T: float, *, copies: bool = True) -> tuple[float, list[float]]:
        """(capacity(T), the fractional copies x) [samples, copies]; x only when ``copies``.

        The objective ``b ((T - phi)/tau + 1)`` (0 before the fill) is cleared and set anew from
        its nonzero coefficients (the builder ignores a coefficient set to 0, so clearing is
        what removes a column that drops out).
        """
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = np.where(T >= self._phi, self._b * ((T - self._phi) / self._tau + 1.0), 0.0)
        self.solves += 1
        active = np.flatnonzero(rates > 0)
        if not len(active):
            return 0.0, []
        self._model.clear_objective()
        self._model.set_maximize(True)
        self._model.set_objective_coefficients(active.tolist(), rates[active].tolist())
        self._solver.solve(self._model)
        if self._solver.status() != self._optimal:
            return 0.0, []
        if not copies:
            return self._solver.objective_value(), []
        return self._solver.objective_value(), self._solver.variable_values().tolist()

    def capacity(self, T: float) -> float:
        """max sum_c x_c b_c ((T - phi_c)/tau_c + 1) over fractional copies of the candidates."""
        return self._solve(T, copies=False)[0]

    def least_time_s(self, *, iterations: int = 14, rel_tol: float = 1e-7) -> float:
        """Least T whose relaxed capacity covers G (a lower bound on T_pipe of any plan of these candidates).

        capacity(T) is non-decreasing in T, so any T with capacity(T) < G is a valid lower bound.
        Newton steps from above: at T_k (capacity >= G) the optimal copies x give a line
        f(T) = sum x_c r_c(T) <= capacity(T); its root (raised to the largest fill among the
        copies used, where the line is exact) is a smaller T with capacity >= G. When the steps
        stop, T (1 - rel_tol) is certified by one more solve (capacity < G); if that fails (the
        capacity is not convex below some fills), bisection below T as before.
        """
        if not self.cands:
            return math.inf
        G = self.problem.global_batch_size
        steps = np.array([-(-G // c.micro_batch_size) for c in self.cands], dtype=np.int64)
        hi = min((self._phi + steps * self._tau).tolist())
        for _ in range(iterations):
            cap, xs = self._solve(hi)
            if cap < G or not xs:
                break
            # the copies used (x > 0: a basic solution has few), in column order as the sums were
            used = [(xs[i], self.cands[i]) for i in np.flatnonzero(np.asarray(xs) > 0).tolist()]
            slope = sum(x * c.micro_batch_size / c.partition.bottleneck_s for x, c in used)
            icpt = sum(x * c.micro_batch_size * (1.0 - c.partition.fill_s / c.partition.bottleneck_s) for x, c in used)
            if slope <= 0:
                break
            floor = max(c.partition.fill_s for x, c in used)
            nxt = max((G - icpt) / slope, floor)
            if nxt >= hi * (1.0 - rel_tol):
                break
            hi = nxt
        lo = hi * (1.0 - rel_tol)
        if self.capacity(lo) < G:
            return lo
        lo = 0.0
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            if self.capacity(mid) >= G:
                hi = mid
            else:
                lo = mid
        return lo


def _lp_columns(cands: list, extra: Sequence[float] | None = None) -> list:
    """The candidates the capacity LP needs (see :class:`_CapacityLP`): per device-count vector, the
    Pareto front of (slope b/tau high, intercept b (1 - phi/tau) high, fill phi low), and of
    ``extra[i]`` low when given (a candidate then stays whenever its dominator is filtered out by
    a threshold on ``extra``)."""
    return [cands[k] for k in _lp_column_indices(cands, extra).tolist()]


def _lp_column_indices(cands: list, extra: Sequence[float] | None = None, *,
                       table: _ColumnTable | None = None) -> np.ndarray:
    """:func:`_lp_columns` as indices into ``cands``, in the same order (``table``: their arrays, if built)."""
    if not cands:
        return np.zeros(0, dtype=np.int64)
    groups: dict[tuple, int] = {}     # device-count vector -> group, numbered in order of first appearance
    seen: dict[tuple, int] = {}       # the same, keyed by the devices in their dict order
    group = []
    for c in cands:
        key = tuple(c.devices.items())
        got = seen.get(key)
        if got is None:
            got = seen[key] = groups.setdefault(tuple(sorted(key)), len(groups))
        group.append(got)
    group = np.array(group)
    if table is None:
        table = _ColumnTable.of(cands, [])
    b, tau, phi = table.b, table.tau, table.phi
    crit = [-b / tau, -b * (1.0 - phi / tau), phi]
    if extra is not None:
        crit.append(np.asarray(extra, dtype=np.float64))
    # by group, then lexicographically by the criteria (stable: ties in candidate order)
    order = np.lexsort((*reversed(crit), group))
    f = np.stack(crit, axis=1)[order]
    g = group[order]
    n = len(cands)
    start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])       # first position of each group
    first = np.repeat(start, np.diff(np.r_[start, n]))         # its group's first position, per position
    earlier = np.arange(n) - first                             # members sorted before it in its group
    i = np.repeat(np.arange(n), earlier)
    j = np.arange(len(i)) - np.repeat(np.cumsum(earlier) - earlier, earlier) + first[i]
    dominated = np.zeros(n, dtype=bool)
    dominated[i[np.all(f[j] <= f[i], axis=1)]] = True          # an earlier member as good everywhere
    return order[~dominated]


def lp_lower_bound_pipe_s(problem: CompositionProblem) -> float:
    """Lower bound on T_pipe: least T whose LP-relaxed capacity (fractional copies) covers G [s].

    capacity(T) = max sum_c x_c b_c (floor((T - phi_c)/tau_c) + 1) over x >= 0 in the
    inventory polytope; relaxing the floor to (T - phi_c)/tau_c + 1 keeps it an upper
    bound of the true capacity, so the least T found is a valid lower bound. Solved with
    OR-Tools' GLOP LP inside a bisection.
    """
    return _CapacityLP(problem, range(len(problem.candidates))).least_time_s()


def composition_lower_bound_s(problem: CompositionProblem, *, num_classes: int = 4) -> float:
    """Lower bound on the composition objective T_pipe + T_sync + T_opt [s], sync included.

    The second value of :func:`composition_bounds` (which see).
    """
    return composition_bounds(problem, num_classes=num_classes)[1]


def composition_bounds(problem: CompositionProblem, *, num_classes: int = 4, workers: int = 1,
                       incumbent_s: float | None = None, copies: bool = True,
                       search_price: Callable[[dict, float], float] | None = None, search_cutoff_s: float = math.inf,
                       on_copy_bound: Callable[[CopyBound], None] | None = None) -> tuple[float, float]:
    """(LB on T_pipe over all candidates, LB on T_pipe + T_sync + T_opt) [s].

    The second value is the larger of the sync-class LP bound below (with ``copies``: its class of all
    candidates only) and, with ``copies`` (default), the branch and bound of :func:`hpp.formulation.composition.copy_bound.copy_bound` (micro-batches per copy
    kept integer, pipeline counts and penalty levels searched). ``incumbent_s``:
    the objective of a known plan; parts of the search worth at least it are dropped with that
    value (the bound is then at most ``incumbent_s``, still a valid lower bound). ``search_price``,
    ``search_cutoff_s`` and ``on_copy_bound`` (with ``copies``): passed to the copy bound / called with its result (its LP
    solutions' rounded plans priced by the caller's search problem; the bound does not depend on them).

    The first equals :func:`lp_lower_bound_pipe_s` (the class of all candidates computes it).
    Sync classes: a plan of h >= 2 pipelines has T_sync >= sync_c(2) for every candidate c it
    uses (sync grows with h). For thresholds 0 = s_0 < s_1 < ... < s_K = inf, a plan whose sync
    lies in [s_i, s_{i+1}) uses only candidates with sync_c(2) < s_{i+1}, so its objective is at
    least s_i + LB_pipe(those candidates) + their least optimizer step. One-pipeline plans
    (no sync) need at least the fastest single copy's time. The bound is the least over the
    classes (LB_pipe: :class:`_CapacityLP`). The LP columns are reduced once for all classes,
    with sync_c(2) as a fourth Pareto criterion, so that a dropped column's dominator is in
    every class the column is in. ``workers``: processes for the class LPs (0: one per core;
    see :func:`_class_pipes`; the values do not depend on it).
    """
    cands = problem.candidates
    if not cands:
        return math.inf, math.inf
    G = problem.global_batch_size
    table = _ColumnTable.of(cands, list(problem.inventory))      # every candidate's arrays, built once
    opt = np.array([c.partition.optimizer_s for c in cands])
    steps = np.array([-(-G // c.micro_batch_size) - 1 for c in cands], dtype=np.int64)
    single = min((table.phi + steps * table.tau + opt).tolist())
    if copies:
        num_classes = 0     # the copy bound prices sync per pipeline count: only the class of all candidates
    s2 = problem.sync_s_all(2)
    s2_arr = np.array(s2)
    columns = _lp_column_indices(cands, s2, table=table)
    levels = sorted(set(s2))
    cuts = sorted({levels[int(round(q * (len(levels) - 1)))] for q in np.linspace(0, 1, num_classes + 1)[1:]})
    thresholds = [0.0, *cuts]
    classes = []           # (lo, hi, least optimizer step, allowed candidates, LP columns, their arrays)
    for i, lo in enumerate(thresholds):
        hi = thresholds[i + 1] if i + 1 < len(thresholds) else math.inf
        allowed = np.flatnonzero(s2_arr < hi)
        if len(allowed):
            cols = columns[s2_arr[columns] < hi]
            classes.append((lo, hi, min(opt[allowed].tolist()), allowed.tolist(),
                            [cands[c] for c in cols.tolist()], table.take(cols)))
    best, pipe_all = single, math.inf
    for (lo, hi, t_opt, *_), pipe in zip(classes, _class_pipes(problem, classes, workers)):
        if hi == math.inf:
            pipe_all = pipe
        best = min(best, lo + pipe + t_opt)
    if copies:
        inc = None if incumbent_s is None or not math.isfinite(incumbent_s) else incumbent_s
        cb = copy_bound(problem, cutoff_s=inc, max_evals=0, search_price=search_price, search_cutoff_s=search_cutoff_s)
        if on_copy_bound is not None:
            on_copy_bound(cb)
        best = max(best, cb.bound_s)
    return pipe_all, best


#: LP columns (summed over the sync classes) from which the classes are solved in two processes
PARALLEL_MIN_COLUMNS = 10000


def _pipes(problem: CompositionProblem, classes: list) -> list[float]:
    return [_CapacityLP(problem, allowed, columns=cols, table=tab).least_time_s()
            for _, _, _, allowed, cols, tab in classes]


def _class_pipes(problem: CompositionProblem, classes: list, workers: int) -> list[float]:
    """LB_pipe of each sync class; with ``workers`` > 1 and at least :data:`PARALLEL_MIN_COLUMNS`
    columns, the classes are split (by column count) between this process and one forked child
    (:func:`hpp.forkshare.run_shares`). The LPs and their solver are the same either way, so are
    the values (GLOP is deterministic)."""
    n = usable_cores() if workers == 0 else workers
    if n < 2 or len(classes) < 2 or sum(len(c[4]) for c in classes) < PARALLEL_MIN_COLUMNS or not can_fork():
        return _pipes(problem, classes)
    load, shares = [0, 0], [[], []]
    for k in sorted(range(len(classes)), key=lambda k: -len(classes[k][4])):
        j = 0 if load[0] <= load[1] else 1
        load[j] += len(classes[k][4])
        shares[j].append(k)
    out = {}
    for ks, pipes in zip(shares, run_shares(lambda ks: _pipes(problem, [classes[k] for k in ks]), shares)):
        out.update(zip(ks, pipes))
    return [out[k] for k in range(len(classes))]
