"""The composition model as a MILP, solved by HiGHS through :func:`scipy.optimize.milp`.

Same model as the CP-SAT one of :mod:`hpp.formulation.composition.cpsat` (same inventory and
TP-group rows, same data balance, same relaxed gradient sync ``max_c sync_s(c, h)``, same
optimizer term), made linear with level variables:

- copies ``x_c`` (integer) and micro-batches per copy ``k_c`` (integer), ``u_c`` = used;
- the product ``x_c k_c`` (samples / b_c) through bit levels: the factor with fewer bits is
  written as ``sum_j 2^j beta_cj`` (beta binary) and each ``w_cj = beta_cj * other`` is
  linearised exactly (McCormick on a binary: ``w <= U beta``, ``w <= other``,
  ``w >= other - U (1 - beta)``);
- the number of pipelines ``h = sum_c x_c`` through a level ladder ``delta_j = [h >= j]``
  (``delta_2 >= delta_3 >= ...``, ``sum_j delta_j = h - 1``), so that any table ``s(h)`` is the
  linear ``sum_j (s(j) - s(j-1)) delta_j``; candidates with identical sync tables share one
  big-M row ``T_sync >= s_g(h) - M_g (1 - v_g)``, ``v_g >= u_c``;
- redundant: ``T_sync >= sum_j min_g (s_g(j) - s_g(j-1)) delta_j`` (some group is used).

Objective ``T_pipe + T_sync + T_opt`` in seconds (sync tables in whole microseconds,
as CP-SAT's: rounded down on a bound problem). Not an oracle: the judged objective is
:func:`~hpp.formulation.composition.objective.composition_objective_s` (see :mod:`hpp.formulation.composition.solve`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from hpp.formulation.composition.problem import US_PER_S, CompositionProblem

__all__ = ["MilpResult", "solve_composition_milp"]


@dataclass(frozen=True)
class MilpResult:
    """HiGHS' answer on the composition MILP (model objective, not the judged one)."""

    counts: dict
    status: str               # OPTIMAL, FEASIBLE, INFEASIBLE, NO_SOLUTION
    model_objective_s: float
    bound_s: float
    wall_s: float
    hit_time_limit: bool
    nodes: int
    num_variables: int
    num_constraints: int
    message: str = ""


@dataclass
class _Builder:
    """Columns (bounds, integrality, cost) and sparse rows ``lo <= a x <= hi``."""

    lb: list = field(default_factory=list)
    ub: list = field(default_factory=list)
    integer: list = field(default_factory=list)
    cost: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    cols: list = field(default_factory=list)
    vals: list = field(default_factory=list)
    lo: list = field(default_factory=list)
    hi: list = field(default_factory=list)

    def var(self, lb: float, ub: float, *, integer: bool, cost: float = 0.0) -> int:
        self.lb.append(lb), self.ub.append(ub), self.integer.append(1 if integer else 0), self.cost.append(cost)
        return len(self.lb) - 1

    def row(self, terms, lo: float = -np.inf, hi: float = np.inf) -> None:
        r = len(self.lo)
        for col, val in terms:
            if val != 0:
                self.rows.append(r), self.cols.append(col), self.vals.append(float(val))
        self.lo.append(lo), self.hi.append(hi)


def _product(b: _Builder, a: int, a_ub: int, o: int, o_ub: int) -> list[tuple[int, int]]:
    """Columns ``w_j`` with ``a * o = sum_j 2^j w_j`` (a expanded in bits); returns [(w_j, 2^j)]."""
    bits = []
    for j in range(max(1, a_ub.bit_length())):
        beta = b.var(0, 1, integer=True)
        w = b.var(0, o_ub, integer=False)
        bits.append((beta, w, 1 << j))
        b.row([(w, 1.0), (beta, -o_ub)], hi=0.0)                 # w <= U beta
        b.row([(w, 1.0), (o, -1.0)], hi=0.0)                     # w <= other
        b.row([(w, 1.0), (o, -1.0), (beta, -o_ub)], lo=-o_ub)    # w >= other - U (1 - beta)
    b.row([(a, 1.0)] + [(beta, -p) for beta, _, p in bits], lo=0.0, hi=0.0)   # a = sum 2^j beta_j
    return [(w, p) for _, w, p in bits]


#: ``formulation="auto"``: the per-copy formulation while the copies' upper bounds sum to at most this, else the
#: product. Measured (HiGHS): on 36 candidates of opt350-3types-40 10 nodes took 9.9 s per copy, 1.7 s with the
#: product; on the 217 of opt350-a100x4-v100x4 (sum 316) both closed the model, in 7.4 s and 4.9 s.
PER_COPY_LIMIT = 100


@contextlib.contextmanager
def _stdout_to_stderr():
    """File descriptor 1 sent to 2 while HiGHS runs: with ``disp`` off it still prints some messages of its own
    on the C stdout (seen: ``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``), which
    would break ``hpp plan --json``'s one JSON object on stdout."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:                 # no file descriptor 1 (an embedding host): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _max_pipelines(problem: CompositionProblem, ub: list[int]) -> int:
    fewest = min(c.num_devices for c in problem.candidates)
    return max(1, min(sum(ub), problem.cluster.num_devices // fewest))


def solve_composition_milp(problem: CompositionProblem, *, time_limit_s: float = 10.0, cutoff_s: float | None = None,
                           lower_bound_pipe_s: float | None = None, mip_rel_gap: float = 1e-6,
                           formulation: str = "auto", per_copy_limit: int = PER_COPY_LIMIT,
                           node_limit: int | None = None) -> MilpResult:
    """Build and solve the MILP of the module docstring; never raises on a time limit.

    Parameters
    ----------
    cutoff_s : float, optional
        Only plans of model objective <= cutoff (an incumbent's judged objective); INFEASIBLE then
        means that nothing beats the incumbent.
    lower_bound_pipe_s : float, optional
        A valid lower bound on T_pipe (redundant row).
    node_limit : int, optional
        HiGHS' branch-and-bound node limit (a deterministic work limit; the time limit still applies).
    """
    t0 = time.perf_counter()
    cands = problem.candidates
    G = problem.global_batch_size
    n = len(cands)
    b = _Builder()
    t_pipe = b.var(0, np.inf, integer=False, cost=1.0)
    t_sync = b.var(0, np.inf, integer=False, cost=1.0)
    t_opt = b.var(0, np.inf, integer=False, cost=1.0)
    ub = [problem.max_copies(c) for c in range(n)]
    per_copy = formulation == "per-copy" or (formulation == "auto" and sum(ub) <= per_copy_limit)
    x, u, samples = [], [], []
    for c, cand in enumerate(cands):
        p = cand.partition
        kmax = -(-G // cand.micro_batch_size)
        if cutoff_s is not None and math.isfinite(cutoff_s):   # no copy may run past the cutoff
            kmax = max(1, min(kmax, math.floor((cutoff_s - p.fill_s) / p.bottleneck_s + 1e-9) + 1))
        xc = b.var(0, ub[c], integer=True)
        uc = b.var(0, 1 if ub[c] > 0 else 0, integer=True)
        b.row([(xc, 1.0), (uc, -ub[c])], hi=0.0)            # used <=> x >= 1
        b.row([(xc, 1.0), (uc, -1.0)], lo=0.0)
        if per_copy:
            # copy j exists (y_j, y_j >= y_{j+1}) and runs k_j micro-batches (k_j >= k_{j+1})
            ys = [b.var(0, 1, integer=True) for _ in range(ub[c])]
            ks = [b.var(0, kmax, integer=True) for _ in range(ub[c])]
            b.row([(xc, 1.0)] + [(y, -1.0) for y in ys], lo=0.0, hi=0.0)
            for j, (y, k) in enumerate(zip(ys, ks)):
                b.row([(k, 1.0), (y, -1.0)], lo=0.0)          # a copy runs >= 1 micro-batch
                b.row([(k, 1.0), (y, -kmax)], hi=0.0)
                # pipeline time: phi + (k - 1) tau for every copy
                b.row([(t_pipe, 1.0), (k, -p.bottleneck_s), (y, -(p.fill_s - p.bottleneck_s))], lo=0.0)
                if j:
                    b.row([(ys[j - 1], 1.0), (y, -1.0)], lo=0.0)
                    b.row([(ks[j - 1], 1.0), (k, -1.0)], lo=0.0)
                samples.append((k, cand.micro_batch_size))
        else:
            kc = b.var(0, kmax, integer=True)
            b.row([(kc, 1.0), (uc, -1.0)], lo=0.0)              # a used copy runs >= 1 micro-batch
            b.row([(kc, 1.0), (uc, -kmax)], hi=0.0)
            if ub[c] > 0:
                prod = _product(b, xc, ub[c], kc, kmax) if ub[c].bit_length() <= kmax.bit_length() \
                    else _product(b, kc, kmax, xc, ub[c])
                samples += [(w, q * cand.micro_batch_size) for w, q in prod]
            # pipeline time: phi + (k - 1) tau for every used candidate
            b.row([(t_pipe, 1.0), (kc, -p.bottleneck_s), (uc, -(p.fill_s - p.bottleneck_s))], lo=0.0)
        # optimizer step
        b.row([(t_opt, 1.0), (uc, -p.optimizer_s)], lo=0.0)
        x.append(xc), u.append(uc)
    # samples cover the global batch; at least one pipeline
    b.row(samples, lo=float(G))
    b.row([(uc, 1.0) for uc in u], lo=1.0)
    # inventory per device type and per TP-group size (as the CP-SAT model)
    for t, cnt in problem.inventory.items():
        b.row([(x[c], cands[c].devices[t]) for c in range(n) if t in cands[c].devices], hi=float(cnt))
        for s in sorted({kk[1] for cd in cands for kk in cd.tp_groups if kk[0] == t and kk[1] > 1}):
            b.row([(x[c], sum(nn * kk[1] for kk, nn in cands[c].tp_groups.items() if kk[0] == t and kk[1] >= s))
                   for c in range(n)], hi=float(problem.tp_capacity(t, s) * s))
    # gradient sync: level ladder over h, one big-M row per distinct sync table
    H = _max_pipelines(problem, ub)
    delta = [b.var(0, 1, integer=True) for _ in range(2, H + 1)]
    b.row([(xc, 1.0) for xc in x] + [(d, -1.0) for d in delta], lo=1.0, hi=1.0)
    for d0, d1 in zip(delta, delta[1:]):
        b.row([(d0, 1.0), (d1, -1.0)], lo=0.0)
    groups: dict[tuple, list[int]] = {}
    for c in range(n):
        if ub[c] > 0:
            groups.setdefault(tuple(problem.sync_table_us(c, H)), []).append(c)
    least = None
    for table, members in groups.items():
        s = np.array((0,) + table[1:], dtype=np.float64) / US_PER_S      # s(1) = 0: one pipeline syncs nothing
        steps = np.diff(s)                                                 # s(j) - s(j-1), j = 2..H
        big_m = float(max(0.0, np.max(s)))
        least = steps if least is None else np.minimum(least, steps)
        if len(members) == 1:
            v = u[members[0]]
        else:
            v = b.var(0, 1, integer=True)
            for c in members:
                b.row([(v, 1.0), (u[c], -1.0)], lo=0.0)
        b.row([(t_sync, 1.0), (v, -big_m)] + [(d, -st) for d, st in zip(delta, steps)], lo=-big_m)
    if least is not None and len(least):
        b.row([(t_sync, 1.0)] + [(d, -st) for d, st in zip(delta, least)], lo=0.0)   # redundant
    if lower_bound_pipe_s is not None:
        b.row([(t_pipe, 1.0)], lo=lower_bound_pipe_s)
    if cutoff_s is not None and math.isfinite(cutoff_s):
        b.row([(t_pipe, 1.0), (t_sync, 1.0), (t_opt, 1.0)], hi=cutoff_s * (1 + 1e-9) + 1e-6)
    A = coo_array((b.vals, (b.rows, b.cols)), shape=(len(b.lo), len(b.lb))).tocsr()
    left = max(0.05, time_limit_s - (time.perf_counter() - t0))
    with _stdout_to_stderr():
        res = milp(np.array(b.cost), integrality=np.array(b.integer), bounds=Bounds(b.lb, b.ub),
                   constraints=LinearConstraint(A, b.lo, b.hi),
                   options={"time_limit": left, "mip_rel_gap": mip_rel_gap, "disp": False,
                            **({"node_limit": node_limit} if node_limit is not None else {})})
    wall = time.perf_counter() - t0
    counts: dict[int, int] = {}
    if res.x is not None:
        counts = {c: int(round(res.x[x[c]])) for c in range(n) if round(res.x[x[c]]) > 0}
    status = {0: "OPTIMAL", 2: "INFEASIBLE"}.get(res.status, "FEASIBLE" if counts else "NO_SOLUTION")
    bound = getattr(res, "mip_dual_bound", None)
    if bound is None or not np.isfinite(bound):
        bound = float(res.fun) if res.status == 0 else math.nan
    obj = float(res.fun) if res.x is not None else math.inf
    return MilpResult(counts, status, obj, float(bound), wall, res.status == 1, int(res.get("mip_node_count") or 0),
                      len(b.lb), len(b.lo), str(res.message))
