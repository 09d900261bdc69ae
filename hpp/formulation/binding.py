"""Device binding: turn candidate copies into pipelines bound to physical devices, and a Plan.

TP groups are placed largest first (sizes are powers of two that divide the node
sizes, so first-fit decreasing always succeeds when the composition's per-size
capacity constraints hold); a stage prefers the node of the previous stage of its
pipeline, so that point-to-point traffic stays inside a node where it can.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.formulation.candidates import Candidate
from hpp.formulation.data_balance import balance_data
from hpp.plan import Pipeline, Plan, Stage, default_schedule
from hpp.profiles.cluster import Cluster

__all__ = ["bind_devices", "build_plan"]


def bind_devices(cluster: Cluster, shapes: Sequence[Candidate]) -> list[list[tuple[int, ...]]]:
    """Device ids for every stage of every pipeline copy in ``shapes`` (one entry per copy).

    Raises
    ------
    HppInputError
        The copies do not fit the cluster's nodes.
    """
    free: dict[int, list[int]] = {}
    for d in cluster.devices:
        free.setdefault(d.node, []).append(d.device_id)
    requests = [(p, s, k) for p, cand in enumerate(shapes) for s, k in enumerate(cand.shape)]
    requests.sort(key=lambda r: (-r[2].tp_degree, r[0], r[1]))
    placed: dict[tuple[int, int], tuple[int, ...]] = {}
    node_of: dict[tuple[int, int], int] = {}
    for p, s, kind in requests:
        options = [n for n, ids in free.items()
                   if cluster.nodes[n].device_type == kind.device_type and len(ids) >= kind.tp_degree]
        if not options:
            raise HppInputError(f"cannot place a TP group of {kind.tp_degree} x {kind.device_type}: the nodes are full",
                                field="cluster.nodes", fix="use fewer pipelines or smaller TP degrees")
        prefer = [node_of.get((p, s - 1)), node_of.get((p, s + 1))]
        pick = next((n for n in prefer if n in options), None)
        if pick is None:
            pick = min(options, key=lambda n: (len(free[n]), n))       # best fit
        ids = tuple(free[pick][:kind.tp_degree])
        del free[pick][:kind.tp_degree]
        placed[(p, s)] = ids
        node_of[(p, s)] = pick
    return [[placed[(p, s)] for s in range(len(cand.shape))] for p, cand in enumerate(shapes)]


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
        bnd = cand.partition.boundaries
        stages = tuple(Stage(bnd[i], bnd[i + 1], k.device_type, k.tp_degree, ids[i],
                             "full" if cand.partition.recompute[i] else "none")
                       for i, k in enumerate(cand.shape))
        m = -(-n // cand.micro_batch_size)
        pipelines.append(Pipeline(stages, cand.micro_batch_size, n, default_schedule(m, len(stages))))
    return Plan(model=model, num_layers=num_layers, global_batch_size=global_batch_size, pipelines=tuple(pipelines),
                sequence_length=sequence_length, profile_ref=dict(profile_ref), cluster_ref=dict(cluster_ref))
