"""The cluster file: JSON forms (versions 1 and 2) of a :class:`~hpp.profiles.cluster.Cluster`.

Version 1 gives each node's intra-node link and one inter-node link. Version 2 gives links per
pair of node groups (device type, and optionally zone): ``links.intra_node`` per type,
``links.inter_node`` per pair of types, ``links.zones`` per pair of zones; links of the bundled GPU
types that the file leaves out are Sailor's measured fits (:mod:`hpp.profiles.network`, eth-easl/sailor
cf2c8e3, MIT). Both are described in :data:`CLUSTER_FORMAT_HELP` and ``docs/CLUSTER.md``. Every key is
checked: an unknown or misspelled one is refused, naming the closest valid key.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.fileio import check_keys, read_json, write_atomic
from hpp.profiles.cluster import DEFAULT_LATENCY_S, AggregateFit, Cluster, Link, NetworkLinks, Node, _pair, _slowest
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES, DeviceType, device_type_from_dict, device_type_to_dict
from hpp.profiles.network import default_intra_node_link, default_pair_link, has_measurements

__all__ = ["CLUSTER_FORMAT_HELP", "cluster_from_dict", "cluster_to_dict", "load_cluster", "save_cluster"]

#: The cluster file format, for users (``hpp plan --help`` shows it; docs/CLUSTER.md has the same text).
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
    intra_node_bandwidth_bytes_per_s (required in version 1): the link between two devices of the node.
  inter_node_bandwidth_bytes_per_s (version 1, required): the link between devices of different nodes.
  device_types (optional for bundled types): memory_bytes = memory of one device [bytes];
    gpus_per_node = the type's usual node size: `hpp scenarios` cuts GPU counts into nodes
    of it; in a cluster file each node's num_devices is what counts. A node with more
    devices than gpus_per_node is planned as one node of that many (TP groups up to its
    size, its intra-node link between all of them; hpp plan notes it). slowdown (>= 1,
    emulated CPU devices only): compute is padded to slowdown x the measured time.
  A link is bytes/s (a number) or {"max_bytes_per_s": peak, "latency_s": s per message,
    "fit_gb_per_s": [a, b, c], "aggregate": [...]}: Sailor's measured fit, the bandwidth for one
    message of x bytes is (a*L^2 + b*L + c) GB/s with L = log2(x / 1e6), capped at the peak
    (without a fit, or where it is not positive: always the peak). These are ONE flow's figures.
    aggregate (optional): [{"flows": 4, "max_bytes_per_s": 6.04e9, "fit_gb_per_s": [a, b, c]}, ...]
    the total bandwidth of k flows between two nodes at once (k devices of one node to k of the
    other); flows leaving a node at once share it (linear between counts, flat above the largest).
    Without it (and without nic_bytes_per_s) flows do not share: hpp plan says so. The bundled
    types' measured links carry Sailor's k -> k figures; `hpp profile-network` measures yours.
  nic_bytes_per_s (optional, per node; version 2 also links.nic_bytes_per_s {type: bytes/s}):
    the node's network capacity, the total of all flows leaving it at once.
  latency_s (optional, default 1e-05): per-message latency of links given as numbers.
  format, version (1 or 2), name, description: optional. Unknown keys are refused.
  version 2: links per pair of node groups instead of one inter-node link:
   {"version": 2, "zones": ["zone-a", "zone-b"],
    "nodes": [{"device_type": "A100-40", "num_devices": 4, "zone": "zone-a"}, ...],
    "links": {"intra_node": {"A100-40": 2.4e11},
              "inter_node": [{"between": ["A100-40", "V100-16"], "link": 1.7e9}],
              "zones": [{"between": ["zone-a", "zone-b"], "link": 5e8}]}}
    links.intra_node: per device type (a node's own intra_node_bandwidth_bytes_per_s wins);
    links.inter_node: per pair of device types (both orders; [A, A] between two A nodes);
    links.zones: per pair of different zones (nodes in different zones use it);
    zones, nodes[i].zone: optional (all nodes or none). Bundled types' links that are left
    out are Sailor's measured fits (one device to one device); a pair without a link and
    without a measurement is refused, naming the pair."""

_TOP_KEYS = ("format", "version", "name", "description", "device_types", "nodes",
             "inter_node_bandwidth_bytes_per_s", "latency_s")
_TOP_KEYS_V2 = ("format", "version", "name", "description", "device_types", "zones", "nodes", "links", "latency_s")
_NODE_KEYS = ("device_type", "num_devices", "intra_node_bandwidth_bytes_per_s", "nic_bytes_per_s")
_NODE_KEYS_V2 = _NODE_KEYS + ("zone",)
_LINKS_KEYS = ("intra_node", "inter_node", "zones", "nic_bytes_per_s")
_PAIR_KEYS = ("between", "link")
_TYPE_KEYS = ("memory_bytes", "gpus_per_node", "slowdown")
_LINK_KEYS = ("max_bytes_per_s", "latency_s", "fit_gb_per_s", "aggregate")
_AGGREGATE_KEYS = ("flows", "max_bytes_per_s", "fit_gb_per_s")
#: Keys users write for a node's device count or type that difflib does not map well.
_NODE_ALIASES = {"gpus": "num_devices", "num_gpus": "num_devices", "gpus_per_node": "num_devices",
                 "count": "num_devices", "devices": "num_devices", "n": "num_devices",
                 "type": "device_type", "gpu": "device_type", "gpu_type": "device_type"}


def _fit_from(value: Mapping, *, source: str, field_name: str) -> tuple[float, float, float] | None:
    fit = value.get("fit_gb_per_s")
    if fit is not None and (not isinstance(fit, list) or len(fit) != 3
                            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in fit)):
        raise HppInputError(f"fit_gb_per_s={fit!r}", source=source, field=f"{field_name}.fit_gb_per_s",
                            fix="give three numbers [a, b, c]: (a*L^2 + b*L + c) GB/s at L = log2(bytes / 1e6)")
    return None if fit is None else (float(fit[0]), float(fit[1]), float(fit[2]))


def _aggregate_from(value: Any, *, source: str, field_name: str) -> tuple[AggregateFit, ...]:
    """The ``aggregate`` list of a link object: checked entries, by increasing flow count."""
    if not isinstance(value, list):
        raise HppInputError(f"aggregate={str(value)[:60]}", source=source, field=field_name,
                            fix='give a list [{"flows": K, "max_bytes_per_s": BYTES_PER_S}, ...]')
    out = []
    for k, e in enumerate(value):
        where = f"{field_name}[{k}]"
        if not isinstance(e, Mapping):
            raise HppInputError(f"expected an object, got {str(e)[:60]}", source=source, field=where,
                                fix='give {"flows": K, "max_bytes_per_s": BYTES_PER_S, "fit_gb_per_s": [a, b, c]}')
        check_keys(e, _AGGREGATE_KEYS, source=source, where=f"{where}.")
        for key in ("flows", "max_bytes_per_s"):
            if key not in e:
                raise HppInputError(f"no {key}", source=source, field=f"{where}.{key}",
                                    fix="give the flow count (>= 2) and their total bandwidth in bytes/s")
        flows, bw = e["flows"], e["max_bytes_per_s"]
        if isinstance(bw, bool) or not isinstance(bw, (int, float)):
            raise HppInputError(f"max_bytes_per_s={bw!r}", source=source, field=f"{where}.max_bytes_per_s",
                                fix="give the total bandwidth of the flows in bytes/s, > 0")
        try:
            out.append(AggregateFit(flows, float(bw), _fit_from(e, source=source, field_name=where)))
        except HppInputError as exc:
            raise HppInputError(exc.message, source=source, fix=exc.fix, field=f"{where}.{exc.field}") from None
    counts = [a.flows for a in out]
    if len(set(counts)) != len(counts):
        raise HppInputError(f"flow counts {counts} repeat", source=source, field=field_name,
                            fix="give each flow count once")
    return tuple(sorted(out, key=lambda a: a.flows))


def _link_from(value: Any, *, source: str, field_name: str, default_latency_s: float) -> Link:
    if isinstance(value, Mapping):
        check_keys(value, _LINK_KEYS, source=source, where=f"{field_name}.")
        fit = _fit_from(value, source=source, field_name=field_name)
        aggregate = (_aggregate_from(value["aggregate"], source=source, field_name=f"{field_name}.aggregate")
                     if "aggregate" in value else ())
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return Link(float(value), default_latency_s)
        if isinstance(value, Mapping):
            return Link(float(value["max_bytes_per_s"]), float(value.get("latency_s", default_latency_s)),
                        fit, aggregate)
    except HppInputError as exc:            # the Link's own check, named at the key it is about in an object
        raise HppInputError(exc.message, source=source, fix=exc.fix,
                            field=f"{field_name}.{exc.field}" if isinstance(value, Mapping) else field_name) from None
    except (KeyError, TypeError, ValueError):
        pass
    raise HppInputError(f"bad link {value!r}", source=source, field=field_name,
                        fix="give bytes/s as a number > 0, or {\"max_bytes_per_s\": ..., \"fit_gb_per_s\": [a, b, c]}")


def _nic_from(value: Any, *, source: str, field_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise HppInputError(f"nic_bytes_per_s={value!r}", source=source, field=field_name,
                            fix="give the node's network capacity in bytes/s, a number > 0")
    return float(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def cluster_from_dict(d: Mapping[str, Any], *, source: str = "<dict>") -> Cluster:
    """Build a :class:`Cluster` from its JSON object (:data:`CLUSTER_FORMAT_HELP`), version 1 or 2.

    Raises
    ------
    HppInputError
        An unknown key anywhere (naming the closest valid key), a missing field (a node's
        ``num_devices`` included), unknown device types, non-positive counts or bandwidths;
        version 2: a pair of device types (or zones) the cluster holds without a link (naming
        the pair), an unknown zone.

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
    >>> c2 = cluster_from_dict({"version": 2, "nodes": [{"device_type": "A100-40", "num_devices": 4},
    ...                                                 {"device_type": "V100-16", "num_devices": 4}]})
    >>> round(c2.node_link(0, 1).max_bytes_per_s / 1e9, 2)      # Sailor's A100-40 <-> V100-16 fit
    1.72
    """
    if not isinstance(d, Mapping):
        raise HppInputError("a cluster must be a JSON object", source=source, fix="see `hpp plan --help`")
    version = d.get("version", 1)
    if version not in (1, 2) or isinstance(version, bool):
        raise HppInputError(f"version {version!r} is not supported", source=source, field="version",
                            fix="use version 1 (one inter-node link) or 2 (links per pair of node groups)")
    v2_only = [k for k in ("links", "zones") if k in d]
    if version == 1 and v2_only:                # the keys of version 2 in a file that does not say so
        said = "says version 1" if "version" in d else "has no version (1 by default)"
        raise HppInputError(f"{' and '.join(map(repr, v2_only))} belong to version 2 but the file {said}",
                            source=source, field="version", fix='add "version": 2')
    check_keys(d, _TOP_KEYS if version == 1 else _TOP_KEYS_V2, source=source, where="")
    if d.get("format", "hpp-cluster") != "hpp-cluster":
        raise HppInputError(f"format is {d['format']!r}, expected 'hpp-cluster'", source=source, field="format",
                            fix='set "format": "hpp-cluster" or leave it out')
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
        check_keys(td, _TYPE_KEYS, source=source, where=f"device_types.{name}.")
        types[name] = device_type_from_dict(name, td, source=source)
    if "nodes" not in d or not isinstance(d["nodes"], list):
        raise HppInputError("no 'nodes' list", source=source, field="nodes",
                            fix="add \"nodes\": [{\"device_type\": ..., \"num_devices\": ...}, ...]")
    if version == 1 and "inter_node_bandwidth_bytes_per_s" not in d:
        raise HppInputError("no inter-node bandwidth", source=source, field="inter_node_bandwidth_bytes_per_s",
                            fix="give the bandwidth between nodes in bytes/s (or use version 2 with links)")
    raw_nodes = [_node_fields(nd, i, types, version, source=source) for i, nd in enumerate(d["nodes"])]
    try:
        if version == 1:
            inter = _link_from(d["inter_node_bandwidth_bytes_per_s"], source=source,
                               field_name="inter_node_bandwidth_bytes_per_s", default_latency_s=latency)
            nodes = tuple(Node(dt, k, _link_from(intra, source=source, default_latency_s=latency,
                                                 field_name=f"nodes[{i}].intra_node_bandwidth_bytes_per_s"),
                               nic_bytes_per_s=_node_nic(d["nodes"][i], None, i, source=source))
                          for i, (dt, k, intra, _) in enumerate(raw_nodes))
            return Cluster(str(d.get("name", Path(source).stem)), types, nodes, inter)
        nodes, net, slowest = network_from_dict(d, raw_nodes, source=source, latency_s=latency)
        return Cluster(str(d.get("name", Path(source).stem)), types, nodes, slowest, net)
    except HppInputError as exc:
        raise exc.with_source(source) from None


def _node_nic(nd: Mapping, by_type: Mapping | None, i: int, *, source: str) -> float:
    """Node ``i``'s NIC capacity [bytes/s]: its own ``nic_bytes_per_s``, else its type's under
    ``links.nic_bytes_per_s`` (``by_type``), else inf."""
    if "nic_bytes_per_s" in nd:
        return _nic_from(nd["nic_bytes_per_s"], source=source, field_name=f"nodes[{i}].nic_bytes_per_s")
    t = nd.get("device_type")
    if by_type and t in by_type:
        return _nic_from(by_type[t], source=source, field_name=f"links.nic_bytes_per_s.{t}")
    return math.inf


def _node_fields(nd: Any, i: int, types: Mapping[str, DeviceType], version: int, *, source: str
                 ) -> tuple[str, int, Any, Any]:
    """(device type, count, raw intra link or None, zone or None) of node ``i``, checked."""
    if not isinstance(nd, Mapping):
        raise HppInputError(f"node {i} is not an object", source=source, field=f"nodes[{i}]",
                            fix='give {"device_type": ..., "num_devices": ..., '
                                '"intra_node_bandwidth_bytes_per_s": ...}')
    check_keys(nd, _NODE_KEYS if version == 1 else _NODE_KEYS_V2, source=source, where=f"nodes[{i}].",
                aliases=_NODE_ALIASES)
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
    if version == 1 and "intra_node_bandwidth_bytes_per_s" not in nd:
        raise HppInputError("no intra-node bandwidth", source=source,
                            field=f"nodes[{i}].intra_node_bandwidth_bytes_per_s",
                            fix="give the bandwidth between two devices of the node in bytes/s")
    zone = nd.get("zone")
    if zone is not None and not isinstance(zone, str):
        raise HppInputError(f"zone {zone!r} is not a string", source=source, field=f"nodes[{i}].zone",
                            fix="name the zone")
    return dt, count, nd.get("intra_node_bandwidth_bytes_per_s"), zone


def _link_to(link: Link) -> Any:
    out: dict[str, Any] = {"max_bytes_per_s": link.max_bytes_per_s, "latency_s": link.latency_s}
    if link.fit_gb_per_s is not None:
        out["fit_gb_per_s"] = list(link.fit_gb_per_s)
    if link.aggregate:
        out["aggregate"] = [{"flows": a.flows, "max_bytes_per_s": a.max_bytes_per_s}
                            | ({"fit_gb_per_s": list(a.fit_gb_per_s)} if a.fit_gb_per_s is not None else {})
                            for a in link.aggregate]
    return out


def cluster_to_dict(c: Cluster) -> dict[str, Any]:
    """JSON object of a cluster (inverse of :func:`cluster_from_dict`); embeds every used device type.

    A version-2 cluster is written with every link explicit (no defaults are needed to read it back).
    """
    used = sorted({n.device_type for n in c.nodes})
    out: dict[str, Any] = {"format": "hpp-cluster", "version": 1 if c.network is None else 2, "name": c.name,
                           "device_types": {t: device_type_to_dict(c.device_types[t]) for t in used}}
    nodes = []
    for n in c.nodes:
        nd: dict[str, Any] = {"device_type": n.device_type, "num_devices": n.num_devices,
                              "intra_node_bandwidth_bytes_per_s": _link_to(n.intra_node)}
        if n.zone is not None:
            nd["zone"] = n.zone
        if n.nic_bytes_per_s != math.inf:
            nd["nic_bytes_per_s"] = n.nic_bytes_per_s
        nodes.append(nd)
    if c.network is None:
        return out | {"nodes": nodes, "inter_node_bandwidth_bytes_per_s": _link_to(c.inter_node)}
    net = c.network
    if net.zones:
        out["zones"] = list(net.zones)
    out["nodes"] = nodes
    out["links"] = {"inter_node": [{"between": list(k), "link": _link_to(v)} for k, v in sorted(net.inter.items())]}
    if net.zone_links:
        out["links"]["zones"] = [{"between": list(k), "link": _link_to(v)} for k, v in sorted(net.zone_links.items())]
    return out


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
    """Write ``c`` as JSON to ``path`` (:func:`hpp.fileio.write_atomic`: whole or not at all)."""
    write_atomic(path, json.dumps(cluster_to_dict(c), indent=2) + "\n")


def network_from_dict(d: Mapping[str, Any], raw_nodes: Sequence[tuple[str, int, Any, Any]], *, source: str,
                      latency_s: float) -> tuple[tuple[Node, ...], NetworkLinks, Link]:
    """The nodes, links and slowest inter-node link of a version-2 cluster object (``cluster_format``).

    ``raw_nodes``: per node (device type, count, its own intra-node link value or None, zone or None).
    Links the object leaves out are the measured defaults for bundled types (measured pairs only).

    Raises
    ------
    HppInputError
        Unknown keys, zones or device types in ``links``, a repeated pair, a bad link; a node whose
        type has no intra-node link. (Missing pairs are refused by :class:`Cluster`.)
    """
    zones = d.get("zones", [])
    if not isinstance(zones, list) or not all(isinstance(z, str) for z in zones) or len(set(zones)) != len(zones):
        raise HppInputError(f"zones={zones!r}", source=source, field="zones", fix="give a list of distinct zone names")
    links = d.get("links", {})
    if not isinstance(links, Mapping):
        raise HppInputError("links must be an object", source=source, field="links",
                            fix='give {"intra_node": {...}, "inter_node": [...], "zones": [...]}')
    check_keys(links, _LINKS_KEYS, source=source, where="links.")
    known = set(d.get("device_types") or {}) | set(BUNDLED_DEVICE_TYPES)
    present = sorted({t for t, *_ in raw_nodes})

    def link(value: Any, where: str) -> Link:
        return _link_from(value, source=source, field_name=where, default_latency_s=latency_s)

    intra_by_type = _by_type(links, "intra_node", known, present, source=source, what="link",
                             example='{"A100-40": 2.4e11}')

    nic_by_type = _by_type(links, "nic_bytes_per_s", known, present, source=source, what="bytes/s",
                           example='{"A100-40": 2.5e10}')
    inter = _pair_links(links, "inter_node", known, "device type", source=source, latency_s=latency_s)
    zone_links = _pair_links(links, "zones", set(zones), "zone", source=source, latency_s=latency_s)
    measured = [t for t in present if has_measurements(t)]
    defaulted = []
    for i, a in enumerate(measured):
        for b in measured[i:]:
            if (a, b) not in inter:
                got = default_pair_link(a, b, latency_s=latency_s)
                if got is not None:
                    inter[(a, b)] = got
                    defaulted.append(f"inter_node {a}-{b}")
    nodes = []
    for i, (t, k, own, zone) in enumerate(raw_nodes):
        if own is not None:
            intra = link(own, f"nodes[{i}].intra_node_bandwidth_bytes_per_s")
        elif t in intra_by_type:
            intra = link(intra_by_type[t], f"links.intra_node.{t}")
        elif has_measurements(t):
            intra = default_intra_node_link(t, k, latency_s=latency_s)
            if f"intra_node {t}" not in defaulted:
                defaulted.append(f"intra_node {t}")
        else:
            raise HppInputError(f"no intra-node link for device type {t!r} (no measurement to default to)",
                                source=source, field=f"links.intra_node.{t}",
                                fix=f'add "{t}": BYTES_PER_S under links.intra_node')
        nodes.append(Node(t, k, intra, zone, _node_nic(d["nodes"][i], nic_by_type, i, source=source)))
    used = [l for (a, b), l in inter.items() if a in present and b in present]
    used += [l for (a, b), l in zone_links.items() if any(n.zone == a for n in nodes) and any(n.zone == b
                                                                                             for n in nodes)]
    slowest = _slowest(used) if used else nodes[0].intra_node
    used_pairs = {f"inter_node {a}-{b}" for (a, b) in inter if a in present and b in present and
                  (a != b or sum(1 for n in nodes if n.device_type == a) > 1)}
    defaulted = [x for x in defaulted if x.startswith("intra_node") or x in used_pairs]
    return tuple(nodes), NetworkLinks(MappingProxyType(inter), MappingProxyType(zone_links), tuple(zones),
                                      tuple(defaulted)), slowest


def _pair_links(links: Mapping[str, Any], key: str, names: set[str], what: str, *, source: str,
                latency_s: float) -> dict[tuple[str, str], Link]:
    """``links[key]``: a list of ``{"between": [A, B], "link": ...}`` over names ``names`` (device types or zones,
    ``what`` says which) -> {sorted pair: link}; every entry checked (one-line errors naming the entry)."""
    out: dict[tuple[str, str], Link] = {}
    entries = links.get(key, [])
    if not isinstance(entries, list):
        raise HppInputError(f"links.{key} must be a list", source=source, field=f"links.{key}",
                            fix='give [{"between": [A, B], "link": BYTES_PER_S}, ...]')
    for k, e in enumerate(entries):
        where = f"links.{key}[{k}]"
        if isinstance(e, Mapping):
            check_keys(e, _PAIR_KEYS, source=source, where=f"{where}.")     # a typo is named first
        if not isinstance(e, Mapping) or "between" not in e or "link" not in e:
            raise HppInputError(f"expected {{\"between\": [A, B], \"link\": ...}}, got {str(e)[:60]}",
                                source=source, field=where, fix="give the pair and its link")
        pair = e["between"]
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise HppInputError(f"between={pair!r}", source=source, field=f"{where}.between",
                                fix=f"name two {what}s")
        for x in pair:
            if x not in names:
                raise HppInputError(f"unknown {what} {x!r}", source=source, field=f"{where}.between",
                                    fix=f"use one of {sorted(names)}" + (" or declare it under zones"
                                                                          if what == "zone" else ""))
        if what == "zone" and pair[0] == pair[1]:
            raise HppInputError(f"a zone link joins two different zones, got {pair}", source=source,
                                field=f"{where}.between",
                                fix="nodes of one zone use links.inter_node; drop this entry")
        key2 = _pair(*pair)
        if key2 in out:
            raise HppInputError(f"the pair {list(key2)} is given twice", source=source, field=where,
                                fix="give each pair once (order does not matter)")
        out[key2] = _link_from(e["link"], source=source, field_name=f"{where}.link",
                               default_latency_s=latency_s)
    return out


def _by_type(links: Mapping[str, Any], key: str, known: set[str], present: list[str], *, source: str,
             what: str, example: str) -> Mapping[str, Any]:
    """``links[key]``: an object {device type: value} whose types are known ({} when absent).

    Raises
    ------
    HppInputError
        Not an object, or an unknown device type (naming the types the cluster has).
    """
    got = links.get(key, {})
    if not isinstance(got, Mapping):
        raise HppInputError(f"links.{key} must be an object {{device type: {what}}}", source=source,
                            field=f"links.{key}", fix=f"e.g. {example}")
    for t in got:
        if t not in known:
            raise HppInputError(f"unknown device type {t!r}", source=source, field=f"links.{key}.{t}",
                                fix=f"use one of {present}")
    return got
