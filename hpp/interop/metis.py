"""Import a Metis plan (ATC'24, SamsungLabs/Metis) as an hpp plan with its cluster.

Metis' ``cost_het_cluster.py`` prints, per plan, ``node_sequence, device_groups, strategies (dp, tp),
batches, layer_partition``. We accept that description as JSON::

    {"format": "metis-plan",                     # optional
     "model": "OPT-350",                         # optional (else --model)
     "gbs": 128,                                 # global batch (else --gbs)
     "node_sequence": ["A100-40", "V100-16"],    # device types in rank order
     "num_nodes": {"A100-40": 2, "V100-16": 2},  # nodes per type (optional with one type)
     "gpus_per_node": {"A100-40": 4},            # optional; default: the bundled type's
     "device_groups": [8, 8],                    # devices per stage, consecutive ranks
     "strategies": [[2, 4], [4, 2]],             # (dp, tp) per stage; dp * tp = group size
     "batches": 8,                               # micro-batches per iteration
     "layer_partition": [0, 14, 26]}             # stage boundaries, S + 1 values

Ranks are numbered node by node, types in ``node_sequence`` order (Metis'
``StagePerformance._get_device_placement``). Stage s's micro-batch size is
``gbs // batches // dp_s`` (Metis' ``IntraStagePlanGenerator``). hpp pipelines are
independent replicas, so the stages of a Metis plan must share one dp degree (and
hence one micro-batch size); replica i of stage s is the i-th TP group of ``tp``
consecutive ranks of the stage's device group and must sit on one node of one type.
The batch is split evenly over the dp replicas (Metis' data split among replicas of
different types inside one stage is not modelled).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.interop.common import (check_gpu, finish_plan, foreign_cluster, global_batch, int_field, layer_ranges,
                                list_field, missing_layers, required)
from hpp.plan_data import Pipeline, Plan, Stage, default_schedule
from hpp.profiles.cluster import Cluster
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.model_profile import ModelProfile

__all__ = ["plan_from_metis"]


def _metis_coverage_defect(data: Any, L: int) -> str:
    """The layer coverage of a Metis plan's ``layer_partition`` in one phrase ('' when it covers [0, L) or
    cannot be read): missing layers, layers beyond the model."""
    part = data.get("layer_partition") if isinstance(data, Mapping) else None
    if not isinstance(part, list) or len(part) < 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                for x in part):
        return ""
    covered = {x for lo, hi in zip(part, part[1:]) for x in range(max(lo, 0), hi)}
    out = [missing_layers(covered, L)]
    beyond = sorted(x for x in covered if x >= L)
    if beyond:
        out.append(f"layers beyond the model: {layer_ranges(beyond).split(' ', 1)[1]}")
    return "; ".join(x for x in out if x)



def plan_from_metis(data: Mapping[str, Any], profile: ModelProfile, *, source: str = "<metis plan>",
                    gbs: int | None = None) -> tuple[Plan, Cluster]:
    """Convert a Metis plan description (module docstring) to a validated hpp plan and its cluster.

    Returns
    -------
    (Plan, Cluster)

    Raises
    ------
    HppInputError
        The first defect found, naming ``source`` and the field (e.g. ``layer_partition``); when
        the layer partition is wrong too, the message adds its coverage ("also layer_partition:
        layers 19-25 are missing"), so one line reports both.
    """
    try:
        return _plan_from_metis(data, profile, source=source, gbs=gbs)
    except HppInputError as exc:
        coverage = _metis_coverage_defect(data, profile.num_layers)
        if not coverage or exc.field == "layer_partition":
            raise
        raise HppInputError(f"{exc.message}; also layer_partition: {coverage}", source=exc.source,
                            field=exc.field, fix=exc.fix) from None


def _plan_from_metis(data: Mapping[str, Any], profile: ModelProfile, *, source: str,
                     gbs: int | None) -> tuple[Plan, Cluster]:
    if not isinstance(data, Mapping):
        raise HppInputError("a Metis plan must be a JSON object", source=source, fix="see hpp/interop/metis.py")
    L = profile.num_layers
    G = global_batch(data, "gbs", gbs, source=source)
    seq = list_field(required(data, "node_sequence", source=source, where="",
                              fix="list the device types in rank order"),
                     source=source, field="node_sequence", what="device types")
    if not seq or len(set(map(str, seq))) != len(seq):
        raise HppInputError(f"node_sequence={seq!r}", source=source, field="node_sequence",
                            fix="list each device type once, in rank order")
    per_node_raw = data.get("gpus_per_node", {})
    if not isinstance(per_node_raw, Mapping):
        raise HppInputError("expected {type: GPUs per node}", source=source, field="gpus_per_node",
                            fix="give an object such as {\"A100-40\": 4}")
    for i, t in enumerate(seq):
        if not isinstance(t, str) or t not in profile.device_types or t not in BUNDLED_DEVICE_TYPES:
            raise HppInputError(f"GPU type {t!r} has no profile for {profile.model}", source=source,
                                field=f"node_sequence[{i}]", fix=f"use one of {list(profile.device_types)}")
    per_node = {t: int_field(per_node_raw.get(t, BUNDLED_DEVICE_TYPES[t].gpus_per_node), source=source,
                             field=f"gpus_per_node.{t}") for t in seq}
    groups = [int_field(x, source=source, field=f"device_groups[{i}]")
              for i, x in enumerate(list_field(required(data, "device_groups", source=source, where="",
                                                        fix="give the devices of each stage"),
                                               source=source, field="device_groups", what="device counts"))]
    S = len(groups)
    if S == 0:
        raise HppInputError("no stages", source=source, field="device_groups", fix="give at least one stage")
    total = sum(groups)
    if "num_nodes" in data:
        nn = data["num_nodes"]
        if not isinstance(nn, Mapping) or set(nn) - set(seq):
            raise HppInputError(f"num_nodes={nn!r}", source=source, field="num_nodes",
                                fix="give {type: nodes} for the types of node_sequence")
        num_nodes = {t: int_field(nn.get(t, 0), source=source, field=f"num_nodes.{t}", minimum=0) for t in seq}
    elif len(seq) == 1:
        num_nodes = {seq[0]: -(-total // per_node[seq[0]])}
    else:
        raise HppInputError("several device types but no node counts", source=source, field="num_nodes",
                            fix="give {type: nodes} for every type of node_sequence")
    nodes = [(t, per_node[t]) for t in seq for _ in range(num_nodes[t])]
    cluster = foreign_cluster(Path(source).stem, nodes)
    if total != cluster.num_devices:
        raise HppInputError(f"device_groups add up to {total} devices but the cluster has {cluster.num_devices}",
                            source=source, field="device_groups", fix="give every device to exactly one stage")

    strategies = list_field(required(data, "strategies", source=source, where="", fix="give (dp, tp) per stage"),
                            source=source, field="strategies", what="(dp, tp) pairs")
    if len(strategies) != S:
        raise HppInputError(f"{len(strategies)} strategies for {S} device groups", source=source,
                            field="strategies", fix="give one (dp, tp) pair per stage")
    dp_tp = []
    for s, st in enumerate(strategies):
        if not (isinstance(st, list) and len(st) == 2):
            raise HppInputError(f"expected [dp, tp], got {st!r}", source=source, field=f"strategies[{s}]",
                                fix="give a pair [dp, tp]")
        dp = int_field(st[0], source=source, field=f"strategies[{s}][0]")
        tp = int_field(st[1], source=source, field=f"strategies[{s}][1]")
        if dp * tp != groups[s]:
            raise HppInputError(f"dp x tp = {dp} x {tp} = {dp * tp} but the stage has {groups[s]} devices",
                                source=source, field=f"strategies[{s}]", fix="make dp x tp equal device_groups[s]")
        dp_tp.append((dp, tp))
    dp = dp_tp[0][0]
    if any(d != dp for d, _ in dp_tp):
        raise HppInputError(f"dp degrees {[d for d, _ in dp_tp]} differ between stages; hpp pipelines are whole "
                            "replicas", source=source, field="strategies", fix="use one dp degree for all stages")

    part = list_field(required(data, "layer_partition", source=source, where="", fix="give the stage boundaries"),
                      source=source, field="layer_partition", what="stage boundaries")
    if len(part) != S + 1:
        raise HppInputError(f"{len(part)} boundaries for {S} stages", source=source, field="layer_partition",
                            fix=f"give {S + 1} boundaries [0, ..., {L}]")
    for i, x in enumerate(part):
        int_field(x, source=source, field=f"layer_partition[{i}]", minimum=0)
    if part[0] != 0 or part[-1] != L:
        raise HppInputError(f"the partition {part} covers [{part[0]}, {part[-1]}) but {profile.model} has layers "
                            f"[0, {L}): {_metis_coverage_defect(data, L)}", source=source,
                            field="layer_partition", fix=f"start at 0 and end at {L}")
    for s in range(S):
        if part[s] >= part[s + 1]:
            raise HppInputError(f"empty stage {s}: layers [{part[s]}, {part[s + 1]})", source=source,
                                field="layer_partition", fix="make the boundaries strictly increasing")

    m = int_field(required(data, "batches", source=source, where="", fix="give the number of micro-batches"),
                  source=source, field="batches")
    if G % (m * dp):
        raise HppInputError(f"gbs={G} is not a multiple of batches x dp = {m} x {dp}: the batch does not add up",
                            source=source, field="batches", fix=f"use a global batch that is a multiple of {m * dp}")
    b = G // m // dp
    pipes = []
    for i in range(dp):
        stages = []
        for s, ((_, tp), lo, hi) in enumerate(zip(dp_tp, part, part[1:])):
            first = sum(groups[:s]) + i * tp
            ids = tuple(range(first, first + tp))
            types = {cluster.devices[d].device_type for d in ids}
            where = f"strategies[{s}]"
            if len(types) > 1:
                raise HppInputError(f"replica {i} of stage {s} mixes GPU types {sorted(types)}", source=source,
                                    field=where, fix="make every TP group one GPU type")
            gpu = types.pop()
            check_gpu(gpu, tp, profile, source=source, field=where)
            stages.append(Stage(lo, hi, gpu, tp, ids))
        pipes.append(Pipeline(tuple(stages), b, G // dp, default_schedule(m, S)))
    model = str(data.get("model", profile.model))
    if model != profile.model:
        raise HppInputError(f"the plan is for {model} but the profile is {profile.model}'s", source=source,
                            field="model", fix=f"pass --model {model}")
    return finish_plan(model, profile, G, pipes, cluster, source=source, fmt="metis")

