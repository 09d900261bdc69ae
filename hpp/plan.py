"""The HPP plan: frozen, solver-independent data; the only input of :mod:`hpp.runtime`.

A plan is a tuple of pipelines. Pipeline ``p`` is an ordered tuple of stages that
covers layers ``[0, L)`` exactly once; stage ``s`` holds ``[layer_start,
layer_stop)`` on ``tp_degree`` devices of one type on one node. Pipeline ``p``
processes ``num_samples`` samples of the global batch in ``num_micro_batches =
ceil(num_samples / micro_batch_size)`` micro-batches (the last one may be
partial); the samples of all pipelines add up to ``global_batch_size``.

JSON form (``format: "hpp-plan"``, version 1)::

    {"format": "hpp-plan", "version": 1, "model": "OPT-350", "num_layers": 26,
     "global_batch_size": 1024, "sequence_length": 2048,
     "profile": {"name": "OPT-350"} | {"path": "profile.json"} | {"embedded": {...}},
     "cluster": {... hpp-cluster object ...} | {"path": "cluster.json"},
     "pipelines": [{"micro_batch_size": 2, "num_micro_batches": 40, "num_samples": 80,
                    "schedule": "1F1B",
                    "stages": [{"layers": [0, 13], "device_type": "A100-40", "tp_degree": 1,
                                "device_ids": [0], "recompute": "none"}, ...]}, ...],
     "predicted": {...} (optional, informational)}

``schedule`` is ``"1F1B"``, or ``"GPipe"`` where a pipeline has fewer
micro-batches than stages (torch's Schedule1F1B refuses that case).
``recompute`` is ``"none"``, ``"full"`` or ``"selective"`` (activation
recomputation of the stage's layers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.fileio import read_json

__all__ = ["Stage", "Pipeline", "Plan", "RECOMPUTE_MODES", "SCHEDULES", "PLAN_FORMAT", "PLAN_VERSION",
           "plan_from_dict", "plan_to_dict", "read_plan_json", "write_plan_json", "default_schedule"]

PLAN_FORMAT = "hpp-plan"
PLAN_VERSION = 1
RECOMPUTE_MODES = ("none", "full", "selective")
SCHEDULES = ("1F1B", "GPipe")


@dataclass(frozen=True, slots=True)
class Stage:
    """Layers ``[layer_start, layer_stop)`` on ``tp_degree`` devices of one type.

    Attributes
    ----------
    layer_start, layer_stop : int
        Half-open layer range; ``layer_start < layer_stop``.
    device_type : str
    tp_degree : int
        Tensor-parallel degree t; ``len(device_ids) == t``.
    device_ids : tuple[int, ...]
        Global device ids (ranks in the cluster), all on one node.
    recompute : str
        Activation recomputation mode, one of :data:`RECOMPUTE_MODES`.
    """

    layer_start: int
    layer_stop: int
    device_type: str
    tp_degree: int
    device_ids: tuple[int, ...]
    recompute: str = "none"

    @property
    def num_layers(self) -> int:
        return self.layer_stop - self.layer_start


def default_schedule(num_micro_batches: int, num_stages: int) -> str:
    """``"1F1B"``, or ``"GPipe"`` when ``num_micro_batches < num_stages`` (Schedule1F1B refuses that)."""
    return "GPipe" if num_micro_batches < num_stages else "1F1B"


@dataclass(frozen=True, slots=True)
class Pipeline:
    """One data-parallel replica: stages in order, its micro-batch size and its share of the batch.

    Attributes
    ----------
    stages : tuple[Stage, ...]
    micro_batch_size : int
        b_p, samples per micro-batch.
    num_samples : int
        n_p, samples of the global batch this pipeline processes (>= 0).
    schedule : str
        ``"1F1B"`` or ``"GPipe"``.
    """

    stages: tuple[Stage, ...]
    micro_batch_size: int
    num_samples: int
    schedule: str = "1F1B"

    @property
    def num_micro_batches(self) -> int:
        """m_p = ceil(n_p / b_p); the last micro-batch may be partial."""
        return -(-self.num_samples // self.micro_batch_size)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def boundaries(self) -> tuple[int, ...]:
        """Stage boundaries ``(0, hi_0, hi_1, ..., L)``."""
        return (self.stages[0].layer_start,) + tuple(s.layer_stop for s in self.stages)

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d for s in self.stages for d in s.device_ids)


@dataclass(frozen=True)
class Plan:
    """A complete HPP plan. Validate with :func:`hpp.validate.validate_plan`.

    Attributes
    ----------
    model : str
    num_layers : int
        L.
    global_batch_size : int
        G = sum of the pipelines' ``num_samples``.
    pipelines : tuple[Pipeline, ...]
    sequence_length : int
        Tokens per sample.
    profile_ref : Mapping
        ``{"name": bundled}`` or ``{"path": file}`` or ``{"embedded": native profile}``.
    cluster_ref : Mapping
        An embedded hpp-cluster object, or ``{"path": file}``.
    predicted : Mapping
        Informational predicted figures written by the planner (not trusted on read).
    """

    model: str
    num_layers: int
    global_batch_size: int
    pipelines: tuple[Pipeline, ...]
    sequence_length: int = 1
    profile_ref: Mapping[str, Any] = field(default_factory=dict)
    cluster_ref: Mapping[str, Any] = field(default_factory=dict)
    predicted: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_pipelines(self) -> int:
        return len(self.pipelines)

    @property
    def device_ids(self) -> tuple[int, ...]:
        """All device ids, pipeline by pipeline, stage by stage (the runtime's rank order)."""
        return tuple(d for p in self.pipelines for d in p.device_ids)

    @property
    def num_devices(self) -> int:
        return len(self.device_ids)


# ----------------------------------------------------------------------------- JSON


def _req(d: Mapping[str, Any], key: str, *, source: str, where: str, fix: str) -> Any:
    if not isinstance(d, Mapping) or key not in d:
        raise HppInputError(f"missing field {key!r}", source=source, field=f"{where}{key}", fix=fix)
    return d[key]


def _int(v: Any, *, source: str, field_name: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise HppInputError(f"{v!r} is not an integer >= {minimum}", source=source, field=field_name,
                            fix=f"give an integer >= {minimum}")
    return v


def _stage_from_dict(d: Mapping[str, Any], *, source: str, where: str) -> Stage:
    layers = _req(d, "layers", source=source, where=where, fix="give the stage's layer range as [start, stop)")
    if (not isinstance(layers, list) or len(layers) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)):
        raise HppInputError(f"layers={layers!r}", source=source, field=f"{where}layers",
                            fix="give [start, stop) as two integers")
    dtype = _req(d, "device_type", source=source, where=where, fix="name the stage's device type")
    tp = _int(d.get("tp_degree", 1), source=source, field_name=f"{where}tp_degree", minimum=1)
    ids = _req(d, "device_ids", source=source, where=where, fix="list the stage's device ids")
    if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
        raise HppInputError(f"device_ids={ids!r}", source=source, field=f"{where}device_ids",
                            fix="give a list of integer device ids")
    rec = d.get("recompute", "none")
    if rec not in RECOMPUTE_MODES:
        raise HppInputError(f"recompute={rec!r}", source=source, field=f"{where}recompute",
                            fix=f"use one of {list(RECOMPUTE_MODES)}")
    return Stage(layers[0], layers[1], str(dtype), tp, tuple(ids), rec)


def plan_from_dict(d: Mapping[str, Any], *, source: str = "<plan>") -> Plan:
    """Parse the JSON object of a plan (structure only; invariants: :func:`hpp.validate.validate_plan`).

    Raises
    ------
    HppInputError
        Wrong format or version, missing or mistyped fields, inconsistent
        ``num_micro_batches`` (naming the file and the field).
    """
    if not isinstance(d, Mapping):
        raise HppInputError("a plan must be a JSON object", source=source, fix="see hpp/plan.py")
    if d.get("format") != PLAN_FORMAT:
        raise HppInputError(f"format is {d.get('format')!r}, expected {PLAN_FORMAT!r}", source=source,
                            field="format", fix="for Sailor or Metis plans pass --format sailor|metis")
    if d.get("version") != PLAN_VERSION:
        raise HppInputError(f"version {d.get('version')!r} is not supported", source=source, field="version",
                            fix=f"use version {PLAN_VERSION}")
    pipes_raw = _req(d, "pipelines", source=source, where="", fix="list the pipelines")
    if not isinstance(pipes_raw, list) or not pipes_raw:
        raise HppInputError("no pipelines", source=source, field="pipelines", fix="give at least one pipeline")
    pipelines = []
    for p, pd in enumerate(pipes_raw):
        where = f"pipelines[{p}]."
        b = _int(_req(pd, "micro_batch_size", source=source, where=where, fix="give the micro-batch size"),
                 source=source, field_name=f"{where}micro_batch_size", minimum=1)
        if "num_samples" in pd:
            n = _int(pd["num_samples"], source=source, field_name=f"{where}num_samples", minimum=0)
        else:
            m = _int(_req(pd, "num_micro_batches", source=source, where=where,
                          fix="give num_samples or num_micro_batches"),
                     source=source, field_name=f"{where}num_micro_batches", minimum=0)
            n = m * b
        stages_raw = _req(pd, "stages", source=source, where=where, fix="list the stages")
        if not isinstance(stages_raw, list) or not stages_raw:
            raise HppInputError("pipeline has no stages", source=source, field=f"{where}stages",
                                fix="give at least one stage")
        stages = tuple(_stage_from_dict(sd, source=source, where=f"{where}stages[{s}].")
                       for s, sd in enumerate(stages_raw))
        m = -(-n // b)
        if "num_micro_batches" in pd and pd["num_micro_batches"] != m:
            raise HppInputError(f"num_micro_batches={pd['num_micro_batches']!r} but num_samples={n} at "
                                f"micro_batch_size={b} needs ceil({n}/{b})={m}", source=source,
                                field=f"{where}num_micro_batches", fix=f"set it to {m} or fix num_samples")
        schedule = pd.get("schedule", default_schedule(m, len(stages)))
        if schedule not in SCHEDULES:
            raise HppInputError(f"schedule={schedule!r}", source=source, field=f"{where}schedule",
                                fix=f"use one of {list(SCHEDULES)}")
        pipelines.append(Pipeline(stages, b, n, schedule))
    num_layers = _int(_req(d, "num_layers", source=source, where="", fix="give the model's layer count"),
                      source=source, field_name="num_layers", minimum=1)
    gbs = _int(_req(d, "global_batch_size", source=source, where="", fix="give the global batch size"),
               source=source, field_name="global_batch_size", minimum=1)
    return Plan(model=str(d.get("model", "")), num_layers=num_layers, global_batch_size=gbs,
                pipelines=tuple(pipelines), sequence_length=int(d.get("sequence_length", 1)),
                profile_ref=dict(d.get("profile", {})), cluster_ref=dict(d.get("cluster", {})),
                predicted=dict(d.get("predicted", {})))


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """JSON object of ``plan`` (inverse of :func:`plan_from_dict`)."""
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "model": plan.model,
        "num_layers": plan.num_layers,
        "global_batch_size": plan.global_batch_size,
        "sequence_length": plan.sequence_length,
        "profile": dict(plan.profile_ref),
        "cluster": dict(plan.cluster_ref),
        "pipelines": [
            {"micro_batch_size": p.micro_batch_size, "num_micro_batches": p.num_micro_batches,
             "num_samples": p.num_samples, "schedule": p.schedule,
             "stages": [{"layers": [s.layer_start, s.layer_stop], "device_type": s.device_type,
                         "tp_degree": s.tp_degree, "device_ids": list(s.device_ids), "recompute": s.recompute}
                        for s in p.stages]}
            for p in plan.pipelines],
        "predicted": dict(plan.predicted),
    }


def read_plan_json(path: str | Path) -> dict[str, Any]:
    """Read a JSON file into a dict, with a clear error for a missing file or bad JSON.

    Raises
    ------
    HppInputError
    """
    return read_json(path, what="plan file")


def write_plan_json(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` as JSON; via a temporary file and a rename, so never half-written."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(plan_to_dict(plan), indent=1) + "\n")
    tmp.replace(path)
