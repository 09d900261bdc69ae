"""The composition as a CP-SAT model (times in integer microseconds, ``US_PER_S``).

Variables x_c (copies), k_c (most micro-batches per copy), h (pipelines); one function per family,
added in this order by :func:`build_composition_model` (the order fixes the model, hence the search):

    _candidate_variables   x_c, used_c, k_c, micro-batches covered (per-copy or product formulation)
    _order_copies          symmetry: a candidate's copies in order (per-copy formulation)
    _time_variables        h and the objective terms t_pipe, t_sync, t_opt [us]
    _usage_links           used_c <=> x_c >= 1; h = sum_c x_c
    _inventory             devices per type and per TP-group size
    _samples               the micro-batches cover the global batch G
    _pipeline_time         t_pipe >= fill + (k_c - 1) bottleneck of every used candidate
    _gradient_sync         t_sync >= sync_c(h), a table over h per candidate
    _optimizer_step        t_opt >= the optimizer step of every used candidate
    _lp_cut                redundant: t_pipe >= the LP bound of the pipeline time
    _cutoff                objective <= the incumbent's

The objective is T_pipe + T_sync + T_opt.

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
from dataclasses import dataclass, field
from typing import Any, Callable

from google.protobuf import text_format
from ortools.sat.python import cp_model

from hpp.forkshare import usable_cores
from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.composition.problem import _PER_COPY_MAX_VARS, US_PER_S, CompositionProblem, to_us
from hpp.formulation.composition.settings import SolverSettings, parse_cpsat_params
from hpp.pruning.rules import copy_order_pairs

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
        solve path, :func:`hpp.formulation.composition.solve.solve`, turns it into the one :class:`~hpp.formulation.composition.solve.SolveResult`).
    gap : float
        :func:`hpp.formulation.composition.solve.gap` of the two (the one gap definition).
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
        workers = usable_cores()
    p.num_workers = max(1, workers)
    if p.num_workers > 1:
        p.interleave_search = True
    p.random_seed = settings.random_seed
    p.log_search_progress = settings.log_search_progress
    if settings.cpsat_params:
        p.merge_text_format(text_format.MessageToString(parse_cpsat_params(settings.cpsat_params)))
    return solver


@dataclass
class _Model:
    """The variables of one composition model (lists indexed by candidate) and how times are rounded."""

    m: cp_model.CpModel
    problem: CompositionProblem
    down: bool                      # a bound problem: every time rounded down, else up
    ub: list[int]                   # most copies per candidate
    H: int                          # most pipelines
    x: list = field(default_factory=list)        # copies
    k: list = field(default_factory=list)        # most micro-batches per copy
    used: list = field(default_factory=list)     # x_c >= 1
    covered: list = field(default_factory=list)  # micro-batches over all copies (a variable or a sum)
    h: Any = None
    t_pipe: Any = None
    t_sync: Any = None
    t_opt: Any = None

    def us(self, x_s: float) -> int:
        """``x_s`` seconds in integer microseconds, rounded as the model rounds (:func:`to_us`)."""
        return to_us(x_s, down=self.down)


def _candidate_variables(mo: _Model, per_copy: bool, symmetry: bool) -> None:
    """Variables x_c (copies), used_c, k_c (most micro-batches per copy) and the micro-batches covered_c,
    in one of two formulations: one (exists, micro-batches) pair per possible copy, or the product x_c * k_c."""
    m, cands, G = mo.m, mo.problem.candidates, mo.problem.global_batch_size
    for c in range(len(cands)):
        kmax = -(-G // cands[c].micro_batch_size)
        xc = m.new_int_var(0, mo.ub[c], f"x_{c}")
        uc = m.new_bool_var(f"used_{c}")
        kc = m.new_int_var(0, kmax, f"k_{c}")
        if per_copy:
            mo.covered.append(_per_copy_samples(m, c, xc, kc, mo.ub[c], kmax, symmetry))
        else:
            mo.covered.append(_product_samples(m, c, xc, kc, mo.ub[c], kmax, symmetry))
        mo.x.append(xc), mo.k.append(kc), mo.used.append(uc)


def _per_copy_samples(m: cp_model.CpModel, c: int, xc, kc, n: int, kmax: int, symmetry: bool):
    """Per copy j of candidate c: y_cj (exists) and k_cj micro-batches, 1 <= k_cj <= kmax when it exists
    (linear, no product); x_c = sum_j y_cj, k_c >= k_cj; returns sum_j k_cj."""
    ys = [m.new_bool_var(f"y_{c}_{j}") for j in range(n)]
    ks = [m.new_int_var(0, kmax, f"k_{c}_{j}") for j in range(n)]
    for y, kk in zip(ys, ks):
        m.add(kk <= kmax * y)
        m.add(kk >= y)
        m.add(kc >= kk)
    if symmetry:
        _order_copies(m, ys, ks)
    m.add(xc == sum(ys))
    return sum(ks)


def _order_copies(m: cp_model.CpModel, ys: list, ks: list) -> None:
    """Symmetry: a candidate's copies in order, present ones first, most micro-batches first (the pruning rule
    :func:`~hpp.pruning.rules.copy_order_pairs`)."""
    for j, i in copy_order_pairs(len(ys)):
        m.add(ys[j] <= ys[i])
        m.add(ks[j] <= ks[i])


def _product_samples(m: cp_model.CpModel, c: int, xc, kc, n: int, kmax: int, symmetry: bool):
    """p_c = x_c * k_c as a CP-SAT product (every copy runs k_c micro-batches); without ``symmetry`` also one
    boolean per copy summing to x_c (the symmetric model, for the ablation); returns p_c."""
    if not symmetry:
        ys = [m.new_bool_var(f"y_{c}_{j}") for j in range(n)]
        m.add(xc == sum(ys))
    pc = m.new_int_var(0, n * kmax, f"p_{c}")
    m.add_multiplication_equality(pc, [xc, kc])
    return pc


def _time_variables(mo: _Model) -> None:
    """Variables h (pipelines) and the three objective terms t_pipe, t_sync, t_opt [us], with their horizons."""
    m, p, cands, G = mo.m, mo.problem, mo.problem.candidates, mo.problem.global_batch_size
    mo.h = m.new_int_var(1, mo.H, "num_pipelines")
    horizon = mo.us(max(c.partition.fill_s + (-(-G // c.micro_batch_size)) * c.partition.bottleneck_s
                        for c in cands)) + 1
    mo.t_pipe = m.new_int_var(0, horizon, "t_pipe_us")
    # the largest sync over every h (per-candidate floor tables need not grow with h: the hierarchical form is
    # allowed only where the group size divides h)
    if p.floor_table is not None:
        t_sync_max = max((max(row) for row in p.sync_tables_us(range(len(cands)), mo.H)), default=0) + 2
    else:
        t_sync_max = max(mo.us(p.sync_s(c, mo.H)) for c in range(len(cands))) + 2
    mo.t_sync = m.new_int_var(0, max(t_sync_max, 1), "t_sync_us")
    mo.t_opt = m.new_int_var(0, max(mo.us(c.partition.optimizer_s) for c in cands) + 1, "t_opt_us")


def _usage_links(mo: _Model) -> None:
    """Usage: used_c <=> x_c >= 1, a used candidate runs k_c >= 1 micro-batches; h = sum_c x_c."""
    m = mo.m
    for c in range(len(mo.x)):
        m.add(mo.x[c] >= 1).only_enforce_if(mo.used[c])
        m.add(mo.x[c] == 0).only_enforce_if(mo.used[c].Not())
        m.add(mo.k[c] >= 1).only_enforce_if(mo.used[c])
    m.add(mo.h == sum(mo.x))


def _inventory(mo: _Model) -> None:
    """Inventory: devices per type, and per TP-group size s the devices in groups of size >= s the nodes hold."""
    m, p, cands, x = mo.m, mo.problem, mo.problem.candidates, mo.x
    n = len(cands)
    for t, cnt in p.inventory.items():
        terms = [x[c] * cands[c].devices[t] for c in range(n) if t in cands[c].devices]
        if terms:
            m.add(sum(terms) <= cnt)
        sizes = sorted({kk[1] for cd in cands for kk in cd.tp_groups if kk[0] == t and kk[1] > 1})
        for s in sizes:
            terms = [x[c] * sum(nn * kk[1] for kk, nn in cands[c].tp_groups.items() if kk[0] == t and kk[1] >= s)
                     for c in range(n)]
            m.add(sum(terms) <= p.tp_capacity(t, s) * s)


def _samples(mo: _Model) -> None:
    """Samples: the copies' micro-batches cover the global batch G."""
    cands = mo.problem.candidates
    mo.m.add(sum(mo.covered[c] * cands[c].micro_batch_size for c in range(len(cands))) >= mo.problem.global_batch_size)


def _pipeline_time(mo: _Model) -> None:
    """Pipeline time: t_pipe >= fill + (k_c - 1) bottleneck for every used candidate."""
    for c, cand in enumerate(mo.problem.candidates):
        p = cand.partition
        mo.m.add(mo.t_pipe >= mo.us(p.fill_s - p.bottleneck_s) + mo.k[c] * mo.us(p.bottleneck_s)
                 ).only_enforce_if(mo.used[c])


_SYNC_BYTES_UNIT = 1_000_000      # bytes per unit of W in :func:`_gradient_sync_compact`


def _gradient_sync_compact(mo: _Model) -> None:
    """Gradient sync of a bound problem without floor tables: its floor is W_c times a factor of h (SyncFloor), so
    t_sync >= W_max f(h), W_max >= W_c of every used candidate (whole MB) and f(h) one table (us per MB), both rounded
    down: O(n + H) instead of n tables of H entries."""
    m, p = mo.m, mo.problem
    cands = p.candidates
    per = [int(math.floor(p.sync_floor.seconds(1.0, h) * _SYNC_BYTES_UNIT * US_PER_S)) for h in range(1, mo.H + 1)]
    w = [int(max(c.partition.stage_param_bytes, default=0.0) // _SYNC_BYTES_UNIT) for c in cands]
    wmax = m.new_int_var(0, max(w, default=0), "sync_bytes_mb")
    for c, wc in enumerate(w):
        if wc > 0:
            m.add(wmax >= wc).only_enforce_if(mo.used[c])
    f = m.new_int_var(0, max(per, default=0), "sync_us_per_mb")
    m.add_element(mo.h, [0] + per, f)
    prod = m.new_int_var(0, max(w, default=0) * max(per, default=0), "sync_floor_us")
    m.add_multiplication_equality(prod, [wmax, f])
    m.add(mo.t_sync >= prod)


def _gradient_sync(mo: _Model) -> None:
    """Gradient sync: t_sync >= sync_c(h) for every used candidate, a table over the number of pipelines h (on a
    bound problem without per-candidate floor tables and more than 256 pipelines: :func:`_gradient_sync_compact`)."""
    if mo.problem.sync_floor is not None and mo.problem.floor_table is None and mo.H > 256:
        _gradient_sync_compact(mo)
        return
    m, n = mo.m, len(mo.problem.candidates)
    tables = mo.problem.sync_tables_us(range(n), mo.H)
    for c in range(n):
        table = [0] + tables[c]
        sync_c = m.new_int_var(0, max(table), f"sync_{c}")
        m.add_element(mo.h, table, sync_c)
        m.add(mo.t_sync >= sync_c).only_enforce_if(mo.used[c])


def _optimizer_step(mo: _Model) -> None:
    """Optimizer step: t_opt >= the slowest optimizer step of every used candidate."""
    for c, cand in enumerate(mo.problem.candidates):
        mo.m.add(mo.t_opt >= mo.us(cand.partition.optimizer_s)).only_enforce_if(mo.used[c])


def _lp_cut(mo: _Model, lower_bound_pipe_s: float) -> None:
    """Redundant LP cut: t_pipe >= the LP bound of the pipeline time (least T whose fractional capacity covers G)."""
    mo.m.add(mo.t_pipe >= to_us(lower_bound_pipe_s, down=True))


def _cutoff(mo: _Model, incumbent_s: float) -> None:
    """Cutoff: objective <= the incumbent's (+ 3 us: the rounding of the three terms)."""
    mo.m.add(mo.t_pipe + mo.t_sync + mo.t_opt <= to_us(incumbent_s) + 3)


def build_composition_model(problem: CompositionProblem, *, settings: SolverSettings = SolverSettings(),
                            hint: dict[int, int] | None = None, symmetry: bool = True,
                            incumbent_s: float | None = None, lower_bound_pipe_s: float | None = None
                            ) -> tuple[cp_model.CpModel, list]:
    """The CP-SAT model of the composition (see the module docstring) and its copy variables x_c.

    Objective in integer microseconds (``US_PER_S``); ``x_<c>`` is the number of copies of
    candidate c. ``incumbent_s`` adds the cutoff objective <= incumbent; ``lower_bound_pipe_s``
    the redundant LP bound on the pipeline time; ``hint`` goes in as a solution hint. On a bound
    problem (``problem.sync_floor`` set) every time is rounded down, else up. The families are added
    in a fixed order (variables and constraints in the same order give the same search).
    """
    ub = [problem.max_copies(c) for c in range(len(problem.candidates))]
    mo = _Model(cp_model.CpModel(), problem, problem.sync_floor is not None, ub,
                min(max(1, sum(ub)), problem.cluster.num_devices))
    per_copy = settings.formulation == "per-copy" or (settings.formulation == "auto" and sum(ub) <= _PER_COPY_MAX_VARS)
    _candidate_variables(mo, per_copy, symmetry)
    _time_variables(mo)
    _usage_links(mo)
    _inventory(mo)
    _samples(mo)
    _pipeline_time(mo)
    _gradient_sync(mo)
    _optimizer_step(mo)
    if lower_bound_pipe_s is not None:
        _lp_cut(mo, lower_bound_pipe_s)
    if incumbent_s is not None and math.isfinite(incumbent_s):
        _cutoff(mo, incumbent_s)
    mo.m.minimize(mo.t_pipe + mo.t_sync + mo.t_opt)
    if hint:
        for c in range(len(mo.x)):
            mo.m.add_hint(mo.x[c], hint.get(c, 0))
    return mo.m, mo.x


#: CP-SAT's deterministic budget for completing a hint (the copies fixed, every other variable found).
HINT_COMPLETION_WORK = 0.5


def _complete_hint(m: cp_model.CpModel, x: list, hint: dict[int, int], *, wall_s: float | None = None) -> bool:
    """Replace the hint of the copies ``x`` by a complete one: the same copies with every other variable's value
    (micro-batches, pipelines, times), found by CP-SAT on a clone of ``m`` with the copies fixed (a small
    deterministic budget, one worker). CP-SAT often cannot complete a hint of the copies alone within a small
    budget (measured: no solution at all in 10 s on 216 candidates with the hint of the incumbent), and starts
    from a complete one. Returns False (the hint kept as it was) when the clone finds none, e.g. a hint past the
    cutoff."""
    clone = m.clone()
    xs = [clone.get_int_var_from_proto_index(v.index) for v in x]
    for c, v in enumerate(xs):
        clone.add(v == hint.get(c, 0))
    clone.clear_hints()
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = HINT_COMPLETION_WORK
    if wall_s is not None:
        solver.parameters.max_time_in_seconds = wall_s
    solver.parameters.num_workers = 1
    if solver.solve(clone) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    m.clear_hints()
    for i in range(len(m.proto.variables)):
        m.add_hint(m.get_int_var_from_proto_index(i), solver.value(clone.get_int_var_from_proto_index(i)))
    return True


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
    if hint:
        _complete_hint(m, x, hint, wall_s=None if settings.max_time_in_seconds is None
                       else settings.max_time_in_seconds / 4)
    solver = cpsat_solver(settings)
    if settings.max_time_in_seconds is not None:     # what is left of the wall limit after the model and the hint
        solver.parameters.max_time_in_seconds = max(0.01, settings.max_time_in_seconds - (time.perf_counter() - t0))
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
    from hpp.formulation.composition.solve import gap    # the one gap (solve imports this module lazily)
    obj = composition_objective_s(problem, counts) if counts else math.inf
    return CompositionResult(counts, name, obj, bound, gap(obj, bound), wall, n, hit_time_limit=hit)
