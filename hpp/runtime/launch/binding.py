"""Device binding from the plan: which host runs which ranks, on which local GPU, of which type.

A plan's device ids are the cluster's, numbered node by node
(:class:`hpp.profiles.cluster.Cluster`): device ``d`` is GPU ``local_index`` of node
``node``. Ranks are numbered as the runtime numbers them (``Plan.device_ids`` order:
pipeline by pipeline, stage by stage, TP rank by TP rank); rank ``r`` runs on the
plan's device ``plan.device_ids[r]``.

Hosts (:func:`host_ranks`, :func:`worker_binding`): in a run of several hosts, the host
with node rank ``i`` (torchrun's ``--node-rank``, static rendezvous) plays the plan's node
``host_nodes[i]``: by default the nodes the plan uses, in order (node rank = node index
when the plan uses every node), or an explicit ``--node-map`` such as ``2,0,1``. It
starts one process per plan device on that node; local rank ``j`` is the ``j``-th of
them by local GPU index, runs as the plan's rank :attr:`RankBinding.rank` (not torchrun's
``RANK``) and uses ``cuda:<local_index>`` (an index among the host's visible GPUs). One
host alone plays every node the plan uses, stacked in node order, local rank = rank.

Device types: :func:`device_type_of` maps ``torch.cuda.get_device_name`` and the
memory size to the bundled names (A100-40, A100-80, V100-16, GH-96, H100, H200,
RTX-3090, RTX-2080, Titan-RTX); users add rules with a JSON file (``table_file=`` or
the environment variable ``HPP_DEVICE_TYPES_FILE``)::

    [{"name_contains": "L40S", "type": "L40S"},
     {"name_contains": "A10", "min_memory_gib": 20, "max_memory_gib": 30, "type": "A10-24"}]

(checked before the bundled rules, first match wins). :func:`check_node_devices`
refuses a host whose GPUs are not the plan's type for its node, or too few.
On CPU, ``--emulate-node-type TYPE[:COUNT]`` (or ``HPP_EMULATE_NODE_TYPE``) lets a
test play a node of that type (:func:`detect_node_devices`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.fileio import read_json
from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.cluster_format import cluster_from_dict

__all__ = ["RankBinding", "NodeDevices", "DeviceRule", "BUNDLED_DEVICE_RULES", "EMULATE_ENV", "TABLE_ENV",
           "plan_cluster", "rank_bindings", "host_nodes", "parse_node_map", "node_bindings", "host_ranks",
           "worker_binding", "load_device_rules", "device_type_of", "detect_node_devices", "check_node_devices",
           "check_host", "parse_endpoint"]

#: Environment variable naming the node type (``TYPE`` or ``TYPE:COUNT``) a CPU host plays.
EMULATE_ENV = "HPP_EMULATE_NODE_TYPE"
#: Environment variable naming a JSON file of extra device-name rules.
TABLE_ENV = "HPP_DEVICE_TYPES_FILE"
_GIB = 2**30


@dataclass(frozen=True, slots=True)
class RankBinding:
    """Where one rank runs: global rank, the plan's device id, its node and local GPU index, its type."""

    rank: int
    device_id: int
    node: int
    local_index: int
    device_type: str


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """What a host has.

    Attributes
    ----------
    types : tuple
        The device type of each local GPU, index order (None: a GPU no rule names); an
        emulated node without a count holds one entry, the type of all its devices.
    count : int or None
        GPUs on the host; None: as many as the plan needs (an emulated node without a count).
    names : tuple[str, ...]
        ``torch.cuda.get_device_name`` of each GPU (empty when emulated).
    emulated : bool
    """

    types: tuple[str | None, ...]
    count: int | None
    names: tuple[str, ...] = ()
    emulated: bool = False

    def check_args(self) -> dict[str, Any]:
        """The ``found_type`` / ``found_count`` arguments of :func:`check_node_devices`."""
        return {"found_type": self.types[0] if self.count is None else self.types, "found_count": self.count}


@dataclass(frozen=True, slots=True)
class DeviceRule:
    """``name_contains`` (case-insensitive) and memory in ``[min_memory_gib, max_memory_gib)`` -> ``device_type``."""

    name_contains: str
    device_type: str
    min_memory_gib: float = 0.0
    max_memory_gib: float = float("inf")

    def matches(self, name: str, memory_bytes: int) -> bool:
        return (self.name_contains.lower() in name.lower()
                and self.min_memory_gib <= memory_bytes / _GIB < self.max_memory_gib)


#: Bundled rules, first match wins (GH200 before H200: its name contains "H200").
BUNDLED_DEVICE_RULES: tuple[DeviceRule, ...] = (
    DeviceRule("A100", "A100-40", 0, 60), DeviceRule("A100", "A100-80", 60),
    DeviceRule("V100", "V100-16", 0, 24), DeviceRule("GH200", "GH-96", 0, 110),
    DeviceRule("H200", "H200"), DeviceRule("H100", "H100"),
    DeviceRule("RTX 3090", "RTX-3090"), DeviceRule("RTX 2080", "RTX-2080"), DeviceRule("TITAN RTX", "Titan-RTX"),
)
_RULE_KEYS = ("name_contains", "type", "min_memory_gib", "max_memory_gib")


def plan_cluster(plan: Plan, cluster: Cluster | None = None) -> Cluster:
    """``cluster``, or the cluster ``plan`` embeds.

    Raises
    ------
    HppInputError
        The plan only names a cluster file (pass the loaded cluster instead).
    """
    if cluster is not None:
        return cluster
    if "nodes" in plan.cluster_ref:
        return cluster_from_dict(plan.cluster_ref, source="plan: cluster")
    raise HppInputError("the plan does not embed its cluster", field="cluster",
                        fix="load the plan's cluster (hpp.resolve.load_plan) and pass it")


def rank_bindings(plan: Plan, cluster: Cluster | None = None) -> tuple[RankBinding, ...]:
    """Every rank's device, in rank order (``Plan.device_ids``).

    Raises
    ------
    HppInputError
        A device id outside the cluster, or a stage whose device type is not its node's.
    """
    c = plan_cluster(plan, cluster)
    out = []
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            for d in st.device_ids:
                if not 0 <= d < c.num_devices:
                    raise HppInputError(f"device id {d} is not in the cluster (valid: 0..{c.num_devices - 1})",
                                        field=f"pipelines[{p}].stages[{s}].device_ids", fix="re-plan for this cluster")
                dev = c.devices[d]
                if dev.device_type != st.device_type:
                    raise HppInputError(f"stage of {st.device_type} on device {d}, a {dev.device_type} of node "
                                        f"{dev.node}", field=f"pipelines[{p}].stages[{s}].device_type",
                                        fix="re-plan for this cluster")
                out.append(RankBinding(len(out), d, dev.node, dev.local_index, dev.device_type))
    return tuple(out)


def parse_node_map(text: str) -> tuple[int, ...]:
    """``"2,0,1"`` -> ``(2, 0, 1)``: host (node rank) ``i`` plays plan node ``value[i]``.

    Raises
    ------
    HppInputError
        Anything but comma-separated non-negative integers.
    """
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise HppInputError(f"--node-map {text!r} is not a list of node indices", field="--node-map",
                            fix="give the plan's node index of each host in node-rank order, e.g. 1,0")
    return tuple(int(p) for p in parts)


def host_nodes(plan: Plan, cluster: Cluster | None = None, node_map: Sequence[int] | None = None
               ) -> tuple[int, ...]:
    """The plan node each host plays, by node rank: ``node_map``, or the nodes the plan uses, in order.

    Raises
    ------
    HppInputError
        A node map that is not a permutation of the plan's used nodes (names them).
    """
    used = tuple(sorted({b.node for b in rank_bindings(plan, cluster)}))
    if node_map is None:
        return used
    if sorted(node_map) != list(used):
        raise HppInputError(f"--node-map {','.join(map(str, node_map))} does not list each node the plan uses "
                            f"({','.join(map(str, used))}) once", field="--node-map",
                            fix=f"give {len(used)} node indices, one per host in node-rank order")
    return tuple(node_map)


def node_bindings(plan: Plan, node: int, cluster: Cluster | None = None) -> tuple[RankBinding, ...]:
    """The ranks a host playing plan node ``node`` starts, in local-rank order (by local GPU index)."""
    return tuple(sorted((b for b in rank_bindings(plan, cluster) if b.node == node), key=lambda b: b.local_index))


def load_device_rules(table_file: str | Path | None = None) -> tuple[DeviceRule, ...]:
    """The user's rules (``table_file``, else ``$HPP_DEVICE_TYPES_FILE``, if any), then the bundled ones.

    Raises
    ------
    HppInputError
        An unreadable file, or an entry without ``name_contains``/``type`` or with an unknown key.
    """
    path = table_file or os.environ.get(TABLE_ENV)
    if not path:
        return BUNDLED_DEVICE_RULES
    data = read_json(Path(path), what="device type table")
    if not isinstance(data, list):
        raise HppInputError("a device type table is a JSON list of rules", source=str(path),
                            fix='e.g. [{"name_contains": "L40S", "type": "L40S"}]')
    rules = []
    for i, r in enumerate(data):
        bad = [k for k in (r if isinstance(r, Mapping) else {}) if k not in _RULE_KEYS]
        if not isinstance(r, Mapping) or bad or "name_contains" not in r or "type" not in r:
            raise HppInputError(f"rule {i} is {r!r}", source=str(path), field=f"[{i}]",
                                fix=f"give name_contains and type (optional min_memory_gib, max_memory_gib); "
                                    f"keys: {', '.join(_RULE_KEYS)}")
        rules.append(DeviceRule(str(r["name_contains"]), str(r["type"]), float(r.get("min_memory_gib", 0.0)),
                                float(r.get("max_memory_gib", float("inf")))))
    return tuple(rules) + BUNDLED_DEVICE_RULES


def device_type_of(name: str, memory_bytes: int, rules: Sequence[DeviceRule] = BUNDLED_DEVICE_RULES) -> str | None:
    """The device type of a GPU called ``name`` with ``memory_bytes`` of memory (first matching rule), or None.

    >>> device_type_of("NVIDIA A100-SXM4-40GB", 42_298_834_944), device_type_of("NVIDIA GH200 480GB", 102 * 2**30)
    ('A100-40', 'GH-96')
    """
    return next((r.device_type for r in rules if r.matches(name, memory_bytes)), None)


def detect_node_devices(*, emulate: str | None = None, table_file: str | Path | None = None) -> NodeDevices | None:
    """This host's devices: ``emulate`` (``TYPE`` or ``TYPE:COUNT``, else ``$HPP_EMULATE_NODE_TYPE``), else CUDA's.

    Returns None on a host without CUDA and without emulation (nothing to check).
    An emulated node without ``:COUNT`` has as many devices as the plan needs (``count`` None).

    Raises
    ------
    HppInputError
        A malformed ``TYPE:COUNT``.
    """
    emulate = emulate or os.environ.get(EMULATE_ENV)
    if emulate:
        kind, _, count = emulate.partition(":")
        if not kind or (count and not count.isdigit()):
            raise HppInputError(f"--emulate-node-type {emulate!r}", field="--emulate-node-type",
                                fix="give TYPE or TYPE:COUNT, e.g. A100-40 or V100-16:4")
        if count:
            return NodeDevices((kind,) * int(count), int(count), emulated=True)
        return NodeDevices((kind,), None, emulated=True)
    import torch   # not on top: 2-9 s to import (-X importtime); the binding itself needs no torch
    if not torch.cuda.is_available():
        return None
    rules = load_device_rules(table_file)
    names, types = [], []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        names.append(props.name)
        types.append(device_type_of(props.name, props.total_memory, rules))
    return NodeDevices(tuple(types), len(types), tuple(names))


def _check_devices(mine: Sequence[RankBinding], *, found_type: str | Sequence[str | None] | None,
                   found_count: int | None, where: str) -> None:
    """Refuse too few GPUs for ``mine`` (``local_index`` = GPU index on this host) or a GPU of another type."""
    if not mine:
        return
    needed = max(b.local_index for b in mine) + 1
    kinds = "/".join(sorted({b.device_type for b in mine}))
    if found_count is not None and found_count < needed:
        raise HppInputError(f"{where} needs {needed} {kinds} devices (local GPU indices up to {needed - 1}) but this "
                            f"host has {found_count}", field="--node-rank",
                            fix="run this share on a host with enough GPUs, or re-plan without the missing ones "
                                "(hpp plan --exclude-devices)")
    if found_type is None:
        return
    for b in mine:
        have = found_type if isinstance(found_type, str) else \
            (found_type[b.local_index] if b.local_index < len(found_type) else b.device_type)
        if have != b.device_type:
            shown = "an unknown GPU type" if have is None else have
            unknown = f"; a GPU name no rule knows: add a rule to ${TABLE_ENV}" if have is None else \
                f" (an emulating CPU host: --emulate-node-type {b.device_type})" if have.startswith("cpu") else ""
            raise HppInputError(f"node {b.node} should have {b.device_type} devices (the plan's cluster) but this "
                                f"host has {shown} (device {b.local_index})", field="--node-rank",
                                fix=f"start this host with the node rank (or --node-map) of a node of its type, or "
                                    f"re-plan{unknown}")


def check_node_devices(plan: Plan, node_index: int, *, found_type: str | Sequence[str | None] | None,
                       found_count: int | None, cluster: Cluster | None = None) -> tuple[RankBinding, ...]:
    """Refuse a host for plan node ``node_index`` whose devices are not the plan's type, or too few.

    Parameters
    ----------
    found_type : str, or one type per local GPU (None: an unknown GPU), or None to skip the type check.
    found_count : int or None
        GPUs the host has (None: as many as needed, e.g. an emulated node without a count).

    Returns
    -------
    tuple of RankBinding
        The node's ranks, in local-rank order.

    Raises
    ------
    HppInputError
        One line naming the node, the expected and the found type, or the count needed and found.
    """
    c = plan_cluster(plan, cluster)
    if not 0 <= node_index < len(c.nodes):
        raise HppInputError(f"node {node_index} is not in the plan's cluster (valid: 0..{len(c.nodes) - 1})",
                            field="--node-rank", fix="use the node index (or --node-map) of this host")
    mine = node_bindings(plan, node_index, c)
    _check_devices(mine, found_type=found_type, found_count=found_count, where=f"node {node_index}")
    return mine


def host_ranks(plan: Plan, *, nnodes: int = 1, node_rank: int = 0, node_map: Sequence[int] | None = None,
               cluster: Cluster | None = None) -> tuple[RankBinding, ...]:
    """The ranks the host of node rank ``node_rank`` starts, in local-rank order; ``local_index`` = its GPU index.

    Several hosts (``nnodes > 1``): host ``i`` plays one plan node (:func:`host_nodes`), as in
    :func:`node_bindings`. One host: it plays every node the plan uses, stacked in node order
    (a node's GPU ``j`` is this host's GPU ``offset + j``, ``offset`` = the devices of the used nodes
    before it), and local rank ``r`` is rank ``r`` (``torchrun --standalone``, the fork launcher).

    Raises
    ------
    HppInputError
        ``nnodes`` is not the number of nodes the plan uses, or a node rank outside ``0..nnodes-1``.
    """
    c = plan_cluster(plan, cluster)
    if nnodes == 1:
        used = sorted({b.node for b in rank_bindings(plan, c)})
        offset, start = {}, 0
        for n in used:
            offset[n], start = start, start + c.nodes[n].num_devices
        return tuple(replace(b, local_index=offset[b.node] + b.local_index) for b in rank_bindings(plan, c))
    nodes = host_nodes(plan, c, node_map)
    if nnodes != len(nodes):
        raise HppInputError(f"--nnodes {nnodes}, but the plan runs on {len(nodes)} nodes "
                            f"({','.join(map(str, nodes))})", field="--nnodes",
                            fix=f"start {len(nodes)} hosts (--nnodes {len(nodes)}), one per plan node")
    if not 0 <= node_rank < nnodes:
        raise HppInputError(f"node rank {node_rank}, but the plan runs on {nnodes} hosts", field="--node-rank",
                            fix=f"use node ranks 0..{nnodes - 1}")
    return node_bindings(plan, nodes[node_rank], c)


def worker_binding(plan: Plan, *, local_rank: int, nnodes: int = 1, node_rank: int = 0,
                   node_map: Sequence[int] | None = None, cluster: Cluster | None = None) -> RankBinding:
    """What local rank ``local_rank`` of this host runs as: the plan rank, its device, its GPU index here.

    Raises
    ------
    HppInputError
        As :func:`host_ranks`, or a local rank beyond this host's ranks.
    """
    mine = host_ranks(plan, nnodes=nnodes, node_rank=node_rank, node_map=node_map, cluster=cluster)
    if not 0 <= local_rank < len(mine):
        raise HppInputError(f"local rank {local_rank}, but this host runs {len(mine)} ranks of the plan",
                            field="--nproc-per-node", fix=f"start {len(mine)} processes on this host")
    return mine[local_rank]


def check_host(plan: Plan, found: NodeDevices | None, *, nnodes: int = 1, node_rank: int = 0,
               node_map: Sequence[int] | None = None, cluster: Cluster | None = None) -> tuple[RankBinding, ...]:
    """Check this host's devices (:func:`detect_node_devices`) for its share of the plan; return its ranks.

    ``found`` None (a CPU host without emulation): nothing is checked. An emulated node of one type
    on a single host that plays nodes of several types is refused (emulate per host, with ``--nnodes``).

    Raises
    ------
    HppInputError
        As :func:`host_ranks` and :func:`check_node_devices` (one line naming the node, the expected
        and the found type, or the devices needed and found).
    """
    mine = host_ranks(plan, nnodes=nnodes, node_rank=node_rank, node_map=node_map, cluster=cluster)
    if found is not None:
        where = f"node {mine[0].node}" if len({b.node for b in mine}) == 1 else \
            f"this host (plan nodes {','.join(map(str, sorted({b.node for b in mine})))})"
        _check_devices(mine, **found.check_args(), where=where)
    return mine


def parse_endpoint(text: str) -> str:
    """Check ``HOST:PORT`` (port 1-65535) and return it.

    >>> parse_endpoint("10.0.0.1:29500")
    '10.0.0.1:29500'

    Raises
    ------
    HppInputError
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise HppInputError(f"--rdzv-endpoint {text!r} is not HOST:PORT", field="--rdzv-endpoint",
                            fix="give node rank 0's address and a free port, e.g. 10.0.0.1:29500")
    return text
