"""Loaders for the two public profile formats of the Sailor artifact into :class:`ModelProfile`.

Source: eth-easl/sailor at commit cf2c8e3 (MIT licence, Copyright ETH Zurich).
The loaders take paths as arguments; the package never reads the public data at
run time (the bundled profiles in ``hpp/profiles/data`` were converted once by
``experiments/convert_public_profiles.py``).

Sailor format (:func:`load_sailor_profiles`)
    Times from ``<GPU>/profile.json`` or ``simulator-profiles.json``:
    ``{mbs: {tp: {layer: [fwd_s, bwd_s, update_s]}}}`` (seconds, one micro-batch
    on one device of a TP group). Bytes from ``llm_info.json``
    (``{model: {tp: {layer: {params_bytes, act_output_bytes, act_mem_bytes}}}}``,
    per device at TP degree tp, for micro-batch 1). Rules, for micro-batch b:

    - ``param_bytes = params_bytes``;
    - ``activation_bytes = b * act_mem_bytes``; ``output_bytes = b * act_output_bytes``;
    - ``optimizer_s[l] = update_s[l]``: Sailor's per-layer share of the optimizer
      step (the source gives the same value for every layer of an (mbs, tp) entry,
      the whole step divided by the layer count: OPT-350 A100-40 mbs 2 tp 1:
      26 x 2.93 ms = 76.18 ms = Metis' ``optimizer_time_ms``). An entry whose
      ``update`` is 0 for every layer has no optimizer measurement: it is kept,
      with a ``note`` and a logged warning, and listed in ``meta["defects"]``.
    - A TP degree present in the times but absent from ``llm_info.json`` has no
      byte figures: with ``strict=False`` (default) the entry is skipped with a
      logged warning and listed in ``meta["skipped_entries"]``; with
      ``strict=True`` it is refused (:class:`HppInputError`).

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

Both loaders refuse (never mix) device types whose layer counts differ, naming
the files: e.g. ``sailor-format/GPT-Neo-2.7/GH-96/profile.json`` (26 layers, a
copy of OPT-350's) against the other GPT-Neo-2.7 types (34 layers).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from hpp.errors import HppInputError
from hpp.fileio import read_json
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.model_profile import Key, LayerProfile, ModelProfile

__all__ = ["load_sailor_profiles", "load_metis_profiles", "load_llm_info", "read_json", "sequence_length_from_llm_info",
           "SAILOR_ARTIFACT", "SAILOR_LICENCE", "METIS_MEMORY_PARAM_FACTOR", "METIS_FORWARD_FRACTION",
           "MIB_BYTES"]

logger = logging.getLogger(__name__)

#: The public artifact the formats come from.
SAILOR_ARTIFACT = "eth-easl/sailor commit cf2c8e3"
SAILOR_LICENCE = "MIT, Copyright ETH Zurich"
#: Metis' per-layer memory counts the parameters 5 times (fp32 weights + grads + 2 Adam states
#: + one more copy); verified: layer_memory_total = 5 x param_bytes + b x llm_info act_mem_bytes.
METIS_MEMORY_PARAM_FACTOR = 5
#: Share of Metis' fwd+bwd per-layer time attributed to the forward pass (assumed 1 : 2 split).
METIS_FORWARD_FRACTION = 1.0 / 3.0
MIB_BYTES = 2 ** 20
MS_PER_S = 1000.0
_METIS_NAME = re.compile(r"^mbs(\d+)_tmp(\d+)\.json$")
PathLike = str | Path


def _as_mapping(value: Any, *, source: str, field: str, fix: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise HppInputError(f"expected a JSON object, got {type(value).__name__}", source=source, field=field,
                            fix=fix)
    return value


def _int_keys(d: Mapping[str, Any], *, source: str, field: str, what: str, minimum: int = 1) -> dict[int, Any]:
    """``{"2": x}`` -> ``{2: x}``; refuses non-integer keys, keys below ``minimum`` and repeats ("2", "02")."""
    out: dict[int, Any] = {}
    for k, v in d.items():
        where = f"{field}.{k}" if field else str(k)
        n = int(k) if isinstance(k, str) and k.strip().isdigit() else None
        if n is None or n < minimum:
            raise HppInputError(f"{what} key {k!r} is not an integer >= {minimum}", source=source, field=where,
                                fix=f"use integer {what} keys >= {minimum}")
        if n in out:
            raise HppInputError(f"duplicate {what} {n} (key {k!r})", source=source, field=where,
                                fix="give each entry once")
        out[n] = v
    return out


def _layer_list(d: Any, *, source: str, field: str) -> list[Any]:
    """``{"0": x0, "1": x1, ...}`` -> ``[x0, x1, ...]``; the keys must be exactly 0 .. L-1."""
    d = _as_mapping(d, source=source, field=field, fix="give {layer: value} for layers 0 .. L-1")
    by_index = _int_keys(d, source=source, field=field, what="layer", minimum=0)
    n = len(by_index)
    if sorted(by_index) != list(range(n)):
        raise HppInputError(f"layer keys {sorted(by_index)} are not 0 .. {n - 1}", source=source,
                            field=field, fix="give every layer from 0 to L-1 exactly once")
    return [by_index[i] for i in range(n)]


def _check_known(device_type: str, known: frozenset[str], *, source: str) -> None:
    if device_type not in known:
        raise HppInputError(f"unknown GPU type {device_type!r}", source=source, field="device_type",
                            fix=f"use one of {sorted(known)} (the directory name is the device type) "
                                "or pass it in known_device_types")


def _check_same_layer_counts(model: str, counts: Mapping[str, tuple[int, str]]) -> int:
    """All device types of ``model`` must have one layer count; refuse naming the odd files otherwise.

    ``counts``: ``{device_type: (num_layers, source file)}``. The majority count is taken as right.
    """
    by_count: dict[int, list[str]] = {}
    for dt, (n, _) in sorted(counts.items()):
        by_count.setdefault(n, []).append(dt)
    if len(by_count) > 1:
        majority = max(by_count, key=lambda n: (len(by_count[n]), n))
        odd = sorted(dt for dt, (n, _) in counts.items() if n != majority)
        odd_text = "; ".join(f"{dt} has {counts[dt][0]} layers ({counts[dt][1]})" for dt in odd)
        raise HppInputError(
            f"{model}: layer count differs between device types: {odd_text}, but "
            f"{', '.join(by_count[majority])} have {majority}", source=counts[odd[0]][1], field="layers",
            fix="profile the same layers on every device type (is the file a copy of another model's?) "
                "or leave the odd device type out with device_types=...")
    return next(iter(by_count))


def load_llm_info(path: PathLike, model: str) -> dict[int, list[Mapping[str, Any]]]:
    """Per-TP, per-layer byte figures of ``model`` from Sailor's ``llm_info.json``.

    Returns
    -------
    dict
        ``{tp_degree: [layer_info, ...]}`` with each ``layer_info`` holding at least
        ``params_bytes``, ``act_output_bytes`` and ``act_mem_bytes`` (bytes, per device
        at that TP degree, micro-batch 1).

    Raises
    ------
    HppInputError
        Missing file or model, malformed entries, negative or missing byte figures.
    """
    src = str(path)
    data = _as_mapping(read_json(path, what="llm_info file"), source=src, field="",
                       fix="give {model: {tp: {layer: {...}}}}")
    if model not in data:
        raise HppInputError(f"model {model!r} is not in llm_info", source=src, field=model,
                            fix=f"use one of {sorted(data)}")
    per_tp = _int_keys(_as_mapping(data[model], source=src, field=model, fix="give {tp: {layer: {...}}}"),
                                source=src, field=model, what="TP degree")
    out: dict[int, list[Mapping[str, Any]]] = {}
    for tp, layers in sorted(per_tp.items()):
        rows = _layer_list(layers, source=src, field=f"{model}.{tp}")
        for i, row in enumerate(rows):
            for name in ("params_bytes", "act_output_bytes", "act_mem_bytes"):
                v = row.get(name) if isinstance(row, Mapping) else None
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise HppInputError(f"{name} is {v!r}", source=src, field=f"{model}.{tp}.{i}.{name}",
                                        fix="give a non-negative integer number of bytes")
        out[tp] = rows
    return out


def _sailor_time_sources(profiles: PathLike | Iterable[PathLike], model: str
                         ) -> list[tuple[str, str, Mapping[str, Any]]]:
    """``[(device_type, source path, {mbs: {tp: {layer: [...]}}})]`` from a simulator file or GPU dirs."""
    if isinstance(profiles, (str, Path)) and Path(profiles).is_file():
        src = str(profiles)
        data = _as_mapping(read_json(profiles, what="simulator profiles"), source=src, field="",
                           fix="give {model: {gpu: {mbs: {tp: {layer: [...]}}}}}")
        if model not in data:
            raise HppInputError(f"model {model!r} is not in the simulator profiles", source=src, field=model,
                                fix=f"use one of {sorted(data)}")
        per_gpu = _as_mapping(data[model], source=src, field=model, fix="give {gpu: {mbs: ...}}")
        return [(gpu, f"{src}[{model}][{gpu}]", times) for gpu, times in per_gpu.items()]
    if isinstance(profiles, (str, Path)):
        root = Path(profiles)
        if not root.is_dir():
            raise HppInputError("no such file or directory", source=str(root),
                                fix="give simulator-profiles.json, a <GPU> directory or a directory of them")
        dirs = [root] if (root / "profile.json").is_file() else sorted(
            d for d in root.iterdir() if (d / "profile.json").is_file())
        if not dirs:
            raise HppInputError("no <GPU>/profile.json under this directory", source=str(root),
                                fix="give sailor-format/<MODEL> or one of its <GPU> directories")
    else:
        dirs = [Path(d) for d in profiles]
    out = []
    for d in dirs:
        f = d / "profile.json"
        out.append((d.name, str(f), read_json(f, what="Sailor profile")))
    return out


def load_sailor_profiles(model: str, profiles: PathLike | Iterable[PathLike], llm_info_path: PathLike, *,
                         sequence_length: int = 1, device_types: Iterable[str] | None = None,
                         known_device_types: Iterable[str] | None = None, strict: bool = False,
                         source: str = "", licence: str = SAILOR_LICENCE,
                         meta: Mapping[str, Any] | None = None) -> ModelProfile:
    """Load Sailor-format per-layer times and ``llm_info.json`` bytes into a :class:`ModelProfile`.

    Parameters
    ----------
    model : str
        Model key in ``llm_info.json`` (and in ``simulator-profiles.json``), e.g. ``"OPT-350"``.
    profiles : path or iterable of paths
        ``simulator-profiles.json``; or a ``sailor-format/<MODEL>`` directory; or
        ``<GPU>`` directories holding ``profile.json`` (device type = directory name).
    llm_info_path : path
        Sailor's ``llm_info.json``.
    sequence_length : int
        Tokens per sample [tokens], recorded in the profile.
    device_types : iterable of str, optional
        Keep only these device types (others are not read further).
    known_device_types : iterable of str, optional
        Accepted device-type names; default: the bundled table (:data:`BUNDLED_DEVICE_TYPES`).
    strict : bool
        Refuse (instead of skip with a warning) a TP degree that ``llm_info.json`` lacks.
    source, licence, meta
        Provenance recorded in the profile; ``meta`` gains ``skipped_entries`` and ``defects``.

    Raises
    ------
    HppInputError
        Missing/malformed files, unknown GPU types, layer counts that differ between
        device types or from ``llm_info.json``, negative or non-finite times, duplicates.
    """
    known = frozenset(known_device_types if known_device_types is not None else BUNDLED_DEVICE_TYPES)
    wanted = None if device_types is None else set(device_types)
    llm_info = load_llm_info(llm_info_path, model)
    llm_layers = {len(rows) for rows in llm_info.values()}
    sources = [s for s in _sailor_time_sources(profiles, model) if wanted is None or s[0] in wanted]
    if wanted is not None and wanted - {s[0] for s in sources}:
        raise HppInputError(f"device types {sorted(wanted - {s[0] for s in sources})} not found",
                            source=str(profiles), field="device_types",
                            fix=f"use some of {sorted(s[0] for s in _sailor_time_sources(profiles, model))}")
    parsed: dict[str, tuple[str, dict[tuple[int, int], list[Any]]]] = {}
    counts: dict[str, tuple[int, str]] = {}
    for gpu, src, times in sources:
        _check_known(gpu, known, source=src)
        if gpu in parsed:
            raise HppInputError(f"device type {gpu!r} given twice ({parsed[gpu][0]} and {src})", source=src,
                                field="device_type", fix="give each GPU directory once")
        table: dict[tuple[int, int], list[Any]] = {}
        per_mbs = _int_keys(_as_mapping(times, source=src, field="", fix="give {mbs: {tp: ...}}"),
                                     source=src, field="", what="micro-batch size")
        for b, per_tp_raw in sorted(per_mbs.items()):
            per_tp = _int_keys(_as_mapping(per_tp_raw, source=src, field=str(b), fix="give {tp: ...}"),
                                        source=src, field=str(b), what="TP degree")
            for t, layers in sorted(per_tp.items()):
                table[(b, t)] = _layer_list(layers, source=src, field=f"{b}.{t}")
        lengths = {len(v) for v in table.values()}
        if len(lengths) > 1:
            raise HppInputError(f"entries have different layer counts {sorted(lengths)}", source=src,
                                field="layers", fix="every (mbs, tp) entry must cover the same layers")
        if not table:
            raise HppInputError("no (mbs, tp) entries", source=src, field="", fix="give measured entries")
        parsed[gpu] = (src, table)
        counts[gpu] = (lengths.pop(), src)
    if not parsed:
        raise HppInputError(f"no device types of {model}", source=str(profiles), field="device_types",
                            fix="give at least one GPU profile")
    num_layers = _check_same_layer_counts(model, counts)
    if llm_layers != {num_layers}:
        raise HppInputError(f"{model} times have {num_layers} layers but llm_info gives {sorted(llm_layers)}",
                            source=str(llm_info_path), field=model,
                            fix="use times and byte figures of the same model and layering")
    entries: dict[Key, LayerProfile] = {}
    skipped: list[str] = []
    defects: list[str] = []
    for gpu, (src, table) in sorted(parsed.items()):
        for (b, t), rows in sorted(table.items()):
            if t not in llm_info:
                msg = (f"{gpu} mbs {b} tp {t}: llm_info has no TP {t} for {model} "
                       f"(has {sorted(llm_info)}), so it has no byte figures")
                if strict:
                    raise HppInputError(msg, source=src, field=f"{b}.{t}",
                                        fix="add the TP degree to llm_info.json or load with strict=False")
                logger.warning("%s: skipped %s", src, msg)
                skipped.append(msg)
                continue
            entry = _sailor_entry(gpu, b, t, rows, llm_info[t], source=src)
            if entry.note:
                logger.warning("%s: %s mbs %d tp %d: %s", src, gpu, b, t, entry.note)
                defects.append(f"{gpu} mbs {b} tp {t}: {entry.note}")
            entries[entry.key] = entry
    full_meta = dict(meta or {})
    full_meta["skipped_entries"] = skipped
    full_meta["defects"] = defects
    return ModelProfile(model=model, num_layers=num_layers, sequence_length=sequence_length, entries=entries,
                        source=source or f"Sailor format ({SAILOR_ARTIFACT}): {profiles}; bytes: {llm_info_path}",
                        licence=licence, meta=full_meta)


def _sailor_entry(gpu: str, b: int, t: int, rows: list[Any], info: list[Mapping[str, Any]], *,
                  source: str) -> LayerProfile:
    fwd, bwd, upd = [], [], []
    for i, row in enumerate(rows):
        field = f"{b}.{t}.{i}"
        if not (isinstance(row, list) and len(row) == 3):
            raise HppInputError(f"expected [fwd_s, bwd_s, update_s], got {row!r}", source=source, field=field,
                                fix="give three numbers in seconds")
        for name, v in zip(("fwd_s", "bwd_s", "update_s"), row):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise HppInputError(f"{name} is {v!r}", source=source, field=field,
                                    fix="give finite times >= 0 in seconds")
        fwd.append(float(row[0]))
        bwd.append(float(row[1]))
        upd.append(float(row[2]))
    note = "optimizer step not measured (update is 0 for every layer in the source)" if not any(upd) else ""
    e = LayerProfile(device_type=gpu, tp_degree=t, micro_batch_size=b, forward_s=tuple(fwd),
                     backward_s=tuple(bwd), optimizer_s=tuple(upd),
                     param_bytes=tuple(int(r["params_bytes"]) for r in info),
                     activation_bytes=tuple(b * int(r["act_mem_bytes"]) for r in info),
                     output_bytes=tuple(b * int(r["act_output_bytes"]) for r in info), note=note)
    e.validate(source=source, where=f"{b}.{t}")
    return e


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
        _check_known(d.name, known, source=str(d))
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
    num_layers = _check_same_layer_counts(model, counts)
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
    data = _as_mapping(data, source=source, field="", fix="give a Metis profile object")
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


def sequence_length_from_llm_info(llm_info_path: PathLike, model: str, *, hidden_size: int) -> int:
    """Tokens per sample implied by ``llm_info.json``: a transformer block's output floats / hidden size.

    Layer 1 (the first block) at TP 1 outputs ``sequence_length x hidden_size`` floats per
    sample (OPT-350: 2097152 = 2048 x 1024; LLAMA-3-8: 33554432 = 8192 x 4096).

    Raises
    ------
    HppInputError
        The output floats are not a multiple of ``hidden_size``.
    """
    data = read_json(llm_info_path, what="llm_info file")
    try:
        floats = int(data[model]["1"]["1"]["act_output_floats"])
    except (KeyError, TypeError, ValueError):
        raise HppInputError("no act_output_floats of layer 1 at TP 1", source=str(llm_info_path),
                            field=f"{model}.1.1.act_output_floats", fix="give the sequence length explicitly") from None
    if hidden_size < 1 or floats % hidden_size:
        raise HppInputError(f"{floats} output floats are not a multiple of hidden size {hidden_size}",
                            source=str(llm_info_path), field=f"{model}.1.1.act_output_floats",
                            fix="check the hidden size or give the sequence length explicitly")
    return floats // hidden_size
