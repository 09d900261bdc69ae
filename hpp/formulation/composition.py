"""Composition: which candidate pipelines to build, how many copies, and the data split.

The composition model (what the CP-SAT model, the greedy heuristic and the
exhaustive oracle all minimise) prices a multiset of candidate copies as

    T = T_pipe + T_sync + T_opt
    T_pipe = least T with sum_c x_c * cap_c(T) >= G      (data balance, exact)
    T_sync = block-wise ring all-reduces of the used candidates' blocks (h = sum_c x_c), the
             slowest stage's sum; the CP-SAT model uses its relaxation max_c max_s ring(W_s, h)
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

import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence

import numpy as np
from ortools.sat.python import cp_model

from hpp.formulation.candidates import Candidate, tp_capacity
from hpp.formulation.cost_model import ring_allreduce_s
from hpp.formulation.data_balance import least_time_s
from hpp.profiles.cluster import Cluster, Link

__all__ = ["US_PER_S", "CompositionProblem", "CompositionResult", "composition_objective_s",
           "pipeline_time_for_counts", "greedy_composition", "solve_composition_cpsat", "SolverSettings",
           "lp_lower_bound_pipe_s", "composition_lower_bound_s", "composition_bounds", "build_composition_model", "block_sync_s", "fill_heuristic", "solo_objective_s"]

log = logging.getLogger(__name__)

US_PER_S = 1_000_000
_PER_COPY_MAX_VARS = 3000   # "auto": per-copy variables while sum of copy bounds stays below this


@dataclass(frozen=True)
class SolverSettings:
    """CP-SAT parameters, explicit (STYLE.md rule 5)."""

    max_time_in_seconds: float = 10.0
    num_workers: int = 0          # CP-SAT workers and candidate processes; 0 = one per usable core
    random_seed: int = 0
    log_search_progress: bool = False
    max_candidates: int = 200     # above this, CP-SAT sees the best candidates only (bound stays global)
    # stop when no better solution came for this long (None: use the full limit); 0.05 s gives the same plans
    # as 0.1 and 0.03 s on the 14 sweep inputs of 8-128 GPUs x 2-4 types (measured)
    patience_s: float | None = 0.05
    formulation: str = "auto"     # "per-copy" (linear), "product" (x_c * k_c), or "auto" (per-copy when small)


@dataclass
class CompositionProblem:
    """Candidates, inventory and global batch of one composition instance."""

    candidates: list[Candidate]
    cluster: Cluster
    global_batch_size: int
    sync_link: Link
    _sync_cache: dict = field(default_factory=dict, repr=False)
    _tp_cache: dict = field(default_factory=dict, repr=False)
    #: solo objective per candidate object (id), shared with sub-problems of the same instance
    solo_cache: dict = field(default_factory=dict, repr=False)

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

    def sync_s(self, c: int, h: int) -> float:
        """Gradient sync of one copy of candidate ``c`` among ``h`` pipelines [s] (memoised).

        The slowest stage's ring all-reduce of its whole gradient (one bucket) among the h
        holders, :func:`~hpp.formulation.cost_model.ring_allreduce_s` (bandwidth at the ring's
        chunk size, as in the cost model; the cost model splits a stage's gradient further
        into blocks).
        """
        key = (c, h)
        got = self._sync_cache.get(key)
        if got is None:
            got = self._sync_cache[key] = max(ring_allreduce_s(w, h, self.sync_link)
                                              for w in self.candidates[c].partition.stage_param_bytes)
        return got

    def sync_table_us(self, c: int, max_pipelines: int) -> list[int]:
        """``[sync_s(c, h) in integer microseconds (rounded up) for h = 1 .. max_pipelines]``, vectorised."""
        h = np.arange(1, max_pipelines + 1, dtype=np.float64)
        link = self.sync_link
        worst = np.zeros_like(h)
        for w in self.candidates[c].partition.stage_param_bytes:
            if w <= 0:
                continue
            chunk = w / h
            bw = np.full_like(h, link.max_bytes_per_s)
            if link.fit_gb_per_s is not None:
                a, b, cc = link.fit_gb_per_s
                x = np.log2(np.maximum(chunk, 1.0) / 1e6)
                fit = (a * x * x + b * x + cc) * 1e9
                bw = np.where(fit > 0, np.minimum(fit, link.max_bytes_per_s), link.max_bytes_per_s)
            t = 2.0 * (h - 1) / h * w / bw + 2.0 * (h - 1) * link.latency_s
            worst = np.maximum(worst, t)
        return [int(v) for v in np.ceil(worst * US_PER_S - 1e-6)]

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


def block_sync_s(problem: CompositionProblem, used: Sequence[int], h: int) -> float:
    """Block-wise gradient sync of ``h`` pipelines built from candidates ``used`` [s].

    As :func:`hpp.formulation.cost_model.estimate_plan` prices it: blocks from the union of the
    used candidates' boundaries; block j is ring-all-reduced among the h holders with the largest
    holder's bytes; a device serialises the blocks of its stage; T_sync = the slowest stage.
    Never below :meth:`CompositionProblem.sync_s` (splitting a gradient into blocks adds latency
    and lowers the fitted bandwidth), so the CP-SAT model's per-stage bucket is a relaxation.
    """
    if h <= 1:
        return 0.0
    cands = [problem.candidates[c] for c in used]
    cuts = sorted({b for c in cands for b in c.partition.boundaries})
    blocks = list(zip(cuts, cuts[1:]))
    ring = [ring_allreduce_s(max(sum(c.partition.layer_param_bytes[lo:hi]) for c in cands), h, problem.sync_link)
            for lo, hi in blocks]
    worst = 0.0
    for c in cands:
        bnd = c.partition.boundaries
        for lo, hi in zip(bnd, bnd[1:]):
            worst = max(worst, sum(r for (blo, _), r in zip(blocks, ring) if lo <= blo < hi))
    return worst


def composition_objective_s(problem: CompositionProblem, counts: dict[int, int]) -> float:
    """T_pipe + T_sync + T_opt of ``counts`` copies (see the module docstring) [s]; inf if empty."""
    counts = {c: x for c, x in counts.items() if x > 0}
    if not counts:
        return math.inf
    h = sum(counts.values())
    t_pipe = pipeline_time_for_counts(problem.candidates, counts, problem.global_batch_size)
    t_sync = block_sync_s(problem, list(counts), h)
    t_opt = max(problem.candidates[c].partition.optimizer_s for c in counts)
    return t_pipe + t_sync + t_opt


def _fill_in_order(problem: CompositionProblem, counts: dict[int, int], order: Sequence[int]
                   ) -> tuple[dict[int, int], list[int]]:
    """Add copies of each candidate of ``order`` in turn while they fit; (counts, copies added in order)."""
    counts = dict(counts)
    added: list[int] = []
    for c in order:
        while True:
            counts[c] = counts.get(c, 0) + 1
            if not problem.fits(counts):
                counts[c] -= 1
                if counts[c] == 0:
                    del counts[c]
                break
            added.append(c)
    return counts, added


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
            _, sequence = _fill_in_order(problem, {}, order)
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


def solo_objective_s(problem: CompositionProblem, c: int) -> float:
    """Objective of filling the inventory with copies of candidate ``c`` alone [s] (inf if none fit)."""
    key = id(problem.candidates[c])
    got = problem.solo_cache.get(key)
    if got is None:
        x = problem.max_copies(c)
        got = composition_objective_s(problem, {c: x}) if x > 0 else math.inf
        problem.solo_cache[key] = got
    return got


def fill_heuristic(problem: CompositionProblem, *, top_k: int = 4) -> tuple[dict[int, int], float]:
    """Heuristic (no bound): combine per-device-type fills, top up with mixed pipelines, then trim.

    1. Rank every candidate by :func:`solo_objective_s` (its copies alone, as many as fit).
    2. For each device type, keep the ``top_k`` single-type candidates; try every combination
       (one candidate per type, or none) with as many copies as fit.
    3. Top the best combination up with copies of multi-type candidates that use leftover devices.
    4. Trim: fewer copies of a candidate when that is faster (less gradient sync / fill).

    Returns
    -------
    (counts, objective_s)
    """
    cands = problem.candidates
    if not cands:
        return {}, math.inf
    solo = [solo_objective_s(problem, c) for c in range(len(cands))]
    by_type: dict[str, list[int]] = {}
    mixed: list[int] = []
    for c, cand in enumerate(cands):
        if not math.isfinite(solo[c]):
            continue
        if len(cand.devices) == 1:
            by_type.setdefault(next(iter(cand.devices)), []).append(c)
        else:
            mixed.append(c)
    options = [[None, *sorted(cs, key=solo.__getitem__)[:top_k]] for cs in by_type.values()]
    mixed.sort(key=solo.__getitem__)

    best: tuple[dict[int, int], float] = ({}, math.inf)
    for combo in itertools.product(*options):
        chosen = [c for c in combo if c is not None]
        counts = {c: problem.max_copies(c) for c in chosen}
        counts, _ = _fill_in_order(problem, counts, mixed[:top_k])
        obj = composition_objective_s(problem, counts)
        if obj < best[1]:
            best = (counts, obj)
    counts, obj = best
    improved = True
    while improved and counts:
        improved = False
        for c in list(counts):
            for f in (0.5, 0.75, 0.9):
                trial = dict(counts)
                trial[c] = int(counts[c] * f)
                if trial[c] == counts[c]:
                    continue
                if trial[c] == 0:
                    del trial[c]
                t = composition_objective_s(problem, trial)
                if t < obj * (1 - 1e-12):
                    counts, obj, improved = trial, t, True
                    break
    return counts, obj


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


class _Improvements(cp_model.CpSolverSolutionCallback):
    """Records when CP-SAT last improved its incumbent, and reports each improvement."""

    def __init__(self, report: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.last = time.perf_counter()
        self.report = report

    def on_solution_callback(self) -> None:
        self.last = time.perf_counter()
        if self.report is not None:
            self.report(f"CP-SAT incumbent {self.objective_value / US_PER_S:.4f} s, "
                        f"bound {self.best_objective_bound / US_PER_S:.4f} s (its model)")


def _solve_with_patience(solver: cp_model.CpSolver, model: cp_model.CpModel, patience_s: float | None,
                         report: Callable[[str], None] | None = None) -> int:
    """``solver.solve(model)``, stopped early once no better solution came for ``patience_s`` seconds."""
    cb = _Improvements(report)
    if patience_s is None:
        return solver.solve(model, cb)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            if time.perf_counter() - cb.last > patience_s:
                solver.stop_search()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return solver.solve(model, cb)
    finally:
        done.set()
        watcher.join()


def build_composition_model(problem: CompositionProblem, *, settings: SolverSettings = SolverSettings(),
                            hint: dict[int, int] | None = None, symmetry: bool = True,
                            incumbent_s: float | None = None, lower_bound_pipe_s: float | None = None
                            ) -> tuple[cp_model.CpModel, list]:
    """The CP-SAT model of the composition (see the module docstring) and its copy variables x_c.

    Objective in integer microseconds (``US_PER_S``); ``x_<c>`` is the number of copies of
    candidate c. ``incumbent_s`` adds the cutoff objective <= incumbent; ``lower_bound_pipe_s``
    the redundant LP bound on the pipeline time; ``hint`` goes in as a solution hint.
    """
    cands = problem.candidates
    G = problem.global_batch_size
    m = cp_model.CpModel()
    n = len(cands)
    ub = [problem.max_copies(c) for c in range(n)]
    H = max(1, sum(ub))
    H = min(H, problem.cluster.num_devices)
    # --- variables: x_c copies, k_c most micro-batches per copy, covered_c micro-batches over all copies
    per_copy = settings.formulation == "per-copy" or (settings.formulation == "auto"
                                                     and sum(ub) <= _PER_COPY_MAX_VARS)
    x, k, used, covered = [], [], [], []
    for c in range(n):
        kmax = -(-G // cands[c].micro_batch_size)
        xc = m.new_int_var(0, ub[c], f"x_{c}")
        uc = m.new_bool_var(f"used_{c}")
        kc = m.new_int_var(0, kmax, f"k_{c}")
        if per_copy:   # one (exists, micro-batches) pair per possible copy: linear, no product
            ys = [m.new_bool_var(f"y_{c}_{j}") for j in range(ub[c])]
            ks = [m.new_int_var(0, kmax, f"k_{c}_{j}") for j in range(ub[c])]
            for y, kk in zip(ys, ks):
                m.add(kk <= kmax * y)
                m.add(kk >= y)
                m.add(kc >= kk)
            if symmetry:   # copies in order: present ones first, most micro-batches first
                for j in range(1, ub[c]):
                    m.add(ys[j] <= ys[j - 1])
                    m.add(ks[j] <= ks[j - 1])
            m.add(xc == sum(ys))
            covered.append(sum(ks))
        else:          # x_c * k_c as a CP-SAT product
            if not symmetry:   # one boolean per copy: the symmetric model, for the ablation
                ys = [m.new_bool_var(f"y_{c}_{j}") for j in range(ub[c])]
                m.add(xc == sum(ys))
            pc = m.new_int_var(0, ub[c] * kmax, f"p_{c}")
            m.add_multiplication_equality(pc, [xc, kc])
            covered.append(pc)
        x.append(xc), k.append(kc), used.append(uc)
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
    m.add(sum(covered[c] * cands[c].micro_batch_size for c in range(n)) >= G)
    # --- pipeline time: phi + (k - 1) tau for every used candidate
    for c in range(n):
        p = cands[c].partition
        m.add(t_pipe >= _us(p.fill_s - p.bottleneck_s) + k[c] * _us(p.bottleneck_s)).only_enforce_if(used[c])
    # --- gradient sync: a table over the number of pipelines h per candidate
    for c in range(n):
        table = [0] + problem.sync_table_us(c, H)
        sync_c = m.new_int_var(0, max(table), f"sync_{c}")
        m.add_element(h, table, sync_c)
        m.add(t_sync >= sync_c).only_enforce_if(used[c])
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
    return m, x


def solve_composition_cpsat(problem: CompositionProblem, *, settings: SolverSettings = SolverSettings(),
                            hint: dict[int, int] | None = None, symmetry: bool = True,
                            incumbent_s: float | None = None,
                            lower_bound_pipe_s: float | None = None,
                            progress: Callable[[str], None] | None = None) -> CompositionResult:
    """Solve the composition with OR-Tools CP-SAT (model: :func:`build_composition_model`).

    ``progress`` receives one line per improved incumbent (the CLI prints them on stderr).

    Never raises on a time limit: returns the best solution found (or the hint) with its gap.
    CP-SAT prices gradient sync with one bucket per stage, a relaxation of the block-wise sync
    of :func:`composition_objective_s`: its bound is valid; the returned objective is exact.
    """
    t0 = time.perf_counter()
    n = len(problem.candidates)
    m, x = build_composition_model(problem, settings=settings, hint=hint, symmetry=symmetry,
                                   incumbent_s=incumbent_s, lower_bound_pipe_s=lower_bound_pipe_s)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = settings.max_time_in_seconds
    solver.parameters.num_workers = settings.num_workers
    solver.parameters.random_seed = settings.random_seed
    solver.parameters.log_search_progress = settings.log_search_progress
    status = _solve_with_patience(solver, m, settings.patience_s, progress)
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


class _CapacityLP:
    """LP relaxation of the samples a set of candidates can finish by time T (GLOP, one model reused).

    Columns: candidate c finishes relaxed ``r_c(T) = b_c ((T - phi_c)/tau_c + 1)`` samples per copy
    for T >= phi_c (0 before). Only the device counts constrain the LP, so a candidate is left
    out when another with the same device counts has slope ``b/tau``, intercept
    ``b (1 - phi/tau)`` and fill phi all at least as good (its rate is then >= at every T):
    this changes no LP value.
    """

    def __init__(self, problem: CompositionProblem, allowed: Sequence[int], *, columns: list | None = None) -> None:
        from ortools.linear_solver import pywraplp

        self._pywraplp = pywraplp
        self.problem = problem
        # ``columns``: the caller's already reduced columns for ``allowed`` (see composition_bounds)
        self.cands = columns if columns is not None else _lp_columns([problem.candidates[c] for c in allowed])
        self.lp = pywraplp.Solver.CreateSolver("GLOP")
        self.xs = [self.lp.NumVar(0.0, self.lp.infinity(), f"x_{i}") for i in range(len(self.cands))]
        for t, n in problem.inventory.items():
            ct = self.lp.Constraint(0.0, float(n))
            for x, cand in zip(self.xs, self.cands):
                if t in cand.devices:
                    ct.SetCoefficient(x, float(cand.devices[t]))
        self.obj = self.lp.Objective()
        self.obj.SetMaximization()
        self.solves = 0

    def _solve(self, T: float) -> tuple[float, list[float]]:
        """(capacity(T), the fractional copies x) [samples, copies]."""
        any_rate = False
        for x, cand in zip(self.xs, self.cands):
            p = cand.partition
            rate = cand.micro_batch_size * ((T - p.fill_s) / p.bottleneck_s + 1.0) if T >= p.fill_s else 0.0
            self.obj.SetCoefficient(x, rate)
            any_rate |= rate > 0
        self.solves += 1
        if not any_rate or self.lp.Solve() != self._pywraplp.Solver.OPTIMAL:
            return 0.0, []
        return self.obj.Value(), [x.solution_value() for x in self.xs]

    def capacity(self, T: float) -> float:
        """max sum_c x_c b_c ((T - phi_c)/tau_c + 1) over fractional copies of the candidates."""
        return self._solve(T)[0]

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
        hi = min(c.partition.fill_s + (-(-G // c.micro_batch_size)) * c.partition.bottleneck_s
                 for c in self.cands)
        for _ in range(iterations):
            cap, xs = self._solve(hi)
            if cap < G or not xs:
                break
            slope = sum(x * c.micro_batch_size / c.partition.bottleneck_s for x, c in zip(xs, self.cands) if x > 0)
            icpt = sum(x * c.micro_batch_size * (1.0 - c.partition.fill_s / c.partition.bottleneck_s)
                       for x, c in zip(xs, self.cands) if x > 0)
            if slope <= 0:
                break
            floor = max(c.partition.fill_s for x, c in zip(xs, self.cands) if x > 0)
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
    groups: dict[tuple, list] = {}
    for i, c in enumerate(cands):
        groups.setdefault(tuple(sorted(c.devices.items())), []).append(i)
    out = []
    for idx in groups.values():
        members = [cands[i] for i in idx]
        if len(members) == 1:
            out.extend(members)
            continue
        f = np.array([[-c.micro_batch_size / c.partition.bottleneck_s,
                       -c.micro_batch_size * (1.0 - c.partition.fill_s / c.partition.bottleneck_s),
                       c.partition.fill_s] + ([extra[i]] if extra is not None else []) for i, c in zip(idx, members)])
        order = np.lexsort(tuple(f[:, k] for k in range(f.shape[1] - 1, -1, -1)))
        f = f[order]
        dom = np.all(f[None, :, :] <= f[:, None, :], axis=2)          # dom[i, j]: j as good as i everywhere
        earlier = np.arange(len(f))[None, :] < np.arange(len(f))[:, None]
        keep = ~np.any(dom & earlier, axis=1)
        out.extend(members[k] for k in order[keep])
    return out


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


def composition_bounds(problem: CompositionProblem, *, num_classes: int = 4) -> tuple[float, float]:
    """(LB on T_pipe over all candidates, LB on T_pipe + T_sync + T_opt) [s].

    The first equals :func:`lp_lower_bound_pipe_s` (the class of all candidates computes it).
    Sync classes: a plan of h >= 2 pipelines has T_sync >= sync_c(2) for every candidate c it
    uses (sync grows with h). For thresholds 0 = s_0 < s_1 < ... < s_K = inf, a plan whose sync
    lies in [s_i, s_{i+1}) uses only candidates with sync_c(2) < s_{i+1}, so its objective is at
    least s_i + LB_pipe(those candidates) + their least optimizer step. One-pipeline plans
    (no sync) need at least the fastest single copy's time. The bound is the least over the
    classes (LB_pipe: :class:`_CapacityLP`). The LP columns are reduced once for all classes,
    with sync_c(2) as a fourth Pareto criterion, so that a dropped column's dominator is in
    every class the column is in.
    """
    cands = problem.candidates
    if not cands:
        return math.inf, math.inf
    G = problem.global_batch_size
    single = min(c.partition.fill_s + (-(-G // c.micro_batch_size) - 1) * c.partition.bottleneck_s
                 + c.partition.optimizer_s for c in cands)
    s2 = [problem.sync_s(c, 2) for c in range(len(cands))]
    s2_of = {id(c): s for c, s in zip(cands, s2)}
    columns = _lp_columns(cands, s2)
    levels = sorted(set(s2))
    cuts = sorted({levels[int(round(q * (len(levels) - 1)))] for q in np.linspace(0, 1, num_classes + 1)[1:]})
    thresholds = [0.0, *cuts]
    best, pipe_all = single, math.inf
    for i, lo in enumerate(thresholds):
        hi = thresholds[i + 1] if i + 1 < len(thresholds) else math.inf
        allowed = [c for c in range(len(cands)) if s2[c] < hi]
        if not allowed:
            continue
        t_opt = min(cands[c].partition.optimizer_s for c in allowed)
        cols = [c for c in columns if s2_of[id(c)] < hi]
        pipe = _CapacityLP(problem, allowed, columns=cols).least_time_s()
        if hi == math.inf:
            pipe_all = pipe
        best = min(best, lo + pipe + t_opt)
    return pipe_all, best
