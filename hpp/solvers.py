"""Interchangeable solvers of the composition problem, one interface and one result record.

Every solver gets a :class:`~hpp.formulation.composition.CompositionProblem` (candidates from
the stage-balance DP, inventory, global batch) and returns a :class:`SolveResult`. All are
judged by the same function, :func:`~hpp.formulation.composition.composition_objective_s`
(``objective_s``), so their answers are comparable:

- ``"cp-sat"``: :func:`~hpp.formulation.composition.solve_composition_cpsat` (the default).
- ``"milp"``: the same composition model as a MILP (:mod:`hpp.composition_milp`), solved by
  HiGHS through :func:`scipy.optimize.milp`.
- ``"heuristic"``: the best of :func:`greedy_composition` and :func:`fill_heuristic`; no bound.

Both exact solvers minimise the *solver model* of the composition module: T_pipe (exact data
balance) + T_sync relaxed to ``max_c sync_s(c, h)`` over used candidates c (one bucket per
stage) + T_opt. That relaxation never exceeds the judged objective (block-wise sync splits a
gradient into more, smaller all-reduces), so a solver's bound is a valid lower bound on the
judged objective, up to CP-SAT's rounding to whole microseconds (see :data:`OPTIMUM_RTOL`).
A result is ``proven_optimal`` when the solver closed its own model (``status == "OPTIMAL"``)
AND the judged objective of its answer is within the tolerance of its bound; an answer that
is optimal for the relaxed model only keeps ``status == "OPTIMAL"`` with ``gap > tol``.

Shared steps of the exact solvers (``warm_start=True``, the default): the heuristic's answer is
the incumbent (CP-SAT hint; for both a cutoff ``model objective <= incumbent``), candidates whose
single micro-batch already exceeds the incumbent are dropped (exact rule ``incumbent_bound``),
the LP bound on T_pipe is a redundant constraint, and the final answer is the better (judged) of
the solver's and the incumbent; the heuristic's seconds count in their wall time. A solver that
hits its time limit returns its best answer and bound; it never raises for that.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from hpp.errors import HppInputError
from hpp.formulation.composition import (CompositionProblem, SolverSettings, build_composition_model,
                                         composition_objective_s, pipeline_time_for_counts, solve_composition_cpsat)
from hpp.formulation.heuristics import fill_heuristic, greedy_composition, solo_objective_s
from hpp.formulation.lp_bound import composition_lower_bound_s, lp_lower_bound_pipe_s
from hpp.pruning.rules import exceeds_incumbent

__all__ = ["SolverOptions", "SolveResult", "SOLVER_NAMES", "DEFAULT_SOLVER", "OPTIMUM_RTOL", "OPTIMUM_ATOL_S",
           "solve", "check_solver", "model_objective_s", "within_tolerance", "export_cpsat_model", "subproblem"]

log = logging.getLogger(__name__)

#: Two objectives [s] are "the same optimum" when they differ by at most
#: ``OPTIMUM_ATOL_S + OPTIMUM_RTOL * max(|a|, |b|)``. CP-SAT rounds every time up to whole
#: microseconds (``_us``): k micro-batches of a pipeline add up to k us, i.e. a relative error
#: of at most 1 us / tau (tau >= 1 ms on every profile we ship: <= 1e-3); HiGHS stops at a
#: relative gap of 1e-6 (set below). 1e-3 relative covers both.
OPTIMUM_RTOL = 1e-3
OPTIMUM_ATOL_S = 1e-5
#: HiGHS' relative MIP gap at which it stops and calls the answer optimal.
MILP_REL_GAP = 1e-6


def within_tolerance(a: float, b: float) -> bool:
    """True if objectives ``a`` and ``b`` [s] are equal within the stated tolerance."""
    return abs(a - b) <= OPTIMUM_ATOL_S + OPTIMUM_RTOL * max(abs(a), abs(b))


@dataclass(frozen=True)
class SolverOptions:
    """Explicit solver parameters (STYLE.md rule 5).

    Attributes
    ----------
    time_limit_s : float
        Wall limit of the solve proper [s] (the warm-start heuristic comes on top).
    num_workers : int
        CP-SAT workers (0 = one per core); HiGHS' MIP search is single-threaded.
    random_seed : int
    warm_start : bool
        Give the exact solvers the heuristic incumbent (hint, cutoff, ``incumbent_bound`` rule).
    max_candidates : int
        Above this many candidates (after the presolve), or above ``max_table_entries`` entries of
        the per-candidate sync tables (candidates x most pipelines), the exact solvers see the best
        candidates only (by solo objective, per device-type set, the incumbent's kept), as the
        planner does; their bound is then the global :func:`composition_lower_bound_s` and their
        status never "OPTIMAL" by the solver alone.
    """

    time_limit_s: float = 10.0
    num_workers: int = 1
    random_seed: int = 0
    warm_start: bool = True
    max_candidates: int = 1000
    max_table_entries: int = 1_000_000

    def __post_init__(self) -> None:
        if not (self.time_limit_s > 0 and math.isfinite(self.time_limit_s)):
            raise HppInputError(f"time limit {self.time_limit_s!r} s", field="--time-limit",
                                fix="give a positive number of seconds")
        if self.num_workers < 0:
            raise HppInputError(f"num_workers={self.num_workers}", field="--workers", fix="give 0 (all cores) or more")


@dataclass(frozen=True)
class SolveResult:
    """One solver's answer on one composition problem (scipy ``OptimizeResult`` style).

    Attributes
    ----------
    solver : str
    status : str
        The solver's status on its own model: ``OPTIMAL``, ``FEASIBLE``, ``INFEASIBLE``,
        ``NO_SOLUTION`` (nothing found in time) or ``HEURISTIC`` (no bound).
    proven_optimal : bool
        ``status == "OPTIMAL"`` and ``objective_s`` within the tolerance of ``bound_s``.
    objective_s : float
        :func:`composition_objective_s` of ``counts`` (the judge; inf without a solution).
    model_objective_s : float
        :func:`model_objective_s` of ``counts`` (what the exact solvers minimise).
    bound_s : float
        Proven lower bound [s] (nan for the heuristic).
    gap : float
        ``(objective_s - bound_s) / objective_s`` (nan without a bound).
    wall_s : float
        Seconds, warm-start heuristic included.
    hit_time_limit : bool
    nodes : int
        Branch-and-bound nodes (HiGHS); -1 where the solver does not report them.
    num_candidates : int
        Candidates the solver saw (after the shared presolve).
    counts : dict[int, int]
        Copies per candidate index of the problem as given.
    note : str
    solver_model_objective_s : float
        :func:`model_objective_s` of the solver's own answer, before the better-judged incumbent may
        replace it (with ``status == "OPTIMAL"``: the optimum of the solver model; exact solvers that
        both close the model agree on it).
    """

    solver: str
    status: str
    proven_optimal: bool
    objective_s: float
    model_objective_s: float
    bound_s: float
    gap: float
    wall_s: float
    hit_time_limit: bool
    nodes: int
    num_candidates: int
    counts: dict = field(default_factory=dict)
    note: str = ""
    solver_model_objective_s: float = math.nan


def model_objective_s(problem: CompositionProblem, counts: Mapping[int, int]) -> float:
    """The exact solvers' objective of ``counts`` [s]: the composition model with relaxed sync.

    T_pipe is the exact data balance with at least one micro-batch per copy
    (``max(least time, max fill)``), T_sync = ``max_c sync_s(c, h)`` over used candidates, T_opt
    the slowest optimizer step. Never above :func:`composition_objective_s` of a plan whose
    copies all get samples.
    """
    counts = {c: x for c, x in counts.items() if x > 0}
    if not counts:
        return math.inf
    h = sum(counts.values())
    cands = problem.candidates
    t_pipe = max(pipeline_time_for_counts(cands, counts, problem.global_batch_size),
                 max(cands[c].partition.fill_s for c in counts))
    t_sync = max(problem.sync_s(c, h) for c in counts) if h > 1 else 0.0
    return t_pipe + t_sync + max(cands[c].partition.optimizer_s for c in counts)


def subproblem(problem: CompositionProblem, keep: list[int]) -> CompositionProblem:
    """The problem restricted to candidates ``keep`` (indices into ``problem``; order kept)."""
    return CompositionProblem([problem.candidates[i] for i in keep], problem.cluster, problem.global_batch_size,
                              problem.sync_link)


def _gap(obj: float, bound: float) -> float:
    if not (math.isfinite(obj) and obj > 0 and bound == bound):
        return math.nan
    return max(0.0, (obj - bound) / obj)


def _heuristic(problem: CompositionProblem) -> tuple[dict[int, int], float, str]:
    g_counts, g_obj = greedy_composition(problem)
    f_counts, f_obj = fill_heuristic(problem)
    if f_obj < g_obj:
        return f_counts, f_obj, "fill"
    return g_counts, g_obj, "greedy"


def _solve_heuristic(problem: CompositionProblem, options: SolverOptions, _inc: "SolveResult | None") -> SolveResult:
    t0 = time.perf_counter()
    counts, obj, which = _heuristic(problem)
    status = "HEURISTIC" if counts else "NO_SOLUTION"
    model = model_objective_s(problem, counts)
    return SolveResult("heuristic", status, False, obj, model, math.nan, math.nan, time.perf_counter() - t0, False, -1,
                       len(problem.candidates), counts, f"best of greedy/fill: {which}", model)


@dataclass(frozen=True)
class _Prepared:
    """What the exact solvers share: the reduced problem, the index map, the incumbent, the LP bound."""

    sub: CompositionProblem
    keep: list[int]
    hint: dict[int, int]
    incumbent_s: float | None
    lb_pipe_s: float | None
    prep_s: float
    global_bound_s: float | None = None     # set when the candidates were restricted


def _best_candidates(problem: CompositionProblem, keep: list[int], must: set[int], limit: int) -> list[int]:
    """Up to about ``limit`` of ``keep``: ``must``, then the best by solo objective per device-type set."""
    groups: dict[frozenset, list[int]] = {}
    for c in keep:
        groups.setdefault(frozenset(problem.candidates[c].devices), []).append(c)
    share = max(1, (limit - len(must)) // max(1, len(groups)))
    out = set(must)
    for members in groups.values():
        out.update(sorted(members, key=lambda c: solo_objective_s(problem, c))[:share])
    return sorted(out)


def _prepare(problem: CompositionProblem, options: SolverOptions, inc: SolveResult | None) -> _Prepared:
    t0 = time.perf_counter()
    extra = 0.0
    if options.warm_start:
        if inc is None:
            inc = _solve_heuristic(problem, options, None)
        extra = inc.wall_s
    keep = [c for c in range(len(problem.candidates)) if problem.max_copies(c) > 0]
    hint: dict[int, int] = {}
    inc_s = None
    if options.warm_start and inc is not None and inc.counts:
        inc_s = inc.objective_s
        keep = sorted(set(c for c in keep if not exceeds_incumbent(problem.candidates[c], inc_s)) | set(inc.counts))
    global_bound = None
    most_pipelines = min(problem.cluster.num_devices, sum(problem.max_copies(c) for c in keep))
    limit = min(options.max_candidates, max(50, options.max_table_entries // max(1, most_pipelines)))
    if len(keep) > limit:
        reduced = subproblem(problem, keep)
        global_bound = max(lp_lower_bound_pipe_s(reduced) + min(c.partition.optimizer_s for c in reduced.candidates),
                           composition_lower_bound_s(reduced))
        keep = _best_candidates(problem, keep, set(inc.counts) if inc_s is not None and inc else set(), limit)
    remap = {old: new for new, old in enumerate(keep)}
    if inc_s is not None and inc is not None:
        hint = {remap[c]: x for c, x in inc.counts.items()}
    sub = subproblem(problem, keep)
    lb = lp_lower_bound_pipe_s(sub) if options.warm_start and keep and global_bound is None else None
    return _Prepared(sub, keep, hint, inc_s, lb, time.perf_counter() - t0 + extra, global_bound)


def _finish(problem: CompositionProblem, solver: str, prep: _Prepared, sub_counts: dict[int, int], status: str,
            bound: float, wall_s: float, hit_limit: bool, nodes: int, note: str = "") -> SolveResult:
    """Map back to the problem's indices, keep the better of the solver's and the incumbent's answer."""
    counts = {prep.keep[c]: x for c, x in sub_counts.items() if x > 0}
    if counts and not problem.fits(counts):          # solver-agnostic validation of the answer
        note = (note + "; " if note else "") + f"answer {counts} does not fit the inventory: dropped"
        counts = {}
        status = "NO_SOLUTION" if status != "OPTIMAL" else "FEASIBLE"
    obj = composition_objective_s(problem, counts) if counts else math.inf
    inc_counts = {prep.keep[c]: x for c, x in prep.hint.items()}
    own = model_objective_s(problem, counts or inc_counts)
    if prep.incumbent_s is not None and (not counts or obj > prep.incumbent_s * (1 + 1e-12)):
        counts = inc_counts
        obj = prep.incumbent_s
        note = (note + "; " if note else "") + "incumbent kept"
        if status == "NO_SOLUTION":
            status = "FEASIBLE"
    if prep.lb_pipe_s is not None:                    # T >= T_pipe >= the LP bound
        bound = max(bound, prep.lb_pipe_s) if bound == bound else prep.lb_pipe_s
    if prep.global_bound_s is not None:               # the solver saw some candidates only: its bound is local
        bound = prep.global_bound_s
        note = (note + "; " if note else "") + f"restricted to {len(prep.sub.candidates)} candidates"
        status = "FEASIBLE" if status in ("OPTIMAL", "INFEASIBLE") and counts else status
    gap = _gap(obj, bound)
    proven = status == "OPTIMAL" and gap == gap and (obj - bound) <= OPTIMUM_ATOL_S + OPTIMUM_RTOL * abs(obj)
    return SolveResult(solver, status, proven, obj, model_objective_s(problem, counts), bound, gap,
                       wall_s + prep.prep_s, hit_limit, nodes, len(prep.sub.candidates), counts, note, own)


def _solve_cpsat(problem: CompositionProblem, options: SolverOptions, inc: SolveResult | None) -> SolveResult:
    prep = _prepare(problem, options, inc)
    if not prep.sub.candidates:
        return _finish(problem, "cp-sat", prep, {}, "INFEASIBLE", math.nan, 0.0, False, -1, "no usable candidate")
    settings = SolverSettings(max_time_in_seconds=options.time_limit_s, num_workers=options.num_workers,
                              random_seed=options.random_seed, patience_s=None)
    r = solve_composition_cpsat(prep.sub, settings=settings, hint=prep.hint or None, incumbent_s=prep.incumbent_s,
                                lower_bound_pipe_s=prep.lb_pipe_s)
    status = {"UNKNOWN": "NO_SOLUTION", "MODEL_INVALID": "NO_SOLUTION"}.get(r.status, r.status)
    hit = status != "OPTIMAL" and status != "INFEASIBLE" and r.wall_s >= 0.95 * options.time_limit_s
    return _finish(problem, "cp-sat", prep, r.counts, status, r.bound_s, r.wall_s, hit, -1)


def _solve_milp(problem: CompositionProblem, options: SolverOptions, inc: SolveResult | None) -> SolveResult:
    from hpp.composition_milp import solve_composition_milp

    prep = _prepare(problem, options, inc)
    if not prep.sub.candidates:
        return _finish(problem, "milp", prep, {}, "INFEASIBLE", math.nan, 0.0, False, -1, "no usable candidate")
    r = solve_composition_milp(prep.sub, time_limit_s=options.time_limit_s, cutoff_s=prep.incumbent_s,
                               lower_bound_pipe_s=prep.lb_pipe_s, mip_rel_gap=MILP_REL_GAP)
    status = r.status
    bound = r.bound_s
    if status == "INFEASIBLE" and prep.incumbent_s is not None:
        # nothing beats the cutoff: the incumbent is optimal (any better plan has model objective < cutoff)
        status, bound = "OPTIMAL", prep.incumbent_s
    return _finish(problem, "milp", prep, r.counts, status, bound, r.wall_s, r.hit_time_limit, r.nodes,
                   f"{r.num_variables} vars, {r.num_constraints} rows")


_REGISTRY: dict[str, Callable[[CompositionProblem, SolverOptions, "SolveResult | None"], SolveResult]] = {
    "cp-sat": _solve_cpsat,
    "milp": _solve_milp,
    "heuristic": _solve_heuristic,
}
SOLVER_NAMES: tuple[str, ...] = tuple(_REGISTRY)
DEFAULT_SOLVER = "cp-sat"


def check_solver(name: str) -> str:
    """``name`` if it is a known solver; raises HppInputError listing the known ones."""
    if name not in _REGISTRY:
        raise HppInputError(f"unknown solver {name!r}", field="--solver", fix=f"use one of {list(SOLVER_NAMES)}")
    return name


def solve(problem: CompositionProblem, solver: str = DEFAULT_SOLVER, *, options: SolverOptions = SolverOptions(),
          incumbent: SolveResult | None = None) -> SolveResult:
    """Solve ``problem`` with the named solver.

    Parameters
    ----------
    problem : CompositionProblem
    solver : ``"cp-sat"``, ``"milp"`` or ``"heuristic"`` (:data:`SOLVER_NAMES`).
    options : SolverOptions
    incumbent : SolveResult, optional
        A heuristic answer already computed on ``problem`` (the warm start; computed if None).
        Its ``wall_s`` is added to the exact solver's.

    Returns
    -------
    SolveResult
        Never raises on a time limit: the best answer found (or the incumbent) with its bound.

    Raises
    ------
    HppInputError
        Unknown solver name, bad options.
    """
    fn = _REGISTRY[check_solver(solver)]
    if not problem.candidates:
        raise HppInputError("the composition problem has no candidate pipeline", field="candidates",
                            fix="check that some pipeline shape fits memory")
    res = fn(problem, options, incumbent)
    log.debug("%s: %s obj %.6g bound %.6g (%.2f s)", solver, res.status, res.objective_s, res.bound_s, res.wall_s)
    return res


def export_cpsat_model(problem: CompositionProblem, path, *, options: SolverOptions = SolverOptions()) -> dict:
    """Write the CP-SAT model of ``problem`` (a ``CpModelProto``) to ``path``; returns a description.

    ``.pb`` writes the binary proto, ``.pbtxt``/``.txt`` the text format. The model is exactly the
    one :func:`solve_composition_cpsat` solves (captured from it, with the warm start of ``options``:
    hint, cutoff, ``incumbent_bound`` presolve, LP bound). Variables ``x_<c>`` are the copies of
    candidate c of the *returned* ``candidates`` list; the objective is in integer microseconds.
    """
    prep = _prepare(problem, options, None)
    model, _ = build_composition_model(prep.sub, hint=prep.hint or None, incumbent_s=prep.incumbent_s,
                                       lower_bound_pipe_s=prep.lb_pipe_s)
    if not model.export_to_file(str(path)):
        raise HppInputError("CP-SAT could not write the model", source=str(path), fix="check the path")
    return {"path": str(path), "objective_unit": "microseconds", "num_variables": len(model.proto.variables),
            "num_constraints": len(model.proto.constraints),
            "candidates": [{"index": i, "problem_index": c, "label": prep.sub.candidates[i].label(),
                            "variable": f"x_{i}"} for i, c in enumerate(prep.keep)],
            "incumbent_s": prep.incumbent_s}

