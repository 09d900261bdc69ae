"""The HPP planner: hierarchical balance (stage balance -> data balance -> composition).

``plan_hpp`` runs the one solve path: candidates (:func:`make_problem`: shapes stage-balanced by
the memoised DP, batched over all shapes, pruned) -> :func:`hpp.formulation.composition.solve.solve` (incumbent, LP
bound, CP-SAT or MILP on the bound problem) -> bind -> estimate. Every figure of the result
(objective, bound, gap, status) describes the returned plan: the objective is the cost model's
predicted iteration time of that plan, the bound a proven lower bound of it over all candidates
and bindings; a seeded baseline plan, when returned, is first checked against the search space.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from hpp.gcfreeze import gc_frozen
from hpp.errors import HppInputError, InfeasibleError
from hpp.formulation.binding import build_plan
from hpp.formulation.space_limits import SearchSpace, stage_kinds
from hpp.formulation.candidates import build_candidates_bounded
from hpp.formulation.composition.bound_model import crossing_times, lower_bound_candidates
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.sync_floor import SyncFloor
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import PlanEstimate, estimate_plan
from hpp.formulation.composition.settings import SolverSettings
from hpp.formulation.space_limits import space_violations
from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.profiles.model_profile import ModelProfile
from hpp.formulation.stage_costs import StageCostCache
from hpp.pruning.rules import PruningOptions
from hpp.formulation.stage_balance import StageBalancer
from hpp.formulation.composition.solve import SolveResult, certify, solve
from hpp.wording import count

__all__ = ["PlannerConfig", "PlannerResult", "plan_hpp", "make_problem", "check_micro_batch_sizes"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class PlannerConfig:
    """Every option of a search, as one tree: what :func:`plan_hpp` and :func:`make_problem` take.

    Attributes
    ----------
    space : SearchSpace
        Which pipelines are candidates (micro-batch sizes, TP degrees, stages, types per pipeline).
    pruning : PruningOptions
        The pruning rules' switches (all on by default; the ablations turn them off).
    solver : SolverSettings
        The composition solver and its limits (time, workers, seed, CP-SAT parameters).
    cost : CostModelConfig
        The cost model's constants (memory headroom, optimizer, ...).

    Examples
    --------
    >>> cfg = PlannerConfig.of(space=SearchSpace(max_stages=4))
    >>> cfg.space.max_stages, cfg.solver == SolverSettings()
    (4, True)
    """

    space: SearchSpace = field(default_factory=SearchSpace)
    pruning: PruningOptions = field(default_factory=PruningOptions)
    solver: SolverSettings = field(default_factory=SolverSettings)
    cost: CostModelConfig = field(default_factory=CostModelConfig)

    @classmethod
    def of(cls, config: "PlannerConfig | CostModelConfig | None" = None, *, space: SearchSpace | None = None,
           pruning: PruningOptions | None = None, solver: SolverSettings | None = None,
           cost: CostModelConfig | None = None) -> "PlannerConfig":
        """``config`` (a PlannerConfig, or a CostModelConfig: the older ``config=`` keyword) with the parts given
        replaced; the rest are the defaults."""
        base = config if isinstance(config, PlannerConfig) else cls(cost=config or CostModelConfig())
        parts = {"space": space, "pruning": pruning, "solver": solver, "cost": cost}
        return replace(base, **{k: v for k, v in parts.items() if v is not None})


@dataclass(frozen=True)
class PlannerResult:
    """Result of :func:`plan_hpp`.

    Attributes
    ----------
    plan : Plan
    estimate : PlanEstimate
        The cost model's prediction of ``plan``.
    search : SolveResult
        Figures of ``plan``: status, objective (= ``estimate.iteration_time_s``), bound, gap,
        ``source`` (``"heuristic"``, ``"lp-rounding"``, ``"cp-sat"``, ``"milp"`` or ``"baseline:<name>"``).
    wall_s : float
        Total search time (candidates + solve + binding) [s].
    stats : dict
        Candidate counts, pruning counters, cache hit rates, phase timings.
    """

    plan: Plan
    estimate: PlanEstimate
    search: SolveResult
    wall_s: float
    stats: Mapping[str, Any] = field(default_factory=dict)
    #: the composition problem the search solved (candidates and the cost-model estimator), for follow-up
    #: questions such as :func:`plan_using_idle_devices`
    problem: "CompositionProblem | None" = field(default=None, repr=False, compare=False)


def make_problem(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                 config: PlannerConfig | CostModelConfig | None = None, space: SearchSpace | None = None,
                 pruning: PruningOptions | None = None, workers: int = 1,
                 profile_ref: Mapping[str, Any] | None = None) -> tuple[CompositionProblem, dict[str, Any]]:
    """Build the candidates (stage balance + pruning) of an instance, with its bound problem and estimator.

    ``config``: a :class:`PlannerConfig` (its space, pruning and cost parts are used) or, as before, the
    :class:`CostModelConfig`; ``space`` / ``pruning``, given, replace its parts.

    ``workers``: processes for the stage balance (0: one per usable core; see
    :func:`~hpp.formulation.candidates.build_candidates`; the candidates are the same for any value).
    The problem's ``estimator`` binds counts to devices and prices the plan with the cost model
    (``profile_ref``: how the plan names its profile, default ``{"name": profile.model}``); its
    ``bound`` problem has the candidates' lower-bound times (:mod:`hpp.formulation.composition.bound_model`).

    Returns
    -------
    (problem, stats)

    Raises
    ------
    HppInputError
        A device type without profile, a non-positive global batch.
    InfeasibleError
        No pipeline shape fits memory (says by how much the best one falls short, and where).
    """
    if global_batch_size < 1:
        raise HppInputError(f"global batch size {global_batch_size}", field="--gbs", fix="give a positive integer")
    cfg = PlannerConfig.of(config, space=space, pruning=pruning)
    space, pruning, config = cfg.space, cfg.pruning, cfg.cost
    t0 = time.perf_counter()
    left_out = check_micro_batch_sizes(cluster, profile, space)
    cache = StageCostCache.for_cluster(cluster, profile, config, enabled=pruning.memoise,
                                       global_batch_size=global_batch_size)
    link = cache.link
    balancer = StageBalancer(cache, allow_recompute=space.allow_recompute, memoise=pruning.memoise)
    priced = cache.links if getattr(balancer, "packed_p2p", False) and hasattr(cache, "links") else None
    if priced is None and hasattr(cache, "links"):
        priced = lambda a, b, run=None: cache.links(a, b)            # noqa: E731  (lower-bound options)

    def bound(cs):      # the bound model, run inside each stage-balance worker on its share
        return lower_bound_candidates(cluster, profile, cs, pipeline_link=link, config=config, priced_links=priced)

    cands, lb_cands, stats = build_candidates_bounded(cluster, profile, balancer, space, pruning, workers=workers,
                                                      bound=bound)
    stats["candidates_s"] = time.perf_counter() - t0
    stats["types_left_out"] = left_out
    stats["cache"] = cache.cache_info()
    stats["dp_rows_computed"] = balancer.rows_computed
    stats["dp_rows_reused"] = balancer.rows_reused
    if not cands:
        raise InfeasibleError(memory_shortfall_message(cluster, profile, cache, space), field="cluster",
                              fix="add devices with more memory, allow recomputation, raise --max-stages or --max-tp,"
                                  " or use smaller micro-batches")
    problem = CompositionProblem(cands, cluster, global_batch_size, link, hierarchical=config.hierarchical_allreduce)
    problem.bound = CompositionProblem(lb_cands, cluster, global_batch_size, link, sync_floor=SyncFloor.of(cluster),
                                       crossed=crossing_times(cluster, profile, cands, lb_cands, pipeline_link=link,
                                                              config=config, priced_links=priced))
    problem.estimator = _estimator(cluster, profile, global_batch_size, cands, config,
                                   profile_ref or {"name": profile.model})
    return problem, stats


def _estimator(cluster: Cluster, profile: ModelProfile, global_batch_size: int, cands, config: CostModelConfig,
               profile_ref: Mapping[str, Any]) -> Callable[[Mapping[int, int]], tuple[Plan, PlanEstimate]]:
    """counts -> (the bound plan, its cost-model estimate), memoised on the counts."""
    cluster_ref = cluster_to_dict(cluster)
    memo: dict[frozenset, tuple[Plan, PlanEstimate]] = {}

    def estimator(counts: Mapping[int, int]) -> tuple[Plan, PlanEstimate]:
        key = frozenset((c, x) for c, x in counts.items() if x > 0)
        got = memo.get(key)
        if got is None:
            plan = build_plan(cluster, model=profile.model, num_layers=profile.num_layers,
                              sequence_length=profile.sequence_length, global_batch_size=global_batch_size,
                              candidates=cands, counts=dict(key), profile_ref=profile_ref, cluster_ref=cluster_ref)
            got = memo[key] = (plan, estimate_plan(plan, cluster, profile, config=config, estimate_missing=False))
        return got
    return estimator


def check_micro_batch_sizes(cluster: Cluster, profile: ModelProfile, space: SearchSpace) -> list[str]:
    """Refuse requested micro-batch sizes that no device type of the cluster was profiled at.

    Returns
    -------
    list of str
        The device types left out because none of the requested sizes is profiled for them (the
        planner says so in its progress lines); [] when every type can be used.

    Raises
    ------
    HppInputError
        No device type has any requested size (naming, per device type, the sizes its profile has),
        or a device type without profile.
    """
    if space.micro_batch_sizes is None:
        return []
    have = {}
    for dtype, kinds in stage_kinds(cluster, profile, space).items():
        have[dtype] = sorted({b for k in kinds for b in profile.micro_batch_sizes(k.device_type, k.tp_degree)})
    if not any(b in sizes for sizes in have.values() for b in space.micro_batch_sizes):
        listed = "; ".join(f"{t}: {','.join(map(str, sizes))}" for t, sizes in sorted(have.items()))
        raise HppInputError(f"no GPU type of the cluster is profiled for {profile.model} at micro-batch sizes "
                            f"{','.join(map(str, space.micro_batch_sizes))} (profiled: {listed})",
                            field="--micro-batch-sizes", fix="use sizes the profile has, or profile them")
    return sorted(t for t, sizes in have.items() if not any(b in sizes for b in space.micro_batch_sizes))


def memory_shortfall_message(cluster: Cluster, profile: ModelProfile, cache: StageCostCache,
                             space: SearchSpace) -> str:
    """Say by how much the roomiest homogeneous shape misses memory, and on which stage."""
    best: tuple[float, str] | None = None
    L = profile.num_layers
    for dtype, kinds in stage_kinds(cluster, profile, space).items():
        for kind in kinds:
            sizes = [b for b in profile.micro_batch_sizes(kind.device_type, kind.tp_degree)
                     if space.micro_batch_sizes is None or b in space.micro_batch_sizes]
            for b in sizes[:1]:
                tab = cache.table(kind.device_type, kind.tp_degree, b)
                S = max(1, min(space.max_stages, L, sum(n.num_devices // kind.tp_degree for n in cluster.nodes
                                                          if n.device_type == dtype)))
                # min over partitions of the worst stage overflow (bottleneck DP on memory)
                row = np.full(L + 1, np.inf)
                row[L] = -np.inf
                pos_best = None
                for d in range(1, S + 1):
                    mem = tab.memory_bytes(d, space.allow_recompute) - tab.capacity_bytes
                    cand = np.maximum(mem, row[None, :])
                    row = cand.min(axis=1)
                    pos_best = row[0]
                over = float(pos_best)
                where = (f"{S} stages of {kind.tp_degree} x {dtype} at micro-batch {b}: the worst stage needs "
                         f"{over / 2**30:.2f} GiB more than the {tab.capacity_bytes / 2**30:.1f} GiB a device has")
                if best is None or over < best[0]:
                    best = (over, where)
    if best is None or best[0] <= 0:
        return (f"no pipeline shape of {profile.model} can be built on this cluster with the requested micro-batch "
                f"sizes, TP degrees and stage limits")
    return f"{profile.model} does not fit in memory on this cluster; the best shape falls short by " \
           f"{best[0] / 2**30:.2f} GiB ({best[1]})"


@gc_frozen()
def plan_hpp(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
             config: PlannerConfig | CostModelConfig | None = None, space: SearchSpace | None = None,
             pruning: PruningOptions | None = None, settings: SolverSettings | None = None,
             profile_ref: Mapping[str, Any] | None = None,
             progress: Callable[[str], None] | None = None,
             seed_plans: Mapping[str, Plan] | None = None) -> PlannerResult:
    """Find the HPP plan with the shortest predicted iteration time (the one solve path).

    Parameters
    ----------
    cluster, profile : the inventory and the model's per-layer profile.
    global_batch_size : int
        G, samples per iteration; any positive integer (no divisibility needed).
    config : PlannerConfig
        Every search option (:class:`PlannerConfig`); a :class:`CostModelConfig` is taken as its ``cost`` part.
    space, pruning, settings : optional; given, they replace ``config``'s search space, pruning switches and
        solver settings (the keywords of the calls made before :class:`PlannerConfig`).
    profile_ref : how the plan names its profile (default ``{"name": profile.model}``).
    seed_plans : optional valid plans (e.g. the baselines'); one inside the search space (checked:
        :func:`~hpp.formulation.space_limits.space_violations`) that the cost model prices below the
        search's plan is returned instead (``search.source == "baseline:<name>"``,
        ``stats["seeded_from"]``), with objective, gap and status of that plan against the same bound.
    progress : optional callback for one-line progress messages (stderr in the CLI).

    Returns
    -------
    PlannerResult

    Raises
    ------
    HppInputError, InfeasibleError
    TypeError
        ``cluster`` is not a :class:`~hpp.profiles.cluster.Cluster` (e.g. ``scenario.cluster``
        passed without calling it).
    """
    if not isinstance(cluster, Cluster):
        raise TypeError(f"plan_hpp: cluster must be a Cluster, got {type(cluster).__name__}"
                        + ("; call it (e.g. scenario.cluster())" if callable(cluster) else ""))
    cfg = PlannerConfig.of(config, space=space, pruning=pruning, solver=settings)
    space, pruning, settings, config = cfg.space, cfg.pruning, cfg.solver, cfg.cost
    if not pruning.incumbent_bound and settings.warm_start:
        settings = SolverSettings(**{**settings.__dict__, "warm_start": False})
    if settings.budgeted and settings.solver != "heuristic" and not settings.portfolio:
        # with a budget, the other exact solver too (each from the same start): never worse than either alone
        settings = replace(settings, portfolio=tuple(x for x in ("cp-sat", "milp") if x != settings.solver))
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    problem, stats = make_problem(cluster, profile, global_batch_size, config=cfg,
                                  workers=settings.num_workers, profile_ref=profile_ref)
    if stats.get("types_left_out"):
        say(f"left out (no profile at micro-batch sizes {','.join(map(str, space.micro_batch_sizes or ()))}): "
            f"{', '.join(stats['types_left_out'])}")
    heur = stats.get("heuristic_candidates", len(problem.candidates))
    say(f"{count(len(problem.candidates), 'candidate pipeline')} from {count(stats['shapes'], 'shape')} "
        f"({stats['candidates_s']:.2f} s)" + (f"; the heuristics walk the {heur} no other dominates"
                                              if heur < len(problem.candidates) else ""))
    deadline = t0 + settings.max_time_in_seconds if settings.max_time_in_seconds is not None else None
    res = solve(problem, settings, progress=progress, deadline=deadline)
    stats["solve_s"] = res.wall_s
    stats["num_candidates"] = len(problem.candidates)
    stats["plan_from"] = res.source
    if not res.counts:
        raise InfeasibleError(f"no plan found ({res.status}: {res.note})", field="cluster",
                              fix="add devices with more memory or relax the search space")
    plan, est = problem.estimator(res.counts)
    for name, seed in (seed_plans or {}).items():
        bad = space_violations(seed, space, cluster=cluster, profile=profile)
        if bad:
            log.info("seed %s outside the search space: %s", name, "; ".join(bad))
            continue
        seed_est = estimate_plan(seed, cluster, profile, config=config, estimate_missing=False)
        if seed_est.fits_memory and seed_est.iteration_time_s < est.iteration_time_s * (1 - 1e-12):
            # the returned plan names its profile as the search's plans do (a seed built elsewhere may name it
            # otherwise: a baseline by model name, --previous by a path relative to the previous plan's folder)
            plan, est = replace(seed, profile_ref=dict(profile_ref or {"name": profile.model})), seed_est
            stats["seeded_from"] = name
            res = certify(res, seed_est.iteration_time_s, source=f"baseline:{name}", counts={})
    if res.source.startswith("baseline:") and res.objective_s < res.bound_s:
        # a seed below the bound of the candidates lies outside them (another partition of the same shape):
        # the bound of the space is then at most its time, and nothing proves it optimal
        res = replace(res, bound_s=res.objective_s, gap=0.0, status="FEASIBLE",
                      note=(res.note + "; " if res.note else "") + "the returned seed beats the candidates' bound")
    bad = space_violations(plan, space, cluster=cluster, profile=profile)
    if bad:       # an internal invariant: the candidates are built inside the space
        raise AssertionError(f"returned plan outside the search space: {'; '.join(bad)}")
    if res.objective_s < res.bound_s * (1 - 1e-9) - 1e-9:
        log.error("objective %.9g s below the bound %.9g s", res.objective_s, res.bound_s)
    wall = time.perf_counter() - t0
    return PlannerResult(plan, est, res, wall, stats, problem)


#: Candidates tried per idle device type by :func:`plan_using_idle_devices` (the best by solo objective).
IDLE_TRIES = 4


def plan_using_idle_devices(problem: CompositionProblem, counts: Mapping[int, int]) -> dict[str, Any] | None:
    """The best plan found that also uses the devices ``counts`` leaves idle, and its predicted time.

    Two greedy fills, each type with free devices in turn (most free first): of the :data:`IDLE_TRIES` candidates
    using that type that fit one more copy, with the best solo objective, add as many copies as fit and keep the one
    the search's own model (:func:`~hpp.formulation.composition.objective.composition_objective_s`) prices least;
    each fill's plan is then priced by the cost model (one pricing per fill: a cost-model pricing per option took
    40 s at 4,096 GPUs). One fill starts from ``counts`` (the returned plan, extended); the other from
    nothing, with candidates of that one type only (each type's own pipelines side by side). What ``hpp plan``
    reports beside an idle-device note: by how much using them was predicted slower.

    Returns
    -------
    dict or None
        ``{"iteration_time_s", "devices_used"}`` of the plan with the most devices working (in pipelines that get
        samples; the faster on a tie); None when neither fill puts more devices to work than ``counts``.
    """
    from hpp.formulation.composition.heuristics import solo_objective_s    # the composition's own ranking
    from hpp.formulation.composition.objective import composition_objective_s

    inv = problem.inventory

    def used(cs: Mapping[int, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for c, x in cs.items():
            for t, n in problem.candidates[c].devices.items():
                out[t] = out.get(t, 0) + x * n
        return out

    def fill(cs: dict[int, int], *, one_type: bool) -> tuple[float, dict[int, int]] | None:
        best = None
        for t in sorted(inv, key=lambda t: used(cs).get(t, 0) - inv[t]):
            if inv[t] - used(cs).get(t, 0) <= 0:
                continue
            tries = sorted((c for c, cand in enumerate(problem.candidates)
                            if t in cand.devices and (not one_type or len(cand.devices) == 1)
                            and problem.max_copies(c) and problem.fits({**cs, c: cs.get(c, 0) + 1})),
                           key=lambda c: (solo_objective_s(problem, c), c))[:IDLE_TRIES]
            options = []
            for c in tries:
                k = 0
                while problem.fits({**cs, c: cs.get(c, 0) + k + 1}):
                    k += 1
                trial = {**cs, c: cs.get(c, 0) + k}
                options.append((composition_objective_s(problem, trial), c, trial))
            if options:
                best = min(options, key=lambda o: (o[0], o[1]))
                cs = best[2]
        return None if best is None else (problem.estimator(cs)[1].iteration_time_s, cs)

    def working(cs: Mapping[int, int]) -> int:
        """Devices of the bound plan's pipelines that get samples (data balance may give an added copy none)."""
        plan = problem.estimator(cs)[0]
        return sum(len(s.device_ids) for p in plan.pipelines if p.num_samples > 0 for s in p.stages)

    now = working(counts)
    found = [(f[0], working(f[1])) for f in (fill({c: x for c, x in counts.items() if x > 0}, one_type=False),
                                             fill({}, one_type=True)) if f is not None]
    found = [f for f in found if f[1] > now]
    if not found:
        return None
    t, n = min(found, key=lambda f: (-f[1], f[0]))
    return {"iteration_time_s": t, "devices_used": n}
