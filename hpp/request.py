"""One plan request: what ``hpp plan`` and :func:`hpp.plan` both build (:func:`build_request`) and run (:func:`run_request`).

The command line parses its flags and the Python API takes keywords, and both hand the same values to
:func:`build_request`, which checks them and returns a frozen :class:`PlanRequest`; :func:`run_request` runs the
baselines (when asked), seeds the search from a previous plan (when given), searches, and checks the plan. So
the two ways to ask for a plan have the same options, the same defaults and the same answer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from hpp.baselines import DEFAULT_BASELINE_TIME_LIMIT_S
from hpp.errors import HppInputError
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.composition.settings import (DEFAULT_SOLVER, MAX_CANDIDATES, NO_CANDIDATE_LIMIT, SOLVER_NAMES,
                                                   SolverSettings)
from hpp.formulation.cost_config import CostModelConfig
from hpp.plan_data import Plan
from hpp.planner import PlannerConfig, PlannerResult, check_micro_batch_sizes, plan_hpp
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.resolve import profile_ref_for
from hpp.validate import validate_plan

__all__ = ["PlanRequest", "PlanOutcome", "build_request", "run_request"]


@dataclass(frozen=True)
class PlanRequest:
    """Everything one search is asked: built by :func:`build_request` (which checks it), run by :func:`run_request`.

    Attributes
    ----------
    cluster : Cluster
    profile : ModelProfile
    global_batch_size : int
        Samples per iteration (>= 1).
    planner : PlannerConfig
        Search space, pruning switches, solver settings and cost-model constants.
    baselines : bool
        Also run the uniform and single-shape baselines; one the cost model prices lower is returned instead.
    baseline_time_limit_s : float
        Both baselines together [s] (> 0).
    previous : Plan or None
        A previous plan (of ``full_cluster``) whose surviving pipelines seed the search.
    profile_ref : mapping
        How the returned plan names its profile (``{"name": ...}`` or ``{"path": ...}``).
    full_cluster : Cluster or None
        The cluster before devices were excluded (None: ``cluster`` itself).
    excluded : frozenset of int
        Device ids of ``full_cluster`` left out.
    id_map : mapping of int to int or None
        Device id of ``full_cluster`` -> device id of ``cluster`` (renumbered node by node); None: the same ids.

    Raises
    ------
    HppInputError
        A non-positive global batch or baseline time limit.
    """

    cluster: Cluster
    profile: ModelProfile
    global_batch_size: int
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    baselines: bool = False
    baseline_time_limit_s: float = DEFAULT_BASELINE_TIME_LIMIT_S
    previous: Plan | None = None
    profile_ref: Mapping[str, Any] = field(default_factory=dict)
    full_cluster: Cluster | None = None
    excluded: frozenset[int] = frozenset()
    id_map: Mapping[int, int] | None = None

    def __post_init__(self) -> None:
        gbs = self.global_batch_size
        if isinstance(gbs, bool) or not isinstance(gbs, int) or gbs < 1:
            raise HppInputError(f"global batch size {gbs!r}", field="global_batch_size",
                                fix="give a positive integer number of samples")
        t = self.baseline_time_limit_s
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise HppInputError(f"baseline time limit {t!r}", field="baseline_time_limit_s",
                                fix="give a positive number of seconds")
        if not self.profile_ref:
            object.__setattr__(self, "profile_ref", profile_ref_for(self.profile))


@dataclass(frozen=True)
class PlanOutcome:
    """What :func:`run_request` returns.

    Attributes
    ----------
    result : PlannerResult
        The returned plan (the search's, or a baseline's / the previous plan's seed where faster), its estimate and
        the search's figures (status, objective, bound, gap, source).
    baselines : mapping
        Baseline name -> :class:`~hpp.baselines.uniform.BaselineResult` ({} without baselines).
    baselines_s : float
        Time of the baseline phase [s].
    seed_s : float
        Time spent seeding from the previous plan [s].
    """

    result: PlannerResult
    baselines: Mapping[str, Any]
    baselines_s: float
    seed_s: float


def build_request(cluster: Cluster, profile: ModelProfile, global_batch_size: int = 1024, *,
                  micro_batch_sizes: Sequence[int] | None = None, max_tp: int | None = None, min_tp: int = 1,
                  max_stages: int = 8, max_types_per_pipeline: int = 2, allow_recompute: bool = True,
                  mixed_tp_pipelines: bool = False, solver: str | None = None, time_limit_s: float | None = None,
                  work_limit: float | None = None, workers: int = 0, seed: int = 0, cpsat_params: str = "",
                  cpsat_on_subset: bool = False, type_classes: bool = False, memory_headroom: float = 0.0,
                  optimizer: str = "adamw", baselines: bool = False,
                  baseline_time_limit_s: float = DEFAULT_BASELINE_TIME_LIMIT_S,
                  exclude_devices: Sequence[int] = (), exclude_nodes: Sequence[int] = (),
                  previous: Plan | None = None, profile_ref: Mapping[str, Any] | None = None) -> PlanRequest:
    """The checked request of one search (``hpp plan``'s flags, by the same names).

    Parameters
    ----------
    cluster, profile, global_batch_size
        What is planned.
    micro_batch_sizes, max_tp, min_tp, max_stages, max_types_per_pipeline, allow_recompute, mixed_tp_pipelines
        The search space (None: every measured micro-batch size / the largest TP degree that fits a node).
    solver : {"cp-sat", "milp", "heuristic"} or None
        The exact solver; one named here runs on up to
        :data:`~hpp.formulation.composition.settings.MAX_CANDIDATES` candidates even at the default budget (who
        names a solver expects it to run); None: CP-SAT within the default budget's candidate limit.
    time_limit_s, work_limit
        A wall-clock budget [s] or a deterministic one (work units); None and None: the default deterministic budget.
    workers, seed, cpsat_params, cpsat_on_subset, type_classes
        Solver settings (0 workers: one per core; CP-SAT SatParameters as text).
    memory_headroom, optimizer
        Cost-model constants: the fraction of every device's memory kept free, the run's optimizer.
    exclude_devices, exclude_nodes
        Device ids / node indices of ``cluster`` to leave out (lost devices); the request's cluster is the rest,
        renumbered node by node (:func:`hpp.replan.shrink_cluster`).
    baselines, baseline_time_limit_s, previous, profile_ref
        See :class:`PlanRequest` (``previous`` is a plan of ``cluster`` before the exclusions).

    Returns
    -------
    PlanRequest

    Raises
    ------
    HppInputError
        An unknown solver, both budgets at once, a bad space value (from :class:`SearchSpace`), a bad
        global batch / time limit, excluded ids not in the cluster.
    """
    if solver is not None and solver not in SOLVER_NAMES:
        raise HppInputError(f"unknown solver {solver!r}", field="solver", fix=f"use one of {', '.join(SOLVER_NAMES)}")
    space = SearchSpace(micro_batch_sizes=tuple(micro_batch_sizes) if micro_batch_sizes else None, max_tp=max_tp,
                        min_tp=min_tp, max_stages=max_stages, max_types_per_pipeline=max_types_per_pipeline,
                        allow_recompute=allow_recompute, mixed_tp_pipelines=mixed_tp_pipelines)
    settings = SolverSettings(solver=solver or DEFAULT_SOLVER, max_time_in_seconds=time_limit_s,
                              num_workers=workers, random_seed=seed, cpsat_on_subset=cpsat_on_subset,
                              cpsat_params=cpsat_params or "", type_classes=type_classes,
                              **({"deterministic_time": work_limit} if work_limit is not None else {}))
    if solver in ("cp-sat", "milp") and not settings.budgeted:   # with a budget the solver sees every candidate
        settings = replace(settings, max_candidates=MAX_CANDIDATES)
    planner = PlannerConfig(space=space, solver=settings,
                            cost=CostModelConfig(memory_headroom=memory_headroom, optimizer=optimizer))
    full, excluded, id_map = cluster, frozenset(), None
    if exclude_devices or exclude_nodes:
        from hpp.replan import excluded_ids, shrink_cluster
        excluded = excluded_ids(full, devices=exclude_devices, nodes=exclude_nodes)
        cluster, id_map = shrink_cluster(full, excluded)
    return PlanRequest(cluster, profile, global_batch_size, planner, baselines=baselines,
                       baseline_time_limit_s=baseline_time_limit_s, previous=previous,
                       profile_ref=dict(profile_ref or {}),      # empty: __post_init__ derives it
                       full_cluster=full if excluded else None, excluded=excluded, id_map=id_map)


def run_request(request: PlanRequest, *, progress: Callable[[str], None] | None = None) -> PlanOutcome:
    """Run one request: the baselines (when asked), the previous plan's seed (when given), the search.

    Parameters
    ----------
    request : PlanRequest
    progress : callable, optional
        Receives one-line progress messages (``hpp plan`` prints them on stderr).

    Returns
    -------
    PlanOutcome

    Raises
    ------
    HppInputError
        Micro-batch sizes no device type was profiled at (before any baseline runs), or a plan invalid on the
        cluster (an internal error: the search builds valid plans).
    InfeasibleError
        No plan fits memory.
    """
    from hpp.baselines.single_shape import run_baselines      # the harness: only a request that asks for it

    say = progress or (lambda _msg: None)
    cluster, profile, gbs, cfg = request.cluster, request.profile, request.global_batch_size, request.planner
    check_micro_batch_sizes(cluster, profile, cfg.space)      # refused before the baselines run
    t = time.perf_counter()
    found: Mapping[str, Any] = {}
    if request.baselines:
        say(f"baselines (together at most {request.baseline_time_limit_s:g} s; --baseline-time-limit S, "
            f"--no-baselines)")
        found = run_baselines(cluster, profile, gbs, space=cfg.space, config=cfg.cost,
                              time_budget_s=request.baseline_time_limit_s, progress=progress)
    baselines_s = time.perf_counter() - t
    seeds = {k: b.plan for k, b in found.items() if b.plan is not None}
    seed_s = _seed_from_previous(request, seeds, say)
    settings = cfg.solver
    limit = settings.candidate_limit
    solver = settings.solver if settings.solver == "heuristic" else \
        f"{settings.solver} on every candidate" if limit >= NO_CANDIDATE_LIMIT else \
        f"{settings.solver} where at most {limit} candidates are left"
    say(f"HPP search ({solver}; " + (f"wall-clock budget {settings.max_time_in_seconds:g} s)"
                                              if settings.max_time_in_seconds is not None else
        f"deterministic: a budget of {settings.work_budget:g} work units; --time-limit S or --work-limit UNITS: more)"))
    result = plan_hpp(cluster, profile, gbs, config=cfg, profile_ref=request.profile_ref, progress=progress,
                      seed_plans=seeds)
    validate_plan(result.plan, cluster, profile, source="<planner output>")
    return PlanOutcome(result, found, baselines_s, seed_s)


def _seed_from_previous(request: PlanRequest, seeds: dict[str, Plan], say: Callable[[str], None]) -> float:
    """Add the previous plan's surviving pipelines to ``seeds``; returns the time taken [s]."""
    prev = request.previous
    if prev is None:
        return 0.0
    from hpp.replan import SEED_NAME, seed_from_previous
    from hpp.wording import count

    t = time.perf_counter()
    ids = request.id_map if request.id_map is not None else {d.device_id: d.device_id for d in request.cluster.devices}
    seed = seed_from_previous(prev, request.full_cluster or request.cluster, request.cluster, ids, request.profile,
                              request.global_batch_size)
    if seed is not None:
        seeds[SEED_NAME] = seed
    survive = len(seed.pipelines) if seed else 0
    say(f"--previous: {survive} of its {count(len(prev.pipelines), 'pipeline')} "
        f"{'survives' if survive == 1 else 'survive'} as a seed ({time.perf_counter() - t:.2f} s)")
    return time.perf_counter() - t
