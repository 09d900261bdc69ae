"""Device binding: turn candidate copies into pipelines bound to physical devices, and a Plan.

:func:`bind_devices` computes node assignments by up to three rules and keeps the best by
:class:`~hpp.formulation.binding_score.BindingScore` (fewest node crossings, then the
fastest gradient rings, then the fastest stage-to-stage links; ties keep the earlier rule):

1. hpp's original best-fit rule (:func:`~hpp.formulation.binding_rules.best_fit_assign`),
   first, so that a plan whose binding is already as good keeps its device ids;
2. run packing (:func:`~hpp.formulation.binding_rules.packed_assign`): a pipeline's
   stages of one device type go whole onto one node where one holds them;
3. for small inputs (at most :data:`EXACT_MAX_STAGES` stages in all, on at most
   :data:`EXACT_MAX_NODES` nodes of the device types they use), an exact branch and bound
   (:func:`~hpp.formulation.binding_exact.exact_assign`) started from the better of the two;
   it stops after :data:`EXACT_MAX_EXPANSIONS` placements (then it keeps the best found).

At scale the binding is therefore the better of rules 1 and 2: each pipeline's runs of
same-type stages whole on one node where a node holds them, zones filled in order.

TP groups never span nodes in any of them. Device ids are then taken node by node, TP
groups largest first (then copy, stage), each from the lowest free ids of its node.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.formulation.binding_exact import exact_assign
from hpp.formulation.binding_rules import best_fit_assign, packed_assign
from hpp.formulation.binding_score import BindingScore, BindingScorer
from hpp.formulation.candidates import Candidate, StageKind
from hpp.formulation.data_balance import balance_data
from hpp.plan_data import Plan, make_pipeline
from hpp.profiles.cluster import Cluster

__all__ = ["bind_devices", "bind_nodes", "build_plan", "rebind_plan", "EXACT_MAX_STAGES", "EXACT_MAX_NODES",
           "EXACT_MAX_EXPANSIONS"]

log = logging.getLogger(__name__)

#: Largest total number of stages (TP groups) over all copies that gets the exact search.
EXACT_MAX_STAGES = 12
#: Most nodes (of the device types the copies use) that get the exact search.
EXACT_MAX_NODES = 16
#: Placements the exact search may try before it keeps the best found (then it is not proven).
EXACT_MAX_EXPANSIONS = 5_000


def bind_nodes(cluster: Cluster, shapes: Sequence[Candidate], *, exact: bool = True
               ) -> tuple[list[list[int]], BindingScore, str]:
    """Node of every stage of every copy: ``(nodes[p][s], score, rule)`` (see the module docstring).

    Parameters
    ----------
    exact : allow the exact search on small inputs (False: the greedy rules only).

    Raises
    ------
    HppInputError
        No rule places every TP group on a node of its device type.
    """
    return _bind_nodes(cluster, [c.shape for c in shapes], [c.partition.boundaries for c in shapes], exact=exact)


def _bind_nodes(cluster: Cluster, kinds: Sequence[Sequence[StageKind]], boundaries: Sequence[Sequence[int]], *,
                exact: bool = True) -> tuple[list[list[int]], BindingScore, str]:
    """:func:`bind_nodes` of pipelines given by their stage kinds and layer boundaries."""
    scorer = BindingScorer(cluster, boundaries)
    best: tuple[list[list[int]], BindingScore, str] | None = None
    for rule, assign in (("best-fit", best_fit_assign), ("packed", packed_assign)):
        nodes = assign(cluster, kinds)
        if nodes is not None:
            score = scorer.score(nodes)
            if best is None or score.better_than(best[1]):
                best = (nodes, score, rule)
    used = {k.device_type for shape in kinds for k in shape}
    if (exact and sum(len(k) for k in kinds) <= EXACT_MAX_STAGES
            and sum(n.device_type in used for n in cluster.nodes) <= EXACT_MAX_NODES):
        nodes, score, proven = exact_assign(cluster, kinds, scorer, incumbent=best[0] if best else None,
                                            max_expansions=EXACT_MAX_EXPANSIONS)
        if nodes is not None and (best is None or score.better_than(best[1])):
            best = (nodes, score, "exact" if proven else "search")
        log.debug("binding: exact search %s", "finished" if proven else "stopped at its budget")
    if best is None:
        worst = max((k for shape in kinds for k in shape), key=lambda k: k.tp_degree)
        raise HppInputError(f"cannot place the TP groups (largest {worst.tp_degree} x {worst.device_type}): "
                            "the nodes are full", field="cluster.nodes",
                            fix="use fewer pipelines or smaller TP degrees")
    log.debug("binding: %s rule, %d node crossings", best[2], best[1].crossings)
    return best


def bind_devices(cluster: Cluster, shapes: Sequence[Candidate]) -> list[list[tuple[int, ...]]]:
    """Device ids for every stage of every pipeline copy in ``shapes`` (one entry per copy).

    Returns
    -------
    list (one per copy) of list (one per stage) of tuple[int, ...]
        The ``tp_degree`` device ids of the stage, all on one node.

    Raises
    ------
    HppInputError
        The copies do not fit the cluster's nodes.
    """
    return _device_ids(cluster, [c.shape for c in shapes], [c.partition.boundaries for c in shapes])


def _device_ids(cluster: Cluster, kinds: Sequence[Sequence[StageKind]],
                boundaries: Sequence[Sequence[int]]) -> list[list[tuple[int, ...]]]:
    """:func:`bind_devices` of pipelines given by their stage kinds and layer boundaries."""
    nodes, _, _ = _bind_nodes(cluster, kinds, boundaries)
    free: dict[int, list[int]] = {}
    for d in cluster.devices:
        free.setdefault(d.node, []).append(d.device_id)
    requests = sorted(((p, s, k) for p, shape in enumerate(kinds) for s, k in enumerate(shape)),
                      key=lambda r: (-r[2].tp_degree, r[0], r[1]))
    placed: dict[tuple[int, int], tuple[int, ...]] = {}
    for p, s, kind in requests:
        n = nodes[p][s]
        placed[(p, s)] = tuple(free[n][:kind.tp_degree])
        del free[n][:kind.tp_degree]
    return [[placed[(p, s)] for s in range(len(shape))] for p, shape in enumerate(kinds)]


def build_plan(cluster: Cluster, *, model: str, num_layers: int, sequence_length: int, global_batch_size: int,
               candidates: Sequence[Candidate], counts: Mapping[int, int], profile_ref: Mapping[str, Any],
               cluster_ref: Mapping[str, Any]) -> Plan:
    """Expand ``counts`` copies of ``candidates`` into a bound, data-balanced :class:`Plan`.

    The data split is exact (:func:`balance_data`); pipelines that receive no sample
    are dropped (they would only add gradient-sync work).
    """
    copies = [candidates[c] for c in sorted(counts) for _ in range(counts[c])]
    split = balance_data([c.partition.bottleneck_s for c in copies], [c.partition.fill_s for c in copies],
                         [c.micro_batch_size for c in copies], global_batch_size)
    kept = [(c, n) for c, n in zip(copies, split.num_samples) if n > 0]
    bound = bind_devices(cluster, [c for c, _ in kept])
    pipelines = []
    for (cand, n), ids in zip(kept, bound):
        pipelines.append(make_pipeline(cand.partition.boundaries, [k.device_type for k in cand.shape],
                                       [k.tp_degree for k in cand.shape], ids, cand.partition.recompute,
                                       cand.micro_batch_size, n))
    return Plan(model=model, num_layers=num_layers, global_batch_size=global_batch_size, pipelines=tuple(pipelines),
                sequence_length=sequence_length, profile_ref=dict(profile_ref), cluster_ref=dict(cluster_ref))


def rebind_plan(plan: Plan, cluster: Cluster, *, cluster_ref: Mapping[str, Any]) -> Plan:
    """``plan``'s pipelines (stages, layers, TP degrees, micro-batches, samples: unchanged) bound to ``cluster``'s
    devices by the same rules as a search's plan (:func:`bind_devices`); ``cluster_ref`` is the plan's new cluster.

    For pricing a plan, e.g. another planner's, on another cluster than the one it was made for
    (``hpp estimate PLAN --cluster FILE``).

    Raises
    ------
    HppInputError
        The cluster has fewer devices of a type than the plan's stages use, or its nodes cannot hold a TP group.
    """
    need: dict[str, int] = {}
    for p in plan.pipelines:
        for st in p.stages:
            need[st.device_type] = need.get(st.device_type, 0) + st.tp_degree
    have = cluster.count_by_type()
    short = [f"{n} x {t} (the cluster has {have.get(t, 0)})" for t, n in sorted(need.items()) if n > have.get(t, 0)]
    if short:
        raise HppInputError(f"the plan's stages use {', '.join(short)}", field="--cluster",
                            fix="give a cluster with at least the devices the plan uses")
    kinds = [tuple(StageKind(st.device_type, st.tp_degree) for st in p.stages) for p in plan.pipelines]
    ids = _device_ids(cluster, kinds, [[p.stages[0].layer_start, *(st.layer_stop for st in p.stages)]
                                       for p in plan.pipelines])
    pipes = tuple(replace(p, stages=tuple(replace(st, device_ids=d) for st, d in zip(p.stages, ds)))
                  for p, ds in zip(plan.pipelines, ids))
    return replace(plan, pipelines=pipes, cluster_ref=dict(cluster_ref))
