"""From the ranks' records to links: the fit of each measured link, the all-reduce check, the cluster file.

Pure functions over the records of :mod:`hpp.runtime.network.measure` (no I/O, no torch): what node rank 0
of ``hpp profile-network`` does once every measurement ended (:mod:`hpp.runtime.network.profile`).

- :func:`fit_links`: per link, the point-to-point round trips (the message, then a one-element
  acknowledgement) less one latency, fitted by :func:`hpp.profiles.network_fit.fit_link`; the all-reduces
  beside the cost model's ring on the fitted link (:func:`allreduce_check`);
- :func:`cluster_file`: the version-2 cluster object of the hosts and their fitted links, checked by reading
  it back.
"""

from __future__ import annotations

import json
import statistics
from typing import Any, Callable, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.formulation.collectives import ring_allreduce_s
from hpp.profiles.cluster import Cluster, Link, NetworkLinks, Node, _pair, _slowest
from hpp.profiles.cluster_format import cluster_from_dict, cluster_to_dict
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES, DeviceType
from hpp.profiles.network_fit import FlowTimes, LinkFit, fit_latency_s, fit_link
from hpp.runtime.network.hosts import HostInfo
from hpp.runtime.network.measure import LinkTask

__all__ = ["fit_links", "allreduce_check", "cluster_file", "link_summary"]


def _round_trips(records: Sequence[Mapping[str, Any]], op: str, stat: Callable[[Sequence[float]], float]
                 ) -> dict[tuple[int, int], dict[int, float]]:
    """``(flows, bytes) -> {flow: stat of its round trips [s]}`` of the ``op`` records."""
    out: dict[tuple[int, int], dict[int, float]] = {}
    for r in records:
        if r["op"] == op and r["seconds"]:
            out.setdefault((int(r["flows"]), int(r["bytes"])), {})[int(r["flow"])] = stat(r["seconds"])
    return out


def _one_way(records: Sequence[Mapping[str, Any]]) -> tuple[list[FlowTimes], list[FlowTimes], float]:
    """The one-way times of a link's point-to-point records: each round trip (the message, then a one-element
    acknowledgement) less one latency, the latency being half the intercept of the probes' round trips.

    A message size's time is the median of its repeats; a probe's the least of them: a tiny message's time is
    mostly waiting (for the receiver to be scheduled, on a busy host), which only ever adds, and the least
    repeat is the link's own latency. Returns (samples, latency probes, latency [s])."""
    probes = _round_trips(records, "probe", min)
    sizes = sorted(x for (_k, x) in probes)
    lat = fit_latency_s(sizes, [probes[(1, x)][0] for x in sizes]) / 2 if sizes else 0.0

    def one_way(rt: float) -> float:
        return rt - lat if rt > 2 * lat else rt / 2

    latency_samples = [FlowTimes(x, 1, (one_way(probes[(1, x)][0]),)) for x in sizes]
    samples = []
    for (k, x), flows in sorted(_round_trips(records, "p2p", statistics.median).items()):
        if sorted(flows) != list(range(k)):
            raise ValueError(f"the {k}-flow times of {x} bytes miss flows {sorted(set(range(k)) - set(flows))}")
        samples.append(FlowTimes(x, k, tuple(one_way(flows[j]) for j in range(k))))
    return samples, latency_samples, lat


def allreduce_check(records: Sequence[Mapping[str, Any]], link: Link, *, ranks_per_group: int
                    ) -> list[dict[str, Any]]:
    """The measured all-reduces of a link beside the cost model's ring on the fitted link.

    Per (flows ``k``, bytes): measured = the slowest group's median over repeats of its slowest member's time;
    predicted = :func:`hpp.formulation.collectives.ring_allreduce_s` of the bytes among ``ranks_per_group`` on
    ``link.shared(k)``; ``bus_bytes_per_s`` = ``2 (h-1)/h * bytes / measured`` (NCCL's bus bandwidth).
    """
    per: dict[tuple[int, int], dict[int, list[list[float]]]] = {}
    for r in records:
        if r["op"] == "allreduce" and r["seconds"]:
            per.setdefault((int(r["flows"]), int(r["bytes"])), {}).setdefault(int(r["flow"]), []).append(r["seconds"])
    out = []
    h = ranks_per_group
    for (k, x), groups in sorted(per.items()):
        measured = max(statistics.median(max(ts) for ts in zip(*members)) for members in groups.values())
        predicted = ring_allreduce_s(x, h, link.shared(k) if k > 1 else link)
        out.append({"flows": k, "ranks_per_group": h, "bytes": x, "measured_s": measured, "predicted_s": predicted,
                    "bus_bytes_per_s": 2 * (h - 1) / h * x / measured if measured > 0 else None})
    return out


def fit_links(tasks: Sequence[LinkTask], records: Sequence[Mapping[str, Any]], *, devices: Sequence[int]
              ) -> list[tuple[LinkTask, LinkFit, float, list[dict[str, Any]]]]:
    """Per task: its fitted link, the latency read from the probes [s] and the all-reduce check.

    Raises
    ------
    ValueError
        A task without usable times (a flow missing, every time at the latency), naming the link.
    """
    out = []
    for i, task in enumerate(tasks):
        mine = [r for r in records if int(r["task"]) == i]
        samples, probes, lat = _one_way(mine)
        try:
            fitted = fit_link(samples, latency_samples=probes)
        except ValueError as exc:
            raise ValueError(f"{task.name}: {exc}") from None
        h = devices[task.node_a] if task.kind == "intra_node" else 2
        out.append((task, fitted, lat, allreduce_check(mine, fitted.link, ranks_per_group=h)))
    return out


def cluster_file(hosts: Sequence[HostInfo], fitted: Sequence[tuple[LinkTask, LinkFit, float, Any]], *, name: str,
                 description: str) -> tuple[dict[str, Any], list[str]]:
    """The version-2 cluster object of the measured hosts and links, and the notes on what it could not measure.

    Nodes are the hosts by node rank; ``links.intra_node`` per device type; ``links.inter_node`` per pair of
    types; ``links.zones`` per pair of zones. A type whose nodes all have one device has no intra-node link to
    measure (and none is ever used: no two devices share such a node): it gets its inter-node link (the slowest
    measured one that involves the type), and a note says so. Bundled device types keep their bundled memory;
    others get the hosts' (the least over the hosts of that type) and their largest node as ``gpus_per_node``.

    Raises
    ------
    HppInputError
        The object does not load back (:func:`hpp.profiles.cluster_format.cluster_from_dict`): a bug, not input.
    """
    notes: list[str] = []
    intra = {t.between[0]: f.link for t, f, _l, _a in fitted if t.kind == "intra_node"}
    inter = {_pair(*t.between): f.link for t, f, _l, _a in fitted if t.kind == "inter_node"}
    zone_links = {_pair(*t.between): f.link for t, f, _l, _a in fitted if t.kind == "zones"}
    types: dict[str, DeviceType] = dict(BUNDLED_DEVICE_TYPES)
    for t in sorted({h.device_type for h in hosts}):
        mine = [h for h in hosts if h.device_type == t]
        if t not in BUNDLED_DEVICE_TYPES:
            types[t] = DeviceType(t, min(h.memory_bytes for h in mine), max(h.num_devices for h in mine))
            notes.append(f"device type {t} is not bundled: memory_bytes {types[t].memory_bytes} is the hosts' "
                         f"(a GPU's memory, or on CPU the host's memory / its devices) and gpus_per_node "
                         f"{types[t].gpus_per_node} its largest node; edit them in the file if they should differ")
        if t not in intra:
            involved = [link for pair, link in inter.items() if t in pair] + list(zone_links.values())
            if not involved:
                raise HppInputError(f"nodes of {t} have one device and no other node: nothing to measure",
                                    field="hosts", fix="measure a cluster of two devices or more")
            intra[t] = _slowest(involved)
            notes.append(f"every {t} node has one device: no intra-node link to measure (none is used); the file "
                         f"gives it the {t} inter-node link")
    present = sorted({h.device_type for h in hosts})
    for ia, a in enumerate(present):          # types that meet only across zones: their pair's link is never used
        for b in present[ia:]:
            na = [h for h in hosts if h.device_type == a]
            nb = [h for h in hosts if h.device_type == b]
            meet = any(x.node_rank != y.node_rank for x in na for y in nb)
            if meet and (a, b) not in inter:
                across = [zone_links[_pair(x.zone, y.zone)] for x in na for y in nb
                          if x.zone != y.zone and x.zone is not None and y.zone is not None]
                if across:
                    inter[(a, b)] = _slowest(across)
                    notes.append(f"{a} and {b} nodes meet only across zones: the file gives their pair the zones' "
                                 "link (they use it)")
    zones = tuple(sorted({h.zone for h in hosts if h.zone is not None}))
    nodes = tuple(Node(h.device_type, h.num_devices, intra[h.device_type], h.zone) for h in hosts)
    used = list(inter.values()) + list(zone_links.values())
    cluster = Cluster(name, types, nodes, _slowest(used) if used else nodes[0].intra_node,
                      NetworkLinks(inter, zone_links, zones))
    d = cluster_to_dict(cluster)
    by_type: dict[str, Any] = {}
    for nd in d["nodes"]:
        by_type[nd["device_type"]] = nd.pop("intra_node_bandwidth_bytes_per_s")
    d["links"] = {"intra_node": by_type, **d["links"]}
    d = {"format": d["format"], "version": d["version"], "name": name, "description": description,
         **{k: v for k, v in d.items() if k not in ("format", "version", "name")}}
    back = cluster_from_dict(json.loads(json.dumps(d)), source="<hpp profile-network output>")
    if [back.node_link(i, j) for i in range(len(nodes)) for j in range(len(nodes))] != \
            [cluster.node_link(i, j) for i in range(len(nodes)) for j in range(len(nodes))]:
        raise HppInputError("the written links do not read back as measured", field="links",
                            fix="report this as a bug of hpp profile-network")
    return d, notes


def link_summary(task: LinkTask, f: LinkFit, lat: float, allreduce: list[dict[str, Any]]) -> dict[str, Any]:
    """One link of ``hpp profile-network --json``: its fit, the points it was fitted to, the all-reduce check."""
    link = f.link
    return {"kind": task.kind, "between": list(task.between), "nodes": [task.node_a, task.node_b],
            "flows": list(task.flows), "latency_s": link.latency_s, "round_trip_latency_s": 2 * lat,
            "max_bytes_per_s": link.max_bytes_per_s, "fit_gb_per_s": list(link.fit_gb_per_s or ()),
            "aggregate": [{"flows": a.flows, "max_bytes_per_s": a.max_bytes_per_s,
                           "fit_gb_per_s": list(a.fit_gb_per_s or ())} for a in link.aggregate],
            "largest_fit_error": f.largest_error,
            "points": [{"flows": k, "bytes": x, "measured_bytes_per_s": m, "fitted_bytes_per_s": ft}
                       for k, x, m, ft in f.points],
            "allreduce": allreduce}
