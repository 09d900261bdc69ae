"""Gap progress (what limits the gap): per input and method, the incumbent and the bound it reaches.

The gap of a search is ``(incumbent - bound) / incumbent`` (:func:`hpp.formulation.composition.solve.gap`):
the incumbent is the best plan's iteration time as the cost model predicts it (the *judged* objective,
what :func:`~hpp.formulation.composition.solve.solve` returns), the bound a proven lower bound of that same
quantity over every candidate and binding. To see which side keeps a gap open, each input is run with
methods that push one side or the other, all on the same candidates (:func:`hpp.planner.make_problem`):

``heuristic``
    :func:`~hpp.formulation.composition.heuristics.best_incumbent`, judged as :func:`solve` judges; bound: the
    sync-class LP of :func:`~hpp.formulation.composition.lp_bound.composition_bounds` *without* the copy bound
    (``copies=False``) on the presolved bound problem, exactly as :func:`solve` restricts it.
``default``
    :func:`hpp.planner.plan_hpp` with default settings and no baseline seeds (``hpp plan --no-baselines``).
``type-classes``
    ``default`` with ``SolverSettings(type_classes=True)``: :mod:`~hpp.formulation.composition.type_classes`.
``copy-bound-deep``
    :func:`~hpp.formulation.composition.copy_bound.copy_bound` on the same bound problem with ``rel_tol=0`` and
    :data:`DEEP_FACTOR` times the local-search budget (``max_evals``, ``pool_size``); bound: the larger of it
    and the LP's pipeline bound plus the least optimizer step (as :func:`solve`); incumbent: the better
    judged plan of the heuristic's and the one it found.
``bound-lp-plan``
    Not a method but the bound's own best plan: the LP copies of the default copy bound (on the presolved
    bound problem, as :func:`solve` runs it) at its least exact level value (``relaxed_s``: that value, what
    the relaxation says the plan costs at least), rounded (floor, then filled) and judged by the cost model
    (``incumbent_s``); ``bound_s`` is nan (one plan's relaxed price is no bound). Where the judged price is far
    above the relaxed one, the relaxation is loose at the very plan that sets the bound.
``cp-sat`` / ``milp``
    :func:`solve` with that solver on *all* candidates left after the presolve (``max_candidates`` raised),
    the heuristic's incumbent as hint and cutoff, at the deterministic budgets given (``budget`` column:
    CP-SAT's work units; HiGHS' node limit is ``MILP_NODES_PER_WORK_UNIT`` per unit); the figures are
    :func:`solve`'s (its bound is the larger of the LP/copy bound and the exact solver's). Skipped (a row
    with a note) above ``max_exact_candidates`` candidates.

The thin script is ``experiments/gap_progress.py``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator, Mapping, Sequence

from hpp.bench.search_overhead import BenchPoint, scenario_points, sweep_points
from hpp.fileio import read_dataclass_csv
from hpp.formulation.composition.copy_bound import copy_bound, round_plans
from hpp.formulation.composition.heuristics import best_incumbent
from hpp.formulation.composition.lp_bound import composition_bounds
from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.composition.settings import SolverSettings
from hpp.formulation.composition.solve import SolveResult, gap, model_objective_s, solve, within_tolerance
from hpp.formulation.composition.type_classes import type_class_bound
from hpp.planner import make_problem, plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.pruning.rules import exceeds_incumbent

__all__ = ["GapRow", "GapSummary", "METHODS", "DEEP_FACTOR", "MAX_EXACT_CANDIDATES", "FULL_SIZES", "FULL_TYPES",
           "FULL_SCENARIOS", "gap_points", "measure_input", "measure_inputs", "same_input_key", "summarise",
           "summary_table", "read_gap_csv", "limits_lines", "type_class_lines"]

#: The methods, in the order each input runs them.
METHODS = ("heuristic", "default", "type-classes", "copy-bound-deep", "bound-lp-plan", "cp-sat", "milp")
#: ``copy-bound-deep``: this many times the copy bound's default local-search budget (max_evals 400, pool 8).
DEEP_FACTOR = 10
#: The exact solvers are skipped above this many candidates (after the presolve): model too large to build.
MAX_EXACT_CANDIDATES = 2000
#: The full mode's sweep (GPU counts and type counts) and bundled scenarios.
FULL_SIZES, FULL_TYPES = (8, 16, 32, 64, 1024), (2, 3, 4)
FULL_SCENARIOS = ("opt350-a100x4-v100x4", "opt350-3types-40", "llama8-3types-40", "opt350-512", "opt350-1024-4types")


@dataclass(frozen=True)
class GapRow:
    """One method on one input (a CSV row). Times in seconds.

    ``candidates``: candidates left after the presolve (the ones the bound covers and the exact solvers see);
    ``budget``: deterministic work units (cp-sat, milp), the local-search factor (copy-bound-deep), nan else;
    ``incumbent_s``: the judged iteration time of the method's best plan (inf: none); ``bound_s``: the proven
    lower bound it reaches (nan: skipped); ``wall_s``: the method's own seconds (``default``: the whole
    ``plan_hpp``; the others exclude building the candidates and the shared heuristic incumbent);
    ``source`` / ``bound_method``: what gave the incumbent and the bound; ``plan_bound_model_s``: the exact
    solvers' bound model's price of the row's plan (:func:`~hpp.formulation.composition.solve.model_objective_s` on
    the bound problem: no search on that model can prove a bound above it); ``solver_status`` /
    ``solver_model_s``: the exact solver's status and objective on its bound model (cp-sat, milp).
    """

    input: str
    num_gpus: int
    num_types: int
    candidates: int
    method: str
    budget: float
    incumbent_s: float
    bound_s: float
    gap: float
    wall_s: float
    source: str = ""
    bound_method: str = ""
    plan_bound_model_s: float = math.nan
    solver_status: str = ""
    solver_model_s: float = math.nan
    note: str = ""
    relaxed_s: float = math.nan


@dataclass(frozen=True)
class GapSummary:
    """Per input: the default's figures, the best incumbent and bound over all methods, and which side moved.

    ``incumbent_gain`` / ``bound_gain``: relative improvement over the default's incumbent / bound (>= 0;
    0 when no method beat it). ``side_moved``: ``incumbent``, ``bound``, ``both`` or ``neither`` (a move
    within the solver's optimum tolerance, 0.1 %, counts as none). ``model_floor_gap``: the gap of the best
    incumbent against the exact solvers' bound-model price of that same plan (``plan_bound_model_s``): the
    least gap CP-SAT or the MILP could ever prove while that plan stays the best (their bound is at most it).
    """

    input: str
    num_gpus: int
    num_types: int
    candidates: int
    default_gap: float
    default_incumbent_s: float
    default_bound_s: float
    best_incumbent_s: float
    best_incumbent_method: str
    best_bound_s: float
    best_bound_method: str
    remaining_gap: float
    incumbent_gain: float
    bound_gain: float
    side_moved: str
    model_floor_gap: float = math.nan
    skipped: list = field(default_factory=list)
    lp_plan_relaxed_s: float = math.nan
    lp_plan_judged_s: float = math.nan
    exact: str = ""


def gap_points(sizes: Iterable[int], type_counts: Iterable[int],
               scenarios: Iterable[str] = ()) -> Iterator[BenchPoint]:
    """The sweep points (:func:`hpp.bench.search_overhead.sweep_points`) then the bundled scenarios named;
    a scenario equal to a sweep point (same cluster and global batch) is still measured under its own name."""
    yield from sweep_points(sizes, type_counts)
    yield from scenario_points(scenarios)


def same_input_key(p: BenchPoint) -> tuple:
    """What makes two points the same problem: model, global batch and the cluster (its name aside)."""
    d = dict(cluster_to_dict(p.cluster))
    d.pop("name", None)
    return p.model, p.global_batch_size, json.dumps(d, sort_keys=True, default=str)


def measure_inputs(points: Iterable[BenchPoint], *, exact_up_to: int | None = None,
                   large_on: Collection[str] | None = None,
                   on_row: Callable[[GapRow], None] | None = None, **kw) -> list[GapRow]:
    """:func:`measure_input` on each point (``kw`` passed on); a point equal to one already measured
    (:func:`same_input_key`, e.g. a bundled scenario that is a sweep point) gets that point's rows under its
    own name, noted ``same input as <name>``. ``exact_up_to``: CP-SAT and the MILP only up to this many GPUs.
    ``large_on``: the inputs (names) on which CP-SAT budgets above 1 unit and the MILP run (None: all); on
    the others they get a skipped row (wall time: 48-73 s per CP-SAT run of 10 units, the MILP at 10 units
    hits a 90 s cap from 632 candidates; measured Dec 2 2026 on 2 cores)."""
    rows: list[GapRow] = []
    seen: dict[tuple, str] = {}

    def keep(r: GapRow) -> None:
        rows.append(r)
        if on_row:
            on_row(r)
    for p in points:
        key = same_input_key(p)
        if key in seen:
            for r in [r for r in rows if r.input == seen[key]]:
                keep(replace(r, input=p.name, note="; ".join(x for x in (f"same input as {seen[key]}", r.note) if x)))
            continue
        seen[key] = p.name
        small = exact_up_to is None or p.num_gpus <= exact_up_to
        skip = {}
        if large_on is not None and p.name not in large_on:
            big = [_label("cp-sat", b) for b in kw.get("cpsat_budgets", ()) if b > 1]
            big += [_label("milp", kw["milp_budget"])] if kw.get("milp_budget") else []
            skip = {k: f"budgets above 1 unit and the MILP only on {', '.join(large_on)} (wall time)" for k in big}
        measure_input(p, **(kw if small else {**kw, "cpsat_budgets": (), "milp_budget": None}), skip=skip,
                      on_row=keep)
    return rows


def _label(method: str, budget: float) -> str:
    return method if budget != budget else f"{method}@{budget:g}"


def measure_input(p: BenchPoint, *, cpsat_budgets: Sequence[float] = (1.0, 10.0), milp_budget: float | None = 10.0,
                  max_exact_candidates: int = MAX_EXACT_CANDIDATES, workers: int = 2,
                  deep: bool = True, skip: Mapping[str, str] | None = None,
                  on_row: Callable[[GapRow], None] | None = None) -> list[GapRow]:
    """Run :data:`METHODS` on input ``p``; one :class:`GapRow` per method and budget.

    Parameters
    ----------
    cpsat_budgets : CP-SAT deterministic budgets [work units]; () for none.
    milp_budget : the MILP's deterministic budget [work units] (node limit), None for none.
    max_exact_candidates : above this many presolved candidates CP-SAT and the MILP are skipped.
    workers : CP-SAT workers (interleaved: deterministic for a given count) and LP processes.
    deep : run ``copy-bound-deep``.
    skip : exact runs (``"cp-sat@10"``, ``"milp@10"``) not to run, with the reason (a row with the reason as note).
    """
    profile = load_bundled_profile(p.model)
    problem, _ = make_problem(p.cluster, profile, p.global_batch_size, workers=1)
    rows: list[GapRow] = []

    def add(method: str, budget: float, n: int, inc: float, bound: float, wall: float, source: str = "",
            bound_method: str = "", note: str = "", counts: dict | None = None, solver_status: str = "",
            solver_model: float = math.nan, relaxed: float = math.nan) -> None:
        priced = model_objective_s(bp, counts) if counts else math.nan
        row = GapRow(p.name, p.num_gpus, p.num_types, n, method, budget, float(inc), float(bound), gap(inc, bound),
                     wall, source, bound_method, float(priced), solver_status, float(solver_model), note,
                     float(relaxed))
        rows.append(row)
        if on_row:
            on_row(row)

    def judge(counts: dict) -> float:
        counts = {c: x for c, x in counts.items() if x > 0}
        return problem.estimator(counts)[1].iteration_time_s if counts else math.inf

    # heuristic: the incumbent and the presolve, as solve() does them; the sync-class LP bound
    t0 = time.perf_counter()
    inc_counts, _ = best_incumbent(problem)
    inc_obj = judge(inc_counts)
    bp = problem.bound_problem()
    keep = [c for c in range(len(problem.candidates)) if problem.max_copies(c) > 0]
    if math.isfinite(inc_obj):
        keep = sorted({c for c in keep if not exceeds_incumbent(bp.candidates[c], inc_obj)} | set(inc_counts))
    bsub = bp.restricted(keep)
    cut = inc_obj if math.isfinite(inc_obj) else None
    lb_pipe, lb_classes = composition_bounds(bsub, workers=1, incumbent_s=cut, copies=False)
    least_opt = min(c.partition.optimizer_s for c in bsub.candidates)
    lp_bound = float(max(lb_pipe + least_opt, lb_classes))
    t_heur = time.perf_counter() - t0
    n = len(keep)
    add("heuristic", math.nan, n, inc_obj, lp_bound, t_heur, "heuristic", "lp (sync classes)", counts=inc_counts)
    incumbent = SolveResult("heuristic", "FEASIBLE", inc_obj, math.nan, math.nan, t_heur, counts=dict(inc_counts))

    res = plan_hpp(p.cluster, profile, p.global_batch_size)
    s = res.search
    add("default", math.nan, s.num_candidates, s.objective_s, s.bound_s, res.wall_s, s.source, s.bound_method, s.note,
        counts=s.counts)

    res = plan_hpp(p.cluster, profile, p.global_batch_size, settings=SolverSettings(type_classes=True))
    s, classes = res.search, type_class_bound(bsub, cutoff_s=cut).classes          # (the note: each class's bound)
    add("type-classes", math.nan, s.num_candidates, s.objective_s, s.bound_s, res.wall_s, s.source, s.bound_method,
        "classes: " + ", ".join(f"{k} {v:.6g} s" for k, v in classes.items()), counts=s.counts)

    if deep:
        t0 = time.perf_counter()
        sub = problem.restricted(keep)
        pos = {c: i for i, c in enumerate(keep)}
        start = {pos[c]: x for c, x in inc_counts.items()}
        cb = copy_bound(sub, bound_problem=bsub, incumbent=(start, composition_objective_s(sub, start)), cutoff_s=cut,
                        rel_tol=0.0, max_evals=400 * DEEP_FACTOR, pool_size=8 * DEEP_FACTOR)
        plan = {keep[c]: x for c, x in cb.counts.items()}
        found = judge(plan)
        bound = float(max(lb_pipe + least_opt, cb.bound_s))
        better = found < inc_obj
        add("copy-bound-deep", float(DEEP_FACTOR), n, min(found, inc_obj), bound, time.perf_counter() - t0,
            "copy-bound" if better else "heuristic", "copy-bound" if cb.bound_s >= lb_pipe + least_opt else "lp",
            f"{cb.nodes} nodes, {cb.lp_solves} LP solves; its plan judged {found:.6g} s",
            counts=plan if better else inc_counts)

    # the bound's own best plan (the default copy bound, as composition_bounds runs it): relaxed vs judged
    t0 = time.perf_counter()
    cb0 = copy_bound(bsub, cutoff_s=cut, max_evals=0)
    plans = round_plans(bsub, (None, None, cb0.known_plan, None), []) if cb0.known_plan else []
    judged = [(judge({keep[c]: x for c, x in q.items()}), q) for q in plans]
    lp_s, lp_q = min(judged, key=lambda v: v[0]) if judged else (math.inf, {})
    copies = ", ".join(f"{x:.2f} x {bsub.candidates[c].label()}" for c, x in
                       sorted(cb0.known_plan.items(), key=lambda kv: -kv[1]))
    add("bound-lp-plan", math.nan, n, lp_s, math.nan, time.perf_counter() - t0, "copy-bound LP", "",
        f"LP copies: {copies or 'none'}; rounded: {len(plans)} plan(s)",
        counts={keep[c]: x for c, x in lp_q.items()} if lp_q else None, relaxed=cb0.known_s)

    exact = [("cp-sat", b) for b in cpsat_budgets] + ([("milp", milp_budget)] if milp_budget is not None else [])
    for name, budget in exact:
        why = (skip or {}).get(_label(name, budget))
        if why:
            add(name, budget, n, math.inf, math.nan, 0.0, note=f"skipped: {why}")
            continue
        if n > max_exact_candidates:
            add(name, budget, n, math.inf, math.nan, 0.0, note=f"skipped: {n} candidates after the presolve > "
                f"{max_exact_candidates} (model too large to build in reasonable time)")
            continue
        # a deterministic budget (the solve path's budgeted phase at that work; a wall limit would be spent whole)
        settings = SolverSettings(solver=name, deterministic_time=budget, max_candidates=max(1, n), num_workers=workers,
                                  max_table_entries=10 ** 12)
        r = solve(problem, settings, incumbent=incumbent)
        note = "; ".join(x for x in (r.note, "WALL CAP HIT" if r.hit_time_limit else "") if x)
        add(name, budget, r.num_candidates, r.objective_s, r.bound_s, r.wall_s, r.source, r.bound_method, note,
            counts=r.counts, solver_status=r.solver_status or "not run", solver_model=r.solver_model_objective_s)
    return rows


def summarise(rows: Sequence[GapRow]) -> list[GapSummary]:
    """One :class:`GapSummary` per input of ``rows`` (in their order)."""
    out = []
    for name in dict.fromkeys(r.input for r in rows):
        mine = [r for r in rows if r.input == name]
        d = next(r for r in mine if r.method == "default")
        ran = [d] + [r for r in mine if r is not d and math.isfinite(r.incumbent_s)]
        best_inc = min(ran, key=lambda r: r.incumbent_s)          # ties: the default
        best_bnd = max([d] + [r for r in mine if r is not d and r.bound_s == r.bound_s], key=lambda r: r.bound_s)
        inc_gain = max(0.0, (d.incumbent_s - best_inc.incumbent_s) / d.incumbent_s)
        bnd_gain = max(0.0, (best_bnd.bound_s - d.bound_s) / d.bound_s) if d.bound_s > 0 else 0.0
        inc_moved = not within_tolerance(best_inc.incumbent_s, d.incumbent_s) and inc_gain > 0
        bnd_moved = not within_tolerance(best_bnd.bound_s, d.bound_s) and bnd_gain > 0
        side = {(True, True): "both", (True, False): "incumbent", (False, True): "bound"}.get((inc_moved, bnd_moved),
                                                                                            "neither")
        out.append(GapSummary(name, d.num_gpus, d.num_types, d.candidates, d.gap, d.incumbent_s, d.bound_s,
                              best_inc.incumbent_s, _label(best_inc.method, best_inc.budget),
                              best_bnd.bound_s, _label(best_bnd.method, best_bnd.budget),
                              gap(best_inc.incumbent_s, best_bnd.bound_s), inc_gain, bnd_gain, side,
                              gap(best_inc.incumbent_s, best_inc.plan_bound_model_s),
                              [_label(r.method, r.budget) for r in mine if r.note.startswith("skipped")],
                              *next(((r.relaxed_s, r.incumbent_s) for r in mine if r.method == "bound-lp-plan"),
                                    (math.nan, math.nan)), _exact_text(mine)))
    return out


def _exact_text(rows: Sequence[GapRow]) -> str:
    """The exact solvers' outcome on one input, e.g. ``cp-sat@1 NO_SOLUTION; milp@10 OPTIMAL (its model 39.02 s)``."""
    out = []
    for r in rows:
        if r.method not in ("cp-sat", "milp"):
            continue
        label = _label(r.method, r.budget)
        if r.note.startswith("skipped"):
            out.append(f"{label} skipped")
            continue
        model = f" (its model {r.solver_model_s:.4g} s)" if math.isfinite(r.solver_model_s) else ""
        out.append(f"{label} {r.solver_status or 'not run'}{model}" + (" wall cap" if "WALL CAP" in r.note else ""))
    return "; ".join(out) or "-"


def summary_table(summaries: Sequence[GapSummary]) -> str:
    """The per-input summary as a markdown table (times in seconds, gaps and gains in %)."""
    head = ("| input | GPUs | cands | default gap | best incumbent vs default | best bound vs default | "
            "remaining gap | side moved | by | exact-model floor | bound's own plan: relaxed vs cost model | exact solvers |")
    lines = [head, "|" + "---|" * 12]
    for s in summaries:
        moved = [m for m, side in ((s.best_incumbent_method, "incumbent"), (s.best_bound_method, "bound"))
                 if s.side_moved in (side, "both")]
        by = ", ".join(moved) or "-"
        lines.append(
            f"| {s.input} | {s.num_gpus} | {s.candidates} | {s.default_gap:.1%} | {s.best_incumbent_s:.4f} vs "
            f"{s.default_incumbent_s:.4f} (-{s.incumbent_gain:.2%}) | {s.best_bound_s:.4f} vs {s.default_bound_s:.4f} "
            f"(+{s.bound_gain:.2%}) | {s.remaining_gap:.1%} | {s.side_moved} | {by} | {s.model_floor_gap:.1%} | "
            f"{s.lp_plan_relaxed_s:.4f} vs {s.lp_plan_judged_s:.4f} | {s.exact or '-'} |")
    return "\n".join(lines)


def read_gap_csv(path: Path) -> list[GapRow]:
    """Rows written by ``experiments/gap_progress.py`` ([] if the file does not exist; ValueError on a column
    :class:`GapRow` lacks)."""
    return read_dataclass_csv(path, GapRow)


def limits_lines(summaries: Sequence[GapSummary]) -> list[str]:
    """What the table says limits the gap, in sentences computed from it (for the README)."""
    n = len(summaries)
    moved = [s for s in summaries if s.side_moved != "neither"]
    loose = [s for s in summaries if s.lp_plan_judged_s == s.lp_plan_judged_s and s.lp_plan_relaxed_s > 0
             and s.lp_plan_judged_s >= s.lp_plan_relaxed_s * (1 + s.default_gap)]
    best_inc = max((s.incumbent_gain for s in summaries), default=0.0)
    best_bnd = max((s.bound_gain for s in summaries), default=0.0)
    out = [f"Beyond the default search, the methods moved the incumbent or the bound on {len(moved)} of {n} inputs "
           f"(at most {best_inc:.2%} on the incumbent, {best_bnd:.2%} on the bound)."]
    if loose:
        out.append(f"On {len(loose)} of {n} inputs the bound's own plan costs, by the cost model, at least (1 + the "
                   f"default gap) times what the relaxation prices it at: there the relaxation is loose at the very "
                   f"plan that sets the bound: the bound, not the search, is what a method must move first: "
                   + ", ".join(f"{s.input} {s.lp_plan_relaxed_s:.4g} vs {s.lp_plan_judged_s:.4g} s" for s in loose) + ".")
    return out


def type_class_lines(rows: Sequence[GapRow]) -> list[str]:
    """The type-class bound against the default (gaps, search-time ratio of this run), a sentence for the README."""
    by: dict[str, dict[str, GapRow]] = {}
    for r in rows:
        by.setdefault(r.input, {})[r.method] = r
    pairs = [(n, m["default"], m["type-classes"]) for n, m in by.items() if {"default", "type-classes"} <= set(m)]
    ratios = sorted(t.wall_s / d.wall_s for _, d, t in pairs if d.wall_s > 0)
    if not ratios:
        return []
    moved = ", ".join(f"{n} {d.gap:.1%} -> {t.gap:.1%}" for n, d, t in pairs if t.bound_s > d.bound_s * (1 + 1e-3))
    return [f"`hpp plan --type-classes` (method `type-classes`) raised the bound by more than 0.1 % on "
            f"{moved.count('->')} of {len(pairs)} inputs ({moved or 'none'}); its search took "
            f"{ratios[len(ratios) // 2]:.2f}x the default's time (median; {ratios[0]:.2f}-{ratios[-1]:.2f}x) in this run."]
