"""The one solve path: ``solve(problem, settings) -> SolveResult`` for every solver.

Candidates (:func:`hpp.planner.make_problem`) -> :func:`solve` (CP-SAT, MILP or the heuristic,
chosen by ``settings.solver``) -> bind -> estimate. ``hpp plan`` (:func:`hpp.planner.plan_hpp`) and
``hpp bench-solvers`` (:mod:`hpp.bench.solvers`) both call :func:`solve`.

What every solver does, in one place:

1. Incumbent: :func:`~hpp.formulation.composition.heuristics.heuristic_incumbent`, on the search model and the
   candidates the heuristics walk (the heuristic pruning rules' set; :mod:`hpp.pruning.rules`).
2. Presolve (``warm_start``): candidates whose lower-bound single micro-batch already exceeds the
   incumbent's objective are dropped (rule ``incumbent_bound``, exact; any plan using one is slower).
3. Bound: the LP bound (:func:`hpp.formulation.composition.lp_bound.composition_bounds`) on the *bound problem*
   (:meth:`CompositionProblem.bound_problem`: lower-bound stage times and a sync floor valid for
   any link model) of every candidate left, those a heuristic rule leaves out of the heuristics' set included.
   The copy bound's LP solutions, rounded, are priced by the search model too: the best, where it beats the
   incumbent there, is improved by a local search over copy counts and becomes a second answer
   (``lp-rounding``); the bound does not depend on it. ``type_classes`` (and any budget): also :mod:`.type_classes`.
4. Exact solver (``cp-sat`` / ``milp``) on the bound problem (:mod:`.exact_step`), from the best plan so far
   (hint and cutoff): at the default budget when it sees every candidate left (at most 16, where CP-SAT's
   presolve alone takes the budget on larger inputs), its bound then counting. With a budget
   (``settings.budgeted``: a wall-clock or a larger deterministic one) the budgeted phase
   (:mod:`.anytime`): a local search priced by the cost model, then the exact solver (and the ``portfolio``'s)
   on every candidate of its model, then the local search again from each one's answer.
5. Judge: every answer is priced by ``problem.estimator`` (bind + the cost model:
   :func:`~hpp.formulation.cost_model.estimate_plan`) where the problem has one, else by
   :func:`~hpp.formulation.composition.objective.composition_objective_s`; the best is returned. At the default
   budget, where the cost model prices it far above the search model, a few neighbours are priced too.
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
from hpp.formulation.composition.objective import composition_objective_s, judge_of, pipeline_time_for_counts
from hpp.formulation.composition.exact_step import (MIN_EXACT_WALL_S, best_candidates, budget_of, budgeted_model,
                                                    candidate_cap, exact_bound, exact_settings, run_exact)
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.anytime import (LOCAL_POOL, Budget, cost_model_local_search, eval_work,
                                                 local_search_pool)
from hpp.formulation.composition.heuristics import ROUNDED_POOL, heuristic_incumbent, rounded_lp_incumbent
from hpp.formulation.composition.lp_bound import composition_bounds
from hpp.formulation.composition.settings import SolverSettings
from hpp.formulation.composition.type_classes import type_class_bound
from hpp.pruning.rules import exceeds_incumbent

__all__ = ["SolveResult", "OPTIMUM_RTOL", "OPTIMUM_ATOL_S", "STATUSES", "solve", "check_solver",
           "model_objective_s", "within_tolerance", "gap", "status_of", "certify"]

log = logging.getLogger(__name__)

#: Two objectives [s] are "the same optimum" when they differ by at most
#: ``OPTIMUM_ATOL_S + OPTIMUM_RTOL * max(|a|, |b|)``. The bound models round every time DOWN to whole
#: microseconds (k micro-batches of a pipeline lose up to k us: relative <= 1 us / tau, tau >= 1 ms on
#: every profile we ship) and HiGHS stops at a relative gap of 1e-6: 1e-3 relative covers both.
OPTIMUM_RTOL = 1e-3
OPTIMUM_ATOL_S = 1e-5
#: At the default budget, when the cost model prices the best plan above this many times the search model's price, up
#: to :data:`MISPRICED_EVALS` of its neighbours are priced by the cost model (:mod:`.anytime`'s local search): the
#: search model misses some links (e.g. an intra-node link slower than the inter-node one: 35.5 s for a plan it
#: priced 2.23 s, measured on instance inverted seed 246 of ``tests/search_truth.py``).
MISPRICED_RATIO, MISPRICED_EVALS = 1.5, 20
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


def solve(problem: CompositionProblem, settings: SolverSettings = SolverSettings(), *,
          incumbent: SolveResult | None = None,
          progress: Callable[[str], None] | None = None, deadline: float | None = None) -> SolveResult:
    """Solve ``problem`` with ``settings.solver`` (see the module docstring for the steps).

    Parameters
    ----------
    problem : CompositionProblem
    settings : SolverSettings
    incumbent : SolveResult, optional
        A heuristic answer already computed on ``problem`` (its counts are the incumbent).
    progress : optional callback for one-line progress messages.
    deadline : float, optional
        With ``settings.max_time_in_seconds``: the :func:`time.perf_counter` value the budgeted phase ends at
        (the caller's start + the limit; default: this call's start + the limit).

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
    judge = judge_of(problem)
    bp = problem.bound_problem()
    if incumbent is not None and incumbent.counts:
        inc_counts = dict(incumbent.counts)
        inc_model = composition_objective_s(problem, inc_counts)
    else:
        inc_counts, inc_model = heuristic_incumbent(problem)     # the search model's price of it
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
    budget = budget_of(settings, t0, deadline)
    budgeted = budget is not None and name != "heuristic" and not settings.solver_answer_only

    def best() -> tuple[float, str, dict]:
        return min(answers, key=lambda a: a[0])          # ties: the first (the incumbent)

    def report(what: str) -> None:                       # a progress line of the budgeted phase
        o = best()[0]
        say(f"{time.perf_counter() - t0:.1f} s: {what}; plan {o:.4f} s ({best()[1]}), bound {bound:.4f} s "
            f"({bound_method}), gap {gap(o, bound):.2%}")

    tc = None
    if settings.type_classes or budgeted:
        cut = best()[0]
        tc = type_class_bound(bsub, cutoff_s=cut if math.isfinite(cut) else None)
    tc_note = "" if tc is None else f"type-class bound {tc.bound_s:.4f} s" + ("" if tc.bound_s > bound else ", no stronger")
    if tc is not None and tc.bound_s > bound:
        bound, bound_method = float(tc.bound_s), "type-classes"
    extra = [keep[c] for c in (copy_bounds[0].pool[:ROUNDED_POOL] if copy_bounds else [])]
    done: set[tuple] = set()

    def local_search(own: list, share: float, size: int = LOCAL_POOL) -> None:
        """The cost-model local search from the best of ``own`` (answers), its pool (``size`` candidates) from their
        plans: with a wall-clock budget ``share`` of what is left, else the whole work budget (each run the same)."""
        obj0, _, start = min(own, key=lambda a: a[0])
        pool_ls = local_search_pool(problem, [a[2] for a in own if a[2]], extra, size)
        key = (frozenset(start.items()), tuple(pool_ls))
        if key in done or not start or (budget.deadline is not None and budget.exhausted()):
            return
        done.add(key)
        work = budget.share(share) if budget.deadline is not None else Budget(None, settings.work_budget)
        better, v, evals = cost_model_local_search(problem, judge, dict(start), obj0, pool_ls, work)
        if v < obj0:
            answers.append((v, "local-search", better))
        report(f"cost-model local search ({evals} plans priced)")

    if budgeted:
        report("type-class bound")
        local_search(list(answers), 0.3)
    pre_best, _, pre_counts = best()              # every exact solver starts from here (hint and cutoff)
    pre_exact_bound = (bound, bound_method)       # the LP / type-class bound, valid whatever the exact solvers prove
    solvers = [name, *(x for x in settings.portfolio if x != name and x != "heuristic")] if budgeted else [name]
    n_pre = len(answers)
    starts: list[list] = []                       # per exact solver run: the answers a run of it alone would have
    model = None                                  # (candidates, bound problem) of the exact solvers with a budget
    for i, exact in enumerate(solvers):
        if name == "heuristic":
            break
        if status_of(best()[0], bound) == "OPTIMAL" and not settings.solver_answer_only:
            if not i:
                note = f"{name} not run: the incumbent is within the optimality tolerance of the bound"
                if name == "cp-sat" and settings.cpsat_params:
                    note += "; --cpsat-params unused"
            break
        if budgeted and budget.deadline is not None and budget.left_s() < MIN_EXACT_WALL_S:
            note = (note + "; " if note else "") + f"{exact} not run: {budget.left_s():.2f} s left of the time limit"
            continue
        if budgeted and model is None:
            model = budgeted_model(problem, keep, pre_counts)
        pool = model[0] if budgeted else keep
        limit = candidate_cap(problem, keep, exact, settings, budget if budgeted else None,
                              model[1] if budgeted else None)
        full = len(pool) <= limit
        if full or settings.cpsat_on_subset or budgeted:
            sel = pool if full else best_candidates(problem, pool, set(pre_counts), limit)
            remap = {old: new for new, old in enumerate(sel)}
            hint = {remap[c]: x for c, x in pre_counts.items() if c in remap} if settings.warm_start else {}
            cutoff = pre_best if settings.warm_start and math.isfinite(pre_best) else None
            run = exact_settings(settings, budget, share=0.6 / (len(solvers) - i)) if budgeted else settings
            sub = model[1] if budgeted and full else bp.restricted(sel)
            counts, status_x, ex_bound, model_x, hit_x, nodes_x, note_x = run_exact(
                exact, sub, run, hint, cutoff, lb_pipe if full else None, progress)
            if exact == name:
                solver_status, solver_model, hit, nodes, note = status_x, model_x, hit_x, nodes_x, note_x
            counts = {sel[c]: x for c, x in counts.items() if x > 0}
            own = []
            if counts and problem.fits(counts):
                answers.append((judge(counts), exact, counts))
                own = [answers[-1]]
            starts.append(answers[:n_pre] + own)
            if counts and not own:
                note = (note + "; " if note else "") + f"{exact}'s answer {counts} does not fit the inventory: dropped"
            if full:
                ex_bound = exact_bound(status_x, ex_bound, cutoff)
                if ex_bound == ex_bound and ex_bound > bound:
                    bound, bound_method = float(ex_bound), ("cutoff" if status_x == "INFEASIBLE" else exact)
                if budgeted and len(sel) < len(keep):
                    note = (note + "; " if note else "") + (f"{exact} on {len(sel)} of {len(keep)} candidates "
                                                            f"(the others dominated in its model)")
            else:
                note = (note + "; " if note else "") + f"{exact} saw {len(sel)} of {len(pool)} candidates"
            if budgeted:
                # its status is of its own model (the bound model), not of the plan's cost-model time
                report(f"{exact} {status_x} on its model" if status_x else f"{exact} done")
        else:
            note = f"{name} skipped: {len(pool)} candidates > {limit}; the LP and copy bound cover all"
            if name == "cp-sat" and settings.cpsat_params:
                note += "; --cpsat-params unused: --cpsat-on-subset runs CP-SAT on a subset"
    if budgeted:
        # from each exact solver's answer, as a run of that solver alone would continue (the same whatever else ran)
        for k, own in enumerate(starts):
            local_search(own, 1.0 / (len(starts) - k))
        size = LOCAL_POOL
        while budget.deadline is not None and not budget.exhausted() and size < len(problem.candidates):
            size *= 2               # time left (a wall-clock budget): a wider neighbourhood from the best plan
            local_search(list(answers), 1.0, size)
    elif name != "heuristic" and not settings.solver_answer_only:
        obj0, _, start = best()
        if start and obj0 > MISPRICED_RATIO * composition_objective_s(problem, start):
            # the search model priced the best plan far below the cost model (e.g. a slow link it does not see):
            # a few neighbours ranked by the cost model itself, at the default budget too (a count: deterministic)
            pool_ls = local_search_pool(problem, [a[2] for a in answers if a[2]], extra)
            better, v, evals = cost_model_local_search(problem, judge, dict(start), obj0, pool_ls,
                                                       Budget(None, MISPRICED_EVALS * eval_work(problem)))
            if v < obj0:
                answers.append((v, "local-search", better))
            ratio = obj0 / composition_objective_s(problem, start)
            note = (note + "; " if note else "") + (f"the cost model prices the search's plan {ratio:.1f}x its "
                                                    f"search model: {evals} neighbours priced by the cost model")
    note = "; ".join(x for x in (note, tc_note) if x)
    if settings.solver_answer_only and name != "heuristic":     # the exact solver's own answer, or none
        answers = [a for a in answers if a[1] == name] or [(math.inf, "", {})]
    obj, source, counts = best()
    obj = float(obj)
    if math.isfinite(obj) and bound > obj * (1 + 1e-9) + 1e-9 and bound_method != pre_exact_bound[1]:
        # an exact solver's bound holds for its bound problem; above a plan the cost model prices lower, that
        # problem was no relaxation here, so its bound is no bound of the plan's time: the LP's is kept
        log.warning("%s's bound %.9g s above a feasible objective %.9g s: its bound problem misprices this "
                    "instance; the %s bound is kept", bound_method, bound, obj, pre_exact_bound[1])
        note = (note + "; " if note else "") + (f"{bound_method}'s bound {bound:.4f} s lies above a plan of "
                                                f"{obj:.4f} s: not used")
        bound, bound_method = pre_exact_bound
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
