"""The native JSON form of a :class:`~hpp.profiles.model_profile.ModelProfile` (``format: "hpp-profile"``).

Format (version 1)::

    {"format": "hpp-profile", "version": 1, "model": "OPT-350", "num_layers": 26,
     "sequence_length": 2048, "source": "...", "licence": "...",
     "entries": [{"device_type": "A100-40", "tp_degree": 1, "micro_batch_size": 2,
                  "forward_s": [...], "backward_s": [...], "optimizer_s": [...],
                  "param_bytes": [...], "activation_bytes": [...], "output_bytes": [...],
                  "estimated": false}, ...]}

(``"calibration"``, optional: what ``hpp run --calibrate`` corrected, :mod:`hpp.profiles.calibration_record`.
Unknown keys, at the top and in an entry, are errors.)

(the optional fields, when measured, are more keys of an entry: ``"attention_activation_bytes"``,
``"step_activation_bytes"``, ``"backward_transient_bytes"`` (lists) and ``"loss_activation_bytes"``;
``"step_time"``, an object: the runtime step's time terms, :mod:`hpp.profiles.step_time`.)

The fields are those of :class:`~hpp.profiles.model_profile.LayerProfile` (see :mod:`hpp.profiles.model_profile`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError, reading_fields
from hpp.fileio import check_header, check_keys, read_json, write_atomic
from hpp.profiles.calibration_record import ProfileCalibration
from hpp.profiles.model_profile import (_OPTIONAL_PER_LAYER_FIELDS, _OPTIONAL_SCALAR_FIELDS, _PER_LAYER_FIELDS,
                                        PROFILE_FORMAT, PROFILE_VERSION, Key, LayerProfile, ModelProfile)
from hpp.profiles.step_time import StepTimeTerms

__all__ = ["profile_from_dict", "profile_to_dict", "load_profile", "save_profile"]

_TOP_KEYS = ("format", "version", "model", "num_layers", "sequence_length", "source", "licence", "meta", "entries",
             "calibration")
_ENTRY_KEYS = ("device_type", "tp_degree", "micro_batch_size", *_PER_LAYER_FIELDS, *_OPTIONAL_PER_LAYER_FIELDS,
               *_OPTIONAL_SCALAR_FIELDS, "step_time", "estimated", "note")


def _entry_from_dict(d: Mapping[str, Any], *, source: str, where: str) -> LayerProfile:
    if not isinstance(d, Mapping):
        raise HppInputError("an entry must be an object", source=source, field=where, fix="see the native format")
    check_keys(d, _ENTRY_KEYS, source=source, where=f"{where}.")
    with reading_fields(source, where, bad_fix="use numbers, one per layer",
                        missing_fix="add it (see the native profile format in hpp/profiles/model_profile.py)"):
        opt = {name: (tuple(int(x) for x in d[name]) if d.get(name) is not None else None)
               for name in _OPTIONAL_PER_LAYER_FIELDS}
        scalars = {name: (int(d[name]) if d.get(name) is not None else None) for name in _OPTIONAL_SCALAR_FIELDS}
        e = LayerProfile(
            device_type=str(d["device_type"]), tp_degree=int(d["tp_degree"]),
            micro_batch_size=int(d["micro_batch_size"]),
            forward_s=tuple(float(x) for x in d["forward_s"]),
            backward_s=tuple(float(x) for x in d["backward_s"]),
            optimizer_s=tuple(float(x) for x in d["optimizer_s"]),
            param_bytes=tuple(int(x) for x in d["param_bytes"]),
            activation_bytes=tuple(int(x) for x in d["activation_bytes"]),
            output_bytes=tuple(int(x) for x in d["output_bytes"]),
            **opt, **scalars,
            step_time=(StepTimeTerms.from_dict(d["step_time"], source=source, where=f"{where}.step_time")
                       if d.get("step_time") is not None else None),
            estimated=bool(d.get("estimated", False)), note=str(d.get("note", "")))
    e.validate(source=source, where=where)
    return e


_EMULATED_KEYS = ("base", "slowdown")


def _check_emulated(emulated: Any, entries: Mapping[Key, LayerProfile], *, source: str) -> None:
    """``meta.emulated``: per emulated device type ``{"base": a device type with entries, "slowdown": a number >=
    1}`` (the emulation pads its ops to ``slowdown`` x their time on the base type, :mod:`hpp.runtime.host`)."""
    if emulated is None:
        return
    if not isinstance(emulated, Mapping):
        raise HppInputError("meta.emulated must be an object", source=source, field="meta.emulated",
                            fix='give {"TYPE": {"base": "cpu", "slowdown": 2.0}}')
    types = sorted({k[0] for k in entries})
    for name, emu in emulated.items():
        where = f"meta.emulated.{name}"
        if not isinstance(emu, Mapping):
            raise HppInputError(f"{emu!r}", source=source, field=where,
                                fix='give {"base": "cpu", "slowdown": 2.0}')
        check_keys(emu, _EMULATED_KEYS, source=source, where=f"{where}.")
        for key in _EMULATED_KEYS:
            if key not in emu:
                raise HppInputError(f"missing field {key!r}", source=source, field=f"{where}.{key}",
                                    fix="give the base device type and the slowdown")
        if str(emu["base"]) not in types:
            raise HppInputError(f"base {emu['base']!r} has no entries", source=source, field=f"{where}.base",
                                fix=f"use one of {types}")
        k = emu["slowdown"]
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not (math.isfinite(k) and k >= 1.0):
            raise HppInputError(f"slowdown {k!r}", source=source, field=f"{where}.slowdown",
                                fix="use a number >= 1 (an emulation only slows the base type down)")


def profile_from_dict(d: Mapping[str, Any], *, source: str = "<dict>") -> ModelProfile:
    """Build a :class:`ModelProfile` from the native JSON object.

    Raises
    ------
    HppInputError
        Wrong format/version, missing fields, a layer count that differs between
        entries (device types) of the model, duplicate entries, bad values.
    """
    check_header(d, fmt=PROFILE_FORMAT, version=PROFILE_VERSION, what="a profile", source=source,
                 format_fix="convert Sailor or Metis files with hpp.profiles.public loaders",
                 shape_fix="see the native profile format")
    check_keys(d, _TOP_KEYS, source=source, where="")
    for name in ("model", "num_layers", "entries"):
        if name not in d:
            raise HppInputError(f"missing field {name!r}", source=source, field=name, fix="add it")
    num_layers = d["num_layers"]
    if not isinstance(num_layers, int) or num_layers < 1:
        raise HppInputError(f"num_layers={num_layers!r}", source=source, field="num_layers",
                            fix="give a positive integer")
    entries: dict[Key, LayerProfile] = {}
    for i, ed in enumerate(d["entries"]):
        e = _entry_from_dict(ed, source=source, where=f"entries[{i}]")
        if e.num_layers != num_layers:
            raise HppInputError(f"{e.device_type} (tp {e.tp_degree}, micro-batch {e.micro_batch_size}) has "
                                f"{e.num_layers} layers but num_layers is {num_layers}", source=source,
                                field=f"entries[{i}].forward_s",
                                fix="every device type of one model must profile the same layers")
        if e.key in entries:
            raise HppInputError(f"duplicate entry {e.key}", source=source, field=f"entries[{i}]",
                                fix="give each (device_type, tp_degree, micro_batch_size) once")
        entries[e.key] = e
    meta = d.get("meta", {})
    if not isinstance(meta, Mapping):
        raise HppInputError("meta must be an object", source=source, field="meta", fix="write {} or remove it")
    _check_emulated(meta.get("emulated"), entries, source=source)
    return ModelProfile(model=str(d["model"]), num_layers=num_layers,
                        sequence_length=int(d.get("sequence_length", 1)), entries=entries,
                        source=str(d.get("source", "")), licence=str(d.get("licence", "")),
                        meta=dict(d.get("meta", {})),
                        calibration=(ProfileCalibration.from_dict(d["calibration"], source=source)
                                     if d.get("calibration") is not None else None))


def profile_to_dict(p: ModelProfile) -> dict[str, Any]:
    """Native JSON object of ``p`` (inverse of :func:`profile_from_dict`)."""
    entries = []
    for key in sorted(p.entries):
        e = p.entries[key]
        ed: dict[str, Any] = {"device_type": e.device_type, "tp_degree": e.tp_degree,
                              "micro_batch_size": e.micro_batch_size}
        for name in _PER_LAYER_FIELDS:
            ed[name] = list(getattr(e, name))
        for name in _OPTIONAL_PER_LAYER_FIELDS:
            if getattr(e, name) is not None:
                ed[name] = list(getattr(e, name))
        for name in _OPTIONAL_SCALAR_FIELDS:
            if getattr(e, name) is not None:
                ed[name] = getattr(e, name)
        if e.step_time is not None:
            ed["step_time"] = e.step_time.to_dict()
        if e.estimated:
            ed["estimated"] = True
        if e.note:
            ed["note"] = e.note
        entries.append(ed)
    out = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": p.model, "num_layers": p.num_layers,
           "sequence_length": p.sequence_length, "source": p.source, "licence": p.licence,
           "meta": dict(p.meta), "entries": entries}
    if p.calibration is not None:
        out["calibration"] = p.calibration.to_dict()
    return out


def load_profile(path: str | Path) -> ModelProfile:
    """Read a native profile JSON file.

    Raises
    ------
    HppInputError
        Missing file, invalid JSON, or validation failure (names the file and the field).
    """
    p = Path(path)
    data = read_json(p, what="profile file")
    try:
        return profile_from_dict(data, source=str(p))
    except HppInputError as exc:
        raise exc.with_source(str(p)) from None


def save_profile(p: ModelProfile, path: str | Path) -> None:
    """Write ``p`` as native JSON (written to a temporary file, then renamed: never half-written)."""
    write_atomic(path, json.dumps(profile_to_dict(p), separators=(",", ":")) + "\n")
