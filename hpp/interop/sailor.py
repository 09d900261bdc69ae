"""Import a Sailor plan (SOSP'25, eth-easl/sailor) as an hpp plan with its cluster; read a Sailor run file.

The planner's output and the ``validation-calibration/*.json`` run files::

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
"""

from __future__ import annotations

import logging

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.interop.common import (check_gpu, finish_plan, foreign_cluster, global_batch, int_field, list_field,
                                missing_layers, required)
from hpp.plan_data import Pipeline, Plan, Stage, default_schedule
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.network import NETWORK_ZONE

__all__ = ["SailorMeasurement", "plan_from_sailor", "sailor_measurement", "SUSPECT_SYNC_SHARE"]

log = logging.getLogger(__name__)

#: A run's ``red_grads`` at or above this share of its ``real`` iteration time is flagged (see
#: :class:`SailorMeasurement`).
SUSPECT_SYNC_SHARE = 0.5


def _contiguous(layers: Any, lo_expected: int, L: int, *, source: str, field: str) -> tuple[int, int]:
    """[lo, hi) of a stage's explicit layer list; refuses empty, unordered, skipping or out-of-model lists."""
    layers = list_field(layers, source=source, field=field, what="layer indices")
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
        raise HppInputError("a Sailor plan must be a JSON object", source=source, fix="see hpp/interop/sailor.py")
    L = profile.num_layers
    plist = list_field(required(data, "pipeline_list", source=source, where="", fix="list the pipelines"),
                       source=source, field="pipeline_list", what="pipelines")
    if not plist:
        raise HppInputError("no pipelines", source=source, field="pipeline_list", fix="give at least one pipeline")
    b = int_field(required(data, "mbs", source=source, where="", fix="give the micro-batch size"), source=source,
                  field="mbs")
    G = global_batch(data, "gbs", gbs, source=source)
    zone = data.get("zone")

    # templates: per pipeline, its stages [(lo, hi)] and per replica the (gpu, gpus_per_node, tp) of each stage
    templates = []
    for k, pd in enumerate(plist):
        w = f"pipeline_list[{k}]."
        lps = list_field(required(pd, "layers_per_stage", source=source, where=w, fix="list each stage's layers"),
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
                                f"{missing_layers(set(range(lo)), L)}", source=source,
                                field=f"{w}layers_per_stage", fix=f"cover layers [0, {L}) exactly once")
        dps = list_field(required(pd, "dp", source=source, where=w, fix="give the dp degree of each stage"),
                         source=source, field=f"{w}dp", what="dp degrees")
        if len(dps) != S:
            raise HppInputError(f"{len(dps)} dp degrees for {S} stages", source=source, field=f"{w}dp",
                                fix="give one dp degree per stage")
        dp = int_field(dps[0], source=source, field=f"{w}dp[0]")
        if any(x != dp for x in dps):
            raise HppInputError(f"dp degrees {dps} differ between stages; hpp pipelines are whole replicas",
                                source=source, field=f"{w}dp", fix="use one dp degree for all stages")
        tps = list_field(required(pd, "tmp_per_stage", source=source, where=w,
                                  fix="give each stage's GPU and TP per replica"),
                         source=source, field=f"{w}tmp_per_stage", what="stages")
        if len(tps) != S:
            raise HppInputError(f"{len(tps)} entries for {S} stages", source=source, field=f"{w}tmp_per_stage",
                                fix="give one entry per stage")
        replicas: list[list[tuple[str, int, int]]] = [[] for _ in range(dp)]
        for s, per_stage in enumerate(tps):
            f = f"{w}tmp_per_stage[{s}]"
            per_stage = list_field(per_stage, source=source, field=f, what="replica configs")
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
                tp = int_field(cfg[1], source=source, field=f"{fj}[1]")
                per_node = int_field(per_node, source=source, field=f"{fj}[0][0][1]")
                check_gpu(gpu, tp, profile, source=source, field=f"{fj}[0][0][0]", tp_field=f"{fj}[1]")
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
    cluster = foreign_cluster(Path(source).stem, nodes)
    return finish_plan(profile.model, profile, G, pipes, cluster, source=source, fmt="sailor")


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
        ``red_grads``: measured gradient-reduction seconds (includes waiting for the slowest replica). No public
        code produces this field; check :attr:`grad_sync_note` before using it.
    num_nodes : int
        ``N``: nodes of the run.
    grad_sync_note : str
        Why ``red_grads`` is not a gradient-sync time ("" when nothing is wrong with it): a value of at least
        :data:`SUSPECT_SYNC_SHARE` of ``real`` would leave the run less than half its iteration for compute,
        pipeline and optimizer, while the other runs' ``red_grads`` are 0.3-11 % of theirs; the artifact's
        N4_D4 run holds 1.06094 s against a real of 1.23516 s, a copy of an older iteration time.
    """

    iteration_time_s: float
    peak_memory_bytes: int
    grad_sync_s: float
    num_nodes: int
    grad_sync_note: str = ""

    @property
    def grad_sync_usable(self) -> bool:
        """True when ``red_grads`` passed the loader's check (:attr:`grad_sync_note` is empty)."""
        return not self.grad_sync_note


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

    real = num("real")
    sync = float(data.get("red_grads", 0.0))
    note = ""
    if sync >= SUSPECT_SYNC_SHARE * real:
        note = (f"red_grads {sync:g} s is {sync / real:.0%} of the measured iteration ({real:g} s): not a "
                "gradient-sync time (a copy of an iteration time?); not used")
        log.warning("%s: %s", source, note)
    return SailorMeasurement(real, int(num("max_mem")), sync, int(data.get("N", 0)), note)

