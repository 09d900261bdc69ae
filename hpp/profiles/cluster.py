"""Clusters: nodes of devices of one type, and the links between them.

A cluster is a tuple of nodes; node ``n`` holds ``num_devices`` devices of one
device type. Devices get global ids (ranks) node by node: node 0's devices are
``0 .. k0-1``, node 1's are ``k0 .. k0+k1-1`` and so on.

Bandwidths are :class:`Link` models: a peak in bytes/s, a latency in seconds and
optionally Sailor's measured fit (``network/*.json`` in the public data), where the
bandwidth for a message of ``x`` bytes is ``(a*L^2 + b*L + c) GB/s`` with
``L = log2(x / 1e6)``, capped at the peak.

JSON form (version 1): see :data:`CLUSTER_FORMAT_HELP` (also in ``hpp plan --help``).
Every key is checked: an unknown or misspelled one is refused, naming the closest valid key.
"""

from __future__ import annotations

import difflib
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
           "load_cluster", "save_cluster", "cluster_notes", "DEFAULT_LATENCY_S", "CLUSTER_FORMAT_HELP"]

#: Default per-message latency [s] when a cluster gives none (order of a NCCL/ethernet hop).
DEFAULT_LATENCY_S = 1e-5
_BYTES_PER_GB = 1e9

#: The cluster file format, for users (``hpp plan --help`` shows it; the README has the same text).
CLUSTER_FORMAT_HELP = """\
cluster file (--cluster FILE; JSON; `hpp scenarios --cluster NAME` prints one to edit):
  {"format": "hpp-cluster", "version": 1, "name": "my-cluster",
   "device_types": {"A100-40": {"memory_bytes": 42338615296, "gpus_per_node": 4}},
   "nodes": [{"device_type": "A100-40", "num_devices": 4,
              "intra_node_bandwidth_bytes_per_s": 2.4e11},
             {"device_type": "V100-16", "num_devices": 4,
              "intra_node_bandwidth_bytes_per_s": {"max_bytes_per_s": 1.5e11,
                                                   "fit_gb_per_s": [0.5, 10.0, 40.0]}}],
   "inter_node_bandwidth_bytes_per_s": 2.5e10, "latency_s": 1e-05}
  nodes (required): one entry per host; devices get ids (ranks) node by node.
    device_type: a bundled type (A100-40, A100-80, V100-16, GH-96, Titan-RTX, RTX-2080,
      RTX-3090) or one defined under device_types; the profile must cover it.
    num_devices (required): the devices this node has. A TP group and the intra-node link
      stay inside one node.
    intra_node_bandwidth_bytes_per_s (required): the link between two devices of the node.
  inter_node_bandwidth_bytes_per_s (required): the link between devices of different nodes.
  device_types (optional for bundled types): memory_bytes = memory of one device [bytes];
    gpus_per_node = the type's usual node size: `hpp scenarios` cuts GPU counts into nodes
    of it; in a cluster file each node's num_devices is what counts. A node with more
    devices than gpus_per_node is planned as one node of that many (TP groups up to its
    size, its intra-node link between all of them; hpp plan notes it). slowdown (>= 1,
    emulated CPU devices only): compute is padded to slowdown x the measured time.
  A link is bytes/s (a number) or {"max_bytes_per_s": peak, "latency_s": s per message,
    "fit_gb_per_s": [a, b, c]}: Sailor's measured fit, the bandwidth for one message of x
    bytes is (a*L^2 + b*L + c) GB/s with L = log2(x / 1e6), capped at the peak (without a
    fit, or where it is not positive: always the peak).
  latency_s (optional, default 1e-05): per-message latency of links given as numbers.
  format, version (1), name, description: optional. Unknown keys are refused."""

_TOP_KEYS = ("format", "version", "name", "description", "device_types", "nodes",
             "inter_node_bandwidth_bytes_per_s", "latency_s")
_NODE_KEYS = ("device_type", "num_devices", "intra_node_bandwidth_bytes_per_s")
_TYPE_KEYS = ("memory_bytes", "gpus_per_node", "slowdown")
_LINK_KEYS = ("max_bytes_per_s", "latency_s", "fit_gb_per_s")
#: Keys users write for a node's device count or type that difflib does not map well.
_NODE_ALIASES = {"gpus": "num_devices", "num_gpus": "num_devices", "gpus_per_node": "num_devices",
                 "count": "num_devices", "devices": "num_devices", "n": "num_devices",
                 "type": "device_type", "gpu": "device_type", "gpu_type": "device_type"}


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
    if isinstance(value, Mapping):
        _check_keys(value, _LINK_KEYS, source=source, where=f"{field_name}.")
        fit = value.get("fit_gb_per_s")
        if fit is not None and (not isinstance(fit, list) or len(fit) != 3
                                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in fit)):
            raise HppInputError(f"fit_gb_per_s={fit!r}", source=source, field=f"{field_name}.fit_gb_per_s",
                                fix="give three numbers [a, b, c]: (a*L^2 + b*L + c) GB/s at L = log2(bytes / 1e6)")
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


def _closest(key: str, valid: tuple[str, ...], aliases: Mapping[str, str] | None = None) -> str:
    """The valid key most like ``key`` (an alias first, then difflib's best ratio)."""
    if aliases and key.lower() in aliases:
        return aliases[key.lower()]
    return max(valid, key=lambda v: difflib.SequenceMatcher(None, key.lower(), v).ratio())


def _check_keys(d: Mapping[str, Any], valid: tuple[str, ...], *, source: str, where: str,
                aliases: Mapping[str, str] | None = None) -> None:
    """Refuse the first key of ``d`` not in ``valid``, naming the closest valid one (one line)."""
    unknown = [k for k in d if k not in valid]
    if not unknown:
        return
    key = str(unknown[0])
    more = f" (and {len(unknown) - 1} more: {', '.join(map(repr, unknown[1:4]))})" if len(unknown) > 1 else ""
    raise HppInputError(f"unknown key {key!r}{more}", source=source, field=f"{where}{key}",
                        fix=f"did you mean {_closest(key, valid, aliases)!r}? valid keys here: {', '.join(valid)}")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def cluster_from_dict(d: Mapping[str, Any], *, source: str = "<dict>") -> Cluster:
    """Build a :class:`Cluster` from its JSON object (:data:`CLUSTER_FORMAT_HELP`).

    Raises
    ------
    HppInputError
        An unknown key anywhere (naming the closest valid key), a missing field (a node's
        ``num_devices`` included), unknown device types, non-positive counts or bandwidths.

    Examples
    --------
    >>> c = cluster_from_dict({"nodes": [{"device_type": "A100-40", "num_devices": 2,
    ...                                   "intra_node_bandwidth_bytes_per_s": 2e11}],
    ...                        "inter_node_bandwidth_bytes_per_s": 2e10})
    >>> c.count_by_type()
    {'A100-40': 2}
    >>> try:
    ...     cluster_from_dict({"nodes": [{"device_type": "A100-40", "num_device": 2,
    ...                                   "intra_node_bandwidth_bytes_per_s": 2e11}],
    ...                        "inter_node_bandwidth_bytes_per_s": 2e10}, source="c.json")
    ... except HppInputError as exc:
    ...     print(exc.field, "->", exc.fix.split("?")[0])
    nodes[0].num_device -> did you mean 'num_devices'
    """
    if not isinstance(d, Mapping):
        raise HppInputError("a cluster must be a JSON object", source=source, fix="see `hpp plan --help`")
    _check_keys(d, _TOP_KEYS, source=source, where="")
    if d.get("format", "hpp-cluster") != "hpp-cluster":
        raise HppInputError(f"format is {d['format']!r}, expected 'hpp-cluster'", source=source, field="format",
                            fix='set "format": "hpp-cluster" or leave it out')
    if d.get("version", 1) != 1:
        raise HppInputError(f"version {d['version']!r} is not supported", source=source, field="version",
                            fix="use version 1")
    latency = d.get("latency_s", DEFAULT_LATENCY_S)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not latency >= 0:
        raise HppInputError(f"latency_s={latency!r}", source=source, field="latency_s",
                            fix="give the per-message latency in seconds, >= 0")
    types: dict[str, DeviceType] = dict(BUNDLED_DEVICE_TYPES)
    own = d.get("device_types") or {}
    if not isinstance(own, Mapping):
        raise HppInputError("device_types must be an object {name: {memory_bytes, gpus_per_node}}", source=source,
                            field="device_types", fix='e.g. {"A100-40": {"memory_bytes": 42338615296, '
                                                     '"gpus_per_node": 4}}')
    for name, td in own.items():
        if not isinstance(td, Mapping):
            raise HppInputError(f"device type {name!r} is not an object", source=source, field=f"device_types.{name}",
                                fix='give {"memory_bytes": BYTES, "gpus_per_node": N}')
        _check_keys(td, _TYPE_KEYS, source=source, where=f"device_types.{name}.")
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
        if not isinstance(nd, Mapping):
            raise HppInputError(f"node {i} is not an object", source=source, field=f"nodes[{i}]",
                                fix='give {"device_type": ..., "num_devices": ..., '
                                    '"intra_node_bandwidth_bytes_per_s": ...}')
        _check_keys(nd, _NODE_KEYS, source=source, where=f"nodes[{i}].", aliases=_NODE_ALIASES)
        if "device_type" not in nd:
            raise HppInputError("node without device_type", source=source, field=f"nodes[{i}].device_type",
                                fix="name the node's device type")
        dt = nd["device_type"]
        if dt not in types:
            near = difflib.get_close_matches(str(dt), list(types), n=1, cutoff=0.4)
            raise HppInputError(f"unknown GPU type {dt!r}", source=source, field=f"nodes[{i}].device_type",
                                fix=(f"did you mean {near[0]!r}? " if near else "")
                                + f"use one of {sorted(types)} or define it under device_types")
        if "num_devices" not in nd:
            raise HppInputError(f"node {i} ({dt}) gives no device count", source=source,
                                field=f"nodes[{i}].num_devices",
                                fix=f"add \"num_devices\": N, the devices this node has (e.g. "
                                    f"{types[dt].gpus_per_node}, the type's usual node size)")
        count = nd["num_devices"]
        if not _count(count):
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


def cluster_notes(cluster: Cluster) -> list[str]:
    """What the planner makes of unusual but valid nodes, one line each (empty list if nothing to say).

    A node with more devices than its type's ``gpus_per_node`` is accepted and planned as one
    node of that many devices: TP groups may be as large as the node allows (and the profile
    measured), and every pair of its devices uses the node's intra-node link.

    Examples
    --------
    >>> from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
    >>> c = Cluster("c", dict(BUNDLED_DEVICE_TYPES), (Node("A100-40", 6, Link(2e11)),), Link(2e10))
    >>> cluster_notes(c)[0].startswith("node 0 has 6 A100-40 devices, more than the type's gpus_per_node 4")
    True
    """
    big: dict[tuple[str, int], list[int]] = {}
    for i, n in enumerate(cluster.nodes):
        per = cluster.device_types[n.device_type].gpus_per_node
        if n.num_devices > per:
            big.setdefault((n.device_type, n.num_devices), []).append(i)
    out = []
    for (t, k), idx in big.items():
        per = cluster.device_types[t].gpus_per_node
        which = f"node {idx[0]} has" if len(idx) == 1 else \
            f"nodes {', '.join(map(str, idx[:5]))}{', ...' if len(idx) > 5 else ''} ({len(idx)}) have"
        out.append(f"{which} {k} {t} devices, more than the type's gpus_per_node {per}: planned as one node of "
                   f"{k} (TP groups up to {k} devices, the node's intra-node link between all of them); split it "
                   f"into nodes of {per} if each host has {per}")
    return out


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
