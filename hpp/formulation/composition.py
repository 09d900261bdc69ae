"""Composition: which candidate pipelines to build, how many copies, and the data split.

The composition model (what the CP-SAT model, the greedy heuristic and the
exhaustive oracle all minimise) prices a multiset of candidate copies as

    T = T_pipe + T_sync + T_opt
    T_pipe = least T with sum_c x_c * cap_c(T) >= G      (data balance, exact)
    T_sync = max over used c of max_s ring(W_s, h, link)  (block-wise sync, h = sum_c x_c)
    T_opt  = max over used c of its slowest optimizer step

where ``ring`` is :func:`hpp.formulation.cost_model.ring_allreduce_s` and ``link``
the inter-node link (the intra-node link on a one-node cluster). On clusters whose
links are uniform and latency-free this equals the cost model of the bound plan;
otherwise the plan is re-priced by the cost model (solver-agnostic validation) and
both figures are reported.

CP-SAT model (times in integer microseconds, ``US_PER_S``): variables x_c (copies),
k_c (most micro-batches per copy), h; constraint families: inventory per device
type and per TP-group size, samples cover G, pipeline time, gradient sync, optimizer
step; objective T_pipe + T_sync + T_opt. The greedy plan goes in as a hint.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from ortools.sat.python import cp_model

from hpp.formulation.candidates import Candidate, tp_capacity
from hpp.formulation.data_balance import least_time_s
from hpp.profiles.cluster import Cluster, Link

__all__ = ["US_PER_S", "CompositionProblem", "CompositionResult", "composition_objective_s",
           "pipeline_time_for_counts", "greedy_composition", "solve_composition_cpsat", "SolverSettings",
           "lp_lower_bound_pipe_s"]

log = logging.getLogger(__name__)

US_PER_S = 1_000_000
_RING_SCALE = 1000   # 2(h-1)/h in thousandths inside CP-SAT


@dataclass(frozen=True)
class SolverSettings:
    """CP-SAT parameters, explicit (STYLE.md rule 5)."""

    max_time_in_seconds: float = 10.0
    num_workers: int = 0          # 0 = one per core
    random_seed: int = 0
    log_search_progress: bool = False


@dataclass
class CompositionProblem:
    """Candidates, inventory and global batch of one composition instance."""

    candidates: list[Candidate]
    cluster: Cluster
    global_batch_size: int
    sync_link: Link
    _sync_cache: dict = field(default_factory=dict, repr=False)
    _tp_cache: dict = field(default_factory=dict, repr=False)

    @cached_property
    def inventory(self) -> dict[str, int]:
        """Devices per type (computed once)."""
        return self.cluster.count_by_type()

    def tp_capacity(self, device_type: str, tp_degree: int) -> int:
        """TP groups of ``tp_degree`` devices of ``device_type`` the nodes hold (memoised)."""
        key = (device_type, tp_degree)
        got = self._tp_cache.get(key)
        if got is None:
            got = self._tp_cache[key] = tp_capacity(self.cluster, device_type, tp_degree)
        return got

    def sync_terms(self, c: int) -> tuple[float, float]:
        """(bandwidth term [s], latency per ring step [s]) of candidate ``c``'s gradient sync.

        sync_c(h) = bandwidth_term * 2 (h-1)/h + latency * 2 (h-1): a ring all-reduce of
        the largest stage's gradient W (one bucket) at the link's bandwidth for a
        message of W bytes (:func:`~hpp.formulation.cost_model.ring_allreduce_s` with
        the bandwidth taken at the whole bucket).
        """
        got = self._sync_cache.get(c)
        if got is None:
            w = max(self.candidates[c].partition.stage_param_bytes)
            got = (w / self.sync_link.bandwidth_bytes_per_s(w) if w > 0 else 0.0, self.sync_link.latency_s)
            self._sync_cache[c] = got
        return got

    def sync_s(self, c: int, h: int) -> float:
        """Gradient sync of one copy of candidate ``c`` among ``h`` pipelines [s]."""
        if h <= 1:
            return 0.0
        bw_term, lat = self.sync_terms(c)
        return bw_term * 2.0 * (h - 1) / h + lat * 2.0 * (h - 1)

    def max_copies(self, c: int) -> int:
        cand = self.candidates[c]
        inv = self.inventory
        ub = min(inv.get(t, 0) // n for t, n in cand.devices.items())
        for (t, s), n in cand.tp_groups.items():
            ub = min(ub, self.tp_capacity(t, s) // n)
        return ub

    def fits(self, counts: dict[int, int]) -> bool:
        """True if ``counts`` copies fit the device inventory and the nodes' TP-group capacity."""
        inv = self.inventory
        used: dict[str, int] = {}
        for c, x in counts.items():
            for t, n in self.candidates[c].devices.items():
                used[t] = used.get(t, 0) + x * n
        if any(used[t] > inv.get(t, 0) for t in used):
            return False
        for t in used:
            for s in sorted({k[1] for c in counts for k in self.candidates[c].tp_groups if k[0] == t and k[1] > 1}):
                need = sum(x * n * k[1] for c, x in counts.items() for k, n in self.candidates[c].tp_groups.items()
                           if k[0] == t and k[1] >= s)
                if need > self.tp_capacity(t, s) * s:
                    return False
        return True


def pipeline_time_for_counts(cands: Sequence[Candidate], counts: dict[int, int], global_batch_size: int) -> float:
    """T_pipe: least time by which ``counts`` copies finish ``global_batch_size`` samples [s] (exact data balance)."""
    groups = [(cands[c].partition.bottleneck_s, cands[c].partition.fill_s, cands[c].micro_batch_size, x)
              for c, x in counts.items() if x > 0]
    if not groups:
        return math.inf
    return least_time_s(groups, global_batch_size)


def composition_objective_s(problem: CompositionProblem, counts: dict[int, int]) -> float:
    """T_pipe + T_sync + T_opt of ``counts`` copies (see the module docstring) [s]; inf if empty."""
    counts = {c: x for c, x in counts.items() if x > 0}
    if not counts:
        return math.inf
    h = sum(counts.values())
    t_pipe = pipeline_time_for_counts(problem.candidates, counts, problem.global_batch_size)
    t_sync = max(problem.sync_s(c, h) for c in counts)
    t_opt = max(problem.candidates[c].partition.optimizer_s for c in counts)
    return t_pipe + t_sync + t_opt


def greedy_composition(problem: CompositionProblem) -> tuple[dict[int, int], float]:
    """Fast heuristic (no bound): fill the inventory with the most sample-efficient candidates.

    Orders candidates by samples/s per device (b / tau / devices), adds copies while
    they fit, records the copies in the order added, and returns the best prefix of
    that sequence (fewer pipelines cost less gradient sync and fill), evaluated with
    :func:`composition_objective_s`. Several orders are tried (per micro-batch size
    and overall); the best wins.

    Returns
    -------
    (counts, objective_s)
    """
    cands = problem.candidates
    if not cands:
        return {}, math.inf
    best: tuple[dict[int, int], float] = ({}, math.inf)
    sizes = sorted({c.micro_batch_size for c in cands})
    for restrict in [None, *sizes]:
        idx = [i for i, c in enumerate(cands) if restrict is None or c.micro_batch_size == restrict]
        for key in ("per_device", "per_copy"):
            if key == "per_device":
                order = sorted(idx, key=lambda i: -cands[i].micro_batch_size / cands[i].partition.bottleneck_s
                               / cands[i].num_devices)
            else:
                order = sorted(idx, key=lambda i: -cands[i].micro_batch_size / cands[i].partition.bottleneck_s)
            counts: dict[int, int] = {}
            sequence: list[int] = []
            for i in order:
                while True:
                    counts[i] = counts.get(i, 0) + 1
                    if not problem.fits(counts):
                        counts[i] -= 1
                        if counts[i] == 0:
                            del counts[i]
                        break
                    sequence.append(i)
            if not sequence:
                continue
            n = len(sequence)
            checks = sorted({max(1, int(round(n * f))) for f in (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)}
                            | set(range(1, min(n, 8) + 1)))
            for k in checks:
                pref: dict[int, int] = {}
                for i in sequence[:k]:
                    pref[i] = pref.get(i, 0) + 1
                obj = composition_objective_s(problem, pref)
                if obj < best[1]:
                    best = (pref, obj)
    return best


@dataclass(frozen=True)
class CompositionResult:
    """Result record of a composition solve (scipy OptimizeResult style).

    Attributes
    ----------
    counts : dict[int, int]
        Copies per candidate index.
    status : str
        ``OPTIMAL``, ``FEASIBLE``, ``INFEASIBLE``, ``UNKNOWN`` or ``HEURISTIC``.
    objective_s, bound_s : float
        Objective of ``counts`` and the solver's proven lower bound [s].
    gap : float
        (objective - bound) / objective; 0 when proven optimal; nan without a bound.
    wall_s : float
    num_candidates : int
    """

    counts: dict
    status: str
    objective_s: float
    bound_s: float
    gap: float
    wall_s: float
    num_candidates: int
    solver: str = "cp-sat"


def _us(x: float) -> int:
    return int(math.ceil(x * US_PER_S - 1e-6))


def solve_composition_cpsat(problem: CompositionProblem, *, settings: SolverSettings = SolverSettings(),
                            hint: dict[int, int] | None = None, symmetry: bool = True,
                            incumbent_s: float | None = None,
                            lower_bound_pipe_s: float | None = None) -> CompositionResult:
    """Solve the composition with OR-Tools CP-SAT (see the module docstring for the model).

    Never raises on a time limit: returns the best solution found (or the hint) with its gap.
    """
    t0 = time.perf_counter()
    cands = problem.candidates
    G = problem.global_batch_size
    m = cp_model.CpModel()
    n = len(cands)
    ub = [problem.max_copies(c) for c in range(n)]
    H = max(1, sum(ub))
    H = min(H, problem.cluster.num_devices)
    # --- variables
    x, k, used, prod = [], [], [], []
    for c in range(n):
        kmax = -(-G // cands[c].micro_batch_size)
        if symmetry:
            xc = m.new_int_var(0, ub[c], f"x_{c}")
        else:  # one boolean per copy: the symmetric model, for the ablation
            ys = [m.new_bool_var(f"y_{c}_{j}") for j in range(ub[c])]
            xc = m.new_int_var(0, ub[c], f"x_{c}")
            m.add(xc == sum(ys))
        uc = m.new_bool_var(f"used_{c}")
        kc = m.new_int_var(0, kmax, f"k_{c}")
        pc = m.new_int_var(0, ub[c] * kmax, f"p_{c}")
        m.add_multiplication_equality(pc, [xc, kc])
        x.append(xc), k.append(kc), used.append(uc), prod.append(pc)
    h = m.new_int_var(1, H, "num_pipelines")
    horizon = _us(max(c.partition.fill_s + (-(-G // c.micro_batch_size)) * c.partition.bottleneck_s
                      for c in cands)) + 1
    t_pipe = m.new_int_var(0, horizon, "t_pipe_us")
    t_sync_max = max(_us(problem.sync_s(c, H)) for c in range(n)) + 2
    t_sync = m.new_int_var(0, max(t_sync_max, 1), "t_sync_us")
    t_opt = m.new_int_var(0, max(_us(c.partition.optimizer_s) for c in cands) + 1, "t_opt_us")
    # --- usage links
    for c in range(n):
        m.add(x[c] >= 1).only_enforce_if(used[c])
        m.add(x[c] == 0).only_enforce_if(used[c].Not())
        m.add(k[c] >= 1).only_enforce_if(used[c])
    m.add(h == sum(x))
    # --- inventory per device type and per TP-group size
    for t, cnt in problem.inventory.items():
        terms = [x[c] * cands[c].devices[t] for c in range(n) if t in cands[c].devices]
        if terms:
            m.add(sum(terms) <= cnt)
        sizes = sorted({kk[1] for cd in cands for kk in cd.tp_groups if kk[0] == t and kk[1] > 1})
        for s in sizes:
            terms = [x[c] * sum(nn * kk[1] for kk, nn in cands[c].tp_groups.items() if kk[0] == t and kk[1] >= s)
                     for c in range(n)]
            m.add(sum(terms) <= problem.tp_capacity(t, s) * s)
    # --- samples cover the global batch
    m.add(sum(prod[c] * cands[c].micro_batch_size for c in range(n)) >= G)
    # --- pipeline time: phi + (k - 1) tau for every used candidate
    for c in range(n):
        p = cands[c].partition
        m.add(t_pipe >= _us(p.fill_s - p.bottleneck_s) + k[c] * _us(p.bottleneck_s)).only_enforce_if(used[c])
    # --- gradient sync: bw_c * 2(h-1)/h + lat * 2(h-1); one shared element for 2(h-1)/h (scaled by _RING_SCALE)
    ring = m.new_int_var(0, 2 * _RING_SCALE, "ring_factor")
    m.add_element(h, [0] + [int(round(2 * (hh - 1) / hh * _RING_SCALE)) for hh in range(1, H + 1)], ring)
    for c in range(n):
        bw_term, lat = problem.sync_terms(c)
        coef = _us(bw_term)
        m.add(t_sync * _RING_SCALE >= coef * ring + _RING_SCALE * _us(2 * lat) * (h - 1)).only_enforce_if(used[c])
    # --- optimizer step
    for c in range(n):
        m.add(t_opt >= _us(cands[c].partition.optimizer_s)).only_enforce_if(used[c])
    # --- redundant: the LP bound of the pipeline time (least T whose fractional capacity covers G)
    if lower_bound_pipe_s is not None:
        m.add(t_pipe >= int(lower_bound_pipe_s * US_PER_S))
    if incumbent_s is not None and math.isfinite(incumbent_s):
        m.add(t_pipe + t_sync + t_opt <= _us(incumbent_s) + 3)  # + rounding of the three terms
    m.minimize(t_pipe + t_sync + t_opt)
    if hint:
        for c in range(n):
            m.add_hint(x[c], hint.get(c, 0))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = settings.max_time_in_seconds
    solver.parameters.num_workers = settings.num_workers
    solver.parameters.random_seed = settings.random_seed
    solver.parameters.log_search_progress = settings.log_search_progress
    status = solver.solve(m)
    wall = time.perf_counter() - t0
    name = solver.status_name(status)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        counts = {c: int(solver.value(x[c])) for c in range(n) if solver.value(x[c]) > 0}
        bound = solver.best_objective_bound / US_PER_S
    else:
        counts = dict(hint or {})
        bound = solver.best_objective_bound / US_PER_S if status != cp_model.INFEASIBLE else math.nan
    obj = composition_objective_s(problem, counts) if counts else math.inf
    if lower_bound_pipe_s is not None and bound == bound:
        bound = max(bound, lower_bound_pipe_s)     # T >= T_pipe >= the LP bound
    if status == cp_model.UNKNOWN and counts:
        name = "FEASIBLE"                          # the hint: a feasible solution of the same model
    if status == cp_model.INFEASIBLE and hint:
        # the incumbent constraint made it infeasible: the hint is optimal within rounding
        name, bound = "OPTIMAL", obj
    gap = 0.0 if name == "OPTIMAL" else ((obj - bound) / obj if math.isfinite(obj) and obj > 0 and bound == bound
                                         else math.nan)
    return CompositionResult(counts, name, obj, bound, max(0.0, gap), wall, n)


def lp_lower_bound_pipe_s(problem: CompositionProblem) -> float:
    """Lower bound on T_pipe: least T whose LP-relaxed capacity (fractional copies) covers G [s].

    capacity(T) = max sum_c x_c b_c (floor((T - phi_c)/tau_c) + 1) over x >= 0 in the
    inventory polytope; relaxing the floor to (T - phi_c)/tau_c + 1 keeps it an upper
    bound of the true capacity, so the least T found is a valid lower bound. Solved with
    scipy's HiGHS LP inside a bisection.
    """
    from scipy.optimize import linprog

    cands = problem.candidates
    types = sorted(problem.inventory)
    A = [[c.devices.get(t, 0) for c in cands] for t in types]
    bnd = [problem.inventory[t] for t in types]
    G = problem.global_batch_size

    def cap(T: float) -> float:
        rate = [-(c.micro_batch_size * max(0.0, (T - c.partition.fill_s) / c.partition.bottleneck_s + 1.0))
                if T >= c.partition.fill_s else 0.0 for c in cands]
        if not any(rate):
            return 0.0
        res = linprog(rate, A_ub=A, b_ub=bnd, bounds=(0, None), method="highs")
        return -res.fun if res.status == 0 else 0.0

    lo, hi = 0.0, min(c.partition.fill_s + (-(-G // c.micro_batch_size)) * c.partition.bottleneck_s for c in cands)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if cap(mid) >= G:
            hi = mid
        else:
            lo = mid
    return lo
