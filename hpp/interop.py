"""Import plans written by other planners (Sailor, Metis) as hpp plans with their cluster.

Both importers are pure: a parsed JSON object and a profile in, a validated
``(Plan, Cluster)`` out. Every defect of the foreign plan is an
:class:`~hpp.errors.HppInputError` naming the file (``source``), the field and the fix:
a layer partition that does not cover every layer, an empty stage, layers beyond
the model, a GPU type without a profile, a batch that does not add up.

Sailor (SOSP'25, eth-easl/sailor; the planner's output and the
``validation-calibration/*.json`` run files)::

    {"pipeline_list": [{"num_stages": S,
                        "layers_per_stage": [[0, 1, ...], ...],          # S lists of layer indices
                        "tmp_per_stage": [[[[gpu, gpus_per_node, zone]], tp], ...],  # S lists of dp entries
                        "dp": [dp, ...]}, ...],                          # S data-parallel degrees
     "mbs": b, "gbs": G}                                                  # gbs may come from --gbs

Each pipeline template is replicated ``dp`` times; Sailor splits the global batch
evenly over all replicas of all templates (``sailor/Planner/simulations/
runtime_simulator.py``: ``ceil(gbs / (mbs * dp * num_pipelines))`` micro-batches), and
Megatron needs ``G`` to be a multiple of ``b`` x replicas, so we require that too.
Cluster: every (replica, stage) runs on its own node of ``gpus_per_node`` devices of
``gpu`` and uses the first ``tp`` of them (as in the calibration runs: N nodes = dp x
pp, GH-96 nodes of 4, TP 4); links are Sailor's measured fits per pair of the GPU types the
plan names (:func:`hpp.profiles.network.default_network`: a version-2 cluster, so stage-to-stage
transfers and gradient rings are priced on the link of the nodes they join; one zone, the one
the bundled measurements cover).

Metis (ATC'24, SamsungLabs/Metis ``cost_het_cluster.py`` prints, per plan:
``node_sequence, device_groups, strategies (dp, tp), batches, layer_partition``). We
accept that description as JSON::

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.plan import Pipeline, Plan, Stage, default_schedule, plan_from_dict, read_plan_json
from hpp.profiles.cluster import Cluster, Node, cluster_to_dict
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.network import NETWORK_ZONE, default_intra_node_link, default_network
from hpp.validate import validate_plan

__all__ = ["FOREIGN_FORMATS", "SailorMeasurement", "detect_plan_format", "plan_from_sailor", "plan_from_metis",
           "sailor_measurement", "load_any_plan"]

FOREIGN_FORMATS = ("sailor", "metis")


def detect_plan_format(data: Any, *, source: str = "<plan>") -> str:
    """``"hpp"``, ``"sailor"`` or ``"metis"`` from the keys of a plan's JSON object.

    >>> detect_plan_format({"pipeline_list": []})
    'sailor'
    """
    if isinstance(data, Mapping):
        if data.get("format") == "hpp-plan":
            return "hpp"
        if "pipeline_list" in data:
            return "sailor"
        if data.get("format") == "metis-plan" or "layer_partition" in data:
            return "metis"
        if "format" in data:
            return "hpp"   # plan_from_dict names the bad format
    raise HppInputError("cannot tell the plan's format (no 'format', 'pipeline_list' or 'layer_partition')",
                        source=source, field="format", fix="pass --format hpp|sailor|metis")


# ----------------------------------------------------------------------------- helpers


def _int(v: Any, *, source: str, field: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise HppInputError(f"{v!r} is not an integer >= {minimum}", source=source, field=field,
                            fix=f"give an integer >= {minimum}")
    return v


def _list(v: Any, *, source: str, field: str, what: str) -> list:
    if not isinstance(v, list):
        raise HppInputError(f"expected a list of {what}, got {type(v).__name__}", source=source, field=field,
                            fix=f"give a list of {what}")
    return v


def _req(d: Mapping[str, Any], key: str, *, source: str, where: str, fix: str) -> Any:
    if not isinstance(d, Mapping) or key not in d:
        raise HppInputError(f"missing field {key!r}", source=source, field=f"{where}{key}", fix=fix)
    return d[key]


def _check_gpu(gpu: Any, tp: int, profile: ModelProfile, *, source: str, field: str,
               tp_field: str | None = None) -> str:
    """The GPU type must have a profile at TP ``tp`` and a known capacity (``tp_field`` names the TP)."""
    if not isinstance(gpu, str) or gpu not in profile.device_types:
        raise HppInputError(f"GPU type {gpu!r} has no profile for {profile.model}", source=source, field=field,
                            fix=f"use one of {list(profile.device_types)}")
    if gpu not in BUNDLED_DEVICE_TYPES:
        raise HppInputError(f"GPU type {gpu!r} has no known memory capacity", source=source, field=field,
                            fix=f"use one of {sorted(BUNDLED_DEVICE_TYPES)}")
    if tp not in profile.tp_degrees(gpu):
        raise HppInputError(f"{profile.model} on {gpu} is not profiled at TP {tp}", source=source,
                            field=tp_field or field, fix=f"use a TP degree in {list(profile.tp_degrees(gpu))}")
    return gpu


def _global_batch(data: Mapping[str, Any], key: str, gbs: int | None, *, source: str) -> int:
    if key in data:
        return _int(data[key], source=source, field=key)
    if gbs is None:
        raise HppInputError("the plan gives no global batch size", source=source, field=key,
                            fix="add it to the file or pass --gbs")
    return _int(gbs, source=source, field="--gbs")


def _cluster(name: str, nodes: Sequence[tuple[str, int]]) -> Cluster:
    """Nodes ``(gpu, devices)`` with Sailor's measured links per pair of GPU types (one zone, one device per
    flow; a version-2 cluster: each pair of nodes uses its types' link, issue 19)."""
    built = tuple(Node(t, n, default_intra_node_link(t, n)) for t, n in nodes)
    network, slowest = default_network(built)
    return Cluster(name, dict(BUNDLED_DEVICE_TYPES), built, slowest, network)


def _finish(model: str, profile: ModelProfile, gbs: int, pipes: list[Pipeline], cluster: Cluster,
            *, source: str, fmt: str) -> tuple[Plan, Cluster]:
    plan = Plan(model=model, num_layers=profile.num_layers, global_batch_size=gbs, pipelines=tuple(pipes),
                sequence_length=profile.sequence_length, profile_ref={"name": profile.model},
                cluster_ref=cluster_to_dict(cluster), predicted={"imported_from": fmt, "file": source})
    validate_plan(plan, cluster, profile, source=source)
    return plan, cluster


def _layer_list(layers: list[int]) -> str:
    """``layers 19-25`` / ``layer 25`` (runs of consecutive layers)."""
    runs: list[list[int]] = []
    for x in layers:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"layer{'s' if len(layers) > 1 else ''} {text}"


def _missing_layers(covered: set[int], L: int) -> str:
    """What a partition leaves out, e.g. ``layers 19-25 are missing (no stage holds them)``; '' if none."""
    gone = [x for x in range(L) if x not in covered]
    if not gone:
        return ""
    verb = "are" if len(gone) > 1 else "is"
    return f"{_layer_list(gone)} {verb} missing (no stage holds {'them' if len(gone) > 1 else 'it'})"


def _metis_coverage_defect(data: Any, L: int) -> str:
    """The layer coverage of a Metis plan's ``layer_partition`` in one phrase ('' when it covers [0, L) or
    cannot be read): missing layers, layers beyond the model."""
    part = data.get("layer_partition") if isinstance(data, Mapping) else None
    if not isinstance(part, list) or len(part) < 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                for x in part):
        return ""
    covered = {x for lo, hi in zip(part, part[1:]) for x in range(max(lo, 0), hi)}
    out = [_missing_layers(covered, L)]
    beyond = sorted(x for x in covered if x >= L)
    if beyond:
        out.append(f"layers beyond the model: {_layer_list(beyond).split(' ', 1)[1]}")
    return "; ".join(x for x in out if x)


def _contiguous(layers: Any, lo_expected: int, L: int, *, source: str, field: str) -> tuple[int, int]:
    """[lo, hi) of a stage's explicit layer list; refuses empty, unordered, skipping or out-of-model lists."""
    layers = _list(layers, source=source, field=field, what="layer indices")
    if not layers:
        raise HppInputError("empty stage: no layers", source=source, field=field,
                            fix="give every stage at least one layer")
    for x in layers:
        if isinstance(x, bool) or not isinstance(x, int):
            raise HppInputError(f"layer {x!r} is not an integer", source=source, field=field,
                                fix="list integer layer indices")
        if not 0 <= x < L:
            raise HppInputError(f"layer {x} is beyond the model (layers 0..{L - 1})", source=source, field=field,
                                fix=f"use layers in [0, {L})")
    if layers != list(range(layers[0], layers[0] + len(layers))):
        raise HppInputError(f"layers {layers} are not consecutive and ascending", source=source, field=field,
                            fix="give each stage a contiguous range of layers")
    if layers[0] != lo_expected:
        what = "skips" if layers[0] > lo_expected else "repeats"
        raise HppInputError(f"stage starts at layer {layers[0]} but the previous one stopped at {lo_expected}: "
                            f"the partition {what} layers", source=source, field=field,
                            fix=f"start this stage at layer {lo_expected}")
    return layers[0], layers[-1] + 1


# ----------------------------------------------------------------------------- Sailor


def plan_from_sailor(data: Mapping[str, Any], profile: ModelProfile, *, source: str = "<sailor plan>",
                     gbs: int | None = None) -> tuple[Plan, Cluster]:
    """Convert a Sailor plan (module docstring) to a validated hpp plan and its cluster.

    Parameters
    ----------
    data : Mapping
        The plan's JSON object (``pipeline_list``, ``mbs``, ``gbs``).
    profile : ModelProfile
        The model's profile (Sailor plans do not name their model).
    gbs : int, optional
        Global batch size when the file has none.

    Returns
    -------
    (Plan, Cluster)

    Raises
    ------
    HppInputError
        Any defect, naming ``source`` and the field (e.g. ``pipeline_list[0].layers_per_stage[1]``).
    """
    if not isinstance(data, Mapping):
        raise HppInputError("a Sailor plan must be a JSON object", source=source, fix="see hpp/interop.py")
    L = profile.num_layers
    plist = _list(_req(data, "pipeline_list", source=source, where="", fix="list the pipelines"),
                  source=source, field="pipeline_list", what="pipelines")
    if not plist:
        raise HppInputError("no pipelines", source=source, field="pipeline_list", fix="give at least one pipeline")
    b = _int(_req(data, "mbs", source=source, where="", fix="give the micro-batch size"), source=source,
             field="mbs")
    G = _global_batch(data, "gbs", gbs, source=source)
    zone = data.get("zone")

    # templates: per pipeline, its stages [(lo, hi)] and per replica the (gpu, gpus_per_node, tp) of each stage
    templates = []
    for k, pd in enumerate(plist):
        w = f"pipeline_list[{k}]."
        lps = _list(_req(pd, "layers_per_stage", source=source, where=w, fix="list each stage's layers"),
                    source=source, field=f"{w}layers_per_stage", what="stages")
        S = len(lps)
        if S == 0:
            raise HppInputError("pipeline has no stages", source=source, field=f"{w}layers_per_stage",
                                fix="give at least one stage")
        if "num_stages" in pd and pd["num_stages"] != S:
            raise HppInputError(f"num_stages={pd['num_stages']!r} but layers_per_stage has {S} stages",
                                source=source, field=f"{w}num_stages", fix=f"set it to {S}")
        bounds, lo = [], 0
        for s, layers in enumerate(lps):
            lo2, hi = _contiguous(layers, lo, L, source=source, field=f"{w}layers_per_stage[{s}]")
            bounds.append((lo2, hi))
            lo = hi
        if lo != L:
            raise HppInputError(f"the layer partition stops at layer {lo} but {profile.model} has {L} layers: "
                                f"{_missing_layers(set(range(lo)), L)}", source=source,
                                field=f"{w}layers_per_stage", fix=f"cover layers [0, {L}) exactly once")
        dps = _list(_req(pd, "dp", source=source, where=w, fix="give the dp degree of each stage"),
                    source=source, field=f"{w}dp", what="dp degrees")
        if len(dps) != S:
            raise HppInputError(f"{len(dps)} dp degrees for {S} stages", source=source, field=f"{w}dp",
                                fix="give one dp degree per stage")
        dp = _int(dps[0], source=source, field=f"{w}dp[0]")
        if any(x != dp for x in dps):
            raise HppInputError(f"dp degrees {dps} differ between stages; hpp pipelines are whole replicas",
                                source=source, field=f"{w}dp", fix="use one dp degree for all stages")
        tps = _list(_req(pd, "tmp_per_stage", source=source, where=w, fix="give each stage's GPU and TP per replica"),
                    source=source, field=f"{w}tmp_per_stage", what="stages")
        if len(tps) != S:
            raise HppInputError(f"{len(tps)} entries for {S} stages", source=source, field=f"{w}tmp_per_stage",
                                fix="give one entry per stage")
        replicas: list[list[tuple[str, int, int]]] = [[] for _ in range(dp)]
        for s, per_stage in enumerate(tps):
            f = f"{w}tmp_per_stage[{s}]"
            per_stage = _list(per_stage, source=source, field=f, what="replica configs")
            if len(per_stage) != dp:
                raise HppInputError(f"{len(per_stage)} replica configs but dp is {dp}", source=source, field=f,
                                    fix="give one [[gpu, gpus_per_node, zone]], tp] entry per replica")
            for j, cfg in enumerate(per_stage):
                fj = f"{f}[{j}]"
                ok = (isinstance(cfg, list) and len(cfg) == 2 and isinstance(cfg[0], list) and cfg[0]
                      and all(isinstance(vm, list) and len(vm) >= 2 for vm in cfg[0]))
                if not ok:
                    raise HppInputError(f"expected [[[gpu, gpus_per_node, zone], ...], tp], got {str(cfg)[:80]}",
                                        source=source, field=fj, fix="use Sailor's tmp_per_stage form")
                if len(cfg[0]) != 1:
                    raise HppInputError(f"the TP group spans {len(cfg[0])} nodes", source=source, field=fj,
                                        fix="hpp puts a stage's TP group on one node")
                gpu, per_node = cfg[0][0][0], cfg[0][0][1]
                vm_zone = cfg[0][0][2] if len(cfg[0][0]) > 2 else zone
                tp = _int(cfg[1], source=source, field=f"{fj}[1]")
                per_node = _int(per_node, source=source, field=f"{fj}[0][0][1]")
                _check_gpu(gpu, tp, profile, source=source, field=f"{fj}[0][0][0]", tp_field=f"{fj}[1]")
                if tp > per_node:
                    raise HppInputError(f"TP {tp} on nodes of {per_node} GPUs", source=source, field=f"{fj}[1]",
                                        fix="use a TP degree <= the GPUs per node")
                if vm_zone not in (None, NETWORK_ZONE) or (zone is not None and vm_zone != zone):
                    raise HppInputError(f"zone {vm_zone!r}: hpp has measured links for one zone only "
                                        f"({NETWORK_ZONE})", source=source, field=f"{fj}[0][0][2]",
                                        fix=f"use zone {NETWORK_ZONE!r}")
                replicas[j].append((gpu, per_node, tp))
        templates.append((bounds, replicas))

    R = sum(len(reps) for _, reps in templates)
    if G % (b * R):
        raise HppInputError(f"gbs={G} is not a multiple of mbs x replicas = {b} x {R}: the batch does not add up",
                            source=source, field="gbs",
                            fix=f"use a global batch that is a multiple of {b * R}, or change mbs or dp")
    n = G // R
    nodes: list[tuple[str, int]] = []
    pipes: list[Pipeline] = []
    for bounds, replicas in templates:
        for reps in replicas:
            stages = []
            for (lo, hi), (gpu, per_node, tp) in zip(bounds, reps):
                first = sum(c for _, c in nodes)
                nodes.append((gpu, per_node))
                stages.append(Stage(lo, hi, gpu, tp, tuple(range(first, first + tp))))
            pipes.append(Pipeline(tuple(stages), b, n, default_schedule(-(-n // b), len(stages))))
    cluster = _cluster(Path(source).stem, nodes)
    return _finish(profile.model, profile, G, pipes, cluster, source=source, fmt="sailor")


@dataclass(frozen=True, slots=True)
class SailorMeasurement:
    """What a Sailor run file (``validation-calibration/*.json``) measured.

    Attributes
    ----------
    iteration_time_s : float
        ``real``: measured seconds per training iteration.
    peak_memory_bytes : int
        ``max_mem``: peak memory of the fullest GPU [bytes].
    grad_sync_s : float
        ``red_grads``: measured gradient-reduction seconds (includes waiting for the slowest replica).
    num_nodes : int
        ``N``: nodes of the run.
    """

    iteration_time_s: float
    peak_memory_bytes: int
    grad_sync_s: float
    num_nodes: int


def sailor_measurement(data: Mapping[str, Any], *, source: str = "<sailor run>") -> SailorMeasurement:
    """The measured figures of a Sailor run file.

    Raises
    ------
    HppInputError
        A missing or non-positive ``real`` or ``max_mem``.
    """
    def num(key: str) -> float:
        v = data.get(key) if isinstance(data, Mapping) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise HppInputError(f"{key}={v!r} is not a positive measurement", source=source, field=key,
                                fix="give the measured value (seconds or bytes)")
        return float(v)

    return SailorMeasurement(num("real"), int(num("max_mem")), float(data.get("red_grads", 0.0)),
                             int(data.get("N", 0)))


# ----------------------------------------------------------------------------- Metis


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
        raise HppInputError("a Metis plan must be a JSON object", source=source, fix="see hpp/interop.py")
    L = profile.num_layers
    G = _global_batch(data, "gbs", gbs, source=source)
    seq = _list(_req(data, "node_sequence", source=source, where="", fix="list the device types in rank order"),
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
    per_node = {t: _int(per_node_raw.get(t, BUNDLED_DEVICE_TYPES[t].gpus_per_node), source=source,
                        field=f"gpus_per_node.{t}") for t in seq}
    groups = [_int(x, source=source, field=f"device_groups[{i}]")
              for i, x in enumerate(_list(_req(data, "device_groups", source=source, where="",
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
        num_nodes = {t: _int(nn.get(t, 0), source=source, field=f"num_nodes.{t}", minimum=0) for t in seq}
    elif len(seq) == 1:
        num_nodes = {seq[0]: -(-total // per_node[seq[0]])}
    else:
        raise HppInputError("several device types but no node counts", source=source, field="num_nodes",
                            fix="give {type: nodes} for every type of node_sequence")
    nodes = [(t, per_node[t]) for t in seq for _ in range(num_nodes[t])]
    cluster = _cluster(Path(source).stem, nodes)
    if total != cluster.num_devices:
        raise HppInputError(f"device_groups add up to {total} devices but the cluster has {cluster.num_devices}",
                            source=source, field="device_groups", fix="give every device to exactly one stage")

    strategies = _list(_req(data, "strategies", source=source, where="", fix="give (dp, tp) per stage"),
                       source=source, field="strategies", what="(dp, tp) pairs")
    if len(strategies) != S:
        raise HppInputError(f"{len(strategies)} strategies for {S} device groups", source=source,
                            field="strategies", fix="give one (dp, tp) pair per stage")
    dp_tp = []
    for s, st in enumerate(strategies):
        if not (isinstance(st, list) and len(st) == 2):
            raise HppInputError(f"expected [dp, tp], got {st!r}", source=source, field=f"strategies[{s}]",
                                fix="give a pair [dp, tp]")
        dp = _int(st[0], source=source, field=f"strategies[{s}][0]")
        tp = _int(st[1], source=source, field=f"strategies[{s}][1]")
        if dp * tp != groups[s]:
            raise HppInputError(f"dp x tp = {dp} x {tp} = {dp * tp} but the stage has {groups[s]} devices",
                                source=source, field=f"strategies[{s}]", fix="make dp x tp equal device_groups[s]")
        dp_tp.append((dp, tp))
    dp = dp_tp[0][0]
    if any(d != dp for d, _ in dp_tp):
        raise HppInputError(f"dp degrees {[d for d, _ in dp_tp]} differ between stages; hpp pipelines are whole "
                            "replicas", source=source, field="strategies", fix="use one dp degree for all stages")

    part = _list(_req(data, "layer_partition", source=source, where="", fix="give the stage boundaries"),
                 source=source, field="layer_partition", what="stage boundaries")
    if len(part) != S + 1:
        raise HppInputError(f"{len(part)} boundaries for {S} stages", source=source, field="layer_partition",
                            fix=f"give {S + 1} boundaries [0, ..., {L}]")
    for i, x in enumerate(part):
        _int(x, source=source, field=f"layer_partition[{i}]", minimum=0)
    if part[0] != 0 or part[-1] != L:
        raise HppInputError(f"the partition {part} covers [{part[0]}, {part[-1]}) but {profile.model} has layers "
                            f"[0, {L}): {_metis_coverage_defect(data, L)}", source=source,
                            field="layer_partition", fix=f"start at 0 and end at {L}")
    for s in range(S):
        if part[s] >= part[s + 1]:
            raise HppInputError(f"empty stage {s}: layers [{part[s]}, {part[s + 1]})", source=source,
                                field="layer_partition", fix="make the boundaries strictly increasing")

    m = _int(_req(data, "batches", source=source, where="", fix="give the number of micro-batches"),
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
            _check_gpu(gpu, tp, profile, source=source, field=where)
            stages.append(Stage(lo, hi, gpu, tp, ids))
        pipes.append(Pipeline(tuple(stages), b, G // dp, default_schedule(m, S)))
    model = str(data.get("model", profile.model))
    if model != profile.model:
        raise HppInputError(f"the plan is for {model} but the profile is {profile.model}'s", source=source,
                            field="model", fix=f"pass --model {model}")
    return _finish(model, profile, G, pipes, cluster, source=source, fmt="metis")


# ----------------------------------------------------------------------------- any file


def load_any_plan(path: str | Path, *, fmt: str | None = None, profile: ModelProfile | None = None,
                  gbs: int | None = None) -> tuple[Plan, Cluster, ModelProfile]:
    """Read an hpp, Sailor or Metis plan file (``fmt`` or detected), resolve and validate it.

    Parameters
    ----------
    fmt : {"hpp", "sailor", "metis"}, optional
        Detected from the keys when None.
    profile : ModelProfile, optional
        Required for Sailor plans (they name no model) and for Metis plans without ``model``.
    gbs : int, optional
        Global batch size for foreign plans that carry none.

    Raises
    ------
    HppInputError
        Naming the file and the field.
    """
    from hpp.resolve import load_plan_inputs

    path = Path(path)
    src = str(path)
    data = read_plan_json(path)
    fmt = fmt or detect_plan_format(data, source=src)
    if fmt == "hpp":
        plan_from_dict(data, source=src)  # format errors first
        return load_plan_inputs(path, profile=profile)
    if fmt not in FOREIGN_FORMATS:
        raise HppInputError(f"unknown plan format {fmt!r}", source=src, field="--format",
                            fix="use hpp, sailor or metis")
    if profile is None:
        name = data.get("model") if isinstance(data, Mapping) else None
        if not name:
            raise HppInputError(f"a {fmt} plan does not name its model", source=src, field="--model",
                                fix="pass --model NAME (e.g. OPT-350)")
        from hpp.profiles.bundled import load_bundled_profile
        try:
            profile = load_bundled_profile(str(name))
        except HppInputError as exc:
            raise HppInputError(exc.message, source=src, field="model", fix=exc.fix) from None
    convert = plan_from_sailor if fmt == "sailor" else plan_from_metis
    plan, cluster = convert(data, profile, source=src, gbs=gbs)
    return plan, cluster, profile
