"""The one solve path: ``solve(problem, settings) -> SolveResult`` for every solver.

Candidates (:func:`hpp.planner.make_problem`) -> :func:`solve` (CP-SAT, MILP or the heuristic,
chosen by ``settings.solver``) -> bind -> estimate. ``hpp plan`` (:func:`hpp.planner.plan_hpp`) and
``hpp bench-solvers`` (:mod:`hpp.bench.solvers`) both call :func:`solve`.

What every solver does, in one place:

1. Incumbent: :func:`~hpp.formulation.composition.heuristics.best_incumbent` on the search model (the best
   of the greedy and fill heuristics, improved by a local search over copy counts).
2. Presolve (``warm_start``): candidates whose lower-bound single micro-batch already exceeds the
   incumbent's objective are dropped (rule ``incumbent_bound``; any plan using one is slower).
3. Bound: the LP bound (:func:`hpp.formulation.composition.lp_bound.composition_bounds`) on the *bound problem*
   (:meth:`CompositionProblem.bound_problem`: lower-bound stage times and a sync floor valid for
   any link model) of all candidates left. The copy bound's LP solutions, rounded, are priced by the search
   model too: the best, where it beats the incumbent there, is improved by a local search over copy counts
   and becomes a second answer (``lp-rounding``); the bound does not depend on it. ``type_classes``: also :mod:`.type_classes`.
4. Exact solver (``cp-sat`` / ``milp``) on the bound problem when it can see every candidate left
   (at most ``settings.candidate_limit``: 16 at the default budget, where CP-SAT's presolve alone takes the
   budget on larger inputs), with the incumbent as hint and cutoff; its bound then counts.
5. Judge: every answer is priced by ``problem.estimator`` (bind + the cost model:
   :func:`~hpp.formulation.cost_model.estimate_plan`) where the problem has one, else by
   :func:`~hpp.formulation.composition.objective.composition_objective_s`; the best is returned.
6. Figures of the returned answer: ``objective_s`` its judged time, ``bound_s`` a proven lower
   bound of the judged time over all candidates and all bindings, ``gap`` = :func:`gap`, status by
   :func:`status_of`: ``OPTIMAL`` only when objective and bound agree within the tolerance.

Status vocabulary: ``OPTIMAL``, ``FEASIBLE``, ``INFEASIBLE`` (no candidate can be used),
``NO_SOLUTION`` (nothing found). Determinism: no wall-clock cut unless the settings set one
(``max_time_in_seconds``); ``hit_time_limit`` says when it stopped the exact solver.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from hpp.errors import HppInputError
from hpp.formulation.composition.objective import composition_objective_s, pipeline_time_for_counts
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.heuristics import best_incumbent, rounded_lp_incumbent, solo_objective_s
from hpp.formulation.composition.lp_bound import composition_bounds
from hpp.formulation.composition.settings import DEFAULT_SOLVER, SOLVER_NAMES, SolverSettings, bench_settings
from hpp.formulation.composition.type_classes import type_class_bound
from hpp.pruning.rules import exceeds_incumbent

__all__ = ["SolverSettings", "SolveResult", "SOLVER_NAMES", "DEFAULT_SOLVER", "OPTIMUM_RTOL", "OPTIMUM_ATOL_S",
           "STATUSES", "solve", "bench_settings", "check_solver", "model_objective_s", "within_tolerance", "gap",
           "status_of", "certify", "export_cpsat_model"]

log = logging.getLogger(__name__)

#: Two objectives [s] are "the same optimum" when they differ by at most
#: ``OPTIMUM_ATOL_S + OPTIMUM_RTOL * max(|a|, |b|)``. The bound models round every time DOWN to whole
#: microseconds (k micro-batches of a pipeline lose up to k us: relative <= 1 us / tau, tau >= 1 ms on
#: every profile we ship) and HiGHS stops at a relative gap of 1e-6: 1e-3 relative covers both.
OPTIMUM_RTOL = 1e-3
OPTIMUM_ATOL_S = 1e-5
#: HiGHS' relative MIP gap at which it stops and calls the answer optimal.
MILP_REL_GAP = 1e-6
#: HiGHS branch-and-bound nodes per unit of ``SolverSettings.deterministic_time`` (its deterministic limit).
MILP_NODES_PER_WORK_UNIT = 2000
#: The status vocabulary of :class:`SolveResult`.
STATUSES = ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "NO_SOLUTION")


def within_tolerance(a: float, b: float) -> bool:
    """True if objectives ``a`` and ``b`` [s] are equal within the stated tolerance."""
    return abs(a - b) <= OPTIMUM_ATOL_S + OPTIMUM_RTOL * max(abs(a), abs(b))


def gap(objective_s: float, bound_s: float) -> float:
    """The one gap: ``(objective - bound) / objective``, at least 0; nan without a finite objective or bound.

    >>> gap(10.0, 9.0)
    0.1
    """
    if not (math.isfinite(objective_s) and objective_s > 0 and bound_s == bound_s):
        return math.nan
    return max(0.0, (objective_s - bound_s) / objective_s)


def status_of(objective_s: float, bound_s: float, *, infeasible: bool = False) -> str:
    """The one status rule: OPTIMAL when objective and bound agree within the tolerance, FEASIBLE with a
    finite objective, else INFEASIBLE (``infeasible``: no candidate can be used) or NO_SOLUTION."""
    if not math.isfinite(objective_s):
        return "INFEASIBLE" if infeasible else "NO_SOLUTION"
    if bound_s == bound_s and objective_s - bound_s <= OPTIMUM_ATOL_S + OPTIMUM_RTOL * abs(objective_s):
        return "OPTIMAL"
    return "FEASIBLE"


@dataclass(frozen=True)
class SolveResult:
    """The answer of :func:`solve` (scipy ``OptimizeResult`` style); the one result type of the solve path.

    Attributes
    ----------
    solver : str
        ``settings.solver``.
    status : str
        :data:`STATUSES`, from :func:`status_of` of ``objective_s`` and ``bound_s``.
    objective_s : float
        The judged time of the returned answer [s]: the cost model's predicted iteration time of its
        plan where the problem has an estimator (always in the planner), else the composition
        objective; inf without an answer.
    bound_s : float
        A proven lower bound of the judged time over all candidates and bindings [s].
    gap : float
        :func:`gap` of the two.
    wall_s : float
        Seconds, heuristic, bound and judging included.
    counts : dict[int, int]
        Copies per candidate index of the problem (empty when the answer is not the search's).
    num_candidates : int
        Candidates left after the presolve.
    source : str
        Where the answer comes from: ``"heuristic"`` (the incumbent), ``"lp-rounding"`` (the copy bound's
        rounded LP plan, locally improved), ``"cp-sat"`` / ``"milp"`` (the exact solver's), or
        ``"baseline:<name>"`` (a seed plan the planner returned, see :func:`certify`).
    bound_method : str
        What proved ``bound_s``: ``"lp"`` (the LP and the copy bound), ``"type-classes"`` (``settings.type_classes``;
        the note gives its value either way), ``"cp-sat"``, ``"milp"`` or ``"cutoff"`` (nothing beats the incumbent).
    hit_time_limit : bool
        The user's wall-clock limit stopped the exact solver (the answer may then depend on the machine).
    nodes : int
        Branch-and-bound nodes (HiGHS); -1 elsewhere.
    model_objective_s : float
        The search model's price of ``counts`` (:func:`composition_objective_s`).
    solver_status : str
        The exact solver's status on its own (bound) model; "" when it did not run.
    solver_model_objective_s : float
        The exact solver's objective on its bound model (nan when it did not run).
    note : str
    """

    solver: str
    status: str
    objective_s: float
    bound_s: float
    gap: float
    wall_s: float
    counts: dict = field(default_factory=dict)
    num_candidates: int = 0
    source: str = "heuristic"
    bound_method: str = "lp"
    hit_time_limit: bool = False
    nodes: int = -1
    model_objective_s: float = math.nan
    solver_status: str = ""
    solver_model_objective_s: float = math.nan
    note: str = ""

    @property
    def proven_optimal(self) -> bool:
        """``status == "OPTIMAL"`` (objective equals the proven bound within the tolerance)."""
        return self.status == "OPTIMAL"


def certify(result: SolveResult, objective_s: float, *, source: str | None = None,
            counts: Mapping[int, int] | None = None) -> SolveResult:
    """``result`` describing another answer of the same problem: objective, gap and status re-derived
    against the same bound (e.g. a seeded baseline's plan the planner returns instead)."""
    return replace(result, objective_s=objective_s, gap=gap(objective_s, result.bound_s),
                   status=status_of(objective_s, result.bound_s), source=source or result.source,
                   counts=dict(counts) if counts is not None else result.counts)


def model_objective_s(problem: CompositionProblem, counts: Mapping[int, int]) -> float:
    """The exact solvers' model objective of ``counts`` on ``problem`` [s] (the relaxed per-stage sync;
    on a bound problem, the sync floor): T_pipe with at least one micro-batch per copy + max sync + T_opt."""
    counts = {c: x for c, x in counts.items() if x > 0}
    if not counts:
        return math.inf
    h = sum(counts.values())
    cands = problem.candidates
    t_pipe = max(pipeline_time_for_counts(cands, counts, problem.global_batch_size),
                 max(cands[c].partition.fill_s for c in counts))
    t_sync = max(problem.sync_s(c, h) for c in counts) if h > 1 else 0.0
    return t_pipe + t_sync + max(cands[c].partition.optimizer_s for c in counts)


def check_solver(name: str) -> str:
    """``name`` if it is a known solver (``greedy``: ``heuristic``); raises HppInputError listing the known ones."""
    return SolverSettings(solver=name).solver


def _judge(problem: CompositionProblem) -> Callable[[dict], float]:
    """counts -> judged objective [s] (memoised on the counts)."""
    memo: dict[frozenset, float] = {}

    def judge(counts: dict) -> float:
        counts = {c: x for c, x in counts.items() if x > 0}
        if not counts:
            return math.inf
        key = frozenset(counts.items())
        got = memo.get(key)
        if got is None:
            if problem.estimator is not None:
                got = problem.estimator(counts)[1].iteration_time_s
            else:
                got = composition_objective_s(problem, counts)
            memo[key] = got
        return got
    return judge


def _heuristic(problem: CompositionProblem) -> tuple[dict[int, int], float]:
    """The incumbent (counts, objective [s]): :func:`~hpp.formulation.composition.heuristics.best_incumbent` on the
    candidates the heuristics use (:attr:`CompositionProblem.heuristic_indices`), as counts of ``problem``."""
    idx = problem.heuristic_indices
    if len(idx) == len(problem.candidates):
        return best_incumbent(problem)
    counts, obj = best_incumbent(problem.restricted(idx))
    return {idx[c]: x for c, x in counts.items()}, obj


def _best_candidates(problem: CompositionProblem, keep: list[int], must: set[int], limit: int) -> list[int]:
    """Up to about ``limit`` of ``keep``: ``must``, then the best by solo objective per device-type set."""
    groups: dict[frozenset, list[int]] = {}
    for c in keep:
        groups.setdefault(frozenset(problem.candidates[c].devices), []).append(c)
    share = max(1, (limit - len(must)) // max(1, len(groups)))
    out = set(must)
    for members in groups.values():
        out.update(sorted(members, key=lambda c: (solo_objective_s(problem, c), c))[:share])
    return sorted(out)


def _exact(name: str, sub, settings: SolverSettings, hint: dict, cutoff: float | None, lb_pipe: float,
           progress) -> tuple[dict, str, float, float, bool, int, str]:
    """(counts, status, bound, model objective, hit limit, nodes, note) of the exact solver on bound problem ``sub``."""
    if name == "cp-sat":
        # imported here: ortools' CP-SAT module costs ~0.4 s to import (measured), paid only when it runs
        from hpp.formulation.composition.cpsat import solve_composition_cpsat
        r = solve_composition_cpsat(sub, settings=settings, hint=hint or None, incumbent_s=cutoff,
                                    lower_bound_pipe_s=lb_pipe, progress=progress)
        status = {"UNKNOWN": "NO_SOLUTION", "MODEL_INVALID": "NO_SOLUTION"}.get(r.status, r.status)
        counts = r.counts if status in ("OPTIMAL", "FEASIBLE") else {}
        return counts, status, r.bound_s, model_objective_s(sub, counts), r.hit_time_limit, -1, ""
    # imported here: scipy.optimize (HiGHS' milp) costs ~0.45 s to import (measured), paid only when it runs
    from hpp.formulation.composition.milp import solve_composition_milp
    # no wall limit: HiGHS stops at a node limit (deterministic) scaled like CP-SAT's deterministic time
    r = solve_composition_milp(sub, time_limit_s=settings.max_time_in_seconds or 3600.0, cutoff_s=cutoff,
                               lower_bound_pipe_s=lb_pipe, mip_rel_gap=MILP_REL_GAP,
                               formulation=settings.formulation,
                               node_limit=max(1, int(MILP_NODES_PER_WORK_UNIT * settings.deterministic_time)))
    hit = r.hit_time_limit and settings.max_time_in_seconds is not None
    return (r.counts, r.status, r.bound_s, r.model_objective_s, hit, r.nodes,
            f"{r.num_variables} vars, {r.num_constraints} rows")


def solve(problem: CompositionProblem, settings: SolverSettings = SolverSettings(), *,
          incumbent: SolveResult | None = None,
          progress: Callable[[str], None] | None = None) -> SolveResult:
    """Solve ``problem`` with ``settings.solver`` (see the module docstring for the steps).

    Parameters
    ----------
    problem : CompositionProblem
    settings : SolverSettings
    incumbent : SolveResult, optional
        A heuristic answer already computed on ``problem`` (its counts are the incumbent).
    progress : optional callback for one-line progress messages.

    Returns
    -------
    SolveResult
        Never raises on a limit: the best answer found with its bound.

    Raises
    ------
    HppInputError
        Unknown solver name, bad settings, a problem without candidates.
    """
    t0 = time.perf_counter()
    name = settings.solver
    if not problem.candidates:
        raise HppInputError("the composition problem has no candidate pipeline", field="candidates",
                            fix="check that some pipeline shape fits memory")
    say = progress or (lambda _msg: None)
    judge = _judge(problem)
    bp = problem.bound_problem()
    if incumbent is not None and incumbent.counts:
        inc_counts = dict(incumbent.counts)
        inc_model = composition_objective_s(problem, inc_counts)
    else:
        inc_counts, inc_model = _heuristic(problem)     # the search model's price of it
    inc_obj = judge(inc_counts)
    answers = [(inc_obj, "heuristic", inc_counts)]
    keep = [c for c in range(len(problem.candidates)) if problem.max_copies(c) > 0]
    if settings.warm_start and math.isfinite(inc_obj):
        # any plan using c takes at least c's lower-bound single micro-batch: slower than the incumbent
        keep = sorted({c for c in keep if not exceeds_incumbent(bp.candidates[c], inc_obj)} | set(inc_counts))
    if not keep:
        return SolveResult(name, "INFEASIBLE", math.inf, math.nan, math.nan, time.perf_counter() - t0,
                           num_candidates=0, source="", note="no candidate fits the inventory")
    bsub = bp.restricted(keep)
    copy_bounds: list = []

    def search_price(plan: dict, cutoff_s: float) -> float:     # the copy bound's rounded plans, search prices
        return composition_objective_s(problem, {keep[c]: x for c, x in plan.items()}, cutoff_s=cutoff_s)

    lb_pipe, lb_total = composition_bounds(bsub, workers=settings.num_workers,
                                           incumbent_s=inc_obj if math.isfinite(inc_obj) else None,
                                           search_price=search_price, search_cutoff_s=inc_model,
                                           on_copy_bound=copy_bounds.append)
    rounded = rounded_lp_incumbent(problem, keep, copy_bounds[0] if copy_bounds else None, inc_model)
    if rounded:
        answers.append((judge(rounded), "lp-rounding", rounded))
    bound = float(max(lb_pipe + min(c.partition.optimizer_s for c in bsub.candidates), lb_total))
    bound_method, hit, nodes, note, solver_status, solver_model = "lp", False, -1, "", "", math.nan
    tc = type_class_bound(bsub, cutoff_s=inc_obj if math.isfinite(inc_obj) else None) if settings.type_classes else None
    tc_note = "" if tc is None else f"type-class bound {tc.bound_s:.4f} s" + ("" if tc.bound_s > bound else ", no stronger")
    if tc is not None and tc.bound_s > bound:
        bound, bound_method = float(tc.bound_s), "type-classes"
    if name != "heuristic" and status_of(inc_obj, bound) == "OPTIMAL" and not settings.solver_answer_only:
        note = f"{name} not run: the incumbent is within the optimality tolerance of the bound"
        if name == "cp-sat" and settings.cpsat_params:
            note += "; --cpsat-params unused"
    elif name != "heuristic":
        most = min(problem.cluster.num_devices, sum(problem.max_copies(c) for c in keep))
        limit = min(settings.candidate_limit, max(50, settings.max_table_entries // max(1, most)))
        full = len(keep) <= limit
        if full or settings.cpsat_on_subset:
            sel = keep if full else _best_candidates(problem, keep, set(inc_counts), limit)
            remap = {old: new for new, old in enumerate(sel)}
            hint = {remap[c]: x for c, x in inc_counts.items() if c in remap} if settings.warm_start else {}
            cutoff = inc_obj if settings.warm_start and math.isfinite(inc_obj) else None
            counts, solver_status, ex_bound, solver_model, hit, nodes, note = _exact(
                name, bp.restricted(sel), settings, hint, cutoff, lb_pipe if full else None, progress)
            counts = {sel[c]: x for c, x in counts.items() if x > 0}
            if counts and problem.fits(counts):
                answers.append((judge(counts), name, counts))
            elif counts:
                note = (note + "; " if note else "") + f"answer {counts} does not fit the inventory: dropped"
            if full:
                if solver_status == "INFEASIBLE" and cutoff is not None:
                    ex_bound = cutoff                   # nothing's bound model beats the incumbent
                elif cutoff is not None and ex_bound == ex_bound:
                    ex_bound = min(ex_bound, cutoff)    # plans cut off cost more than the incumbent
                if ex_bound == ex_bound and ex_bound > bound:
                    bound, bound_method = float(ex_bound), ("cutoff" if solver_status == "INFEASIBLE" else name)
            else:
                note = (note + "; " if note else "") + f"{name} saw {len(sel)} of {len(keep)} candidates"
        else:
            note = f"{name} skipped: {len(keep)} candidates > {limit}; the LP and copy bound cover all"
            if name == "cp-sat" and settings.cpsat_params:
                note += "; --cpsat-params unused: --cpsat-on-subset runs CP-SAT on a subset"
    note = "; ".join(x for x in (note, tc_note) if x)
    if settings.solver_answer_only and name != "heuristic":     # the exact solver's own answer, or none
        answers = [a for a in answers if a[1] == name] or [(math.inf, "", {})]
    obj, source, counts = min(answers, key=lambda a: a[0])      # ties: the first (the incumbent)
    obj = float(obj)
    if math.isfinite(obj) and bound > obj * (1 + 1e-9) + 1e-9:
        log.error("bound %.9g s above a feasible objective %.9g s: the bound model is wrong", bound, obj)
    res = SolveResult(name, status_of(obj, bound), obj, bound, gap(obj, bound), time.perf_counter() - t0,
                      counts, len(keep), source, bound_method, hit, nodes, composition_objective_s(problem, counts)
                      if counts else math.inf, solver_status, solver_model, note)
    who = name if name == "heuristic" or solver_status else f"search ({name} not run)"
    say(f"{who} {res.status}: objective {obj:.4f} s ({source}), bound {bound:.4f} s ({bound_method}), "
        f"gap {res.gap:.2%}{'; ' + note if note else ''}")
    log.debug("%s: %s obj %.6g bound %.6g (%.2f s)", name, res.status, obj, bound, res.wall_s)
    return res


def export_cpsat_model(problem: CompositionProblem, path, *, settings: SolverSettings = SolverSettings()) -> dict:
    """Write the CP-SAT model :func:`solve` would solve on ``problem`` (its bound problem, all candidates left
    after the presolve, the warm start of ``settings``) to ``path``; returns a description.

    ``.pb`` writes the binary proto, ``.pbtxt``/``.txt`` the text format. Variables ``x_<i>`` are the copies of
    the i-th listed candidate; the objective is in integer microseconds (rounded down: a bound model).
    """
    # imported here: ortools' CP-SAT module costs ~0.4 s to import (measured), paid only on export
    from hpp.formulation.composition.cpsat import build_composition_model

    judge = _judge(problem)
    bp = problem.bound_problem()
    keep = [c for c in range(len(problem.candidates)) if problem.max_copies(c) > 0]
    hint, inc_obj = {}, None
    if settings.warm_start:
        inc_counts, _ = _heuristic(problem)
        inc_obj = judge(inc_counts)
        keep = sorted({c for c in keep if not exceeds_incumbent(bp.candidates[c], inc_obj)} | set(inc_counts))
        hint = {keep.index(c): x for c, x in inc_counts.items()}
    bsub = bp.restricted(keep)
    lb_pipe = composition_bounds(bsub)[0] if settings.warm_start else None
    model, _ = build_composition_model(bsub, settings=settings, hint=hint or None, incumbent_s=inc_obj,
                                       lower_bound_pipe_s=lb_pipe)
    if not model.export_to_file(str(path)):
        raise HppInputError("CP-SAT could not write the model", source=str(path), fix="check the path")
    return {"path": str(path), "objective_unit": "microseconds", "num_variables": len(model.proto.variables),
            "num_constraints": len(model.proto.constraints),
            "candidates": [{"index": i, "problem_index": c, "label": problem.candidates[c].label(),
                            "variable": f"x_{i}"} for i, c in enumerate(keep)],
            "incumbent_s": inc_obj}
