"""The one settings record of the solve path (:func:`hpp.formulation.composition.solve.solve`, :func:`hpp.planner.plan_hpp`).

No solver import here (but in :func:`check_cpsat_params`, when CP-SAT parameters are given): the record is plain
data, checked at the boundary. CP-SAT parameters can
also be given as text, as the OR-Tools examples do (``"num_workers:1,random_seed:1"``), parsed
with ``google.protobuf.text_format`` into ``sat_parameters_pb2.SatParameters``; they are applied
last, over the explicit fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from google.protobuf import text_format
from ortools.sat import sat_parameters_pb2

from hpp.errors import HppInputError

__all__ = ["SolverSettings", "SOLVER_NAMES", "DEFAULT_SOLVER", "DEFAULT_DETERMINISTIC_TIME", "SMALL_BUDGET_MAX_CANDIDATES",
           "MAX_CANDIDATES", "NO_CANDIDATE_LIMIT", "parse_cpsat_params", "check_cpsat_params", "bench_settings"]

#: The solvers of the one interface.
SOLVER_NAMES: tuple[str, ...] = ("cp-sat", "milp", "heuristic")
DEFAULT_SOLVER = "cp-sat"
#: CP-SAT's deterministic time limit (its own work units, about seconds on one quiet core) when no wall limit is
#: set: the search stops at the same point on every run, so the answer does not depend on the machine's load.
#: Small by default (it replaces the old 0.05 s wall-clock "patience", which kept the search fast): on the
#: bundled scenarios that run CP-SAT (<= 200 candidates) it found nothing better than the incumbent even at
#: 0.25 units (llama8-3types-40: 0.25 units took 4.4 s wall under load 8, status UNKNOWN; measured Dec 1).
#: Raise it (``deterministic_time``, or ``--cpsat-params "max_deterministic_time:5"``) to let CP-SAT work.
DEFAULT_DETERMINISTIC_TIME = 0.05
#: The exact solver's candidate limit at the default deterministic budget (``max_candidates=None``). With 0.05
#: units CP-SAT spends the budget in its presolve (probing) on larger models: on the 24 inputs of 25-198
#: candidates measured (bundled opt350-a100x4-v100x4 v1, llama8-3types-40 v1 and v2, 21 synthetic ones) it
#: moved neither the bound nor the plan and cost 0.2-0.7 s of CPU each; on 24 inputs of 2-10 candidates it
#: moved the bound or the plan on 6 (``experiments/cpsat_budget.py``, results/cpsat_budget.csv, Dec 1 2026).
#: With a larger budget the limit is :data:`MAX_CANDIDATES`.
SMALL_BUDGET_MAX_CANDIDATES = 16
#: The exact solver's candidate limit when an exact solver is named at the default budget (``hpp plan --solver``).
MAX_CANDIDATES = 200
#: The candidate limit with more than the default budget: none (the exact solver sees every candidate).
NO_CANDIDATE_LIMIT = 10**9


def parse_cpsat_params(text: str):
    """``text`` (protobuf text format, fields comma- or space-separated) as ``SatParameters``.

    >>> parse_cpsat_params("num_workers:1,random_seed:7").random_seed
    7

    Raises
    ------
    HppInputError
        Not valid text format of ``SatParameters`` (names the parser's complaint).
    """
    params = sat_parameters_pb2.SatParameters()
    try:
        text_format.Parse(text.replace(",", " "), params)
    except text_format.ParseError as exc:
        raise HppInputError(f"CP-SAT parameters {text!r}: {exc}", field="--cpsat-params",
                            fix="give SatParameters in text format, e.g. \"num_workers:1,random_seed:1\"") from None
    if params.HasField("max_time_in_seconds"):
        raise HppInputError(f"CP-SAT parameters {text!r}: max_time_in_seconds is a wall-clock cut the result would not "
                            f"report", field="--cpsat-params",
                            fix="use --time-limit S (the result then says when it stopped the solver)")
    return params


def check_cpsat_params(text: str) -> None:
    """Refuse ``text`` unless CP-SAT itself accepts its values: :func:`parse_cpsat_params`, then an empty model solved
    with them (about 5 ms; CP-SAT checks every parameter's range there and answers MODEL_INVALID naming the first it
    refuses). Imports CP-SAT (0.5 s), so only when parameters are given.

    Raises
    ------
    HppInputError
        Not text format, ``max_time_in_seconds`` (use the time limit), or a value out of range
        (``num_workers:-5``: "parameter 'num_workers' should be in [0,10000]. Current value is -5").
    """
    params = parse_cpsat_params(text)
    from ortools.sat.python import cp_model          # lazy: the solver's import cost is paid only here
    solver = cp_model.CpSolver()
    solver.parameters.merge_text_format(text_format.MessageToString(params))
    if solver.solve(cp_model.CpModel()) == cp_model.MODEL_INVALID:
        raise HppInputError(f"CP-SAT refuses the parameters {text!r}: {solver.solution_info()}", field="--cpsat-params",
                            fix="give values in the ranges of OR-Tools' SatParameters (sat_parameters.proto)")


@dataclass(frozen=True)
class SolverSettings:
    """How the composition is solved (all parameters explicit; STYLE.md rule 5).

    Attributes
    ----------
    solver : str
        ``"cp-sat"`` (default), ``"milp"`` (HiGHS) or ``"heuristic"`` (incumbent and LP bound only).
    max_time_in_seconds : float or None
        The search's wall-clock budget [s]: the solve path improves the plan and the bound until then
        (:mod:`hpp.formulation.composition.anytime`) and returns the best found. None (default): no wall
        limit; the search stops at ``deterministic_time`` only, so the same input, seed and worker count give
        the same answer. With a limit the answer may depend on the machine's speed; the result says when it
        stopped the exact solver (``SolveResult.hit_time_limit``; ``status`` stays what the bound proves).
    deterministic_time : float
        The deterministic budget in work units: CP-SAT's ``max_deterministic_time`` (always set), HiGHS'
        node limit, and above the default (:data:`DEFAULT_DETERMINISTIC_TIME`) the budgeted phase's work.
    num_workers : int
        CP-SAT workers, and processes for the stage balance and the LP bound; 0 = one per usable core.
        CP-SAT with several workers runs interleaved (``interleave_search``), which is deterministic.
    random_seed : int
    warm_start : bool
        The heuristic incumbent goes to the exact solvers as hint and cutoff (and prunes candidates
        by the ``incumbent_bound`` rule).
    max_candidates : int or None
        The exact solver runs when at most this many candidates are left after the presolve (it then
        sees all of them and its bound counts); with more, the incumbent and the LP bound decide,
        unless ``cpsat_on_subset``. None (default): :data:`SMALL_BUDGET_MAX_CANDIDATES` at the default
        deterministic budget, :data:`MAX_CANDIDATES` with a larger one (:attr:`candidate_limit`).
    cpsat_on_subset : bool
        Above ``max_candidates``, run the exact solver on the best ``max_candidates`` candidates (per
        device-type set by solo objective); it may improve the plan, its bound is not used.
    max_table_entries : int
        Also restrict (as above) when candidates x most pipelines exceeds this (the sync tables' size).
    cpsat_params : str
        Extra CP-SAT parameters in text format (applied last; see :func:`parse_cpsat_params`).
    log_search_progress : bool
        CP-SAT's own log on stderr.
    formulation : str
        CP-SAT model: ``"per-copy"`` (linear), ``"product"`` (x_c * k_c), ``"auto"`` (per-copy when small).
    type_classes : bool
        Also bound the plans by type class (:mod:`hpp.formulation.composition.type_classes`): a bound at least as
        strong, at the cost of one more copy bound per device type and one for mixed rings (off by default).
    solver_answer_only : bool
        The exact solver runs even where the incumbent already meets the bound, and the result's plan is its own
        answer (NO_SOLUTION when it found none), not the best of it and the heuristic's: to benchmark a solver
        cold (``hpp bench-solvers --no-hint``, with ``warm_start`` off). The bound is the same.
    portfolio : tuple of str
        With a budget (:attr:`budgeted`): more exact solvers run after ``solver``, each from the same start (hint
        and cutoff) as a run of it alone, each followed by the same cost-model local search: the result is at
        least as good as each of those runs would be with this budget (``hpp plan``: the other exact solver).
    """

    solver: str = DEFAULT_SOLVER
    max_time_in_seconds: float | None = None
    deterministic_time: float = DEFAULT_DETERMINISTIC_TIME
    num_workers: int = 0
    random_seed: int = 0
    warm_start: bool = True
    max_candidates: int | None = None
    cpsat_on_subset: bool = False
    max_table_entries: int = 1_000_000
    cpsat_params: str = ""
    log_search_progress: bool = False
    formulation: str = "auto"
    type_classes: bool = False
    solver_answer_only: bool = False
    portfolio: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.solver not in SOLVER_NAMES:
            raise HppInputError(f"unknown solver {self.solver!r}", field="--solver", fix=f"use one of {list(SOLVER_NAMES)}")
        t = self.max_time_in_seconds
        if t is not None and not (t > 0 and math.isfinite(t)):
            raise HppInputError(f"time limit {t!r} s", field="--time-limit", fix="give a positive number of seconds")
        if not (self.deterministic_time > 0 and math.isfinite(self.deterministic_time)):
            raise HppInputError(f"deterministic_time={self.deterministic_time!r}", field="deterministic_time",
                                fix="give a positive number")
        if self.num_workers < 0:
            raise HppInputError(f"num_workers={self.num_workers}", field="--workers", fix="give 0 (all cores) or more")
        if self.max_candidates is not None and self.max_candidates < 1:
            raise HppInputError(f"max_candidates={self.max_candidates}", field="max_candidates", fix="give 1 or more")
        if self.formulation not in ("auto", "per-copy", "product"):
            raise HppInputError(f"formulation={self.formulation!r}", field="formulation",
                                fix="use auto, per-copy or product")
        if self.cpsat_params:
            check_cpsat_params(self.cpsat_params)
        bad = [x for x in self.portfolio if x not in SOLVER_NAMES]
        if bad:
            raise HppInputError(f"portfolio solver(s) {bad}", field="portfolio", fix=f"use some of {list(SOLVER_NAMES)}")

    @property
    def work_budget(self) -> float:
        """The deterministic budget in work units: ``deterministic_time``, or the ``max_deterministic_time`` of
        ``cpsat_params`` when it sets one (the limit CP-SAT applies)."""
        budget = self.deterministic_time
        params = parse_cpsat_params(self.cpsat_params) if self.cpsat_params else None
        if params is not None and params.HasField("max_deterministic_time"):
            budget = params.max_deterministic_time
        return budget

    @property
    def budgeted(self) -> bool:
        """More than the default budget: a wall-clock limit, or a deterministic budget above
        :data:`DEFAULT_DETERMINISTIC_TIME`. The solve path then runs its budgeted phase
        (:mod:`hpp.formulation.composition.anytime`) and the exact solver on every candidate.

        >>> SolverSettings().budgeted, SolverSettings(max_time_in_seconds=10).budgeted
        (False, True)
        >>> SolverSettings(deterministic_time=1.0).budgeted
        True
        """
        return self.max_time_in_seconds is not None or self.work_budget > DEFAULT_DETERMINISTIC_TIME

    @property
    def candidate_limit(self) -> int:
        """The most candidates the exact solver is run on: ``max_candidates``, or by the budget when None:
        :data:`SMALL_BUDGET_MAX_CANDIDATES` at the default budget, every candidate with more
        (:attr:`budgeted`).

        >>> SolverSettings().candidate_limit, SolverSettings(deterministic_time=1.0).candidate_limit
        (16, 1000000000)
        >>> SolverSettings(cpsat_params="max_deterministic_time:5").candidate_limit
        1000000000
        """
        if self.max_candidates is not None:
            return self.max_candidates
        return NO_CANDIDATE_LIMIT if self.budgeted else SMALL_BUDGET_MAX_CANDIDATES


def bench_settings(solver: str, time_limit_s: float | None, num_workers: int = 1, cpsat_params: str = "", *,
                   work_units: float | None = None) -> SolverSettings:
    """The settings of ``hpp bench-solvers`` / ``hpp instances solve``: a wall-clock limit per solver [s], CP-SAT's
    deterministic limit and HiGHS' node limit scaled to it; with more than the default budget the solve path's
    budgeted phase (as ``hpp plan`` with that budget, without the other exact solver), at the default budget or
    less the exact solver on all candidates up to 1,000 (above: on the best 1,000, its bound then not used).

    ``work_units``: instead of a wall limit, a deterministic budget per solver (CP-SAT's work units, HiGHS
    :data:`~hpp.formulation.composition.exact_step.MILP_NODES_PER_WORK_UNIT` nodes per unit; ``time_limit_s`` must
    then be None): the same input, seed and worker count give the same rows whatever the host's speed or load.

    Raises
    ------
    HppInputError
        Both limits or neither, or a limit that is not a positive finite number.
    """
    if work_units is not None and time_limit_s is not None:
        raise HppInputError("--time-limit and --work-limit both given", field="--work-limit",
                            fix="give one: --time-limit S (wall clock) or --work-limit UNITS (deterministic)")
    if work_units is None and time_limit_s is None:
        raise HppInputError("no solver limit given", field="--time-limit",
                            fix="give --time-limit S (wall clock) or --work-limit UNITS (deterministic)")
    budget = work_units if work_units is not None else time_limit_s
    if not (math.isfinite(budget) and budget > 0):
        flag = "--work-limit" if work_units is not None else "--time-limit"
        raise HppInputError(f"{budget:g} {'work units' if work_units is not None else 's'}", field=flag,
                            fix="give a positive number")
    return SolverSettings(solver=solver, max_time_in_seconds=time_limit_s, deterministic_time=budget,
                          num_workers=num_workers, cpsat_on_subset=True, cpsat_params=cpsat_params,
                          max_candidates=None if time_limit_s is not None or budget > DEFAULT_DETERMINISTIC_TIME
                          else 1000)
