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
recomputation of the stage's layers). Any other key is refused (the references' keys: :mod:`hpp.resolve`).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.fileio import check_header, check_keys, read_json, write_atomic

__all__ = ["Stage", "Pipeline", "Plan", "RECOMPUTE_MODES", "SCHEDULES", "PLAN_FORMAT", "PLAN_VERSION",
           "plan_from_dict", "plan_to_dict", "read_plan_json", "write_plan_json", "default_schedule",
           "make_pipeline"]

PLAN_FORMAT = "hpp-plan"
PLAN_VERSION = 1
RECOMPUTE_MODES = ("none", "full", "selective")
SCHEDULES = ("1F1B", "GPipe")

_TOP_KEYS = ("format", "version", "model", "num_layers", "global_batch_size", "sequence_length", "profile", "cluster",
             "pipelines", "predicted")
_PIPELINE_KEYS = ("micro_batch_size", "num_micro_batches", "num_samples", "schedule", "stages")
_STAGE_KEYS = ("layers", "device_type", "tp_degree", "device_ids", "recompute")


def _is_int(v: Any, minimum: int) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and v >= minimum


def _need_int(v: Any, field_name: str, minimum: int, source: str | None = None) -> int:
    if not _is_int(v, minimum):
        raise HppInputError(f"{v!r} is not an integer >= {minimum}", source=source, field=field_name,
                            fix=f"give an integer >= {minimum}")
    return v


@contextmanager
def _within(prefix: str, source: str | None = None) -> Iterator[None]:
    """Re-raise a construction check's :class:`HppInputError` with ``prefix`` before its field (and ``source``)."""
    try:
        yield
    except HppInputError as exc:
        raise HppInputError(exc.message, source=exc.source or source,
                            field=f"{prefix}{exc.field}" if exc.field else prefix.rstrip(".") or None,
                            fix=exc.fix) from None


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

    def __post_init__(self) -> None:
        """Check what needs no other input: a non-empty layer range, one device id per TP rank, the mode.
        Raises HppInputError naming the field (``layers``, ``tp_degree``, ``device_ids``, ``recompute``)."""
        if not (_is_int(self.layer_start, 0) and _is_int(self.layer_stop, 0)):
            raise HppInputError(f"layers=[{self.layer_start!r}, {self.layer_stop!r})", field="layers",
                                fix="give [start, stop) as two integers >= 0")
        if self.layer_start >= self.layer_stop:
            raise HppInputError(f"empty stage: layers [{self.layer_start}, {self.layer_stop})", field="layers",
                                fix="give every stage at least one layer, start < stop")
        _need_int(self.tp_degree, "tp_degree", 1)
        if not isinstance(self.device_ids, tuple) or not all(_is_int(d, 0) for d in self.device_ids):
            raise HppInputError(f"device_ids={self.device_ids!r}", field="device_ids",
                                fix="give a tuple of integer device ids >= 0")
        if self.tp_degree != len(self.device_ids):
            raise HppInputError(f"tp_degree={self.tp_degree} but {len(self.device_ids)} device ids",
                                field="device_ids", fix="give exactly tp_degree device ids")
        if self.recompute not in RECOMPUTE_MODES:
            raise HppInputError(f"recompute={self.recompute!r}", field="recompute",
                                fix=f"use one of {list(RECOMPUTE_MODES)}")

    @property
    def num_layers(self) -> int:
        return self.layer_stop - self.layer_start


def default_schedule(num_micro_batches: int, num_stages: int) -> str:
    """``"1F1B"``, or ``"GPipe"`` when ``num_micro_batches < num_stages`` (Schedule1F1B refuses that)."""
    return "GPipe" if num_micro_batches < num_stages else "1F1B"


def make_pipeline(boundaries: Sequence[int], device_types: Sequence[str], tp_degrees: Sequence[int],
                  device_ids: Sequence[tuple[int, ...]], recompute: Sequence[bool | str], micro_batch_size: int,
                  num_samples: int) -> "Pipeline":
    """The pipeline whose stage ``i`` holds layers ``[boundaries[i], boundaries[i + 1])`` on ``device_ids[i]``.

    ``recompute[i]``: a mode of :data:`RECOMPUTE_MODES`, or a bool (True: ``"full"``, False: ``"none"``).
    The schedule is :func:`default_schedule`'s. Every planner and baseline builds its stages here.

    Raises
    ------
    HppInputError
        The construction checks of :class:`Stage` and :class:`Pipeline`.

    Examples
    --------
    >>> p = make_pipeline((0, 2, 3), ("A", "B"), (1, 2), ((0,), (4, 5)), (False, True), 2, 2)
    >>> [(s.layer_start, s.layer_stop, s.recompute) for s in p.stages], p.schedule
    ([(0, 2, 'none'), (2, 3, 'full')], 'GPipe')
    """
    stages = tuple(Stage(boundaries[i], boundaries[i + 1], device_types[i], tp_degrees[i], device_ids[i],
                         r if isinstance(r, str) else ("full" if r else "none"))
                   for i, r in enumerate(recompute))
    return Pipeline(stages, micro_batch_size, num_samples,
                    default_schedule(-(-num_samples // micro_batch_size), len(stages)))


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

    def __post_init__(self) -> None:
        """Check what needs no other input: stages present and contiguous, sizes, the schedule. Raises
        HppInputError naming the field (``stages[s].layers``, ``micro_batch_size``, ``schedule``, ...)."""
        if not isinstance(self.stages, tuple) or not self.stages:
            raise HppInputError("pipeline has no stages", field="stages", fix="give a tuple of at least one stage")
        _need_int(self.micro_batch_size, "micro_batch_size", 1)
        _need_int(self.num_samples, "num_samples", 0)
        for s in range(1, len(self.stages)):
            start, expect = self.stages[s].layer_start, self.stages[s - 1].layer_stop
            if start != expect:
                what = "skips" if start > expect else "repeats"
                raise HppInputError(f"stage starts at layer {start} but the previous one stopped at {expect}: "
                                    f"the pipeline {what} layers", field=f"stages[{s}].layers",
                                    fix=f"start this stage at layer {expect}")
        if self.schedule not in SCHEDULES:
            raise HppInputError(f"schedule={self.schedule!r}", field="schedule", fix=f"use one of {list(SCHEDULES)}")
        m = self.num_micro_batches
        if self.schedule == "1F1B" and 0 < m < len(self.stages):
            raise HppInputError(f"1F1B needs at least as many micro-batches as stages ({m} < {len(self.stages)})",
                                field="schedule", fix="use schedule 'GPipe' or more micro-batches")

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

    def __post_init__(self) -> None:
        """Check what needs no cluster or profile: every pipeline covers layers ``[0, num_layers)``, no device
        is used twice, the samples add up to ``global_batch_size``. Raises HppInputError naming the field."""
        _need_int(self.num_layers, "num_layers", 1)
        _need_int(self.global_batch_size, "global_batch_size", 1)
        if not isinstance(self.pipelines, tuple) or not self.pipelines:
            raise HppInputError("no pipelines", field="pipelines", fix="give a tuple of at least one pipeline")
        used: dict[int, str] = {}
        for p, pipe in enumerate(self.pipelines):
            if not isinstance(pipe, Pipeline):
                raise HppInputError(f"{type(pipe).__name__} is not a Pipeline", field=f"pipelines[{p}]",
                                    fix="give hpp.plan_data.Pipeline objects")
            first, last = pipe.stages[0].layer_start, pipe.stages[-1].layer_stop
            if first != 0:
                raise HppInputError(f"the first stage starts at layer {first}: the pipeline skips layers [0, {first})",
                                    field=f"pipelines[{p}].stages[0].layers", fix="start the first stage at layer 0")
            if last != self.num_layers:
                raise HppInputError(f"the pipeline stops at layer {last} but the model has {self.num_layers} layers",
                                    field=f"pipelines[{p}].stages", fix=f"cover layers [0, {self.num_layers}) "
                                                                        f"exactly once")
            for s, st in enumerate(pipe.stages):
                where = f"pipelines[{p}].stages[{s}]"
                for d in st.device_ids:
                    if d in used:
                        raise HppInputError(f"device {d} is used twice (also by {used[d]})",
                                            field=f"{where}.device_ids", fix="bind every device to at most one stage")
                    used[d] = where
        total = sum(pipe.num_samples for pipe in self.pipelines)
        if total != self.global_batch_size:
            raise HppInputError(f"the pipelines' samples add up to {total}, not the global batch size "
                                f"{self.global_batch_size}", field="pipelines[*].num_samples",
                                fix="make the samples sum to global_batch_size")

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


def _stage_from_dict(d: Mapping[str, Any], *, source: str, where: str) -> Stage:
    layers = _req(d, "layers", source=source, where=where, fix="give the stage's layer range as [start, stop)")
    check_keys(d, _STAGE_KEYS, source=source, where=where)
    if (not isinstance(layers, list) or len(layers) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)):
        raise HppInputError(f"layers={layers!r}", source=source, field=f"{where}layers",
                            fix="give [start, stop) as two integers")
    dtype = _req(d, "device_type", source=source, where=where, fix="name the stage's device type")
    ids = _req(d, "device_ids", source=source, where=where, fix="list the stage's device ids")
    if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
        raise HppInputError(f"device_ids={ids!r}", source=source, field=f"{where}device_ids",
                            fix="give a list of integer device ids")
    with _within(where, source):      # the rest: Stage's own checks
        return Stage(layers[0], layers[1], str(dtype), d.get("tp_degree", 1), tuple(ids), d.get("recompute", "none"))


def plan_from_dict(d: Mapping[str, Any], *, source: str = "<plan>") -> Plan:
    """Parse the JSON object of a plan (structure only; invariants: :func:`hpp.validate.validate_plan`).

    Raises
    ------
    HppInputError
        Wrong format or version, an unknown key (naming the closest known one), missing or mistyped fields,
        inconsistent ``num_micro_batches`` (naming the file and the field).
    """
    check_header(d, fmt=PLAN_FORMAT, version=PLAN_VERSION, what="a plan", source=source,
                 format_fix="give a plan that hpp plan --out wrote (Sailor or Metis plans: hpp estimate --format sailor|metis)", shape_fix="see hpp/plan_data.py")
    check_keys(d, _TOP_KEYS, source=source, where="")
    if bad := next((k for k in ("profile", "cluster", "predicted") if not isinstance(d.get(k, {}), Mapping)), None):
        raise HppInputError(f"{bad} is not an object", source=source, field=bad, fix="see hpp/plan_data.py")
    pipes_raw = _req(d, "pipelines", source=source, where="", fix="list the pipelines")
    if not isinstance(pipes_raw, list) or not pipes_raw:
        raise HppInputError("no pipelines", source=source, field="pipelines", fix="give at least one pipeline")
    pipelines = []
    for p, pd in enumerate(pipes_raw):
        where = f"pipelines[{p}]."
        b = _need_int(_req(pd, "micro_batch_size", source=source, where=where, fix="give the micro-batch size"),
                      f"{where}micro_batch_size", 1, source)
        check_keys(pd, _PIPELINE_KEYS, source=source, where=where)
        if "num_samples" in pd:
            n = _need_int(pd["num_samples"], f"{where}num_samples", 0, source)
        else:
            m = _need_int(_req(pd, "num_micro_batches", source=source, where=where,
                               fix="give num_samples or num_micro_batches"), f"{where}num_micro_batches", 0, source)
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
        with _within(where, source):
            pipelines.append(Pipeline(stages, b, n, pd.get("schedule", default_schedule(m, len(stages)))))
    num_layers = _req(d, "num_layers", source=source, where="", fix="give the model's layer count")
    gbs = _req(d, "global_batch_size", source=source, where="", fix="give the global batch size")
    with _within("", source):
        return Plan(model=str(d.get("model", "")), num_layers=num_layers, global_batch_size=gbs,
                    pipelines=tuple(pipelines), sequence_length=int(d.get("sequence_length", 1)),
                    profile_ref=dict(d.get("profile", {})), cluster_ref=dict(d.get("cluster", {})),
                    predicted=dict(d.get("predicted", {})))


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """JSON object of ``plan`` (inverse of :func:`plan_from_dict`)."""
    return {
        "format": PLAN_FORMAT, "version": PLAN_VERSION, "model": plan.model, "num_layers": plan.num_layers,
        "global_batch_size": plan.global_batch_size, "sequence_length": plan.sequence_length,
        "profile": dict(plan.profile_ref), "cluster": dict(plan.cluster_ref),
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
    """The JSON object of a plan file (:class:`HppInputError`: a missing file, bad JSON or a repeated key)."""
    return read_json(path, what="plan file")


def write_plan_json(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` as JSON; via a temporary file and a rename, so never half-written."""
    write_atomic(path, json.dumps(plan_to_dict(plan), indent=1) + "\n")
