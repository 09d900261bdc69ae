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

Metis format (:func:`load_metis_profiles`, in :mod:`hpp.profiles.public_metis`)
    ``<GPU>/mbs{b}_tmp{t}.json`` files; forward/backward split assumed 1 : 2, so every entry is
    ``estimated=True``.

Both loaders refuse (never mix) device types whose layer counts differ, naming
the files: e.g. ``sailor-format/GPT-Neo-2.7/GH-96/profile.json`` (26 layers, a
copy of OPT-350's) against the other GPT-Neo-2.7 types (34 layers).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from hpp.errors import HppInputError
from hpp.fileio import read_json
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.model_profile import Key, LayerProfile, ModelProfile
from hpp.profiles.public_common import (SAILOR_ARTIFACT, SAILOR_LICENCE, PathLike, as_mapping, check_known,
                                        check_same_layer_counts, int_keys, layer_list, load_llm_info)

__all__ = ["load_sailor_profiles"]

logger = logging.getLogger(__name__)


def _sailor_time_sources(profiles: PathLike | Iterable[PathLike], model: str
                         ) -> list[tuple[str, str, Mapping[str, Any]]]:
    """``[(device_type, source path, {mbs: {tp: {layer: [...]}}})]`` from a simulator file or GPU dirs."""
    if isinstance(profiles, (str, Path)) and Path(profiles).is_file():
        src = str(profiles)
        data = as_mapping(read_json(profiles, what="simulator profiles"), source=src, field="",
                          fix="give {model: {gpu: {mbs: {tp: {layer: [...]}}}}}")
        if model not in data:
            raise HppInputError(f"model {model!r} is not in the simulator profiles", source=src, field=model,
                                fix=f"use one of {sorted(data)}")
        per_gpu = as_mapping(data[model], source=src, field=model, fix="give {gpu: {mbs: ...}}")
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
        check_known(gpu, known, source=src)
        if gpu in parsed:
            raise HppInputError(f"device type {gpu!r} given twice ({parsed[gpu][0]} and {src})", source=src,
                                field="device_type", fix="give each GPU directory once")
        table: dict[tuple[int, int], list[Any]] = {}
        per_mbs = int_keys(as_mapping(times, source=src, field="", fix="give {mbs: {tp: ...}}"),
                                     source=src, field="", what="micro-batch size")
        for b, per_tp_raw in sorted(per_mbs.items()):
            per_tp = int_keys(as_mapping(per_tp_raw, source=src, field=str(b), fix="give {tp: ...}"),
                                        source=src, field=str(b), what="TP degree")
            for t, layers in sorted(per_tp.items()):
                table[(b, t)] = layer_list(layers, source=src, field=f"{b}.{t}")
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
    num_layers = check_same_layer_counts(model, counts)
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

