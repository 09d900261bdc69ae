"""Loader of the public Metis profile format (Sailor artifact, ``metis-format/``) into :class:`ModelProfile`.

Metis format (:func:`load_metis_profiles`)
    ``<GPU>/mbs{b}_tmp{t}.json`` files. Rules:

    - ``layer_compute_total_ms`` is forward + backward: split 1 : 2
      (:data:`METIS_FORWARD_FRACTION`); the split is an assumption, so every entry
      is ``estimated=True`` with a note saying so;
    - ``param_bytes = parameters_per_layer_bytes``; ``output_bytes = activation_parameters_bytes``;
    - ``activation_bytes = layer_memory_total_mb * 2**20 - 5 * param_bytes``
      (:data:`METIS_MEMORY_PARAM_FACTOR`: Metis counts weights, gradients and
      optimizer states as 5 x the parameter bytes; checked against ``llm_info.json``
      in the tests);
    - ``optimizer_s`` = ``optimizer_time_ms / 1000`` split across layers in
      proportion to ``param_bytes``.

Like the Sailor loader (:mod:`hpp.profiles.public`), it refuses (never mixes) device types whose layer
counts differ, naming the files.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from hpp.errors import HppInputError
from hpp.fileio import read_json
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.model_profile import Key, LayerProfile, ModelProfile
from hpp.profiles.public_common import (SAILOR_ARTIFACT, SAILOR_LICENCE, PathLike, as_mapping, check_known,
                                        check_same_layer_counts)

__all__ = ["load_metis_profiles", "METIS_MEMORY_PARAM_FACTOR", "METIS_FORWARD_FRACTION", "MIB_BYTES"]

#: Metis' per-layer memory counts the parameters 5 times (fp32 weights + grads + 2 Adam states
#: + one more copy); verified: layer_memory_total = 5 x param_bytes + b x llm_info act_mem_bytes.
METIS_MEMORY_PARAM_FACTOR = 5
#: Share of Metis' fwd+bwd per-layer time attributed to the forward pass (assumed 1 : 2 split).
METIS_FORWARD_FRACTION = 1.0 / 3.0
MIB_BYTES = 2 ** 20
MS_PER_S = 1000.0
_METIS_NAME = re.compile(r"^mbs(\d+)_tmp(\d+)\.json$")


def _metis_dirs(gpu_dirs: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(gpu_dirs, (str, Path)):
        root = Path(gpu_dirs)
        if not root.is_dir():
            raise HppInputError("no such directory", source=str(root),
                                fix="give metis-format/<MODEL> or one of its <GPU> directories")
        if any(_METIS_NAME.match(f.name) for f in root.iterdir()):
            return [root]
        return sorted(d for d in root.iterdir() if d.is_dir())
    return [Path(d) for d in gpu_dirs]


def load_metis_profiles(model: str, gpu_dirs: PathLike | Iterable[PathLike], *, sequence_length: int = 1,
                        device_types: Iterable[str] | None = None, known_device_types: Iterable[str] | None = None,
                        source: str = "", licence: str = SAILOR_LICENCE,
                        meta: Mapping[str, Any] | None = None) -> ModelProfile:
    """Load Metis-format ``mbs{b}_tmp{t}.json`` files into a :class:`ModelProfile`.

    Parameters
    ----------
    model : str
        Model name; must match each file's ``model.model_name`` when present.
    gpu_dirs : path or iterable of paths
        A ``metis-format/<MODEL>`` directory, or ``<GPU>`` directories (device type = name).
    sequence_length, device_types, known_device_types, source, licence, meta
        As in :func:`load_sailor_profiles`.

    Every entry is ``estimated=True``: the forward/backward split is assumed (module docstring).

    Raises
    ------
    HppInputError
        Missing/malformed files or fields, per-layer lists of different lengths inside a
        file, layer counts that differ between device types, negative derived activation
        bytes, unknown GPU types.
    """
    known = frozenset(known_device_types if known_device_types is not None else BUNDLED_DEVICE_TYPES)
    wanted = None if device_types is None else set(device_types)
    entries: dict[Key, LayerProfile] = {}
    counts: dict[str, tuple[int, str]] = {}
    for d in _metis_dirs(gpu_dirs):
        if wanted is not None and d.name not in wanted:
            continue
        files = sorted(f for f in d.iterdir() if _METIS_NAME.match(f.name)) if d.is_dir() else []
        if not files:
            raise HppInputError("no mbs{b}_tmp{t}.json files", source=str(d),
                                fix="give a Metis-format <GPU> directory")
        check_known(d.name, known, source=str(d))
        for f in files:
            b, t = (int(x) for x in _METIS_NAME.match(f.name).groups())  # type: ignore[union-attr]
            e = _metis_entry(model, d.name, b, t, read_json(f, what="Metis profile"), source=str(f))
            if d.name in counts and counts[d.name][0] != e.num_layers:
                raise HppInputError(f"{e.num_layers} layers but {counts[d.name][1]} has {counts[d.name][0]}",
                                    source=str(f), field="model.num_layers",
                                    fix="profile the same layers in every file")
            counts.setdefault(d.name, (e.num_layers, str(f)))
            if e.key in entries:
                raise HppInputError(f"duplicate entry {e.key}", source=str(f), field="device_type",
                                    fix="give each GPU directory once")
            entries[e.key] = e
    if not entries:
        raise HppInputError(f"no Metis profiles of {model}", source=str(gpu_dirs), field="device_types",
                            fix="give at least one <GPU> directory with mbs{b}_tmp{t}.json files")
    num_layers = check_same_layer_counts(model, counts)
    return ModelProfile(model=model, num_layers=num_layers, sequence_length=sequence_length, entries=entries,
                        source=source or f"Metis format ({SAILOR_ARTIFACT}): {gpu_dirs}", licence=licence,
                        meta=dict(meta or {}))


def _metis_field(data: Mapping[str, Any], dotted: str, *, source: str) -> Any:
    cur: Any = data
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise HppInputError("missing field", source=source, field=dotted,
                                fix="give a complete Metis profile (see Metis' profile schema)")
        cur = cur[part]
    return cur


def _metis_numbers(data: Mapping[str, Any], dotted: str, *, source: str, n: int | None) -> list[float]:
    vals = _metis_field(data, dotted, source=source)
    if not isinstance(vals, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in vals):
        raise HppInputError(f"expected a list of finite numbers >= 0, got {str(vals)[:80]}", source=source,
                            field=dotted, fix="give one non-negative number per layer")
    if n is not None and len(vals) != n:
        raise HppInputError(f"{len(vals)} values but model.num_layers is {n}", source=source, field=dotted,
                            fix="give exactly one value per layer (the file is internally inconsistent)")
    return [float(v) for v in vals]


def _metis_entry(model: str, gpu: str, b: int, t: int, data: Any, *, source: str) -> LayerProfile:
    data = as_mapping(data, source=source, field="", fix="give a Metis profile object")
    name = data.get("model", {}).get("model_name") if isinstance(data.get("model"), Mapping) else None
    if name is not None and name != model:
        raise HppInputError(f"model_name is {name!r}, expected {model!r}", source=source, field="model.model_name",
                            fix="load the files of one model together")
    n = _metis_field(data, "model.num_layers", source=source)
    if not isinstance(n, int) or n < 1:
        raise HppInputError(f"num_layers is {n!r}", source=source, field="model.num_layers",
                            fix="give a positive integer")
    compute_ms = _metis_numbers(data, "execution_time.layer_compute_total_ms", source=source, n=n)
    params = _metis_numbers(data, "model.parameters.parameters_per_layer_bytes", source=source, n=n)
    outputs = _metis_numbers(data, "model.parameters.activation_parameters_bytes", source=source, n=n)
    memory_mb = _metis_numbers(data, "execution_memory.layer_memory_total_mb", source=source, n=n)
    opt_ms = _metis_field(data, "execution_time.optimizer_time_ms", source=source)
    if isinstance(opt_ms, bool) or not isinstance(opt_ms, (int, float)) or not opt_ms >= 0:
        raise HppInputError(f"optimizer_time_ms is {opt_ms!r}", source=source,
                            field="execution_time.optimizer_time_ms", fix="give a number of ms >= 0")
    act = [round(m * MIB_BYTES - METIS_MEMORY_PARAM_FACTOR * p) for m, p in zip(memory_mb, params)]
    for i, a in enumerate(act):
        if a < 0:
            raise HppInputError(f"layer {i}: layer_memory_total_mb x 2**20 is below {METIS_MEMORY_PARAM_FACTOR} x "
                                f"parameter bytes, so activation bytes would be {a}", source=source,
                                field=f"execution_memory.layer_memory_total_mb[{i}]",
                                fix="check the memory and parameter figures of this layer")
    total_params = sum(params)
    opt_s = opt_ms / MS_PER_S
    e = LayerProfile(
        device_type=gpu, tp_degree=t, micro_batch_size=b,
        forward_s=tuple(c / MS_PER_S * METIS_FORWARD_FRACTION for c in compute_ms),
        backward_s=tuple(c / MS_PER_S * (1.0 - METIS_FORWARD_FRACTION) for c in compute_ms),
        optimizer_s=tuple(opt_s * p / total_params if total_params else opt_s / n for p in params),
        param_bytes=tuple(int(p) for p in params), activation_bytes=tuple(act),
        output_bytes=tuple(int(o) for o in outputs), estimated=True,
        note="Metis format: forward:backward split of layer_compute_total_ms assumed 1:2; "
             "optimizer time split by parameter bytes")
    e.validate(source=source, where="")
    return e

