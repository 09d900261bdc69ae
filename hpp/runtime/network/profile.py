"""``hpp profile-network`` as a library call: measure the cluster's links and write them as a cluster file.

Every host runs it with its node rank (one host: no flags). In order:

1. this host's devices (:func:`detect_host`: CUDA's GPUs, one type per host, or on CPU the node an
   ``--emulate-node-type TYPE:COUNT`` plays, COUNT gloo processes);
2. the roll call of the hosts (:class:`hpp.runtime.network.hosts.Rendezvous`): every host's devices and
   zone, flags that must agree, before any rank starts; a host that does not answer is named (exit 2);
3. the links to measure (:func:`hpp.runtime.network.measure.link_tasks`) and this host's ranks, started
   with torchrun like ``hpp run``'s (:func:`hpp.runtime.launch.launchers.launch_torchrun`, static rendezvous on node
   rank 0's host, ``module=hpp.runtime.network.measure``); node rank 0 prints the measurements as they end;
4. node rank 0 fits every link (:func:`hpp.runtime.network.links.fit_links`) and writes a version-2 cluster
   file (:func:`hpp.runtime.network.links.cluster_file`: the hosts as nodes, ``links.intra_node`` per type,
   ``links.inter_node`` per pair of types, ``links.zones``), read back by
   :func:`hpp.profiles.cluster_format.cluster_from_dict` before it is written through a temporary file and a
   rename; the other hosts get the summary.

A host whose ranks fail learns from the roll call's connections whether another host stopped answering
(:meth:`~hpp.runtime.network.hosts.Rendezvous.failed`): the failure then names that host (exit 2), else
the failed rank (exit 1). No output file is written unless every measurement ended.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.fileio import folder_writable, write_atomic
from hpp.runtime.launch.binding import EMULATE_ENV, TABLE_ENV, detect_node_devices, parse_endpoint
from hpp.runtime.network.hosts import HostInfo, Rendezvous
from hpp.runtime.network.links import cluster_file, fit_links, link_summary
from hpp.runtime.network.measure import MeasureConfig, link_tasks, node_offsets
from hpp.wording import count

__all__ = ["NetworkProfileError", "profile_network", "detect_host"]

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
    if device == "cpu":
        raise HppInputError("--device cpu without an emulated node", field="--emulate-node-type",
                            fix="give --emulate-node-type TYPE:COUNT, the COUNT gloo processes this host runs (e.g. "
                                "cpu:2)")
    found = detect_node_devices(emulate=None)
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
    import torch    # not on top: 2-6 s to import; only a CUDA host needs it here
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(found.count))
    return "cuda", found.types[0], found.count, int(memory)


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
    force : bool, replace an existing ``out``.
    rendezvous_timeout_s, run_timeout_s, group_timeout_s : float
        The roll call's wait for every host, the whole measurement's limit, the process groups' timeout [s].
    progress : callable, optional, called with each progress line.

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
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    out = Path(out)
    sizes = _check_flags(sizes_bytes=sizes_bytes, repeats=repeats, warmup=warmup, nnodes=nnodes, node_rank=node_rank,
                         rdzv_endpoint=rdzv_endpoint)
    if node_rank == 0:
        _check_out(out, force=force)
    dev, me = _this_host(device=device, emulate_node_type=emulate_node_type, zone=zone, node_rank=node_rank,
                         settings={"--sizes": sizes, "--repeats": repeats, "--warmup": warmup, "--nnodes": nnodes})
    backend, ndev = me.settings["backend"], me.num_devices
    with Rendezvous(rdzv_endpoint, nnodes=nnodes, node_rank=node_rank, timeout_s=rendezvous_timeout_s) as rdzv:
        if nnodes > 1:
            say(f"{me.label}: waiting up to {rendezvous_timeout_s:g} s for the other hosts at {rdzv_endpoint}")
        hosts, port = rdzv.gather(me)
        devices = [h.num_devices for h in hosts]
        tasks = _link_tasks(hosts)
        if node_rank == 0:
            say(f"{count(len(hosts), 'host')} ({', '.join(f'{h.device_type}:{h.num_devices}' for h in hosts)}), "
                f"{backend}: measuring {count(len(tasks), 'link')} ({', '.join(t.name for t in tasks)}) at "
                f"{count(len(sizes), 'message size')}, {count(repeats, 'repeat')}")
        cfg = MeasureConfig(devices=devices, tasks=[asdict(t) for t in tasks], sizes_bytes=sizes, repeats=repeats,
                            warmup=warmup, device=dev, timeout_s=group_timeout_s)
        endpoint = None if nnodes == 1 else f"{rdzv_endpoint.rpartition(':')[0]}:{port}"
        records = _measure(cfg, rdzv, hosts, me, say=say, nnodes=nnodes, node_rank=node_rank, endpoint=endpoint,
                           num_local=ndev, run_timeout_s=run_timeout_s)
        if records is None:                         # another host's ranks: node rank 0 writes and summarises
            summary = rdzv.finish(None)
            if summary is None:
                raise _failure("", hosts, rdzv.failed("no summary from node rank 0", wait_s=0.0), me, after=True)
            return summary
        description = (f"measured by hpp profile-network ({backend}, {count(len(hosts), 'host')}, sizes "
                       f"{sizes[0]}..{sizes[-1]} bytes, {count(repeats, 'repeat')})")
        fitted, notes = _write_cluster(out, rdzv, hosts, tasks, records, name=name or out.stem,
                                       description=description)
        say(f"wrote {out}")
        summary = {"out": str(out), "written_by": me.label, "backend": backend,
                   "hosts": [asdict(h) for h in hosts], "sizes_bytes": sizes, "repeats": repeats, "warmup": warmup,
                   "links": [link_summary(*f) for f in fitted], "notes": notes,
                   "wall_s": time.perf_counter() - t0}
        return rdzv.finish(summary) or summary


def _link_tasks(hosts: Sequence[HostInfo]) -> list:
    """The links to measure between the hosts' devices (:func:`link_tasks`); none is bad input."""
    tasks = link_tasks([(h.device_type, h.num_devices, h.zone) for h in hosts])
    if not tasks:
        raise HppInputError(f"the cluster has {count(sum(h.num_devices for h in hosts), 'device')}: nothing to "
                            "measure", field="hosts", fix="measure two devices of one node, or two nodes")
    return tasks


def _this_host(*, device: str, emulate_node_type: str | None, zone: str | None, node_rank: int,
               settings: dict[str, Any]) -> tuple[str, HostInfo]:
    """``(torch device kind, what this host tells the roll call)``; message buffers must fit half of a CPU host's
    memory (``settings["--sizes"]`` on each of its ranks)."""
    dev, dtype, ndev, memory = detect_host(device=device, emulate=emulate_node_type)
    biggest = max(settings["--sizes"])
    if dev == "cpu" and ndev * biggest > _CPU_MEMORY_SHARE * _host_memory_bytes():
        raise HppInputError(f"{count(ndev, 'rank')} x {biggest} bytes of message buffers exceed half of this "
                            "host's memory", field="--sizes", fix="give smaller --sizes on CPU")
    settings = {**settings, "backend": "nccl" if dev == "cuda" else "gloo"}
    return dev, HostInfo(node_rank, socket.gethostname(), dtype, ndev, zone, memory, settings)


def _write_cluster(out: Path, rdzv: Rendezvous, hosts: Sequence[HostInfo], tasks: Sequence[Any], records: list, *,
                   name: str, description: str) -> tuple[list, list[str]]:
    """Fit the links to node rank 0's records and write the cluster file; ``(the fits, the file's notes)``. A failure
    is told to the other hosts before it is raised."""
    try:
        try:
            fitted = fit_links(tasks, records, devices=[h.num_devices for h in hosts])
        except ValueError as exc:
            raise NetworkProfileError(str(exc), exit_code=1) from None
        d, notes = cluster_file(hosts, fitted, name=name, description=description)
        write_atomic(out, json.dumps(d, indent=1) + "\n")
    except (NetworkProfileError, HppInputError, OSError) as exc:
        rdzv.failed(str(exc), wait_s=0.0)
        raise
    return fitted, notes


def _check_flags(*, sizes_bytes: Sequence[int], repeats: int, warmup: int, nnodes: int, node_rank: int,
                 rdzv_endpoint: str | None) -> list[int]:
    """The message sizes (rounded up to 4 bytes, sorted, distinct); :class:`HppInputError` for a bad flag."""
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
    return sizes


def _measure(cfg: MeasureConfig, rdzv: Rendezvous, hosts: Sequence[HostInfo], me: HostInfo, *,
             say: Callable[[str], None], nnodes: int, node_rank: int, endpoint: str | None, num_local: int,
             run_timeout_s: float) -> list | None:
    """Run this host's measuring ranks under torchrun; node rank 0's records (other hosts: None).

    Raises
    ------
    NetworkProfileError
        A rank failed, or another host ended or stopped answering before this host's ranks finished.
    """
    # here, not on top: it imports torch (2-6 s, -X importtime), which a bad flag or the roll call never needs
    from hpp.runtime.launch.launchers import launch_torchrun

    offset = node_offsets(cfg.devices)[node_rank]
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
            res = launch_torchrun(json.dumps(asdict(cfg)), num_threads=cfg.num_threads, world_size=sum(cfg.devices),
                                  out_dir=Path(tmp), timeout_s=run_timeout_s, poll=poll, nnodes=nnodes,
                                  node_rank=node_rank, rdzv_endpoint=endpoint,
                                  local_ranks=range(offset, offset + num_local), module="hpp.runtime.network.measure")
            line = None if res.ok else res.failure_message()
        except _AnotherHostEnded:               # this host's ranks were stopped at once (launch_torchrun)
            done = all((Path(tmp) / f"rank{r}.json").exists() for r in range(offset, offset + num_local))
            line = None if done else "this host stopped its ranks"     # done: the news came after the end
        if line is not None:
            raise _failure(line, hosts, rdzv.failed(line), me)
        if node_rank != 0:
            return None
        return json.loads((Path(tmp) / "rank0.json").read_text())["records"]
