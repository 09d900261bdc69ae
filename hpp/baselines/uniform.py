"""The uniform (Megatron DP x PP x TP) baseline, and what every baseline shares (result record, clock).

See :mod:`hpp.baselines.single_shape` for what the baselines are; this module holds the uniform one, priced
fast enough for 4,096 GPUs (:func:`uniform_baseline`), and the pieces the single-shape search in
:mod:`hpp.baselines.single_shape` uses too.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from hpp.formulation.space_limits import SearchSpace, common_micro_batch_sizes, runnable_tp_degrees
from hpp.formulation.collectives import allreduce_s, concurrent_allreduces, edge_link, p2p_flows
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan, stage_compute_s
from hpp.formulation.stage_balance import StageKind
from hpp.plan_data import Pipeline, Plan, make_pipeline
from hpp.profiles.cluster import Cluster
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.profiles.model_profile import ModelProfile

__all__ = ["BaselineResult", "uniform_baseline"]


@dataclass(frozen=True)
class BaselineResult:
    """Best plan of one baseline: its predicted iteration time [s], throughput [samples/s], search wall [s]."""

    name: str
    plan: Plan | None
    iteration_time_s: float
    throughput: float
    wall_s: float
    description: str
    candidates: int = 0

    @property
    def feasible(self) -> bool:
        return self.plan is not None


def _even_split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _make_plan(profile: ModelProfile, cluster: Cluster, gbs: int, pipelines: list[Pipeline]) -> Plan:
    return Plan(model=profile.model, num_layers=profile.num_layers, global_batch_size=gbs,
                pipelines=tuple(pipelines), sequence_length=profile.sequence_length,
                profile_ref={"name": profile.model}, cluster_ref=cluster_to_dict(cluster))


def _price(plan: Plan, cluster: Cluster, profile: ModelProfile, config: CostModelConfig) -> float:
    est = estimate_plan(plan, cluster, profile, config=config, estimate_missing=False)
    return est.iteration_time_s if est.fits_memory else math.inf


class _Clock:
    """A deadline [perf_counter s] and a throttled progress callback (one line at most every ``every_s``)."""

    def __init__(self, budget_s: float | None, progress: Callable[[str], None] | None, every_s: float = 2.0) -> None:
        self.t0 = time.perf_counter()
        self.deadline = None if budget_s is None else self.t0 + budget_s
        self.progress = progress
        self.every_s = every_s
        self._next = self.t0 + every_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def tick(self, message: Callable[[], str]) -> None:
        """Report ``message()`` if a progress callback is set and ``every_s`` passed since the last line."""
        if self.progress is not None and time.perf_counter() >= self._next:
            self.progress(message())
            self._next = time.perf_counter() + self.every_s


def _uniform_groups(cluster: Cluster, tp: int) -> list[tuple[str, tuple[int, ...], int]]:
    """TP groups cut from the nodes in cluster order: (device type, device ids, node index)."""
    groups = []
    first = 0
    for node_idx, node in enumerate(cluster.nodes):
        ids = list(range(first, first + node.num_devices))
        first += node.num_devices
        groups += [(node.device_type, tuple(ids[i:i + tp]), node_idx) for i in range(0, len(ids) - tp + 1, tp)]
    return groups


def _uniform_layout(cluster: Cluster, groups, pp: int, samples: list[int]):
    """The distinct pipelines of a DP x PP layout and what the gradient sync needs.

    Replica r takes groups r*PP .. r*PP+PP-1; replicas without samples are left out. Two replicas
    with the same stage types, the same links between consecutive stages and the same samples get
    the same estimate from the cost model (nothing else of a pipeline enters it), so one
    representative per class is priced.

    Returns
    -------
    (representatives, stage_groups, stage_types, replicas, memo, crossing_flows)
        representatives: one replica index per class; stage_groups[s] / stage_types[s]: the TP
        groups (device-id tuples, one per kept replica) / device types holding stage s; replicas:
        kept replica count; memo: an empty dict for :func:`_uniform_sync_s`'s all-reduce times;
        crossing_flows: the point-to-point flows leaving each node at once over all kept replicas
        (:func:`~hpp.formulation.collectives.p2p_flows`), with which each stage link is priced.
    """
    reps: dict[tuple, int] = {}
    stage_groups: list[list[tuple[int, ...]]] = [[] for _ in range(pp)]
    stage_types: list[set[str]] = [set() for _ in range(pp)]
    kept = sum(1 for n in samples if n > 0)
    node = [d.node for d in cluster.devices]
    rows = [groups[r * pp:(r + 1) * pp] for r in range(kept)]
    flows = p2p_flows([(node[a[1][-1]], node[b[1][0]]) for row in rows for a, b in zip(row, row[1:])])
    for r, row in enumerate(rows):
        for s, (t, ids, _) in enumerate(row):
            stage_groups[s].append(ids)
            stage_types[s].add(t)
        links = tuple(cluster.nodes[node[a[1][-1]]].intra_node if node[a[1][-1]] == node[b[1][0]]
                      else edge_link(cluster, node[a[1][-1]], node[b[1][0]], flows) for a, b in zip(row, row[1:]))
        reps.setdefault((tuple(t for t, _, _ in row), links, samples[r]), r)
    return list(reps.values()), stage_groups, stage_types, kept, {}, flows


def _uniform_pipeline(profile: ModelProfile, groups, r: int, pp: int, tp: int, bounds, b: int, n: int,
                      rec: str) -> Pipeline:
    rows = [groups[r * pp + s] for s in range(pp)]
    return make_pipeline(bounds, [g[0] for g in rows], [tp] * pp, [g[1] for g in rows], [rec] * pp, b, n)


def _uniform_sync_s(cluster: Cluster, profile: ModelProfile, layout, bounds, tp: int, b: int,
                    config: CostModelConfig) -> tuple[float, float]:
    """(exposed gradient sync [s], largest optimizer step [s]) of a uniform layout, as the cost model has them.

    Every replica has the same stage boundaries, so the blocks are the stages and each device holds
    one: the exposed sync is the slowest stage's all-reduce among all kept replicas' TP groups of that
    stage, the stages' all-reduces priced together by :func:`hpp.formulation.collectives.concurrent_allreduces`
    on their actual (per-pair, shared) links, exactly as :func:`estimate_plan` prices the blocks (best ring
    order, or hierarchical where cheaper). Memoised per (bytes per stage) in the layout's memo (its devices
    never change).
    """
    _, stage_groups, stage_types, _, memo = layout[:5]
    hier = config.hierarchical_allreduce
    spans = list(zip(bounds, bounds[1:]))
    entries = [[profile.layer_profile(t, tp, b, estimate=False) for t in sorted(stage_types[s])]
               for s in range(len(spans))]
    stage_bytes = tuple(max(sum(e.param_bytes[lo:hi]) for e in es) for (lo, hi), es in zip(spans, entries))
    key = (stage_bytes, hier)
    if key not in memo:
        memo[key] = concurrent_allreduces([(w, stage_groups[s]) for s, w in enumerate(stage_bytes)], cluster,
                                          hierarchical=hier)
    costs, flows = memo[key]
    sync = opt = 0.0
    for s, (lo, hi) in enumerate(spans):
        es = entries[s]
        if config.grad_sync == "block":
            t = costs[s].seconds
        else:
            shared = flows if len(stage_groups[s]) > 1 else None
            t = sum(allreduce_s(max(e.param_bytes[l] for e in es), stage_groups[s], cluster, hierarchical=hier,
                                flows=shared).seconds for l in range(lo, hi))
        sync = max(sync, t)
        opt = max(opt, max(sum(e.optimizer_s[lo:hi]) for e in es))
    return sync, opt


def _uniform_pipe_bound_s(profile: ModelProfile, groups, layout, samples, bounds, tp: int, b: int, rec: str) -> float:
    """A lower bound [s] of the layout's slowest pipeline: micro-batches x its slowest stage's compute.

    A stage runs the forward and backward of each micro-batch one after another, whatever the
    schedule, so no pipeline finishes sooner (checked against the cost model in the tests).
    """
    pp = len(bounds) - 1
    fb: dict[tuple[str, int], float] = {}
    bound = 0.0
    for r in layout[0]:
        slowest = 0.0
        for s in range(pp):
            key = (groups[r * pp + s][0], s)
            if key not in fb:
                e = profile.layer_profile(key[0], tp, b, estimate=False)
                fb[key] = sum(stage_compute_s(e, bounds[s], bounds[s + 1], rec))
            slowest = max(slowest, fb[key])
        bound = max(bound, -(-samples[r] // b) * slowest)
    return bound


def _uniform_time_s(cluster: Cluster, profile: ModelProfile, gbs: int, layout, pipes: list[Pipeline], bounds,
                    tp: int, b: int, config: CostModelConfig) -> float:
    """The cost model's iteration time [s] of a uniform layout from its distinct pipelines ``pipes`` (inf if
    it does not fit memory); equal to :func:`estimate_plan` of the whole plan (tested). ``gbs`` [samples] is
    not needed (the distinct pipelines carry their samples); kept for the callers."""
    # the distinct pipelines only: their samples are the plan's batch (Plan checks the sum); the estimate's
    # pipeline and optimizer times do not depend on it
    reduced = Plan(model=profile.model, num_layers=profile.num_layers,
                   global_batch_size=sum(p.num_samples for p in pipes), pipelines=tuple(pipes),
                   sequence_length=profile.sequence_length)
    est = estimate_plan(reduced, cluster, profile, config=config, estimate_missing=False, p2p_flows=layout[5])
    if not est.fits_memory:
        return math.inf
    sync, _ = _uniform_sync_s(cluster, profile, layout, bounds, tp, b, config)
    return est.pipeline_time_s + sync + est.optimizer_s


def uniform_baseline(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                     space: SearchSpace = SearchSpace(), config: CostModelConfig = CostModelConfig(),
                     time_budget_s: float | None = None,
                     progress: Callable[[str], None] | None = None) -> BaselineResult:
    """Megatron-style DP x PP x TP (see the module docstring).

    Parameters
    ----------
    time_budget_s : float, optional
        Stop once the search has run this long [s] (checked before every layout); the result then
        says "truncated" and is the best layout priced.
    progress : callable, optional
        Receives a one-line progress message every 2 s or so.

    Notes
    -----
    Each layout is priced from its distinct pipelines (:func:`_uniform_time_s`, equal to the cost
    model on the whole plan), so 4,096 GPUs cost about what a few dozen do, and a layout whose
    lower bound (exact gradient sync and optimizer step plus :func:`_uniform_pipe_bound_s`) cannot
    beat the best one so far is not priced at all; the winner is then priced once more by
    :func:`estimate_plan` on the whole plan, which is the figure returned.
    """
    clock = _Clock(time_budget_s, progress)
    L = profile.num_layers
    types = sorted(cluster.count_by_type())
    # TP degrees measured for every type that the runtime can run (they divide the heads), as HPP's space
    common_tp = set.intersection(*(set(profile.tp_degrees(t)) for t in types)) & set(runnable_tp_degrees(profile))
    best: tuple[float, Any, str] = (math.inf, None, "no feasible DP x PP x TP layout")
    n_cands = pruned = 0
    truncated = False
    recs = ("none", "full") if space.allow_recompute else ("none",)
    for tp in sorted(common_tp):
        if truncated:
            break
        if not space.allows_tp(tp):
            continue
        groups = _uniform_groups(cluster, tp)
        sizes = common_micro_batch_sizes(profile, tuple(StageKind(t, tp) for t in types), space)
        for pp in range(1, min(L, len(groups), space.max_stages) + 1):       # HPP's limits (SearchSpace)
            if truncated:
                break
            dp = len(groups) // pp
            bounds = [0, *itertools.accumulate(_even_split(L, pp))]
            samples = _even_split(global_batch_size, dp)
            layout = None
            kept = sum(1 for n in samples if n > 0)
            if any(len({t for t, _, _ in groups[r * pp:(r + 1) * pp]}) > space.max_types_per_pipeline
                   for r in range(kept)):
                continue          # a replica spans more device types than HPP's space allows per pipeline
            for b in sizes:
                if truncated:
                    break
                for rec in recs:
                    if clock.over():
                        truncated = True
                        break
                    clock.tick(lambda: f"uniform: {n_cands} layouts priced, best "
                                       f"{_fmt_s(best[0])} ({clock.elapsed():.0f} s)")
                    n_cands += 1
                    if layout is None:
                        layout = _uniform_layout(cluster, groups, pp, samples)
                    sync, opt = _uniform_sync_s(cluster, profile, layout, bounds, tp, b, config)
                    if (_uniform_pipe_bound_s(profile, groups, layout, samples, bounds, tp, b, rec) + sync + opt
                            >= best[0]):
                        pruned += 1               # cannot beat the best layout so far
                        continue
                    pipes = [_uniform_pipeline(profile, groups, r, pp, tp, bounds, b, samples[r], rec)
                             for r in layout[0]]
                    t = _uniform_time_s(cluster, profile, global_batch_size, layout, pipes, bounds, tp, b, config)
                    if t < best[0]:
                        best = (t, (tp, pp, b, rec, groups, bounds, samples),
                                f"DP={layout[3]} PP={pp} TP={tp} b={b} recompute={rec}")
    plan, t_plan = None, math.inf
    if best[1] is not None:
        tp, pp, b, rec, groups, bounds, samples = best[1]
        pipes = [_uniform_pipeline(profile, groups, r, pp, tp, bounds, b, n, rec) for r, n in enumerate(samples) if n]
        plan = _make_plan(profile, cluster, global_batch_size, pipes)
        t_plan = _price(plan, cluster, profile, config)       # the whole plan, by the full cost model
        if not math.isfinite(t_plan):
            plan = None
    wall = clock.elapsed()
    desc = best[2] + (f"; search stopped at the time limit after {n_cands} layouts, {wall:.1f} s"
                      if truncated else "")
    return BaselineResult("uniform", plan, t_plan, global_batch_size / t_plan if plan else 0.0, wall, desc, n_cands)


def _fmt_s(t: float) -> str:
    return f"{t:.3f} s/iter" if math.isfinite(t) else "none feasible yet"
