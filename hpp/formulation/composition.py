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

The heuristics that give the incumbent are in :mod:`hpp.formulation.heuristics`, the LP
bound in :mod:`hpp.formulation.lp_bound`.
"""

from __future__ import annotations

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
           "pipeline_time_for_counts", "solve_composition_cpsat", "SolverSettings", "build_composition_model",
           "block_sync_s"]

log = logging.getLogger(__name__)

US_PER_S = 1_000_000
_PER_COPY_MAX_VARS = 3000   # "auto": per-copy variables while sum of copy bounds stays below this


@dataclass(frozen=True)
class SolverSettings:
    """How the planner's composition step runs CP-SAT (all parameters explicit).

    Attributes
    ----------
    max_time_in_seconds : float
        CP-SAT's time limit [s] (what is left of it after the LP bound).
    num_workers : int
        CP-SAT workers, and processes for the stage balance and the LP bound; 0 = one per usable core.
    random_seed : int
    log_search_progress : bool
        CP-SAT's own log on stderr.
    max_candidates : int
        CP-SAT runs when there are at most this many candidates (it then sees them all and can prove
        optimality). With more it could see only the best of them (chosen per device-type set) and
        could not certify the plan: it is skipped, and the heuristic incumbent with the LP bound over
        all candidates decides, unless ``cpsat_on_subset``.
    cpsat_on_subset : bool
        Run CP-SAT on the best ``max_candidates`` candidates even when there are more (it may improve
        the plan, never certify it). Off by default: on the benchmark's 32- and 64-GPU inputs of 2-4
        types, given the best 13 to 200 candidates, it found no solution at all within its patience
        (status UNKNOWN) and cost 0.07-0.17 s per search (measured).
    patience_s : float or None
        Stop CP-SAT when no better solution came for this long [s] (None: use the full limit); 0.05 s
        gave the same plans as 0.1 and 0.03 s on 14 sweep inputs of 8-128 GPUs x 2-4 types (measured).
    formulation : str
        ``"per-copy"`` (linear), ``"product"`` (x_c * k_c), or ``"auto"`` (per-copy when small).
    """

    max_time_in_seconds: float = 10.0
    num_workers: int = 0
    random_seed: int = 0
    log_search_progress: bool = False
    max_candidates: int = 200
    cpsat_on_subset: bool = False
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
    #: ring all-reduce times by (bytes, holders) (see :meth:`ring_s`), shared likewise (same sync link)
    ring_cache: dict = field(default_factory=dict, repr=False)
    #: max_copies and _copy_rows, by candidate index and by (device counts, TP-group counts)
    _ub_cache: dict = field(default_factory=dict, repr=False)
    _rows_cache: dict = field(default_factory=dict, repr=False)

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
            stage_bytes = self.candidates[c].partition.stage_param_bytes
            got = self.ring_cache.get((stage_bytes, h))       # candidates share stage gradients
            if got is None:
                got = self.ring_cache[stage_bytes, h] = max(self.ring_s(w, h) for w in stage_bytes)
            self._sync_cache[key] = got
        return got

    def sync_s_all(self, h: int) -> list[float]:
        """``[sync_s(c, h) for every candidate c]`` [s], the same floats: :meth:`ring_s` once per distinct
        stage gradient size, then each candidate's largest (max is exact)."""
        owner, sizes = [], []
        for c, cand in enumerate(self.candidates):
            stage_bytes = cand.partition.stage_param_bytes
            owner.extend([c] * len(stage_bytes))
            sizes.extend(stage_bytes)
        if not sizes:
            return [0.0] * len(self.candidates)
        distinct, inverse = np.unique(np.array(sizes, dtype=np.float64), return_inverse=True)
        ring = np.array([self.ring_s(w, h) for w in distinct.tolist()])
        out = np.full(len(self.candidates), -np.inf)
        np.maximum.at(out, np.array(owner), ring[inverse.reshape(-1)])
        return out.tolist()

    def ring_s(self, num_bytes: float, h: int) -> float:
        """Ring all-reduce of ``num_bytes`` among ``h`` holders over the sync link [s] (memoised).

        :func:`~hpp.formulation.cost_model.ring_allreduce_s`; candidates share stage gradients of the
        same size, so the memo answers most calls. (The memo also holds :meth:`sync_s` per tuple of
        stage bytes.)
        """
        key = (num_bytes, h)
        got = self.ring_cache.get(key)
        if got is None:
            got = self.ring_cache[key] = ring_allreduce_s(num_bytes, h, self.sync_link)
        return got

    def sync_table_us(self, c: int, max_pipelines: int) -> list[int]:
        """``[sync_s(c, h) in integer microseconds (rounded up) for h = 1 .. max_pipelines]``, vectorised."""
        return self.sync_tables_us([c], max_pipelines)[0]

    def sync_tables_us(self, cs: Sequence[int], max_pipelines: int) -> list[list[int]]:
        """:meth:`sync_table_us` of each candidate of ``cs``, vectorised over all their stages at once."""
        h = np.arange(1, max_pipelines + 1, dtype=np.float64)
        link = self.sync_link
        owner, stage_bytes = [], []           # one row per stage with a gradient
        for i, c in enumerate(cs):
            for w in self.candidates[c].partition.stage_param_bytes:
                if w > 0:
                    owner.append(i)
                    stage_bytes.append(w)
        worst = np.zeros((len(cs), len(h)))
        if stage_bytes:
            w = np.array(stage_bytes, dtype=np.float64)[:, None]
            chunk = w / h
            bw = np.full_like(chunk, link.max_bytes_per_s)
            if link.fit_gb_per_s is not None:
                a, b, cc = link.fit_gb_per_s
                x = np.log2(np.maximum(chunk, 1.0) / 1e6)
                fit = (a * x * x + b * x + cc) * 1e9
                bw = np.where(fit > 0, np.minimum(fit, link.max_bytes_per_s), link.max_bytes_per_s)
            t = 2.0 * (h - 1) / h * w / bw + 2.0 * (h - 1) * link.latency_s
            owner = np.array(owner)
            first = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])   # each owner's first row
            worst[owner[first]] = np.maximum(0.0, np.maximum.reduceat(t, first, axis=0))
        us = np.ceil(worst * US_PER_S - 1e-6)
        if not np.isfinite(us).all():
            return [[int(v) for v in row] for row in us]     # int() raises on them, as it did
        return us.astype(np.int64).tolist()

    def max_copies(self, c: int) -> int:
        """Most copies of candidate ``c`` the inventory and the nodes' TP-group capacity hold alone (memoised)."""
        ub = self._ub_cache.get(c)
        if ub is None:
            cand = self.candidates[c]
            usage = _usage_key(cand)
            ub = self._ub_cache.get(usage)    # candidates of the same device and TP-group counts share it
            if ub is None:
                inv = self.inventory
                ub = min(inv.get(t, 0) // n for t, n in cand.devices.items())
                for (t, s), n in cand.tp_groups.items():
                    ub = min(ub, self.tp_capacity(t, s) // n)
                self._ub_cache[usage] = ub
            self._ub_cache[c] = ub
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

    def _copy_rows(self, c: int) -> tuple[tuple, dict, frozenset] | None:
        """What one copy of candidate ``c`` adds to the rows :meth:`fits` checks (memoised).

        ``(devices, groups, sizes)``: ``devices`` the (type, devices) pairs; ``groups`` maps each
        (type, TP size > 1) row it adds to, to its devices in groups of that size or larger; ``sizes``
        the rows of the group sizes it has (the TP rows fits checks once it is used). None when the
        copy does not fit this bookkeeping (a TP group of a type it has no devices of, a count that is
        not positive, or no device at all); the callers then use :meth:`fits`.
        """
        if c in self._rows_cache:
            return self._rows_cache[c]
        cand = self.candidates[c]
        usage = _usage_key(cand)
        if usage not in self._rows_cache:      # candidates of the same device and TP-group counts share rows
            self._rows_cache[usage] = _usage_rows(cand)
        rows = self._rows_cache[c] = self._rows_cache[usage]
        return rows


def _usage_key(cand: Candidate) -> tuple[tuple, tuple]:
    """(devices, TP groups) of one copy as a hashable key: candidates with equal keys fit alike."""
    return tuple(cand.devices.items()), tuple(cand.tp_groups.items())


def _usage_rows(cand: Candidate) -> tuple[tuple, dict, frozenset] | None:
    """:meth:`CompositionProblem._copy_rows` of a candidate (computed)."""
    groups = cand.tp_groups
    if not (cand.devices and all(n > 0 for n in cand.devices.values()) and all(n > 0 for n in groups.values())
            and all(t in cand.devices for t, _ in groups)):
        return None
    largest: dict[str, int] = {}
    for t, s in groups:
        largest[t] = max(largest.get(t, 0), s)
    coefs = {(t, s): sum(n * g[1] for g, n in groups.items() if g[0] == t and g[1] >= s)
             for t, top in largest.items() for s in range(2, top + 1)}
    return tuple(cand.devices.items()), coefs, frozenset(g for g in groups if g[1] > 1)


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
        Objective of ``counts`` and a proven lower bound [s] (in the planner's result: the best of
        CP-SAT's and the LP bound over all candidates).
    gap : float
        (objective - bound) / objective; 0 when proven optimal; nan without a bound.
    wall_s : float
        CP-SAT's time (model and solve) [s]; 0 when it was skipped.
    num_candidates : int
    solver : str
        ``"cp-sat"`` (it ran; ``PlannerResult.stats["plan_from"]`` says whether its solution or the
        heuristic incumbent is the plan), ``"heuristic"`` (CP-SAT skipped above ``max_candidates``:
        incumbent plus LP bound) or ``"greedy"`` (the ``greedy`` solver: no bound, status ``HEURISTIC``).
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
            self.report(f"CP-SAT solution {self.objective_value / US_PER_S:.4f} s in its relaxed model (sync one "
                        f"bucket per stage; priced exactly at the end), bound {self.best_objective_bound / US_PER_S:.4f} s")


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
    tables = problem.sync_tables_us(range(n), H)
    for c in range(n):
        table = [0] + tables[c]
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
