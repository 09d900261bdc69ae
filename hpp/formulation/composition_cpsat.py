"""The composition as a CP-SAT model (times in integer microseconds, ``US_PER_S``).

Variables x_c (copies), k_c (most micro-batches per copy), h (pipelines); one constraint family
each: usage links, inventory per device type and per TP-group size, samples cover G, pipeline time,
gradient sync (a table over h per candidate), optimizer step; redundant: the LP bound of the
pipeline time; cutoff: objective <= incumbent. The objective is T_pipe + T_sync + T_opt.

Solved on a *bound problem* (:meth:`CompositionProblem.bound_problem`) every time is rounded DOWN
to whole microseconds, so CP-SAT's ``best_objective_bound`` is a lower bound of the real-valued
bound model, hence of the cost model's iteration time of every plan of the candidates. On a search
problem times round up (the old, conservative pricing of answers).

Determinism: no wall-clock cut unless ``SolverSettings.max_time_in_seconds`` is set; the search
stops at ``deterministic_time`` (CP-SAT's ``max_deterministic_time``); several workers run
interleaved (``interleave_search``), so the same model, seed and worker count give the same answer.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

from ortools.sat.python import cp_model

from hpp.formulation.composition import (_PER_COPY_MAX_VARS, US_PER_S, CompositionProblem, composition_objective_s,
                                         to_us)
from hpp.formulation.solver_settings import SolverSettings, parse_cpsat_params

__all__ = ["CompositionResult", "build_composition_model", "solve_composition_cpsat", "cpsat_solver"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompositionResult:
    """Result record of a composition solve (scipy OptimizeResult style).

    Attributes
    ----------
    counts : dict[int, int]
        Copies per candidate index.
    status : str
        CP-SAT's status on its own model: ``OPTIMAL``, ``FEASIBLE``, ``INFEASIBLE``, ``UNKNOWN``.
    objective_s, bound_s : float
        Composition objective of ``counts`` and CP-SAT's bound of its model [s] (a raw answer: the
        solve path, :func:`hpp.solvers.solve`, turns it into the one :class:`~hpp.solvers.SolveResult`).
    gap : float
        (objective - bound) / objective; 0 when proven optimal; nan without a bound.
    wall_s : float
        CP-SAT's time (model and solve) [s]; 0 when it was skipped.
    num_candidates : int
    solver : str
    hit_time_limit : bool
        The wall-clock limit (only when the user set one) stopped the search.
    """

    counts: dict
    status: str
    objective_s: float
    bound_s: float
    gap: float
    wall_s: float
    num_candidates: int
    solver: str = "cp-sat"
    hit_time_limit: bool = False


class _Improvements(cp_model.CpSolverSolutionCallback):
    """Reports each improved CP-SAT solution (progress lines only: it never stops the search)."""

    def __init__(self, report: Callable[[str], None]) -> None:
        super().__init__()
        self.report = report

    def on_solution_callback(self) -> None:
        self.report(f"CP-SAT solution {self.objective_value / US_PER_S:.4f} s in its bound model, "
                    f"bound {self.best_objective_bound / US_PER_S:.4f} s")


def cpsat_solver(settings: SolverSettings) -> cp_model.CpSolver:
    """A CpSolver with the settings' parameters: deterministic time always, the wall limit only when set,
    interleaved workers (deterministic), seed, then the text parameters over them."""
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_deterministic_time = settings.deterministic_time
    if settings.max_time_in_seconds is not None:
        p.max_time_in_seconds = settings.max_time_in_seconds
    workers = settings.num_workers
    if workers == 0:
        from hpp.forkshare import usable_cores
        workers = usable_cores()
    p.num_workers = max(1, workers)
    if p.num_workers > 1:
        p.interleave_search = True
    p.random_seed = settings.random_seed
    p.log_search_progress = settings.log_search_progress
    if settings.cpsat_params:
        from google.protobuf import text_format
        p.merge_text_format(text_format.MessageToString(parse_cpsat_params(settings.cpsat_params)))
    return solver


def build_composition_model(problem: CompositionProblem, *, settings: SolverSettings = SolverSettings(),
                            hint: dict[int, int] | None = None, symmetry: bool = True,
                            incumbent_s: float | None = None, lower_bound_pipe_s: float | None = None
                            ) -> tuple[cp_model.CpModel, list]:
    """The CP-SAT model of the composition (see the module docstring) and its copy variables x_c.

    Objective in integer microseconds (``US_PER_S``); ``x_<c>`` is the number of copies of
    candidate c. ``incumbent_s`` adds the cutoff objective <= incumbent; ``lower_bound_pipe_s``
    the redundant LP bound on the pipeline time; ``hint`` goes in as a solution hint. On a bound
    problem (``problem.sync_floor`` set) every time is rounded down, else up.
    """
    down = problem.sync_floor is not None

    def _us(x: float) -> int:
        return to_us(x, down=down)

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
        m.add(t_pipe >= to_us(lower_bound_pipe_s, down=True))
    if incumbent_s is not None and math.isfinite(incumbent_s):
        m.add(t_pipe + t_sync + t_opt <= to_us(incumbent_s) + 3)  # + rounding of the three terms
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

    ``progress`` receives one line per improved solution (the CLI prints them on stderr).
    Never raises on a limit: returns the best solution found (or the hint) and CP-SAT's bound
    of its model (nan when it proved nothing; with ``incumbent_s`` a cutoff, INFEASIBLE means
    nothing beats the incumbent in the model: the bound is then the incumbent's model value).
    """
    t0 = time.perf_counter()
    n = len(problem.candidates)
    m, x = build_composition_model(problem, settings=settings, hint=hint, symmetry=symmetry,
                                   incumbent_s=incumbent_s, lower_bound_pipe_s=lower_bound_pipe_s)
    solver = cpsat_solver(settings)
    status = solver.solve(m, _Improvements(progress) if progress is not None else None)
    wall = time.perf_counter() - t0
    name = solver.status_name(status)
    hit = (settings.max_time_in_seconds is not None and status not in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
           and solver.wall_time >= 0.95 * settings.max_time_in_seconds)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        counts = {c: int(solver.value(x[c])) for c in range(n) if solver.value(x[c]) > 0}
        bound = solver.best_objective_bound / US_PER_S
    else:
        counts = dict(hint or {})
        bound = solver.best_objective_bound / US_PER_S if status == cp_model.UNKNOWN else math.nan
    obj = composition_objective_s(problem, counts) if counts else math.inf
    gap = (obj - bound) / obj if math.isfinite(obj) and obj > 0 and bound == bound else math.nan
    return CompositionResult(counts, name, obj, bound, max(0.0, gap) if gap == gap else gap, wall, n,
                             hit_time_limit=hit)
