"""Default links from Sailor's measured network fits (bundled as ``hpp/profiles/data/network.json``).

Source: eth-easl/sailor commit cf2c8e3 (MIT licence, Copyright ETH Zurich),
``network/intra_node_bandwidths.json`` and ``network/multizone_bandwidths_het.json``
(only zone ``us-central1-a`` to itself). Each fit is ``[[a, b, c], max_bw]``: the
bandwidth for a message of ``x`` bytes is ``a L^2 + b L + c`` GB/s with
``L = log2(x / 1e6)``, capped at ``max_bw`` bytes/s (see :class:`~hpp.profiles.cluster.Link`).
The data carry no latency; links get :data:`~hpp.profiles.cluster.DEFAULT_LATENCY_S`.

Rules (documented choices):

- Device counts. The fits are measured for some device counts only (intra-node 2, 4
  and for the RTX types 8; inter-node 1, 2, 4 and for the RTX types 8). A count that
  is not measured takes the largest measured count below it, or the smallest
  measured one if there is none (so a 1-device node gets the 2-device intra fit;
  that link is never used for point-to-point traffic inside one device anyway).
- Inter-node count: ``num_devices`` devices per node send at the same time
  (``[src][n][zone][dst][n]``); the default 1 is one device to one device.
- Several device types: the link is the slowest (least peak bandwidth) over all
  ordered pairs of the types, using the measured cross-type fit where the file has
  one (e.g. Titan-RTX <-> RTX-3090 is ~0.11 GB/s, far below either type's own
  2.8 GB/s) and otherwise the slower of the two types' own fits.
- Concurrent flows: each inter-node link carries the measured aggregate figures of ``k -> k`` flows
  (``[src][k][zone][dst][k]``, k = 2, 4 and for the RTX types 8) as
  :class:`~hpp.profiles.cluster.AggregateFit` (the slower direction where both are measured), so
  that flows leaving one node at once share it (:meth:`~hpp.profiles.cluster.Link.shared`): an
  A100-40 node gives 2.42 GB/s to one flow and 6.04 GB/s to four in all.
- Aliases: device types absent from the inter-node file use another type's fits
  (:data:`INTER_NODE_ALIASES`): ``A100-80 -> A100-40`` (same host family on GCP;
  Sailor's homogeneous ``multizone_bandwidths.json`` measures A100-80 at ~4.5 GB/s
  peak one-to-one, so the A100-40 figure of ~2.4 GB/s is the conservative choice).
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from itertools import product
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.fileio import read_json
from hpp.profiles.cluster import DEFAULT_LATENCY_S, AggregateFit, Link, NetworkLinks, Node

__all__ = ["default_intra_node_link", "default_inter_node_link", "default_pair_link", "default_network",
           "has_measurements", "network_table_from_sailor",
           "INTER_NODE_ALIASES", "NETWORK_ZONE", "NETWORK_DATA_FILE"]

NETWORK_ZONE = "us-central1-a"
NETWORK_DATA_FILE = "network.json"
#: Device types missing from the inter-node measurements -> the type whose fits they use.
INTER_NODE_ALIASES: Mapping[str, str] = MappingProxyType({"A100-80": "A100-40"})
_Fit = tuple[tuple[float, float, float], float]  # ((a, b, c) GB/s fit, max bytes/s)


def _fit(value: Any, *, source: str, field: str) -> _Fit:
    """Validate one ``[[a, b, c], max_bw]`` fit."""
    ok = (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list) and len(value[0]) == 3
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                  for x in (*value[0], value[1])))
    if not ok:
        raise HppInputError(f"expected [[a, b, c], max_bytes_per_s], got {str(value)[:80]}", source=source,
                            field=field, fix="give a quadratic fit in GB/s and a peak in bytes/s")
    if not value[1] > 0:
        raise HppInputError(f"peak bandwidth is {value[1]} bytes/s", source=source, field=field,
                            fix="give a bandwidth > 0 bytes/s")
    return (float(value[0][0]), float(value[0][1]), float(value[0][2])), float(value[1])


def _counts(d: Any, *, source: str, field: str) -> dict[int, Any]:
    if not isinstance(d, Mapping) or not d:
        raise HppInputError("expected a non-empty {device count: ...} object", source=source, field=field,
                            fix="give fits per device count")
    out = {}
    for k, v in d.items():
        if not (isinstance(k, str) and k.isdigit() and int(k) >= 1):
            raise HppInputError(f"device count {k!r} is not a positive integer", source=source,
                                field=f"{field}.{k}", fix="use counts 1, 2, 4, 8")
        out[int(k)] = v
    return out


def network_table_from_sailor(intra_path: str | Path, het_path: str | Path, *,
                              zone: str = NETWORK_ZONE) -> dict[str, Any]:
    """Extract the bundled network table from Sailor's two network files (used by the converter).

    Returns
    -------
    dict
        ``{"intra_node": {type: {count: fit}}, "inter_node": {src: {count: {dst: fit}}}}`` with
        ``fit = [[a, b, c], max_bytes_per_s]``; inter-node keeps only ``zone`` to ``zone`` and
        equal device counts on both sides.

    Raises
    ------
    HppInputError
        Missing/malformed files, non-positive peak bandwidths, an absent zone.
    """
    intra_src, het_src = str(intra_path), str(het_path)
    intra_raw = read_json(intra_path, what="intra-node bandwidth file")
    het_raw = read_json(het_path, what="inter-node bandwidth file")
    if not isinstance(intra_raw, Mapping) or not intra_raw:
        raise HppInputError("expected {gpu: {count: fit}}", source=intra_src, field="", fix="give intra-node fits")
    intra = {gpu: {str(n): [list(f[0]), f[1]] for n, f in sorted(
        (n, _fit(v, source=intra_src, field=f"{gpu}.{n}"))
        for n, v in _counts(per, source=intra_src, field=gpu).items())} for gpu, per in sorted(intra_raw.items())}
    if not isinstance(het_raw, Mapping) or zone not in het_raw:
        raise HppInputError(f"zone {zone!r} not found", source=het_src, field=zone,
                            fix="use a zone of the file")
    inter: dict[str, dict[str, dict[str, Any]]] = {}
    for src_gpu, per_count in sorted(het_raw[zone].items()):
        for n, per_zone in sorted(_counts(per_count, source=het_src, field=f"{zone}.{src_gpu}").items()):
            for dst_gpu, per_dst in sorted(per_zone.get(zone, {}).items()):
                field = f"{zone}.{src_gpu}.{n}.{zone}.{dst_gpu}.{n}"
                if str(n) in per_dst:
                    f = _fit(per_dst[str(n)], source=het_src, field=field)
                    inter.setdefault(src_gpu, {}).setdefault(str(n), {})[dst_gpu] = [list(f[0]), f[1]]
    return {"intra_node": intra, "inter_node": inter}


@functools.lru_cache(maxsize=1)
def _bundled_table() -> tuple[Mapping[str, Mapping[int, _Fit]], Mapping[str, Mapping[int, Mapping[str, _Fit]]]]:
    """Parse the bundled ``data/network.json`` once (immutable result)."""
    src = f"hpp/profiles/data/{NETWORK_DATA_FILE}"
    data = json.loads(resources.files("hpp.profiles").joinpath("data").joinpath(NETWORK_DATA_FILE).read_text())
    intra = {gpu: MappingProxyType({n: _fit(f, source=src, field=f"intra_node.{gpu}.{n}")
                                    for n, f in _counts(per, source=src, field=f"intra_node.{gpu}").items()})
             for gpu, per in data["intra_node"].items()}
    inter = {gpu: MappingProxyType({n: MappingProxyType({dst: _fit(f, source=src, field=f"inter_node.{gpu}.{n}.{dst}")
                                                         for dst, f in per_dst.items()})
                                    for n, per_dst in _counts(per, source=src, field=f"inter_node.{gpu}").items()})
             for gpu, per in data["inter_node"].items()}
    return MappingProxyType(intra), MappingProxyType(inter)


def _pick_count(measured: Iterable[int], num_devices: int) -> int:
    """Largest measured count <= ``num_devices``, else the smallest measured count."""
    ms = sorted(measured)
    below = [m for m in ms if m <= num_devices]
    return below[-1] if below else ms[0]


def _link(fit: _Fit, latency_s: float, aggregate: tuple[AggregateFit, ...] = ()) -> Link:
    return Link(max_bytes_per_s=fit[1], latency_s=latency_s, fit_gb_per_s=fit[0], aggregate=aggregate)


def _aggregate(a: str, b: str) -> tuple[AggregateFit, ...]:
    """The measured ``k -> k`` aggregate fits (k >= 2) between a node of inter-file type ``a`` and one of ``b``:
    per count measured in either direction, the slower direction's (least peak).

    Between two types, an entry that repeats that direction's ``1 -> 1`` fit exactly is a copy, not a
    measurement (the file fills A100-40 / V100-16 <-> GH-96 at every count with the one-flow figure); a count
    with no real measurement takes the slower of the two types' own ``k -> k`` figures (each node's network
    caps its flows: the fallback rule of :func:`default_inter_node_link`)."""
    _, inter = _bundled_table()
    out = []
    for k in sorted({n for src in (a, b) for n in inter[src] if n >= 2}):
        fits = [inter[src][k][dst] for src, dst in ((a, b), (b, a)) if k in inter[src] and dst in inter[src][k]
                and (a == b or inter[src].get(1, {}).get(dst) != inter[src][k][dst])]
        if not fits and a != b:
            fits = [inter[t][k][t] for t in (a, b) if k in inter[t] and t in inter[t][k]]
        if fits:
            fit = min(fits, key=lambda f: f[1])
            out.append(AggregateFit(k, fit[1], fit[0]))
    return tuple(out)


def _check_count(num_devices: int, field: str) -> None:
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise HppInputError(f"{field} is {num_devices!r}", field=field, fix="give a positive integer")


def default_intra_node_link(device_type: str, num_devices: int, *, latency_s: float = DEFAULT_LATENCY_S) -> Link:
    """Link between two devices of one node of ``num_devices`` devices of ``device_type``.

    Parameters
    ----------
    device_type : str
        A device type of the intra-node measurements (the seven bundled GPU types).
    num_devices : int
        Devices on the node (> 0); unmeasured counts follow the module's count rule.
    latency_s : float
        Per-message latency [s] (the measurements give none).

    Examples
    --------
    >>> link = default_intra_node_link("A100-40", 4)
    >>> round(link.max_bytes_per_s / 1e9, 1)
    243.2

    Raises
    ------
    HppInputError
        Unknown device type or non-positive ``num_devices``.
    """
    _check_count(num_devices, "num_devices")
    intra, _ = _bundled_table()
    if device_type not in intra:
        raise HppInputError(f"no intra-node bandwidth measurement for device type {device_type!r}",
                            field="device_type", fix=f"use one of {sorted(intra)} or give the link explicitly")
    per = intra[device_type]
    return _link(per[_pick_count(per, num_devices)], latency_s)


def default_inter_node_link(device_types: Iterable[str], *, num_devices: int = 1,
                            latency_s: float = DEFAULT_LATENCY_S) -> Link:
    """Link between devices of different nodes, for nodes of the given device types.

    Parameters
    ----------
    device_types : iterable of str
        The device types of the nodes the link joins (one or more; order irrelevant).
    num_devices : int
        Devices per node that send at the same time (default 1: one device to one device).
    latency_s : float
        Per-message latency [s].

    Returns
    -------
    Link
        The slowest link over all pairs of the types (module docstring).

    Examples
    --------
    >>> round(default_inter_node_link(["A100-40", "V100-16"]).max_bytes_per_s / 1e9, 2)
    1.72

    Raises
    ------
    HppInputError
        Empty ``device_types``, an unknown type, or non-positive ``num_devices``.
    """
    _check_count(num_devices, "num_devices")
    names = sorted(set(device_types))
    if not names:
        raise HppInputError("no device types given", field="device_types", fix="give at least one device type")
    types = [_inter_name(t) for t in names]
    fit, a, b = min(((_pair_fit(a, b, num_devices) or _fallback_fit(a, b, num_devices), a, b)
                     for a, b in product(types, types)), key=lambda f: f[0][1])
    return _link(fit, latency_s, _aggregate(a, b) if num_devices == 1 else ())


def _inter_name(t: str) -> str:
    """The inter-node file's name of device type ``t`` (through :data:`INTER_NODE_ALIASES`), checked."""
    _, inter = _bundled_table()
    mapped = INTER_NODE_ALIASES.get(t, t)
    if mapped not in inter:
        raise HppInputError(f"no inter-node bandwidth measurement for device type {t!r}", field="device_types",
                            fix=f"use one of {sorted(set(inter) | set(INTER_NODE_ALIASES))} "
                                "or give the link explicitly")
    return mapped


def _own_fit(t: str, num_devices: int) -> _Fit:
    _, inter = _bundled_table()
    per = inter[t]
    counts = [n for n in per if t in per[n]]
    return per[_pick_count(counts, num_devices)][t]


def _pair_fit(a: str, b: str, num_devices: int) -> _Fit | None:
    """The measured (a, b) fit (the slower direction where both are measured); None if unmeasured."""
    _, inter = _bundled_table()
    if a == b:
        return _own_fit(a, num_devices)
    measured = []
    for src, dst in ((a, b), (b, a)):
        counts = [n for n in inter[src] if dst in inter[src][n]]
        if counts:
            measured.append(inter[src][_pick_count(counts, num_devices)][dst])
    return min(measured, key=lambda f: f[1]) if measured else None


def _fallback_fit(a: str, b: str, num_devices: int) -> _Fit:
    """An unmeasured cross-type pair: the slower of the two types' own fits (module docstring)."""
    return min([_own_fit(a, num_devices), _own_fit(b, num_devices)], key=lambda f: f[1])


def default_pair_link(type_a: str, type_b: str, *, fallback: bool = False,
                      latency_s: float = DEFAULT_LATENCY_S) -> Link | None:
    """Sailor's measured inter-node link between a node of ``type_a`` and one of ``type_b`` (one device each).

    The type's own fit when ``type_a == type_b``; for two types the measured cross-type fit (the
    slower direction where both are measured).

    Parameters
    ----------
    fallback : bool
        An unmeasured cross-type pair: False returns None; True takes the slower of the two types'
        own fits (the rule of :func:`default_inter_node_link`).

    Examples
    --------
    >>> round(default_pair_link("A100-40", "GH-96").max_bytes_per_s / 1e9, 2)
    2.42
    >>> default_pair_link("A100-40", "RTX-2080") is None
    True

    Raises
    ------
    HppInputError
        A type without inter-node measurements.
    """
    a, b = _inter_name(type_a), _inter_name(type_b)
    fit = _pair_fit(a, b, 1)
    if fit is None and fallback:
        fit = _fallback_fit(a, b, 1)
        slower = a if _own_fit(a, 1) == fit else b
        return _link(fit, latency_s, _aggregate(slower, slower))
    return None if fit is None else _link(fit, latency_s, _aggregate(a, b))


def has_measurements(device_type: str) -> bool:
    """True if the bundled fits cover ``device_type`` (intra- and inter-node)."""
    intra, inter = _bundled_table()
    return device_type in intra and INTER_NODE_ALIASES.get(device_type, device_type) in inter


def default_network(nodes: Sequence[Node], *, latency_s: float = DEFAULT_LATENCY_S
                    ) -> tuple[NetworkLinks, Link]:
    """Version-2 links of bundled-type nodes from the measured fits (unmeasured pairs: the fallback rule).

    Returns
    -------
    (NetworkLinks, Link)
        The (type, type) links of every pair of the nodes' types, and the slowest of them
        (:attr:`Cluster.inter_node`; equal to :func:`default_inter_node_link` of the types).
    """
    types = sorted({n.device_type for n in nodes})
    inter = {(a, b): default_pair_link(a, b, fallback=True, latency_s=latency_s)
             for i, a in enumerate(types) for b in types[i:]}
    return NetworkLinks(MappingProxyType(inter)), default_inter_node_link(types, latency_s=latency_s)
