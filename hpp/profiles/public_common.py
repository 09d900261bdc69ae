"""What the Sailor and Metis profile loaders share: the artifact, JSON-shape checks, ``llm_info.json``.

Source: eth-easl/sailor at commit cf2c8e3 (MIT licence, Copyright ETH Zurich). The format rules are
in :mod:`hpp.profiles.public` (Sailor) and :mod:`hpp.profiles.public_metis` (Metis).
Every check raises :class:`~hpp.errors.HppInputError` naming the file, the field and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.fileio import read_json

__all__ = ["SAILOR_ARTIFACT", "SAILOR_LICENCE", "PathLike", "as_mapping", "int_keys", "layer_list", "check_known",
           "check_same_layer_counts", "load_llm_info", "sequence_length_from_llm_info"]

#: The public artifact the formats come from.
SAILOR_ARTIFACT = "eth-easl/sailor commit cf2c8e3"
SAILOR_LICENCE = "MIT, Copyright ETH Zurich"
PathLike = str | Path


def as_mapping(value: Any, *, source: str, field: str, fix: str) -> Mapping[str, Any]:
    """``value`` when it is a JSON object; else :class:`HppInputError` naming ``field`` with ``fix``."""
    if not isinstance(value, Mapping):
        raise HppInputError(f"expected a JSON object, got {type(value).__name__}", source=source, field=field,
                            fix=fix)
    return value


def int_keys(d: Mapping[str, Any], *, source: str, field: str, what: str, minimum: int = 1) -> dict[int, Any]:
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


def layer_list(d: Any, *, source: str, field: str) -> list[Any]:
    """``{"0": x0, "1": x1, ...}`` -> ``[x0, x1, ...]``; the keys must be exactly 0 .. L-1."""
    d = as_mapping(d, source=source, field=field, fix="give {layer: value} for layers 0 .. L-1")
    by_index = int_keys(d, source=source, field=field, what="layer", minimum=0)
    n = len(by_index)
    if sorted(by_index) != list(range(n)):
        raise HppInputError(f"layer keys {sorted(by_index)} are not 0 .. {n - 1}", source=source,
                            field=field, fix="give every layer from 0 to L-1 exactly once")
    return [by_index[i] for i in range(n)]


def check_known(device_type: str, known: frozenset[str], *, source: str) -> None:
    """Refuse a device type (a directory name) that is not in ``known``."""
    if device_type not in known:
        raise HppInputError(f"unknown GPU type {device_type!r}", source=source, field="device_type",
                            fix=f"use one of {sorted(known)} (the directory name is the device type) "
                                "or pass it in known_device_types")


def check_same_layer_counts(model: str, counts: Mapping[str, tuple[int, str]]) -> int:
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
    data = as_mapping(read_json(path, what="llm_info file"), source=src, field="",
                      fix="give {model: {tp: {layer: {...}}}}")
    if model not in data:
        raise HppInputError(f"model {model!r} is not in llm_info", source=src, field=model,
                            fix=f"use one of {sorted(data)}")
    per_tp = int_keys(as_mapping(data[model], source=src, field=model, fix="give {tp: {layer: {...}}}"),
                                source=src, field=model, what="TP degree")
    out: dict[int, list[Mapping[str, Any]]] = {}
    for tp, layers in sorted(per_tp.items()):
        rows = layer_list(layers, source=src, field=f"{model}.{tp}")
        for i, row in enumerate(rows):
            for name in ("params_bytes", "act_output_bytes", "act_mem_bytes"):
                v = row.get(name) if isinstance(row, Mapping) else None
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise HppInputError(f"{name} is {v!r}", source=src, field=f"{model}.{tp}.{i}.{name}",
                                        fix="give a non-negative integer number of bytes")
        out[tp] = rows
    return out



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
