"""What the ranks of ``hpp profile-network`` measure, and how: timed transfers with torch.distributed.

Which links (:func:`link_tasks`, pure): per device type, two devices of one node of that type
(``intra_node``, one flow); per pair of device types whose nodes share a zone (or all nodes, without
zones), a node of each (``inter_node``); per pair of zones, a node in each (``zones``). Between two
nodes, ``k`` concurrent flows for ``k`` = 1, the powers of two below the smaller node's device count and
that count (:func:`flow_counts`): local device ``i`` of one node sends to local device ``i`` of the other,
``i < k``, all at once.

How (every rank runs the same schedule; the ranks of a measurement do it, the others wait at the
barriers): for each message size and each repeat, a barrier of all ranks, then

- point to point: each sender times ``send`` of the message and ``recv`` of a one-element
  acknowledgement from its receiver (a round trip of the message and the acknowledgement; the fit
  takes one latency off for the acknowledgement, :mod:`hpp.runtime.network.profile`);
- latency probes: the same with one flow and the tiny messages of
  :data:`hpp.profiles.network_fit.LATENCY_PROBE_BYTES`;
- all-reduce: each of the ``k`` pairs (inside a node: all the node's devices) all-reduces the message
  on its own group at once; each member times its call.

On CUDA the backend is NCCL (a rank per GPU, its local index; the device is synchronised before
each clock read), on CPU gloo. The first ``warmup`` repeats are left out. Each rank writes
``OUT_DIR/rank<r>.json`` (rank 0: every rank's records, gathered) or ``rank<r>.error``, through a
temporary file and a rename; rank 0 appends one line per finished measurement to
``OUT_DIR/progress.jsonl`` (the launcher prints them).

Entry point: ``python -m hpp.runtime.network.measure CONFIG.json OUT_DIR`` (what torchrun starts).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

from hpp.fileio import write_atomic
from hpp.profiles.network_fit import LATENCY_PROBE_BYTES

__all__ = ["LinkTask", "MeasureConfig", "flow_counts", "link_tasks", "node_offsets", "measure_main"]

logger = logging.getLogger(__name__)

_ELEMENT_BYTES = 4                      # float32 messages: gloo and NCCL move them alike


@dataclass(frozen=True, slots=True)
class LinkTask:
    """One link to measure.

    Attributes
    ----------
    kind : str
        ``intra_node`` (two devices of one node), ``inter_node`` (a node of each type) or ``zones``.
    between : tuple of str
        The device type (``intra_node``), the two device types (``inter_node``) or the two zones.
    node_a, node_b : int
        The node ranks measured (equal for ``intra_node``).
    flows : tuple of int
        Concurrent flow counts, 1 first.
    """

    kind: str
    between: tuple[str, ...]
    node_a: int
    node_b: int
    flows: tuple[int, ...]

    @property
    def name(self) -> str:
        """``intra_node A100-40``, ``inter_node A100-40 - V100-16``, ``zones z1 - z2``."""
        return f"{self.kind} {' - '.join(self.between)}"


def flow_counts(devices_a: int, devices_b: int) -> tuple[int, ...]:
    """The concurrent flow counts measured between two nodes: 1, the powers of two below the smaller device
    count, and that count.

    >>> flow_counts(8, 4), flow_counts(6, 6), flow_counts(1, 4)
    ((1, 2, 4), (1, 2, 4, 6), (1,))
    """
    m = min(devices_a, devices_b)
    out = [1]
    k = 2
    while k < m:
        out.append(k)
        k *= 2
    if m >= 2:
        out.append(m)
    return tuple(out)


def link_tasks(nodes: Sequence[tuple[str, int, str | None]]) -> tuple[LinkTask, ...]:
    """The links to measure on a cluster of ``nodes`` (per node rank: device type, devices, zone or None).

    The first node (by node rank) of each type with two devices gives the type's intra-node link; the first
    two nodes of a pair of types (two different nodes) in the first zone that holds both give the pair's
    inter-node link (pairs that only meet across zones need none: they use the zones' link); the first node
    of each of two zones gives the zones' link.

    Examples
    --------
    >>> [(t.name, t.node_a, t.node_b, t.flows) for t in link_tasks([("A", 2, None), ("A", 2, None), ("B", 1, None)])]
    [('intra_node A', 0, 0, (1,)), ('inter_node A - A', 0, 1, (1, 2)), ('inter_node A - B', 0, 2, (1,))]
    """
    tasks: list[LinkTask] = []
    types = sorted({t for t, _n, _z in nodes})
    for t in types:
        two = next((i for i, (tt, n, _z) in enumerate(nodes) if tt == t and n >= 2), None)
        if two is not None:
            tasks.append(LinkTask("intra_node", (t,), two, two, (1,)))
    zones = sorted({z for _t, _n, z in nodes}, key=lambda z: (z is None, z or ""))
    done: set[tuple[str, str]] = set()
    for z in zones:
        members = [i for i, (_t, _n, zz) in enumerate(nodes) if zz == z]
        for ia, a in enumerate(types):
            for b in types[ia:]:
                if (a, b) in done:
                    continue
                na = next((i for i in members if nodes[i][0] == a), None)
                nb = next((i for i in members if nodes[i][0] == b and i != na), None)
                if na is None or nb is None:
                    continue
                done.add((a, b))
                tasks.append(LinkTask("inter_node", (a, b), na, nb, flow_counts(nodes[na][1], nodes[nb][1])))
    named = [z for z in zones if z is not None]
    for iz, za in enumerate(named):
        for zb in named[iz + 1:]:
            na = next(i for i, n in enumerate(nodes) if n[2] == za)
            nb = next(i for i, n in enumerate(nodes) if n[2] == zb)
            tasks.append(LinkTask("zones", (za, zb), na, nb, flow_counts(nodes[na][1], nodes[nb][1])))
    return tuple(tasks)


def node_offsets(devices: Sequence[int]) -> list[int]:
    """The global rank of each node's first device: torchrun numbers ranks by node rank, each node's local ranks
    in order (``[2, 3, 1]`` -> ``[0, 2, 5]``)."""
    out, total = [], 0
    for n in devices:
        out.append(total)
        total += n
    return out


@dataclass(frozen=True)
class MeasureConfig:
    """Everything a rank of ``hpp profile-network`` needs; plain JSON data.

    Attributes
    ----------
    devices : list of int
        Devices (ranks) of each node rank.
    tasks : list of dict
        :class:`LinkTask` fields, in the order measured.
    sizes_bytes : list of int
        Message sizes [bytes], multiples of 4.
    repeats, warmup : int
        Timed repeats per size, and untimed ones before them.
    device : str
        ``cpu`` (gloo) or ``cuda`` (NCCL).
    timeout_s : float
        Process-group timeout [s]: a peer that stops answering fails the ranks within it.
    num_threads : int
        torch threads per rank (the launcher sets ``OMP_NUM_THREADS`` from it).
    """

    devices: list[int]
    tasks: list[dict] = field(default_factory=list)
    sizes_bytes: list[int] = field(default_factory=list)
    repeats: int = 5
    warmup: int = 1
    device: str = "cpu"
    timeout_s: float = 120.0
    num_threads: int = 1


def _timed_p2p(dist, torch, buf, ack, nbytes: int, peer: int, *, sender: bool, device) -> float | None:
    """The sender's round trip [s] of ``nbytes`` to ``peer`` and a one-element acknowledgement; None on the receiver."""
    msg = buf[:max(1, nbytes // _ELEMENT_BYTES)]
    if not sender:
        dist.recv(msg, src=peer)
        dist.send(ack, dst=peer)
        return None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    dist.send(msg, dst=peer)
    dist.recv(ack, src=peer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _timed_allreduce(dist, torch, buf, nbytes: int, group, device) -> float:
    msg = buf[:max(1, nbytes // _ELEMENT_BYTES)]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    dist.all_reduce(msg, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _pairs(task: LinkTask, k: int, offsets: Sequence[int]) -> list[tuple[int, int]]:
    """(sender, receiver) global ranks of ``k`` concurrent flows of ``task``."""
    if task.kind == "intra_node":
        return [(offsets[task.node_a], offsets[task.node_a] + 1)]
    return [(offsets[task.node_a] + i, offsets[task.node_b] + i) for i in range(k)]


def _groups_of(task: LinkTask, offsets: Sequence[int], devices: Sequence[int]) -> list[tuple[int, ...]]:
    """The all-reduce groups of ``task``: the node's devices (intra-node), else each flow's pair."""
    if task.kind == "intra_node":
        return [tuple(range(offsets[task.node_a], offsets[task.node_a] + devices[task.node_a]))]
    return [tuple(sorted(p)) for p in _pairs(task, max(task.flows), offsets)]


def _run(cfg: MeasureConfig, *, rank: int, world_size: int, out_dir: Path) -> list[dict[str, Any]]:
    """Measure every task; return this rank's records (rank 0: everyone's)."""
    # here, not on top: the launcher imports this module for link_tasks (pure), and torch takes 2-6 s to import
    import torch
    import torch.distributed as dist

    offsets = node_offsets(cfg.devices)
    node = max(i for i, o in enumerate(offsets) if o <= rank)
    if cfg.device == "cuda":
        device = torch.device("cuda", rank - offsets[node])
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    torch.set_num_threads(cfg.num_threads)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=cfg.timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        tasks = [LinkTask(t["kind"], tuple(t["between"]), t["node_a"], t["node_b"], tuple(t["flows"]))
                 for t in cfg.tasks]
        groups: dict[tuple[int, ...], Any] = {}
        for task in tasks:                               # every rank creates every group, in one order
            for g in _groups_of(task, offsets, cfg.devices):
                if g not in groups:
                    groups[g] = dist.new_group(list(g), timeout=timedelta(seconds=cfg.timeout_s))
        largest = max([*cfg.sizes_bytes, *LATENCY_PROBE_BYTES])
        buf = torch.ones(largest // _ELEMENT_BYTES + 1, dtype=torch.float32, device=device)
        ack = torch.zeros(1, dtype=torch.float32, device=device)
        records: list[dict[str, Any]] = []
        progress = out_dir / "progress.jsonl"
        for ti, task in enumerate(tasks):
            t_task = time.perf_counter()
            for k in task.flows:
                pairs = _pairs(task, k, offsets)
                mine = [(j, s, r) for j, (s, r) in enumerate(pairs) if rank in (s, r)]
                for op, sizes in (("probe", LATENCY_PROBE_BYTES if k == 1 else ()), ("p2p", cfg.sizes_bytes)):
                    for nbytes in sizes:
                        times: dict[int, list[float]] = {}
                        for rep in range(cfg.warmup + cfg.repeats):
                            dist.barrier()
                            for j, s, r in mine:
                                t = _timed_p2p(dist, torch, buf, ack, nbytes, r if rank == s else s,
                                               sender=rank == s, device=device)
                                if t is not None and rep >= cfg.warmup:
                                    times.setdefault(j, []).append(t)
                        records += [{"task": ti, "op": op, "flows": k, "flow": j, "bytes": nbytes, "seconds": ts}
                                    for j, ts in times.items()]
                members = _groups_of(task, offsets, cfg.devices)[: 1 if task.kind == "intra_node" else k]
                mine_g = [(j, g) for j, g in enumerate(members) if rank in g]
                for nbytes in cfg.sizes_bytes:
                    times = {}
                    for rep in range(cfg.warmup + cfg.repeats):
                        dist.barrier()
                        for j, g in mine_g:
                            t = _timed_allreduce(dist, torch, buf, nbytes, groups[g], device)
                            if rep >= cfg.warmup:
                                times.setdefault(j, []).append(t)
                    records += [{"task": ti, "op": "allreduce", "flows": k, "flow": j, "bytes": nbytes,
                                 "seconds": ts, "rank": rank} for j, ts in times.items()]
            dist.barrier()
            if rank == 0:
                with progress.open("a") as f:
                    f.write(json.dumps({"task": ti, "name": task.name, "of": len(tasks),
                                        "wall_s": time.perf_counter() - t_task}) + "\n")
        gathered: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(records, gathered, dst=0)
        if rank == 0:
            records = [r for part in gathered for r in part]
        dist.barrier()
        return records
    finally:
        dist.destroy_process_group()


def measure_main(cfg: MeasureConfig, *, rank: int, world_size: int, out_dir: Path) -> int:
    """:func:`_run` that writes ``rank<r>.json`` (0) or ``rank<r>.error`` (1) with the reason."""
    try:
        records = _run(cfg, rank=rank, world_size=world_size, out_dir=out_dir)
        write_atomic(out_dir / f"rank{rank}.json", json.dumps({"rank": rank, "records": records}))
        return 0
    except BaseException as exc:  # noqa: BLE001 - a rank must report, whatever stopped it
        first = str(exc).splitlines()[0] if str(exc) else ""
        msg = f"rank {rank} aborted: {type(exc).__name__}: {first}"
        logger.error("%s", msg)
        try:
            write_atomic(out_dir / f"rank{rank}.error", msg + "\n")
        except OSError:
            pass
        return 1


def _main(argv: list[str]) -> int:
    from hpp.runtime.launch.processes import die_with_parent
    die_with_parent(signal.SIGKILL)                   # torchrun's agent gone (killed launcher): no orphan rank
    if len(argv) != 2:
        sys.stderr.write("usage: python -m hpp.runtime.network.measure CONFIG.json OUT_DIR\n")
        return 2
    cfg = MeasureConfig(**json.loads(Path(argv[0]).read_text()))
    logging.basicConfig(level=os.environ.get("HPP_LOG_LEVEL", "WARNING"),
                        format=f"%(asctime)s %(name)s rank{os.environ.get('RANK')}: %(message)s")
    return measure_main(cfg, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                        out_dir=Path(argv[1]))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
