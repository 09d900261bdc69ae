"""The exact solvers' step of the solve path (:func:`hpp.formulation.composition.solve.solve`, step 4): which
candidates they see, which model, which limits, and the run of one of them (CP-SAT or HiGHS) on a bound problem.

At the default budget the exact solver runs on the candidates left after the presolve, on the bound problem, up to
:attr:`~hpp.formulation.composition.settings.SolverSettings.candidate_limit` candidates. With a budget
(:attr:`~hpp.formulation.composition.settings.SolverSettings.budgeted`) it sees every candidate of the budgeted
model (:func:`budgeted_model`: reduced by a dominance exact for its model, with the copy bound's per-type sync
floors where they fit), up to a size that follows the budget (:func:`model_size_cap`), with its share of the budget
(:func:`exact_settings`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from hpp.errors import HppInputError

from hpp.formulation.composition.anytime import Budget, exact_model_candidates
from hpp.formulation.composition.copy_bound_levels import floor_tables
from hpp.formulation.composition.heuristics import heuristic_incumbent, solo_objective_s
from hpp.formulation.composition.lp_bound import composition_bounds
from hpp.formulation.composition.objective import judge_of
from hpp.formulation.composition.problem import CompositionProblem, ProblemCaches
from hpp.formulation.composition.settings import SolverSettings
from hpp.pruning.rules import exceeds_incumbent

__all__ = ["MILP_REL_GAP", "MILP_NODES_PER_WORK_UNIT", "MIN_EXACT_WALL_S", "FLOOR_TABLE_MAX_ENTRIES",
           "MODEL_CANDIDATES_PER_S", "MODEL_CANDIDATES_PER_UNIT", "best_candidates", "run_exact", "budgeted_model",
           "model_size_cap", "candidate_cap", "exact_bound", "exact_settings", "budget_of", "export_cpsat_model"]

#: HiGHS' relative MIP gap at which it stops and calls the answer optimal.
MILP_REL_GAP = 1e-6
#: HiGHS branch-and-bound nodes per unit of ``SolverSettings.deterministic_time`` (its deterministic limit).
MILP_NODES_PER_WORK_UNIT = 2000
#: With a wall-clock budget, an exact solver is not started with less than this left [s] (building its model alone
#: takes about that on a few hundred candidates).
MIN_EXACT_WALL_S = 0.3

#: The most (candidates x pipeline counts) for which the budgeted exact model gets the copy bound's per-type sync
#: floors (their tables, and the dominance that compares them at every count, grow with both).
FLOOR_TABLE_MAX_ENTRIES = 200_000


def budgeted_model(problem: CompositionProblem, keep: list[int], must: Mapping[int, int]
                    ) -> tuple[list[int], CompositionProblem]:
    """The exact solvers' model with a budget: ``(selected indices, their bound problem)``.

    The candidates ``keep`` reduced by :func:`~hpp.formulation.composition.anytime.exact_model_candidates` (``must``
    kept). Where (candidates x most pipelines) is at most :data:`FLOOR_TABLE_MAX_ENTRIES`, the bound problem has the
    copy bound's per-type sync floors as well
    (:func:`~hpp.formulation.composition.copy_bound_levels.floor_tables`, computed over every candidate of ``keep``,
    the dominance then comparing them at every count); else the cluster-wide floor only.
    """
    bp = problem.bound_problem()
    most = min(problem.cluster.num_devices, sum(problem.max_copies(c) for c in keep))
    pool = exact_model_candidates(bp, keep, must=list(must))
    if len(keep) * most > FLOOR_TABLE_MAX_ENTRIES:
        return pool, bp.restricted(pool)
    floors = floor_tables(bp.restricted(keep), most)
    row = {c: r for r, c in enumerate(keep)}
    sel = exact_model_candidates(bp, keep, must=list(must), floors=floors)
    sub = bp.restricted(sel)
    return sel, replace(sub, floor_table=floors[[row[c] for c in sel]],
                        caches=ProblemCaches(ring=sub.caches.ring, by_usage=sub.caches.by_usage))


#: With a budget, the exact solvers' model holds at most this many candidates per second of wall-clock budget left,
#: or per unit of deterministic budget: (CP-SAT, HiGHS). Building a CP-SAT model of 3,000 candidates took ~10 s
#: (opt350-1024-4types), and HiGHS spent 40 s on 192 candidates of opt350-3types-40 with a limit of 200 nodes (its
#: node limit does not bound its root work; measured); above, they run on the best that many (their bound then not
#: used).
MODEL_CANDIDATES_PER_S = {"cp-sat": 100, "milp": 30}
MODEL_CANDIDATES_PER_UNIT = {"cp-sat": 2000, "milp": 400}


def model_size_cap(exact: str, settings: SolverSettings, budget: Budget) -> int:
    """The most candidates the budgeted exact model of solver ``exact`` may hold (:data:`MODEL_CANDIDATES_PER_S`,
    :data:`MODEL_CANDIDATES_PER_UNIT`), at least 30."""
    if budget.deadline is not None:
        return max(30, int(MODEL_CANDIDATES_PER_S[exact] * budget.left_s()))
    return max(30, int(MODEL_CANDIDATES_PER_UNIT[exact] * settings.work_budget))


def best_candidates(problem: CompositionProblem, keep: list[int], must: set[int], limit: int) -> list[int]:
    """Up to about ``limit`` of ``keep``: ``must``, then the best by solo objective per device-type set."""
    groups: dict[frozenset, list[int]] = {}
    for c in keep:
        groups.setdefault(frozenset(problem.candidates[c].devices), []).append(c)
    share = max(1, (limit - len(must)) // max(1, len(groups)))
    out = set(must)
    for members in groups.values():
        out.update(sorted(members, key=lambda c: (solo_objective_s(problem, c), c))[:share])
    return sorted(out)


def run_exact(name: str, sub, settings: SolverSettings, hint: dict, cutoff: float | None, lb_pipe: float,
           progress) -> tuple[dict, str, float, float, bool, int, str]:
    """(counts, status, bound, model objective, hit limit, nodes, note) of the exact solver on bound problem ``sub``."""
    from hpp.formulation.composition.solve import model_objective_s       # solve imports this module
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


def budget_of(settings: SolverSettings, t0: float, deadline: float | None) -> Budget | None:
    """The budget of the budgeted phase (None at the default budget): the wall-clock limit from ``t0`` (or the
    caller's ``deadline``), else the deterministic work budget."""
    if not settings.budgeted:
        return None
    if settings.max_time_in_seconds is not None:
        return Budget(deadline if deadline is not None else t0 + settings.max_time_in_seconds)
    return Budget(None, settings.work_budget)


def exact_settings(settings: SolverSettings, budget: Budget, *, share: float) -> SolverSettings:
    """The exact solver's settings in the budgeted phase: with a wall-clock budget ``share`` of what is left (its
    deterministic limit then no tighter), else the deterministic budget as given (each exact run gets it whole)."""
    if budget.deadline is None:
        return settings
    left = max(0.05, share * budget.left_s())
    return replace(settings, max_time_in_seconds=left, deterministic_time=max(settings.deterministic_time, left))


def candidate_cap(problem: CompositionProblem, keep: list[int], exact: str, settings: SolverSettings,
                  budget: Budget | None, model: CompositionProblem | None) -> int:
    """The most candidates exact solver ``exact`` sees (above: the best that many, its bound then not used): the
    settings' :attr:`~hpp.formulation.composition.settings.SolverSettings.candidate_limit`, and as many as its sync
    tables of the most pipelines fit in ``max_table_entries`` (not for CP-SAT's one-table sync of a large bound
    problem without per-candidate floors, :func:`~hpp.formulation.composition.cpsat.build_composition_model`); with a
    ``budget`` (its ``model``, :func:`budgeted_model`) at most :func:`model_size_cap`."""
    most = min(problem.cluster.num_devices, sum(problem.max_copies(c) for c in keep))
    compact = budget is not None and exact == "cp-sat" and model.floor_table is None and most > 256
    limit = settings.candidate_limit if compact else \
        min(settings.candidate_limit, max(50, settings.max_table_entries // max(1, most)))
    return limit if budget is None else min(limit, model_size_cap(exact, settings, budget))


def exact_bound(status: str, bound_s: float, cutoff_s: float | None) -> float:
    """The bound an exact run on every candidate proves [s] (nan: none): with a cutoff (a feasible plan's time),
    INFEASIBLE means nothing's bound model beats that plan, and plans cut off cost more than it."""
    if status == "INFEASIBLE" and cutoff_s is not None:
        return cutoff_s
    if cutoff_s is not None and bound_s == bound_s:
        return min(bound_s, cutoff_s)
    return bound_s


def export_cpsat_model(problem: CompositionProblem, path, *, settings: SolverSettings = SolverSettings()) -> dict:
    """Write the CP-SAT model :func:`solve` would solve on ``problem`` (its bound problem, all candidates left
    after the presolve, the warm start of ``settings``; with a budget reduced and with the per-type sync floors,
    as there) to ``path``; returns a description.

    ``.pb`` writes the binary proto, ``.pbtxt``/``.txt`` the text format. Variables ``x_<i>`` are the copies of
    the i-th listed candidate; the objective is in integer microseconds (rounded down: a bound model).
    """
    # imported here: ortools' CP-SAT module costs ~0.4 s to import (measured), paid only on export
    from hpp.formulation.composition.cpsat import build_composition_model

    judge = judge_of(problem)
    bp = problem.bound_problem()
    keep = [c for c in range(len(problem.candidates)) if problem.max_copies(c) > 0]
    hint, inc_obj = {}, None
    if settings.warm_start:
        inc_counts, _ = heuristic_incumbent(problem)
        inc_obj = judge(inc_counts)
        keep = sorted({c for c in keep if not exceeds_incumbent(bp.candidates[c], inc_obj)} | set(inc_counts))
        hint = {keep.index(c): x for c, x in inc_counts.items()}
    bsub = bp.restricted(keep)
    lb_pipe = composition_bounds(bsub)[0] if settings.warm_start else None
    if settings.budgeted:                           # as solve() builds it with a budget
        sel, bsub = budgeted_model(problem, keep, {c: 1 for c in hint and {keep[i] for i in hint}})
        hint = {sel.index(keep[i]): x for i, x in hint.items()}
        keep = sel
    model, _ = build_composition_model(bsub, settings=settings, hint=hint or None, incumbent_s=inc_obj,
                                       lower_bound_pipe_s=lb_pipe)
    if not model.export_to_file(str(path)):
        raise HppInputError("CP-SAT could not write the model", source=str(path), fix="check the path")
    return {"path": str(path), "objective_unit": "microseconds", "num_variables": len(model.proto.variables),
            "num_constraints": len(model.proto.constraints),
            "candidates": [{"index": i, "problem_index": c, "label": problem.candidates[c].label(),
                            "variable": f"x_{i}"} for i, c in enumerate(keep)],
            "incumbent_s": inc_obj}
