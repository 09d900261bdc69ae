"""``hpp profile-network`` as a library call: measure the cluster's links and write them as a cluster file.

Every host runs it with its node rank (one host: no flags). In order:

1. this host's devices (:func:`detect_host`: CUDA's GPUs, one type per host, or on CPU the node an
   ``--emulate-node-type TYPE:COUNT`` plays, COUNT gloo processes);
2. the roll call of the hosts (:class:`hpp.runtime.network_hosts.Rendezvous`): every host's devices and
   zone, flags that must agree, before any rank starts; a host that does not answer is named (exit 2);
3. the links to measure (:func:`hpp.runtime.network_measure.link_tasks`) and this host's ranks, started
   with torchrun like ``hpp run``'s (:func:`hpp.runtime.launch.launch_torchrun`, static rendezvous on node
   rank 0's host, ``module=hpp.runtime.network_measure``); node rank 0 prints the measurements as they end;
4. node rank 0 fits every link (:func:`fit_links`: :func:`hpp.profiles.network_fit.fit_link` on the
   round trips less one latency for the acknowledgement) and writes a version-2 cluster file
   (:func:`cluster_file`: the hosts as nodes, ``links.intra_node`` per type, ``links.inter_node`` per pair of
   types, ``links.zones``), read back by :func:`hpp.profiles.cluster_format.cluster_from_dict` before it is
   written through a temporary file and a rename; the other hosts get the summary.

A host whose ranks fail learns from the roll call's connections whether another host stopped answering
(:meth:`~hpp.runtime.network_hosts.Rendezvous.failed`): the failure then names that host (exit 2), else
the failed rank (exit 1). No output file is written unless every measurement ended.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.fileio import folder_writable, write_atomic
from hpp.profiles.cluster import Cluster, Link, NetworkLinks, Node, _pair, _slowest
from hpp.profiles.cluster_format import cluster_from_dict, cluster_to_dict
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES, DeviceType
from hpp.profiles.network_fit import FlowTimes, LinkFit, fit_latency_s, fit_link
from hpp.runtime.binding import EMULATE_ENV, TABLE_ENV, detect_node_devices
from hpp.runtime.network_hosts import HostInfo, Rendezvous
from hpp.runtime.network_measure import LinkTask, MeasureConfig, link_tasks, node_offsets
from hpp.wording import count

__all__ = ["NetworkProfileError", "profile_network", "detect_host", "fit_links", "cluster_file", "allreduce_check"]

logger = logging.getLogger(__name__)

#: CPU: the ranks' message buffers may take at most this share of the host's memory.
_CPU_MEMORY_SHARE = 0.5


class _AnotherHostEnded(Exception):
    """Raised in the launcher's poll when the roll call hears that another host failed or went away."""


class NetworkProfileError(RuntimeError):
    """The measurement failed; ``exit_code`` 2 when a host stopped answering, else 1. The message is one line."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _host_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def detect_host(*, device: str, emulate: str | None) -> tuple[str, str, int, int]:
    """``(device, device type, devices, memory of one device [bytes])`` of this host.

    ``device``: ``auto`` (CUDA when this host has GPUs and no emulation is asked), ``cuda`` or ``cpu``;
    ``emulate``: ``TYPE:COUNT`` (default ``$HPP_EMULATE_NODE_TYPE``), a CPU node of COUNT devices.

    Raises
    ------
    HppInputError
        CPU without an emulated node (or without its COUNT), emulation with ``--device cuda``, no GPU with
        ``--device cuda``, a GPU no device rule names, GPUs of two types.
    """
    emulate = emulate or os.environ.get(EMULATE_ENV) or None
    if emulate:
        if device == "cuda":
            raise HppInputError("--emulate-node-type plays a CPU node (gloo), but --device cuda was given",
                                field="--emulate-node-type", fix="drop --device cuda, or drop the emulation")
        found = detect_node_devices(emulate=emulate)
        if found.count is None:
            raise HppInputError(f"--emulate-node-type {emulate!r} gives no device count", field="--emulate-node-type",
                                fix="give TYPE:COUNT, e.g. cpu:2 (COUNT gloo processes on this host)")
        if found.count < 1:
            raise HppInputError(f"--emulate-node-type {emulate!r}", field="--emulate-node-type",
                                fix="give a COUNT >= 1")
        return "cpu", found.types[0], found.count, _host_memory_bytes() // found.count
    found = detect_node_devices(emulate=None) if device in ("auto", "cuda") else None
    if found is None or not found.count:
        if device == "cuda":
            raise HppInputError("--device cuda but this host has no CUDA device", field="--device",
                                fix="run on a GPU host, or measure gloo with --emulate-node-type TYPE:COUNT")
        raise HppInputError("this host has no CUDA device and no emulated node", field="--emulate-node-type",
                            fix="give --emulate-node-type TYPE:COUNT to measure gloo between COUNT processes "
                                "(e.g. cpu:2), or run on a GPU host")
    if None in found.types:
        name = found.names[found.types.index(None)]
        raise HppInputError(f"no device rule names the GPU {name!r}", field="device type",
                            fix=f"add a rule to the file ${TABLE_ENV} names")
    if len(set(found.types)) > 1:
        raise HppInputError(f"this host has GPUs of types {sorted(set(found.types))}: a node holds one type",
                            field="CUDA_VISIBLE_DEVICES", fix="make one type visible per hpp profile-network host")
    import torch
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(found.count))
    return "cuda", found.types[0], found.count, int(memory)


# ----------------------------------------------------------------------------- fitting the records

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
            raise NetworkProfileError(f"the {k}-flow times of {x} bytes miss flows {sorted(set(range(k)) - set(flows))}",
                                      exit_code=1)
        samples.append(FlowTimes(x, k, tuple(one_way(flows[j]) for j in range(k))))
    return samples, latency_samples, lat


def allreduce_check(records: Sequence[Mapping[str, Any]], link: Link, *, ranks_per_group: int
                    ) -> list[dict[str, Any]]:
    """The measured all-reduces of a link beside the cost model's ring on the fitted link.

    Per (flows ``k``, bytes): measured = the slowest group's median over repeats of its slowest member's time;
    predicted = :func:`hpp.formulation.collectives.ring_allreduce_s` of the bytes among ``ranks_per_group`` on
    ``link.shared(k)``; ``bus_bytes_per_s`` = ``2 (h-1)/h * bytes / measured`` (NCCL's bus bandwidth).
    """
    from hpp.formulation.collectives import ring_allreduce_s    # numpy: only once there is something to price

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
    NetworkProfileError
        A task without usable times (a flow missing, every time at the latency).
    """
    out = []
    for i, task in enumerate(tasks):
        mine = [r for r in records if int(r["task"]) == i]
        samples, probes, lat = _one_way(mine)
        try:
            fitted = fit_link(samples, latency_samples=probes)
        except ValueError as exc:
            raise NetworkProfileError(f"{task.name}: {exc}", exit_code=1) from None
        h = devices[task.node_a] if task.kind == "intra_node" else 2
        out.append((task, fitted, lat, allreduce_check(mine, fitted.link, ranks_per_group=h)))
    return out


# ----------------------------------------------------------------------------- the cluster file

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


def _link_summary(task: LinkTask, f: LinkFit, lat: float, allreduce: list[dict[str, Any]]) -> dict[str, Any]:
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


# ----------------------------------------------------------------------------- the run

def _check_out(out: Path, *, force: bool) -> None:
    if out.exists() and not force:
        raise HppInputError("exists", source=str(out), field="--out", fix="give a new path, or --force to replace it")
    if out.exists() and out.is_dir():
        raise HppInputError("is a folder", source=str(out), field="--out", fix="give a file path")
    if not folder_writable(out):
        raise HppInputError("its folder does not exist or cannot be written", source=str(out), field="--out",
                            fix="give a path in a writable folder")


def _failure(line: str, hosts: Sequence[HostInfo], lost: Mapping[int, str], me: HostInfo, *,
             after: bool = False) -> NetworkProfileError:
    """The one line of a failed measurement: a host that stopped answering first (exit 2), then another host's
    failure, then this host's own ``line`` (exit 1). ``after``: this host's ranks ended well, node rank 0 did not
    follow."""
    label = {h.node_rank: h.label for h in hosts}
    stopped = [r for r, w in lost.items() if w.startswith("stopped")]
    if stopped:
        who = ", ".join(label.get(r, f"node rank {r}") for r in stopped)
        when = "after the measurements, before writing the file" if after else "during the measurements"
        mine = "" if after else f"; {me.label} stopped its own ranks"
        return NetworkProfileError(f"{who} stopped answering {when} (its launcher went away){mine}. Fix: look at "
                                   "that host, then run hpp profile-network again on every host", exit_code=2)
    here = "this host's measurements ended" if after else f"here: {line}"
    others = [(r, w) for r, w in lost.items() if w.startswith("failed")]
    if others:
        r, w = others[0]
        return NetworkProfileError(f"{label.get(r, f'node rank {r}')} {w}; {here}", exit_code=1)
    if after:
        return NetworkProfileError("node rank 0 sent no summary within a minute of the measurements' end; this "
                                   "host's measurements ended. Fix: look at node rank 0's output", exit_code=1)
    return NetworkProfileError(f"{me.label}: {line}", exit_code=1)


def profile_network(*, out: str | Path, sizes_bytes: Sequence[int], repeats: int = 5, warmup: int = 1,
                    device: str = "auto", nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
                    emulate_node_type: str | None = None, zone: str | None = None, force: bool = False,
                    rendezvous_timeout_s: float = 120.0, run_timeout_s: float = 1800.0,
                    group_timeout_s: float = 120.0, name: str | None = None,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure this cluster's links with torch.distributed and write them as a cluster file (module docstring).

    Parameters
    ----------
    out : path
        The cluster file node rank 0 writes (the other hosts write nothing).
    sizes_bytes : sequence of int
        Message sizes [bytes] of the bandwidth fit (>= 2 distinct, each > 0; rounded up to 4 bytes).
    repeats, warmup : int
        Timed repeats per size (>= 1), untimed ones before them (>= 0).
    device : ``auto``, ``cuda`` or ``cpu`` (see :func:`detect_host`).
    nnodes, node_rank, rdzv_endpoint
        Several hosts: as ``hpp run``'s (``HOST:PORT`` of node rank 0: the roll call listens on PORT).
    emulate_node_type : ``TYPE:COUNT``, CPU only.
    zone : str, optional
        This host's zone (all hosts or none).
    force : bool
        Replace an existing ``out``.
    rendezvous_timeout_s, run_timeout_s, group_timeout_s : float
        The roll call's wait for every host, the whole measurement's limit, the process groups' timeout [s].
    progress : callable, optional
        Called with each progress line.

    Returns
    -------
    dict
        The summary (``--json``): ``out``, ``hosts``, ``backend``, ``sizes_bytes``, ``links`` (per link its fit,
        the points it was fitted to, and the all-reduce check), ``notes``, ``wall_s``.

    Raises
    ------
    HppInputError
        Bad flags, an existing ``out`` without ``force``, the roll call's errors (a host that did not answer).
    NetworkProfileError
        The measurement failed (a host that stopped answering: ``exit_code`` 2).
    """
    from hpp.runtime.launch import launch_torchrun
    from hpp.runtime.run_setup import parse_endpoint

    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    out = Path(out)
    sizes = sorted({max(4, -(-int(x) // 4) * 4) for x in sizes_bytes})
    if any(x <= 0 for x in sizes_bytes) or len(sizes) < 2:
        raise HppInputError(f"--sizes {list(sizes_bytes)}", field="--sizes",
                            fix="give at least two different message sizes > 0, e.g. 1MB,16MB,256MB,1GB")
    if repeats < 1 or warmup < 0:
        raise HppInputError(f"--repeats {repeats} --warmup {warmup}", field="--repeats",
                            fix="give --repeats >= 1 and --warmup >= 0")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise HppInputError(f"--node-rank {node_rank} of --nnodes {nnodes}", field="--node-rank",
                            fix="give --nnodes N >= 1 and --node-rank in 0..N-1")
    if nnodes > 1 and rdzv_endpoint is None:
        raise HppInputError(f"--nnodes {nnodes} without --rdzv-endpoint", field="--rdzv-endpoint",
                            fix="give HOST:PORT of the host with node rank 0 (the same on every host)")
    if rdzv_endpoint is not None:
        parse_endpoint(rdzv_endpoint)
    if node_rank == 0:
        _check_out(out, force=force)
    dev, dtype, ndev, memory = detect_host(device=device, emulate=emulate_node_type)
    if dev == "cpu" and ndev * max(sizes) > _CPU_MEMORY_SHARE * _host_memory_bytes():
        raise HppInputError(f"{count(ndev, 'rank')} x {max(sizes)} bytes of message buffers exceed half of this "
                            "host's memory", field="--sizes", fix="give smaller --sizes on CPU")
    backend = "nccl" if dev == "cuda" else "gloo"
    settings = {"--sizes": sizes, "--repeats": repeats, "--warmup": warmup, "--nnodes": nnodes, "backend": backend}
    me = HostInfo(node_rank, socket.gethostname(), dtype, ndev, zone, memory, settings)
    with Rendezvous(rdzv_endpoint, nnodes=nnodes, node_rank=node_rank, timeout_s=rendezvous_timeout_s) as rdzv:
        if nnodes > 1:
            say(f"{me.label}: waiting up to {rendezvous_timeout_s:g} s for the other hosts at {rdzv_endpoint}")
        hosts, port = rdzv.gather(me)
        devices = [h.num_devices for h in hosts]
        tasks = link_tasks([(h.device_type, h.num_devices, h.zone) for h in hosts])
        if not tasks:
            raise HppInputError(f"the cluster has {count(sum(devices), 'device')}: nothing to measure",
                                field="hosts", fix="measure two devices of one node, or two nodes")
        if node_rank == 0:
            say(f"{count(len(hosts), 'host')} ({', '.join(f'{h.device_type}:{h.num_devices}' for h in hosts)}), "
                f"{backend}: measuring {count(len(tasks), 'link')} ({', '.join(t.name for t in tasks)}) at "
                f"{count(len(sizes), 'message size')}, {count(repeats, 'repeat')}")
        cfg = MeasureConfig(devices=devices, tasks=[asdict(t) for t in tasks], sizes_bytes=sizes, repeats=repeats,
                            warmup=warmup, device=dev, timeout_s=group_timeout_s)
        offset = node_offsets(devices)[node_rank]
        endpoint = None if nnodes == 1 else f"{rdzv_endpoint.rpartition(':')[0]}:{port}"
        with tempfile.TemporaryDirectory(prefix="hpp-netprof-") as tmp:
            seen = [0]

            def poll() -> None:
                path = Path(tmp) / "progress.jsonl"
                lines = path.read_text().splitlines() if path.exists() else []
                for text in lines[seen[0]:]:
                    p = json.loads(text)
                    say(f"measured {p['name']} ({p['task'] + 1} of {p['of']}, {p['wall_s']:.1f} s)")
                seen[0] = len(lines)
                if rdzv.news():                     # another host ended or stopped answering: its peers here
                    raise _AnotherHostEnded()       # would wait for it until the group timeout

            try:
                res = launch_torchrun(cfg, world_size=sum(devices), out_dir=Path(tmp), timeout_s=run_timeout_s,
                                      poll=poll, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=endpoint,
                                      local_ranks=range(offset, offset + ndev), module="hpp.runtime.network_measure")
                line = None if res.ok else res.failure_message()
            except _AnotherHostEnded:               # this host's ranks were stopped at once (launch_torchrun)
                line = "this host stopped its ranks"
            if line is not None:
                raise _failure(line, hosts, rdzv.failed(line), me)
            if node_rank != 0:
                summary = rdzv.finish(None)
                if summary is None:
                    raise _failure("", hosts, rdzv.failed("no summary from node rank 0", wait_s=0.0), me, after=True)
                return summary
            records = res.results[0]["records"]
        try:
            fitted = fit_links(tasks, records, devices=devices)
            description = (f"measured by hpp profile-network ({backend}, {count(len(hosts), 'host')}, sizes "
                           f"{sizes[0]}..{sizes[-1]} bytes, {count(repeats, 'repeat')})")
            d, notes = cluster_file(hosts, fitted, name=name or out.stem, description=description)
            write_atomic(out, json.dumps(d, indent=1) + "\n")
        except (NetworkProfileError, HppInputError, OSError) as exc:
            rdzv.failed(str(exc), wait_s=0.0)
            raise
        say(f"wrote {out}")
        summary = {"out": str(out), "written_by": me.label, "backend": backend,
                   "hosts": [asdict(h) for h in hosts], "sizes_bytes": sizes, "repeats": repeats, "warmup": warmup,
                   "links": [_link_summary(*f) for f in fitted], "notes": notes,
                   "wall_s": time.perf_counter() - t0}
        return rdzv.finish(summary) or summary
