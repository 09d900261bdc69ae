"""Clusters: nodes of devices of one type, and the links between them.

A cluster is a tuple of nodes; node ``n`` holds ``num_devices`` devices of one
device type. Devices get global ids (ranks) node by node: node 0's devices are
``0 .. k0-1``, node 1's are ``k0 .. k0+k1-1`` and so on.

Bandwidths are :class:`Link` models: a peak in bytes/s, a latency in seconds and
optionally Sailor's measured fit (``network/*.json`` in the public data), where the
bandwidth for a message of ``x`` bytes is ``(a*L^2 + b*L + c) GB/s`` with
``L = log2(x / 1e6)``, capped at the peak.

JSON form (version 1)::

    {"format": "hpp-cluster", "version": 1, "name": "...",
     "device_types": {"A100-40": {"memory_bytes": ..., "gpus_per_node": 4}, ...},
     "nodes": [{"device_type": "A100-40", "num_devices": 4,
                "intra_node_bandwidth_bytes_per_s": 2.4e11}, ...],
     "inter_node_bandwidth_bytes_per_s": 2.4e9, "latency_s": 1e-5}

``device_types`` may be omitted for the bundled GPU types; a link may be given as
an object ``{"max_bytes_per_s": ..., "fit_gb_per_s": [a, b, c], "latency_s": ...}``
instead of a number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.fileio import read_json
from hpp.profiles.devices import (BUNDLED_DEVICE_TYPES, DeviceType, device_type_from_dict,
                                  device_type_to_dict)

__all__ = ["Link", "Node", "Device", "Cluster", "cluster_from_dict", "cluster_to_dict",
           "load_cluster", "save_cluster", "DEFAULT_LATENCY_S"]

#: Default per-message latency [s] when a cluster gives none (order of a NCCL/ethernet hop).
DEFAULT_LATENCY_S = 1e-5
_BYTES_PER_GB = 1e9


@dataclass(frozen=True, slots=True)
class Link:
    """Bandwidth model of a link.

    Attributes
    ----------
    max_bytes_per_s : float
        Peak bandwidth [bytes/s], > 0.
    latency_s : float
        Fixed cost per message [s], >= 0.
    fit_gb_per_s : tuple of 3 floats or None
        Sailor's quadratic fit ``(a, b, c)``: bandwidth [GB/s] for a message of ``x``
        bytes is ``a L^2 + b L + c`` with ``L = log2(x / 1e6)``. ``None`` = always the peak.
    """

    max_bytes_per_s: float
    latency_s: float = DEFAULT_LATENCY_S
    fit_gb_per_s: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        if not (self.max_bytes_per_s > 0 and math.isfinite(self.max_bytes_per_s)):
            raise HppInputError(f"bandwidth must be a positive number of bytes/s, got {self.max_bytes_per_s}",
                                fix="give a bandwidth > 0 in bytes/s")
        if not self.latency_s >= 0:
            raise HppInputError(f"latency must be >= 0 s, got {self.latency_s}", fix="give latency_s >= 0")

    def bandwidth_bytes_per_s(self, message_bytes: float) -> float:
        """Effective bandwidth [bytes/s] for one message of ``message_bytes`` bytes.

        Source: Sailor's network fits (``network/multizone_bandwidths_het.json``).
        Falls back to the peak when no fit is given or the fit is not positive.
        """
        if self.fit_gb_per_s is None or message_bytes <= 0:
            return self.max_bytes_per_s
        x = math.log2(max(message_bytes, 1.0) / 1e6)
        a, b, c = self.fit_gb_per_s
        bw = (a * x * x + b * x + c) * _BYTES_PER_GB
        if bw <= 0:
            return self.max_bytes_per_s
        return min(bw, self.max_bytes_per_s)

    def transfer_s(self, message_bytes: float) -> float:
        """Time [s] to send one message of ``message_bytes`` bytes: latency + bytes / bandwidth."""
        if message_bytes <= 0:
            return 0.0
        return self.latency_s + message_bytes / self.bandwidth_bytes_per_s(message_bytes)


@dataclass(frozen=True, slots=True)
class Node:
    """A host with ``num_devices`` devices of one type.

    Attributes
    ----------
    device_type : str
        Key into :attr:`Cluster.device_types`.
    num_devices : int
        Devices on this node, > 0.
    intra_node : Link
        Link between two devices of this node.
    """

    device_type: str
    num_devices: int
    intra_node: Link


@dataclass(frozen=True, slots=True)
class Device:
    """One physical device: global id (rank), node index, index inside the node, type name."""

    device_id: int
    node: int
    local_index: int
    device_type: str


@dataclass(frozen=True)
class Cluster:
    """Nodes of devices, device types and the inter-node link.

    Attributes
    ----------
    name : str
    device_types : Mapping[str, DeviceType]
    nodes : tuple[Node, ...]
    inter_node : Link
        Link between devices of different nodes.
    """

    name: str
    device_types: Mapping[str, DeviceType]
    nodes: tuple[Node, ...]
    inter_node: Link
    _cache: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise HppInputError(f"cluster {self.name!r} has no nodes", field="nodes",
                                fix="list at least one node")
        for i, n in enumerate(self.nodes):
            if n.device_type not in self.device_types:
                raise HppInputError(f"unknown device type {n.device_type!r}", field=f"nodes[{i}].device_type",
                                    fix=f"use one of {sorted(self.device_types)} or add it under device_types")
            if n.num_devices <= 0:
                raise HppInputError(f"node {i} has num_devices={n.num_devices}", field=f"nodes[{i}].num_devices",
                                    fix="give a positive number of devices")

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        """All devices, numbered node by node (global ids = ranks)."""
        out: list[Device] = []
        for n, node in enumerate(self.nodes):
            for j in range(node.num_devices):
                out.append(Device(len(out), n, j, node.device_type))
        return tuple(out)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def device(self, device_id: int) -> Device:
        """The device with global id ``device_id``; raises ``IndexError`` if there is none."""
        if not 0 <= device_id < len(self.devices):
            raise IndexError(f"device id {device_id} not in [0, {len(self.devices)})")
        return self.devices[device_id]

    def count_by_type(self) -> dict[str, int]:
        """Number of devices per device type."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.device_type] = out.get(n.device_type, 0) + n.num_devices
        return out

    def link(self, a: int, b: int) -> Link:
        """The link between devices ``a`` and ``b`` (intra-node if they share a node)."""
        da, db = self.devices[a], self.devices[b]
        if da.node == db.node:
            return self.nodes[da.node].intra_node
        return self.inter_node

    def slowest_link(self, device_ids: "list[int] | tuple[int, ...]") -> Link:
        """The link of least peak bandwidth among all pairs of ``device_ids`` (one node => intra)."""
        nodes = {self.devices[d].node for d in device_ids}
        if len(nodes) == 1:
            return self.nodes[next(iter(nodes))].intra_node
        return self.inter_node


def _link_from(value: Any, *, source: str, field_name: str, default_latency_s: float) -> Link:
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return Link(float(value), default_latency_s)
        if isinstance(value, Mapping):
            fit = value.get("fit_gb_per_s")
            return Link(float(value["max_bytes_per_s"]), float(value.get("latency_s", default_latency_s)),
                        tuple(float(x) for x in fit) if fit is not None else None)  # type: ignore[arg-type]
    except HppInputError as exc:
        raise HppInputError(exc.message, source=source, field=field_name, fix=exc.fix) from None
    except (KeyError, TypeError, ValueError):
        pass
    raise HppInputError(f"bad link {value!r}", source=source, field=field_name,
                        fix="give bytes/s as a number > 0, or {\"max_bytes_per_s\": ..., \"fit_gb_per_s\": [a, b, c]}")


def cluster_from_dict(d: Mapping[str, Any], *, source: str = "<dict>") -> Cluster:
    """Build a :class:`Cluster` from its JSON object (see the module docstring).

    Raises
    ------
    HppInputError
        Missing fields, unknown device types, non-positive counts or bandwidths.
    """
    if not isinstance(d, Mapping):
        raise HppInputError("a cluster must be a JSON object", source=source, fix="see hpp/profiles/cluster.py")
    latency = d.get("latency_s", DEFAULT_LATENCY_S)
    types: dict[str, DeviceType] = dict(BUNDLED_DEVICE_TYPES)
    for name, td in (d.get("device_types") or {}).items():
        types[name] = device_type_from_dict(name, td, source=source)
    if "nodes" not in d or not isinstance(d["nodes"], list):
        raise HppInputError("no 'nodes' list", source=source, field="nodes",
                            fix="add \"nodes\": [{\"device_type\": ..., \"num_devices\": ...}, ...]")
    if "inter_node_bandwidth_bytes_per_s" not in d:
        raise HppInputError("no inter-node bandwidth", source=source, field="inter_node_bandwidth_bytes_per_s",
                            fix="give the bandwidth between nodes in bytes/s")
    inter = _link_from(d["inter_node_bandwidth_bytes_per_s"], source=source,
                       field_name="inter_node_bandwidth_bytes_per_s", default_latency_s=latency)
    nodes = []
    for i, nd in enumerate(d["nodes"]):
        if not isinstance(nd, Mapping) or "device_type" not in nd:
            raise HppInputError("node without device_type", source=source, field=f"nodes[{i}].device_type",
                                fix="name the node's device type")
        dt = nd["device_type"]
        if dt not in types:
            raise HppInputError(f"unknown GPU type {dt!r}", source=source, field=f"nodes[{i}].device_type",
                                fix=f"use one of {sorted(types)} or define it under device_types")
        count = nd.get("num_devices", types[dt].gpus_per_node)
        if not isinstance(count, int) or count <= 0:
            raise HppInputError(f"num_devices={count!r}", source=source, field=f"nodes[{i}].num_devices",
                                fix="give a positive integer")
        if "intra_node_bandwidth_bytes_per_s" not in nd:
            raise HppInputError("no intra-node bandwidth", source=source,
                                field=f"nodes[{i}].intra_node_bandwidth_bytes_per_s",
                                fix="give the bandwidth between two devices of the node in bytes/s")
        intra = _link_from(nd["intra_node_bandwidth_bytes_per_s"], source=source,
                           field_name=f"nodes[{i}].intra_node_bandwidth_bytes_per_s", default_latency_s=latency)
        nodes.append(Node(dt, count, intra))
    try:
        return Cluster(str(d.get("name", Path(source).stem)), types, tuple(nodes), inter)
    except HppInputError as exc:
        raise exc.with_source(source) from None


def _link_to(link: Link) -> Any:
    out: dict[str, Any] = {"max_bytes_per_s": link.max_bytes_per_s, "latency_s": link.latency_s}
    if link.fit_gb_per_s is not None:
        out["fit_gb_per_s"] = list(link.fit_gb_per_s)
    return out


def cluster_to_dict(c: Cluster) -> dict[str, Any]:
    """JSON object of a cluster (inverse of :func:`cluster_from_dict`); embeds every used device type."""
    used = sorted({n.device_type for n in c.nodes})
    return {
        "format": "hpp-cluster",
        "version": 1,
        "name": c.name,
        "device_types": {t: device_type_to_dict(c.device_types[t]) for t in used},
        "nodes": [{"device_type": n.device_type, "num_devices": n.num_devices,
                   "intra_node_bandwidth_bytes_per_s": _link_to(n.intra_node)} for n in c.nodes],
        "inter_node_bandwidth_bytes_per_s": _link_to(c.inter_node),
    }


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster JSON file.

    Raises
    ------
    HppInputError
        The file is missing, is not JSON, or fails validation (the message names the file and field).
    """
    p = Path(path)
    data = read_json(p, what="cluster file")
    return cluster_from_dict(data, source=str(p))


def save_cluster(c: Cluster, path: str | Path) -> None:
    """Write ``c`` as JSON to ``path``."""
    Path(path).write_text(json.dumps(cluster_to_dict(c), indent=2) + "\n")
