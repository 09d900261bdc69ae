"""The HPP planner: hierarchical balance (stage balance -> data balance -> composition).

``plan_hpp`` runs the search of HPP.md: candidate shapes are stage-balanced by the
memoised DP, batched over all shapes (:mod:`hpp.formulation.stage_balance_batch`), pruned
(:mod:`hpp.pruning`), composed (:mod:`hpp.formulation.heuristics` for the incumbent,
:mod:`hpp.formulation.lp_bound` for the bound, and CP-SAT with the incumbent as hint when it
can see every candidate, :mod:`hpp.formulation.composition`), bound to devices,
data-balanced exactly, and re-priced with the cost model.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from hpp.gcpause import gc_paused
from hpp.errors import HppInputError, InfeasibleError
from hpp.formulation.binding import build_plan
from hpp.formulation.candidates import SearchSpace, build_candidates, stage_kinds
from hpp.formulation.composition import CompositionProblem, CompositionResult, SolverSettings, solve_composition_cpsat
from hpp.formulation.heuristics import fill_heuristic, greedy_composition, solo_objective_s
from hpp.formulation.lp_bound import composition_bounds
from hpp.formulation.cost_model import CostModelConfig, PlanEstimate, estimate_plan
from hpp.plan import Plan
from hpp.profiles.cluster import Cluster, Link, cluster_to_dict
from hpp.profiles.model_profile import ModelProfile
from hpp.pruning.memo import StageCostCache
from hpp.pruning.rules import PruningOptions, exceeds_incumbent
from hpp.formulation.stage_balance import StageBalancer

__all__ = ["PlannerResult", "plan_hpp", "pipeline_link", "make_problem", "check_micro_batch_sizes", "SOLVERS"]

log = logging.getLogger(__name__)

SOLVERS = ("cp-sat", "greedy")


@dataclass(frozen=True)
class PlannerResult:
    """Result of :func:`plan_hpp`.

    Attributes
    ----------
    plan : Plan
    estimate : PlanEstimate
        The cost model's prediction of ``plan``.
    composition : CompositionResult
        Solver status, objective (the composition model), bound, gap, wall time.
    wall_s : float
        Total search time (candidates + solve + binding) [s].
    stats : dict
        Candidate counts, pruning counters, cache hit rates, phase timings.
    """

    plan: Plan
    estimate: PlanEstimate
    composition: CompositionResult
    wall_s: float
    stats: Mapping[str, Any] = field(default_factory=dict)


def pipeline_link(cluster: Cluster) -> Link:
    """The link the planner assumes between pipeline stages and among gradient holders.

    The inter-node link (the slower one) unless the cluster is a single node.
    """
    if len(cluster.nodes) == 1:
        return cluster.nodes[0].intra_node
    return cluster.inter_node


def make_problem(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                 space: SearchSpace = SearchSpace(), pruning: PruningOptions = PruningOptions(),
                 config: CostModelConfig = CostModelConfig(), workers: int = 1
                 ) -> tuple[CompositionProblem, dict[str, Any]]:
    """Build the candidates (stage balance + pruning) of an instance.

    ``workers``: processes for the stage balance (0: one per usable core; see
    :func:`~hpp.formulation.candidates.build_candidates`; the candidates are the same for any value).

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
    t0 = time.perf_counter()
    left_out = check_micro_batch_sizes(cluster, profile, space)
    link = pipeline_link(cluster)
    caps = {t: d.memory_bytes for t, d in cluster.device_types.items()}
    cache = StageCostCache(profile, caps, link, config, enabled=pruning.memoise, global_batch_size=global_batch_size)
    balancer = StageBalancer(cache, allow_recompute=space.allow_recompute, memoise=pruning.memoise)
    cands, stats = build_candidates(cluster, profile, balancer, space, pruning, workers=workers)
    stats["candidates_s"] = time.perf_counter() - t0
    stats["types_left_out"] = left_out
    stats["cache"] = cache.cache_info()
    stats["dp_rows_computed"] = balancer.rows_computed
    stats["dp_rows_reused"] = balancer.rows_reused
    if not cands:
        raise InfeasibleError(memory_shortfall_message(cluster, profile, cache, space), field="cluster",
                              fix="add devices with more memory, allow recomputation, raise --max-stages or --max-tp,"
                                  " or use smaller micro-batches")
    return CompositionProblem(cands, cluster, global_batch_size, link), stats


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


def _subproblem(problem: CompositionProblem, keep: list[int], hint: dict[int, int]
                ) -> tuple[CompositionProblem, dict[int, int]]:
    """The problem restricted to candidates ``keep`` (indices into ``problem``) and the hint re-indexed."""
    remap = {old: new for new, old in enumerate(keep)}
    sub = CompositionProblem([problem.candidates[i] for i in keep], problem.cluster, problem.global_batch_size,
                             problem.sync_link, solo_cache=problem.solo_cache, ring_cache=problem.ring_cache)
    return sub, {remap[c]: x for c, x in hint.items() if c in remap}


def _best_candidates(problem: CompositionProblem, hint: dict[int, int], limit: int) -> list[int]:
    """Up to ``limit`` candidate indices: the hint's, then the best by solo objective, per device-type set."""
    groups: dict[frozenset, list[int]] = {}
    for c, cand in enumerate(problem.candidates):
        groups.setdefault(frozenset(cand.devices), []).append(c)
    share = max(1, (limit - len(hint)) // max(1, len(groups)))
    keep = set(hint)
    for members in groups.values():
        keep.update(sorted(members, key=lambda c: solo_objective_s(problem, c))[:share])
    return sorted(keep)


@gc_paused()
def plan_hpp(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
             space: SearchSpace = SearchSpace(), pruning: PruningOptions = PruningOptions(),
             settings: SolverSettings = SolverSettings(), config: CostModelConfig = CostModelConfig(),
             solver: str = "cp-sat", profile_ref: Mapping[str, Any] | None = None,
             progress: Callable[[str], None] | None = None,
             seed_plans: Mapping[str, Plan] | None = None) -> PlannerResult:
    """Find the HPP plan with the shortest predicted iteration time.

    Parameters
    ----------
    cluster, profile : the inventory and the model's per-layer profile.
    global_batch_size : int
        G, samples per iteration; any positive integer (no divisibility needed).
    space, pruning, settings, config : search space, pruning switches, CP-SAT settings, cost-model constants.
    solver : ``"cp-sat"`` (default: incumbent, LP bound and gap; CP-SAT runs when there are at most
        ``settings.max_candidates`` candidates, see :class:`SolverSettings`) or ``"greedy"`` (no bound).
    profile_ref : how the plan names its profile (default ``{"name": profile.model}``).
    seed_plans : optional valid plans (e.g. the baselines', whose spaces HPP's contains); if the cost
        model prices one below the searched plan, it is returned instead (``stats["seeded_from"]``).
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
    if solver not in SOLVERS:
        raise HppInputError(f"unknown solver {solver!r}", field="--solver", fix=f"use one of {list(SOLVERS)}")
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    problem, stats = make_problem(cluster, profile, global_batch_size, space=space, pruning=pruning, config=config,
                                  workers=settings.num_workers)
    if stats.get("types_left_out"):
        say(f"left out (no profile at micro-batch sizes {','.join(map(str, space.micro_batch_sizes or ()))}): "
            f"{', '.join(stats['types_left_out'])}")
    say(f"{len(problem.candidates)} candidate pipelines from {stats['shapes']} shapes "
        f"({stats['candidates_s']:.2f} s)")
    t1 = time.perf_counter()
    hint, hint_obj = greedy_composition(problem)
    fill, fill_obj = fill_heuristic(problem)
    if fill_obj < hint_obj:
        hint, hint_obj = fill, fill_obj
    stats["heuristic_s"] = time.perf_counter() - t1
    stats["heuristic_objective_s"] = hint_obj
    say(f"heuristic incumbent {hint_obj:.4f} s")
    if solver == "greedy":
        comp = CompositionResult(hint, "HEURISTIC", hint_obj, math.nan, math.nan, time.perf_counter() - t1,
                                 len(problem.candidates), solver="greedy")
    else:
        if pruning.incumbent_bound and math.isfinite(hint_obj):
            keep = [i for i, c in enumerate(problem.candidates) if not exceeds_incumbent(c, hint_obj)]
            stats["pruned_incumbent"] = len(problem.candidates) - len(keep)
            if stats["pruned_incumbent"]:
                say(f"incumbent bound pruned {stats['pruned_incumbent']} candidates ({len(keep)} left)")
            problem, hint = _subproblem(problem, keep, hint)
        t2 = time.perf_counter()
        lb, comp_lb = composition_bounds(problem, workers=settings.num_workers)
        global_bound = max(lb + min(c.partition.optimizer_s for c in problem.candidates), comp_lb)
        stats["bound_s"] = time.perf_counter() - t2
        n, kept = len(problem.candidates), None
        if n > settings.max_candidates and not settings.cpsat_on_subset:
            # CP-SAT would see a subset only and could not certify the plan: the incumbent and the LP bound decide
            comp = CompositionResult(hint, "UNKNOWN", hint_obj, math.nan, math.nan, 0.0, n, solver="heuristic")
            stats["cpsat_candidates"] = 0
        else:
            sub, sub_hint = problem, hint
            stats["cpsat_candidates"] = n
            if n > settings.max_candidates:
                kept = _best_candidates(problem, hint, settings.max_candidates)
                sub, sub_hint = _subproblem(problem, kept, hint)
                stats["cpsat_candidates"] = len(kept)
            # the time limit covers bound + CP-SAT: CP-SAT gets what is left (at least 0.5 s)
            left = settings.max_time_in_seconds - (time.perf_counter() - t1)
            comp = solve_composition_cpsat(sub, settings=replace(settings, max_time_in_seconds=max(0.5, left)),
                                           hint=sub_hint, symmetry=pruning.symmetry,
                                           incumbent_s=hint_obj if pruning.incumbent_bound else None,
                                           lower_bound_pipe_s=lb, progress=progress)
        counts, obj = comp.counts, comp.objective_s
        if kept is not None:
            counts = {kept[c]: x for c, x in counts.items()}
        stats["plan_from"] = "cp-sat" if comp.solver == "cp-sat" else "heuristic"
        if not counts or obj > hint_obj * (1 + 1e-9) or counts == hint:
            counts, obj = hint, hint_obj          # the incumbent is a feasible solution of the same model
            stats["plan_from"] = "heuristic"
        # CP-SAT's bound holds for the candidates it saw and for its relaxed sync (one bucket per stage):
        # the gap is always the exact objective against the best valid bound
        bound = global_bound if kept is not None or comp.bound_s != comp.bound_s else max(comp.bound_s, global_bound)
        gap = max(0.0, (obj - bound) / obj) if obj > 0 else 0.0
        if gap <= 1e-6:
            status, gap = "OPTIMAL", 0.0
        elif comp.status in ("OPTIMAL", "FEASIBLE", "UNKNOWN", "INFEASIBLE"):
            status = "FEASIBLE"
        else:
            status = comp.status
        comp = CompositionResult(counts, status, obj, bound, gap, comp.wall_s, len(problem.candidates),
                                 solver=comp.solver)
        seen = (f"; CP-SAT saw the best {len(kept)} of {n} candidates" if kept else
                f"; CP-SAT skipped: {n} candidates > {settings.max_candidates}" if comp.solver == "heuristic" else "")
        say(f"search {comp.status}: objective {comp.objective_s:.4f} s, bound {comp.bound_s:.4f} s, "
            f"gap {comp.gap:.2%} ({comp.wall_s:.2f} s{seen})")
    stats["solve_s"] = comp.wall_s
    stats["num_candidates"] = len(problem.candidates)
    plan = build_plan(cluster, model=profile.model, num_layers=profile.num_layers,
                      sequence_length=profile.sequence_length, global_batch_size=global_batch_size,
                      candidates=problem.candidates, counts=comp.counts,
                      profile_ref=profile_ref or {"name": profile.model}, cluster_ref=cluster_to_dict(cluster))
    est = estimate_plan(plan, cluster, profile, config=config, estimate_missing=False)
    for name, seed in (seed_plans or {}).items():
        if not space.mixed_tp_pipelines and any(len({s.tp_degree for s in pipe.stages}) > 1
                                                for pipe in seed.pipelines):
            continue                # a seed outside the space (several TP degrees in one pipeline)
        seed_est = estimate_plan(seed, cluster, profile, config=config, estimate_missing=False)
        if seed_est.fits_memory and seed_est.iteration_time_s < est.iteration_time_s * (1 - 1e-12):
            plan, est = seed, seed_est
            stats["seeded_from"] = name
    wall = time.perf_counter() - t0
    return PlannerResult(plan, est, comp, wall, stats)
