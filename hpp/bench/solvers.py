"""bench-solvers: every solver of :mod:`hpp.formulation.composition.solve` on every instance of a suite, in one run.

Per instance the composition problem is built once (:meth:`Instance.problem`), the heuristic
runs once (it is also the exact solvers' warm start), then each exact solver runs with the same
settings, all through the one solve path :func:`hpp.formulation.composition.solve.solve`: every answer is bound to devices
and priced by the cost model (``objective_s``: the plan's predicted iteration time), and every
bound is a lower bound of that same quantity over all candidates and bindings.

Time to the best solution: a solver "reaches the best" on an instance when its objective is
within :func:`hpp.formulation.composition.solve.within_tolerance` of the least objective any solver found there; its
time to best is then its wall time (the solvers do not report when they found their final
answer, so this is the time until the answer was available), else infinite. The performance
profile (Dolan and More 2002) plots, per solver, the share of instances whose time to best is
within a factor x of the fastest solver's.

Consistency checks (:func:`check_consistency`): exact solvers that both close their (bound) model
on all candidates agree on its optimum; those that both prove optimality agree on it; no answer is
below another solver's proven bound; the heuristic never beats a proven optimum (all within the
tolerance of :mod:`hpp.formulation.composition.solve`).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from hpp.bench.instance_format import Instance
from hpp.errors import InfeasibleError
from hpp.fileio import write_rows_csv
from hpp.formulation.composition.solve import OPTIMUM_ATOL_S, OPTIMUM_RTOL, SolveResult, solve, within_tolerance
from hpp.formulation.composition.settings import SOLVER_NAMES, SolverSettings, bench_settings

__all__ = ["BenchRow", "CSV_COLUMNS", "run_bench", "check_consistency", "write_csv", "plot_time_to_best",
           "plot_performance_profile", "summary_table", "DEFAULT_TIME_LIMIT_S"]

log = logging.getLogger(__name__)

#: Default per-solver time limit [s] per suite (quick: the whole suite in < 3 minutes on 2 cores).
DEFAULT_TIME_LIMIT_S = {"quick": 5.0, "full": 30.0}


#: The CSV's columns, in order: the instance's, the solver's (:class:`SolveResult` fields), the comparison's.
CSV_COLUMNS = ("instance", "family", "num_gpus", "num_types", "num_layers", "num_candidates", "build_s", "solver",
               "status", "proven_optimal", "objective_s", "model_objective_s", "bound_s", "gap", "wall_s",
               "hit_time_limit", "nodes", "time_to_best_s", "reached_best", "note", "solver_model_objective_s",
               "solver_status", "source", "bound_method")
_RESULT_NAMES = frozenset(f.name for f in fields(SolveResult)) | {"proven_optimal"}


@dataclass(frozen=True)
class BenchRow:
    """One solver on one instance (a CSV row): the instance's figures and the solver's :class:`SolveResult`.

    The result's figures read as the row's own (``row.status`` is ``row.result.status``, likewise
    ``objective_s``, ``bound_s``, ``gap``, ``wall_s``, ``proven_optimal``, ...); ``num_candidates`` is the
    instance's (before the solver's presolve).

    Attributes
    ----------
    num_candidates : int
        Candidates of the instance's composition problem.
    build_s : float
        Seconds to build the problem.
    result : SolveResult
        The solver's answer (status ``NO_CANDIDATES`` when no pipeline fits memory).
    time_to_best_s : float
        The solver's wall time when it reached the least objective of the instance, else inf [s].
    reached_best : bool
    """

    instance: str
    family: str
    num_gpus: int
    num_types: int
    num_layers: int
    num_candidates: int
    build_s: float
    result: SolveResult
    time_to_best_s: float = math.inf
    reached_best: bool = False

    def __getattr__(self, name: str):
        if name in _RESULT_NAMES:          # only reached for names the row does not hold itself
            return getattr(self.result, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def as_csv(self) -> dict:
        """The row's :data:`CSV_COLUMNS` -> value."""
        return {c: getattr(self, c) for c in CSV_COLUMNS}


def _no_candidates(inst: Instance, build_s: float, exc: InfeasibleError) -> BenchRow:
    """The one row of an instance on which no pipeline fits memory."""
    result = SolveResult(solver="-", status="NO_CANDIDATES", objective_s=math.inf, bound_s=math.nan, gap=math.nan,
                         wall_s=0.0, source="", bound_method="", model_objective_s=math.inf, note=str(exc))
    return BenchRow(inst.name, inst.family, inst.num_gpus, inst.num_types, 0, 0, build_s, result)


def run_bench(instances: Iterable[Instance], *, solvers: Sequence[str] = SOLVER_NAMES,
              options: SolverSettings = bench_settings("cp-sat", 10.0), on_row: Callable[[BenchRow], None] | None = None
              ) -> list[BenchRow]:
    """Run ``solvers`` on every instance; rows in instance order, solvers in the given order.

    An instance on which no pipeline fits memory gets one row with status ``NO_CANDIDATES``.

    Raises
    ------
    HppInputError
        An instance that fails validation (e.g. names a missing profile), an unknown solver.
    """
    rows: list[BenchRow] = []
    for inst in instances:
        t0 = time.perf_counter()
        try:
            problem, _stats = inst.problem()
        except InfeasibleError as exc:
            row = _no_candidates(inst, time.perf_counter() - t0, exc)
            rows.append(row)
            if on_row:
                on_row(row)
            continue
        build_s = time.perf_counter() - t0
        layers = inst.load_profile().num_layers
        ncand = len(problem.candidates)
        incumbent = solve(problem, replace(options, solver="heuristic"))
        results = [incumbent if s == "heuristic" else
                   solve(problem, replace(options, solver=s), incumbent=incumbent if options.warm_start else None)
                   for s in solvers]
        best = min(r.objective_s for r in results)
        for r in results:
            reached = math.isfinite(best) and within_tolerance(r.objective_s, best)
            row = BenchRow(inst.name, inst.family, inst.num_gpus, inst.num_types, layers, ncand, build_s, r,
                           time_to_best_s=r.wall_s if reached else math.inf, reached_best=reached)
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def _by_instance(rows: Sequence[BenchRow]) -> dict[str, dict[str, BenchRow]]:
    out: dict[str, dict[str, BenchRow]] = {}
    for r in rows:
        if r.solver != "-":
            out.setdefault(r.instance, {})[r.solver] = r
    return out


def check_consistency(rows: Sequence[BenchRow]) -> list[str]:
    """Violations of the agreement rules of the module docstring (empty: all hold)."""
    bad = []
    for inst, m in _by_instance(rows).items():
        exact = [r for r in m.values() if r.solver != "heuristic"]
        for i, a in enumerate(exact):
            for b in exact[i + 1:]:
                if (a.solver_status == b.solver_status == "OPTIMAL" and " saw " not in a.note + b.note
                        and a.num_candidates == b.num_candidates
                        and not within_tolerance(a.solver_model_objective_s, b.solver_model_objective_s)):
                    bad.append(f"{inst}: {a.solver} and {b.solver} both close the model but disagree: "
                               f"{a.solver_model_objective_s:.6f} vs {b.solver_model_objective_s:.6f} s")
                if a.proven_optimal and b.proven_optimal and not within_tolerance(a.objective_s, b.objective_s):
                    bad.append(f"{inst}: {a.solver} and {b.solver} both prove optimal but disagree: "
                               f"{a.objective_s:.6f} vs {b.objective_s:.6f} s")
        for r in m.values():
            for e in exact:
                if e.bound_s == e.bound_s and r.objective_s < e.bound_s - OPTIMUM_ATOL_S - OPTIMUM_RTOL * e.bound_s:
                    bad.append(f"{inst}: {r.solver}'s objective {r.objective_s:.6f} s is below {e.solver}'s bound "
                               f"{e.bound_s:.6f} s")
            if r.solver == "heuristic":
                for e in exact:
                    if e.proven_optimal and r.objective_s < e.objective_s and not within_tolerance(r.objective_s,
                                                                                                   e.objective_s):
                        bad.append(f"{inst}: the heuristic ({r.objective_s:.6f} s) beats {e.solver}'s proven "
                                   f"optimum {e.objective_s:.6f} s")
    return bad


def write_csv(rows: Sequence[BenchRow], path: Path) -> None:
    """Write rows to ``path`` (header :data:`CSV_COLUMNS`), via a temporary file."""
    write_rows_csv((r.as_csv() for r in rows), path, columns=CSV_COLUMNS)


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else math.nan


def _solvers(rows: Sequence[BenchRow]) -> list[str]:
    return list(dict.fromkeys(r.solver for r in rows if r.solver != "-"))


def _plt():
    # local: matplotlib.pyplot adds ~2 s to start-up; only the plots need it
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


_STYLE = {"cp-sat": ("tab:blue", "o"), "milp": ("tab:orange", "s"), "heuristic": ("tab:green", "^")}


def plot_time_to_best(rows: Sequence[BenchRow], path: Path, *, time_limit_s: float | None = None) -> None:
    """Per instance (x), each solver's time to the best solution (log y); hollow x = never reached it."""
    plt = _plt()
    insts = list(_by_instance(rows))
    fig, ax = plt.subplots(figsize=(max(9, 0.6 * len(insts) + 3), 5.5))
    for k, s in enumerate(_solvers(rows)):
        color, marker = _STYLE.get(s, (None, "D"))
        xs, ys, xm, ym = [], [], [], []
        for i, name in enumerate(insts):
            r = _by_instance(rows)[name].get(s)
            if r is None:
                continue
            if r.reached_best:
                xs.append(i + 0.12 * (k - 1)), ys.append(max(r.time_to_best_s, 1e-3))
            else:
                xm.append(i + 0.12 * (k - 1)), ym.append(max(r.wall_s, 1e-3))
        ax.scatter(xs, ys, color=color, marker=marker, label=f"{s}: reached the best", zorder=3)
        if xm:
            ax.scatter(xm, ym, color=color, marker="x", label=f"{s}: did not (its wall time)", zorder=3)
    if time_limit_s:
        ax.axhline(time_limit_s, color="grey", linestyle=":", linewidth=1, label=f"time limit {time_limit_s:g} s")
    ax.set_yscale("log")
    ax.set_xticks(range(len(insts)))
    ax.set_xticklabels(insts, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("time to the best solution [s]")
    ax.set_title("Time to the best solution per instance (exact solvers: heuristic warm start included)", fontsize=10)
    ax.grid(True, which="both", axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ratios(rows: Sequence[BenchRow]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {s: [] for s in _solvers(rows)}
    for m in _by_instance(rows).values():
        fastest = min((r.time_to_best_s for r in m.values()), default=math.inf)
        for s, r in m.items():
            out[s].append(r.time_to_best_s / max(fastest, 1e-6) if math.isfinite(r.time_to_best_s) else math.inf)
    return out


def plot_performance_profile(rows: Sequence[BenchRow], path: Path, *, deterministic: bool = False) -> None:
    """Share of instances on which a solver reaches the best solution within x times the fastest solver's time
    (``deterministic``: the limit is a work limit, as in :func:`summary_table`)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    ratios = _ratios(rows)
    finite = [x for v in ratios.values() for x in v if math.isfinite(x)]
    xmax = max(2.0, max(finite, default=2.0) * 1.5)
    for s, rs in ratios.items():
        color, _ = _STYLE.get(s, (None, "D"))
        pts = sorted(rs)
        n = len(pts)
        xs, ys = [1.0], [sum(1 for r in pts if r <= 1.0) / n if n else 0.0]
        for r in pts:
            if math.isfinite(r) and r > 1.0:
                xs.append(r), ys.append(sum(1 for q in pts if q <= r) / n)
        xs.append(xmax), ys.append(ys[-1])
        at_limit = [r.gap for r in rows if r.solver == s and _stopped(r, deterministic)]
        label = s + (" (no bound)" if s == "heuristic" else
                     f" (gap at the limit: median {_median(at_limit):.1%} over {len(at_limit)})" if at_limit
                     else " (never hit the limit)")
        ax.step(xs, ys, where="post", color=color, label=label, linewidth=2)
    ax.set_xscale("log", base=2)
    ax.set_xlim(1.0, xmax)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("x: time to the best solution / the fastest solver's")
    ax.set_ylabel("share of instances")
    ax.set_title("Performance profile: time to the best solution", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _stopped(r: BenchRow, deterministic: bool) -> bool:
    """The row's exact solver was stopped by its limit: the wall clock, or with a work limit (``deterministic``)
    its budget (it ran and did not close its model: FEASIBLE or NO_SOLUTION)."""
    if deterministic:
        return r.solver != "heuristic" and r.solver_status in ("FEASIBLE", "NO_SOLUTION")
    return bool(r.hit_time_limit)


def summary_table(rows: Sequence[BenchRow], *, deterministic: bool = False, hint: bool = True) -> str:
    """Per solver: instances, proven optimal, model closed, median wall time, median gap, best found, wins.

    ``deterministic``: the run had a work limit (``--work-limit``), not a wall limit: ``gap@limit`` is over the rows
    whose exact solver ran out of its budget. ``hint``: the exact solvers started from the heuristic's plan."""
    by = _by_instance(rows)
    wins: dict[str, dict[str, int]] = {s: {} for s in _solvers(rows)}
    for name, m in by.items():
        reached = [r for r in m.values() if r.reached_best]
        if not reached:
            continue
        w = min(reached, key=lambda r: r.time_to_best_s)
        fam = w.family.split("/")[-1]
        wins[w.solver][fam] = wins[w.solver].get(fam, 0) + 1
    lines = [f"{'solver':<10} {'inst':>4} {'proven opt':>10} {'model opt':>9} {'median s':>8} {'median gap':>10} "
             f"{'gap@limit':>9} {'best found':>10} {'wins':>4}  where it wins (fastest to the best, by family)"]
    for s in _solvers(rows):
        rs = [r for r in rows if r.solver == s]
        at_limit = [r.gap for r in rs if _stopped(r, deterministic)]
        gap_txt = f"{_median([r.gap for r in rs]):.2%}"
        lim_txt = "-" if s == "heuristic" else (f"{_median(at_limit):.2%}" if at_limit else "none hit")
        where = ", ".join(f"{k} {v}" for k, v in sorted(wins[s].items(), key=lambda kv: -kv[1])) or "-"
        lines.append(f"{s:<10} {len(rs):>4} {sum(r.proven_optimal for r in rs):>10} "
                     f"{sum(r.solver_status == 'OPTIMAL' for r in rs):>9} {_median([r.wall_s for r in rs]):>8.2f} "
                     f"{gap_txt:>10} {lim_txt:>9} {sum(r.reached_best for r in rs):>10} {sum(wins[s].values()):>4}  {where}")
    limit = ("its work limit (--work-limit) stopped it before it closed its model (deterministic: the same rows on "
             "any host)" if deterministic else "its wall-clock limit (--time-limit) stopped it (those results depend "
             "on the host's speed and load)")
    start = ("cp-sat and milp start from the heuristic's plan as a hint and return it when they find nothing better, "
             "so their best found includes the heuristic's" if hint else
             "cp-sat and milp start cold (--no-hint): each row's plan is the solver's own, NO_SOLUTION where it "
             "found none")
    lines.append(f"(objective: the cost model's predicted iteration time of the returned plan; bound: a proven lower "
                 f"bound of it over all candidates and bindings (LP / copy bound, and the exact solver's when it saw "
                 f"every candidate); proven opt: status OPTIMAL, objective within {OPTIMUM_RTOL:g} relative of the "
                 f"bound; model opt: the exact solver closed its bound model; median gap: over all its instances; "
                 f"gap@limit: over the instances where {limit}; best found: instances where it returned the best "
                 f"objective of any solver; wins: of those, where it was the fastest to it; tolerance "
                 f"{OPTIMUM_ATOL_S:g} s + {OPTIMUM_RTOL:g} relative; {start}; model opt is on their "
                 f"bound model, a relaxation, not a proof about the returned plan)")
    return "\n".join(lines)
