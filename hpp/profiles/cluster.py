"""Clusters: nodes of devices of one type, and the links between them.

A cluster is a tuple of nodes; node ``n`` holds ``num_devices`` devices of one
device type (and optionally sits in a zone). Devices get global ids (ranks) node by
node: node 0's devices are ``0 .. k0-1``, node 1's are ``k0 .. k0+k1-1`` and so on.

Bandwidths are :class:`Link` models: a peak in bytes/s, a latency in seconds and
optionally Sailor's measured fit (``network/*.json`` in the public data), where the
bandwidth for a message of ``x`` bytes is ``(a*L^2 + b*L + c) GB/s`` with
``L = log2(x / 1e6)``, capped at the peak.

Shared network. A link's own figures are what ONE flow between two nodes gets. Flows that leave
(or enter) a node at the same time share that node's network: a link may carry
:class:`AggregateFit` figures, the total bandwidth of ``k`` concurrent flows between two nodes of
its pair (Sailor's ``k -> k`` measurements: an A100-40 node gives 2.42 GB/s to one flow, 6.04 GB/s
to four in all; a GH-96 node, one NIC per GPU, 4 x 22.9; an RTX node 2.86 GB/s to any number), and a
node may state its NIC capacity (``Node.nic_bytes_per_s``, the total of all its flows).
:meth:`Link.shared` gives the link one of ``k`` concurrent flows sees:

    bw_k(x) = min(bw_1(x), agg_k(x) / k, nic / k)

with ``agg_k`` the measured aggregate at ``k`` flows, linear in ``k`` between measured counts (``k = 1``
is the link's own fit) and flat above the largest measured count (a NIC that saturates does not
speed up with more flows). A link without aggregate figures and without a NIC capacity shares
nothing (each flow runs at its one-flow bandwidth: the model before shared networks).

Two network descriptions (JSON forms in :mod:`hpp.profiles.cluster_format`):

- version 1: each node's intra-node link and ONE inter-node link for every pair of nodes;
- version 2 (:class:`NetworkLinks`): links per pair of node groups: the inter-node link of
  each pair of device types (a node of type A to a node of type B), and of each pair of zones
  (nodes in different zones use the zone pair's link); intra-node links per type.

:meth:`Cluster.node_link` gives the link between two nodes under either description.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import combinations_with_replacement
from typing import Any, Callable, Hashable, Iterable, Mapping

from hpp.errors import HppInputError
from hpp.profiles.devices import DeviceType

__all__ = ["AggregateFit", "Link", "Node", "Device", "NetworkLinks", "Cluster", "DEFAULT_LATENCY_S"]

#: Default per-message latency [s] when a cluster gives none (order of a NCCL/ethernet hop).
DEFAULT_LATENCY_S = 1e-5
_BYTES_PER_GB = 1e9

#: a memo's marker for "not computed yet" (None may be a computed value)
_MISSING = object()


@dataclass(frozen=True, slots=True)
class AggregateFit:
    """The total bandwidth of ``flows`` concurrent flows between two nodes (each node sending ``flows`` of them).

    Attributes
    ----------
    flows : int
        Number of concurrent flows, >= 2 (one flow is the :class:`Link`'s own figures).
    max_bytes_per_s : float
        Peak aggregate bandwidth [bytes/s] of the ``flows`` flows together, > 0.
    fit_gb_per_s : tuple of 3 floats or None
        Quadratic fit of the aggregate bandwidth [GB/s] in ``L = log2(x / 1e6)`` for messages of ``x`` bytes
        per flow, as :class:`Link`'s; ``None`` = always the peak.

    Source: Sailor's ``network/multizone_bandwidths_het.json``, entries ``[src][k][dst][k]`` (eth-easl/sailor
    cf2c8e3), or ``hpp profile-network`` on the user's cluster.
    """

    flows: int
    max_bytes_per_s: float
    fit_gb_per_s: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.flows, bool) or not isinstance(self.flows, int) or self.flows < 2:
            raise HppInputError(f"an aggregate figure is for 2 or more concurrent flows, got {self.flows!r}",
                                field="flows", fix="give flows >= 2 (one flow is the link's own figures)")
        if not (self.max_bytes_per_s > 0 and math.isfinite(self.max_bytes_per_s)):
            raise HppInputError(f"aggregate bandwidth must be a positive number of bytes/s, got {self.max_bytes_per_s}",
                                field="max_bytes_per_s", fix="give a bandwidth > 0 in bytes/s")

    def bandwidth_bytes_per_s(self, message_bytes: float) -> float:
        """Aggregate bandwidth [bytes/s] of the ``flows`` flows for messages of ``message_bytes`` each (the peak
        where there is no fit, where it is not positive, or for an empty message)."""
        return _fitted_bandwidth(self.fit_gb_per_s, self.max_bytes_per_s, message_bytes)


def _fitted_bandwidth(fit: tuple[float, float, float] | None, peak: float, message_bytes: float) -> float:
    """``a L^2 + b L + c`` GB/s at ``L = log2(x / 1e6)``, capped at ``peak``; the peak without a fit, where the
    fit is not positive, or for an empty message [bytes/s]."""
    if fit is None or message_bytes <= 0:
        return peak
    x = math.log2(max(message_bytes, 1.0) / 1e6)
    a, b, c = fit
    bw = (a * x * x + b * x + c) * _BYTES_PER_GB
    return peak if bw <= 0 else min(bw, peak)


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
    aggregate : tuple of AggregateFit
        Total bandwidth of 2, 4, ... concurrent flows between two nodes of the link's pair, by increasing
        ``flows`` (module docstring); empty: flows do not share (or nothing is known of it).
    share : int
        The number of concurrent flows this link is priced for (>= 1; :meth:`shared` sets it):
        :meth:`bandwidth_bytes_per_s` is then one flow's share.
    nic_share_bytes_per_s : float
        One flow's share of the nodes' NIC capacity [bytes/s] (``inf``: no NIC capacity given).
    """

    max_bytes_per_s: float
    latency_s: float = DEFAULT_LATENCY_S
    fit_gb_per_s: tuple[float, float, float] | None = None
    aggregate: tuple[AggregateFit, ...] = ()
    share: int = 1
    nic_share_bytes_per_s: float = math.inf

    def __post_init__(self) -> None:
        if not (self.max_bytes_per_s > 0 and math.isfinite(self.max_bytes_per_s)):
            raise HppInputError(f"bandwidth must be a positive number of bytes/s, got {self.max_bytes_per_s}",
                                field="max_bytes_per_s", fix="give a bandwidth > 0 in bytes/s")
        if not self.latency_s >= 0:
            raise HppInputError(f"latency must be >= 0 s, got {self.latency_s}", field="latency_s",
                                fix="give latency_s >= 0")
        counts = [a.flows for a in self.aggregate]
        if counts != sorted(set(counts)):
            raise HppInputError(f"aggregate figures for flow counts {counts}", field="aggregate",
                                fix="give each flow count once, in increasing order")
        if isinstance(self.share, bool) or not isinstance(self.share, int) or self.share < 1:
            raise HppInputError(f"share={self.share!r}", field="share", fix="give a number of flows >= 1")
        if not self.nic_share_bytes_per_s > 0:
            raise HppInputError(f"nic_share_bytes_per_s={self.nic_share_bytes_per_s}", field="nic_bytes_per_s",
                                fix="give a NIC capacity > 0 in bytes/s")

    def __repr__(self) -> str:          # the sharing fields only where set (links print in plans and tests)
        extra = "".join(f", {k}={getattr(self, k)!r}" for k, default in
                        (("aggregate", ()), ("share", 1), ("nic_share_bytes_per_s", math.inf))
                        if getattr(self, k) != default)
        return (f"Link(max_bytes_per_s={self.max_bytes_per_s!r}, latency_s={self.latency_s!r}, "
                f"fit_gb_per_s={self.fit_gb_per_s!r}{extra})")

    @property
    def shares_network(self) -> bool:
        """True if concurrent flows on this link slow each other (aggregate figures or a NIC capacity)."""
        return bool(self.aggregate) or self.nic_share_bytes_per_s < math.inf or self.share > 1

    def single_flow_bytes_per_s(self, message_bytes: float) -> float:
        """One flow's bandwidth alone on the link [bytes/s] (the link's own fit, capped at its peak)."""
        return _fitted_bandwidth(self.fit_gb_per_s, self.max_bytes_per_s, message_bytes)

    def aggregate_bytes_per_s(self, flows: int, message_bytes: float) -> float:
        """Total bandwidth of ``flows`` concurrent flows [bytes/s] (module docstring: the measured aggregate,
        linear in the flow count between measured counts, flat above the largest; ``flows`` x one flow's without
        aggregate figures), before any NIC capacity.

        Examples
        --------
        >>> l = Link(2e9, 0.0, aggregate=(AggregateFit(4, 6e9),))
        >>> [round(l.aggregate_bytes_per_s(k, 1e6) / 1e9, 3) for k in (1, 2, 4, 8)]
        [2.0, 3.333, 6.0, 6.0]
        """
        one = self.single_flow_bytes_per_s(message_bytes)
        if flows <= 1:
            return one
        if not self.aggregate:
            return flows * one
        lo_k, lo_bw = 1, one
        for a in self.aggregate:
            bw = a.bandwidth_bytes_per_s(message_bytes)
            if flows <= a.flows:
                return lo_bw + (bw - lo_bw) * ((flows - lo_k) / (a.flows - lo_k))
            lo_k, lo_bw = a.flows, bw
        return lo_bw

    def shared(self, flows: int, *, nic_bytes_per_s: float = math.inf) -> "Link":
        """This link as one of ``flows`` concurrent flows sees it, with nodes of NIC capacity ``nic_bytes_per_s``.

        Its :meth:`bandwidth_bytes_per_s` is ``min(bw_1(x), agg_flows(x) / flows, nic / flows)``
        (module docstring): never above one flow's own bandwidth.

        Examples
        --------
        >>> l = Link(2.42e9, 0.0, aggregate=(AggregateFit(4, 6.04e9),))
        >>> round(l.shared(4).bandwidth_bytes_per_s(1e9) / 1e9, 2)
        1.51
        >>> round(Link(2e9, 0.0).shared(4, nic_bytes_per_s=4e9).bandwidth_bytes_per_s(1e9) / 1e9, 2)
        1.0
        """
        if flows <= 1 and nic_bytes_per_s == math.inf:
            return self if self.share == 1 else replace(self, share=1, nic_share_bytes_per_s=math.inf)
        k = max(1, int(flows))
        return replace(self, share=k, nic_share_bytes_per_s=nic_bytes_per_s / k)

    def bandwidth_bytes_per_s(self, message_bytes: float) -> float:
        """Effective bandwidth [bytes/s] of one message of ``message_bytes`` bytes (Sailor's network fits,
        ``network/multizone_bandwidths_het.json``; the peak when no fit is given or the fit is not positive),
        one flow's share when the link is :meth:`shared`."""
        one = _fitted_bandwidth(self.fit_gb_per_s, self.max_bytes_per_s, message_bytes)
        if self.share == 1:
            return min(one, self.nic_share_bytes_per_s)
        return min(one, self.aggregate_bytes_per_s(self.share, message_bytes) / self.share,
                   self.nic_share_bytes_per_s)

    @property
    def peak_bytes_per_s(self) -> float:
        """The largest bandwidth one flow gets at any message size [bytes/s] (an upper bound of
        :meth:`bandwidth_bytes_per_s`): the peak, or the flow's share of the aggregate and NIC peaks."""
        if self.share == 1:
            return min(self.max_bytes_per_s, self.nic_share_bytes_per_s)
        agg = [a.max_bytes_per_s for a in self.aggregate]
        peak_agg = self.aggregate_bytes_per_s(self.share, 0.0) if agg else math.inf
        return min(self.max_bytes_per_s, peak_agg / self.share, self.nic_share_bytes_per_s)

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
    zone : str or None
        The node's zone (version-2 clusters; ``None``: no zones).
    nic_bytes_per_s : float
        The node's network capacity [bytes/s]: the total of all flows that leave it (or enter it) at
        once; ``inf`` when not given (then only the links' aggregate figures share).
    """

    device_type: str
    num_devices: int
    intra_node: Link
    zone: str | None = None
    nic_bytes_per_s: float = math.inf

    def __post_init__(self) -> None:
        if not self.nic_bytes_per_s > 0:
            raise HppInputError(f"nic_bytes_per_s={self.nic_bytes_per_s}", field="nic_bytes_per_s",
                                fix="give the node's network capacity in bytes/s, > 0")


@dataclass(frozen=True, slots=True)
class Device:
    """One physical device: global id (rank), node index, index inside the node, type name."""

    device_id: int
    node: int
    local_index: int
    device_type: str


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class NetworkLinks:
    """Inter-node links per pair of node groups (version-2 clusters).

    Attributes
    ----------
    inter : Mapping[(str, str), Link]
        Link between a node of type A and a node of type B, keyed by the sorted pair
        ``(min(A, B), max(A, B))``; ``(A, A)`` between two nodes of type A.
    zone_links : Mapping[(str, str), Link]
        Link between nodes of two different zones, keyed by the sorted pair; used instead of
        ``inter`` whenever the two nodes' zones differ.
    zones : tuple of str
        The declared zones (empty: none).
    defaulted : tuple of str
        The links a cluster file left out that were filled with Sailor's measured fits (one public cloud's), as
        ``"inter_node A-B"`` / ``"intra_node A"``; empty for a file that gives every link it uses.
    """

    inter: Mapping[tuple[str, str], Link]
    zone_links: Mapping[tuple[str, str], Link] = field(default_factory=dict)
    zones: tuple[str, ...] = ()
    defaulted: tuple[str, ...] = field(default=(), compare=False)      # provenance, not the network

    def type_link(self, a: str, b: str) -> Link | None:
        """The (a, b) inter-node link, or None if not given."""
        return self.inter.get(_pair(a, b))

    def zone_link(self, a: str, b: str) -> Link | None:
        """The (a, b) zone link, or None if not given."""
        return self.zone_links.get(_pair(a, b))


def _slowest(links: Iterable[Link]) -> Link:
    """The link of least peak bandwidth (first one on ties)."""
    return min(links, key=lambda l: l.max_bytes_per_s)


@dataclass(frozen=True)
class Cluster:
    """Nodes of devices, device types and the links between nodes.

    Attributes
    ----------
    name : str
    device_types : Mapping[str, DeviceType]
    nodes : tuple[Node, ...]
    inter_node : Link
        Version 1: the link between devices of different nodes. Version 2: the slowest (least
        peak) inter-node link between any two nodes of the cluster (the one-link view that
        :meth:`single_link` keeps; code that wants the actual link uses :meth:`node_link`).
    network : NetworkLinks or None
        Version 2: links per pair of device types and of zones; ``None`` = version 1.
    """

    name: str
    device_types: Mapping[str, DeviceType]
    nodes: tuple[Node, ...]
    inter_node: Link
    network: NetworkLinks | None = None
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
        if self.network is not None:
            self._check_network(self.network)

    def _check_network(self, net: NetworkLinks) -> None:
        """Every pair of node groups the cluster holds has a link; zones are declared; all or no nodes zoned."""
        zoned = [n.zone is not None for n in self.nodes]
        if any(zoned) and not all(zoned):
            i = zoned.index(False)
            raise HppInputError(f"node {i} has no zone while other nodes have one", field=f"nodes[{i}].zone",
                                fix=f"give every node a zone (one of {list(net.zones)}) or none")
        for i, n in enumerate(self.nodes):
            if n.zone is not None and n.zone not in net.zones:
                raise HppInputError(f"unknown zone {n.zone!r}", field=f"nodes[{i}].zone",
                                    fix=f"use one of {list(net.zones)} or declare it under zones")
        groups: dict[str | None, dict[str, int]] = {}
        for n in self.nodes:
            per = groups.setdefault(n.zone, {})
            per[n.device_type] = per.get(n.device_type, 0) + 1
        for zone, per in groups.items():
            for a, b in combinations_with_replacement(sorted(per), 2):
                if (a != b or per[a] > 1) and net.type_link(a, b) is None:
                    where = f" in zone {zone!r}" if zone is not None else ""
                    raise HppInputError(f"no inter-node link between {a} and {b}{where}: the cluster holds both",
                                        field="links.inter_node",
                                        fix=f'add {{"between": ["{a}", "{b}"], "link": BYTES_PER_S}}')
        for za, zb in combinations_with_replacement(sorted(z for z in groups if z is not None), 2):
            if za != zb and net.zone_link(za, zb) is None:
                raise HppInputError(f"no link between zones {za} and {zb}: the cluster has nodes in both",
                                    field="links.zones", fix=f'add {{"between": ["{za}", "{zb}"], "link": BYTES_PER_S}}')

    @property
    def per_pair(self) -> bool:
        """True for a version-2 cluster (links per pair of node groups)."""
        return self.network is not None

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

    def type_link(self, type_a: str, type_b: str, zone_a: str | None = None, zone_b: str | None = None) -> Link:
        """The inter-node link between a node of ``type_a`` (in ``zone_a``) and one of ``type_b`` (``zone_b``).

        Version 2: the zone pair's link when both zones are given and differ, else the type pair's.
        Version 1: :attr:`inter_node`. Symmetric in (a, b).

        Raises
        ------
        HppInputError
            No link for that pair (the cluster holds no such pair of nodes).
        """
        net = self.network
        if net is None:
            return self.inter_node
        if zone_a is not None and zone_b is not None and zone_a != zone_b:
            got, what = net.zone_link(zone_a, zone_b), f"zones {zone_a} and {zone_b}"
        else:
            got, what = net.type_link(type_a, type_b), f"{type_a} and {type_b}"
        if got is None:
            raise HppInputError(f"no inter-node link between {what}", field="links",
                                fix="give the link in the cluster's links section")
        return got

    def node_pair_links(self, type_a: str, type_b: str) -> tuple[Link, ...]:
        """The distinct links between a node of ``type_a`` and a different node of ``type_b``: :meth:`type_link` of
        every zone pair two such nodes span (zones in sorted order), memoised; () when no two such nodes exist.
        Version 1: ``(inter_node,)`` when they do.

        Raises
        ------
        HppInputError
            A link for such a pair is missing (:meth:`type_link`).
        """
        key = ("node_pair_links", type_a, type_b)
        got = self._cache.get(key)
        if got is None:
            za = Counter(n.zone for n in self.nodes if n.device_type == type_a)
            zb = Counter(n.zone for n in self.nodes if n.device_type == type_b)
            pairs = [(x, y) for x in sorted(za, key=str) for y in sorted(zb, key=str)
                     if x != y or type_a != type_b or za[x] > 1]          # two different nodes
            got = () if not pairs else (self.inter_node,) if self.network is None else \
                tuple(dict.fromkeys(self.type_link(type_a, type_b, x, y) for x, y in pairs))
            self._cache[key] = got
        return got

    def memoised(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, computed once per ``key`` for this cluster (a cluster is immutable, so any figure derived
        from it alone can be kept with it; e.g. the p2p link options of :mod:`hpp.formulation.collectives`)."""
        got = self._cache.get(key, _MISSING)
        if got is _MISSING:
            got = self._cache[key] = compute()
        return got

    def node_link(self, i: int, j: int) -> Link:
        """The link between a device of node ``i`` and one of node ``j`` (node ``i``'s intra-node link if i == j)."""
        if i == j:
            return self.nodes[i].intra_node
        if self.network is None:
            return self.inter_node
        key = (i, j) if i < j else (j, i)
        got = self._cache.get(("node_link", key))
        if got is None:
            a, b = self.nodes[i], self.nodes[j]
            got = self._cache[("node_link", key)] = self.type_link(a.device_type, b.device_type, a.zone, b.zone)
        return got

    def link(self, a: int, b: int) -> Link:
        """The link between devices ``a`` and ``b`` (:meth:`node_link` of their nodes)."""
        return self.node_link(self.devices[a].node, self.devices[b].node)

    def slowest_link(self, device_ids: "list[int] | tuple[int, ...]") -> Link:
        """The link of least peak bandwidth among all pairs of ``device_ids`` (one node => intra)."""
        nodes = sorted({self.devices[d].node for d in device_ids})
        if len(nodes) == 1:
            return self.nodes[nodes[0]].intra_node
        if self.network is None:
            return self.inter_node
        return _slowest(self.node_link(i, j) for k, i in enumerate(nodes) for j in nodes[k + 1:])

    def link_bound(self, device_types: Iterable[str]) -> Link:
        """A link never slower, at any message size, than any link between devices of ``device_types``.

        Over the intra-node links of the nodes of those types and the inter-node links between
        any two of their nodes (zones included): the largest peak, the least latency, no fit
        (a fitted link's bandwidth never exceeds its peak). A valid optimistic link for lower
        bounds of communication time.

        Examples
        --------
        >>> from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
        >>> c = Cluster("c", dict(BUNDLED_DEVICE_TYPES), (Node("A100-40", 2, Link(2e11, 1e-6)),
        ...             Node("V100-16", 2, Link(1e11, 2e-6))), Link(1e9, 1e-5))
        >>> c.link_bound(["V100-16"])
        Link(max_bytes_per_s=100000000000.0, latency_s=2e-06, fit_gb_per_s=None)

        Raises
        ------
        HppInputError
            A device type the cluster has no node of.
        """
        return self._bound(set(device_types), inter_only=False)

    def inter_link_bound(self, device_types: Iterable[str]) -> Link:
        """As :meth:`link_bound`, over the inter-node links only (between two different nodes of those types).

        With a single node of those types (no inter-node link among them): :meth:`link_bound`.
        """
        return self._bound(set(device_types), inter_only=True)

    def _bound(self, types: set[str], *, inter_only: bool) -> Link:
        missing = sorted(types - {n.device_type for n in self.nodes})
        if missing or not types:
            raise HppInputError(f"the cluster has no node of device type(s) {missing}", field="device_types",
                                fix=f"use types of {sorted(self.count_by_type())}")
        key = ("link_bound", frozenset(types), inter_only)
        got = self._cache.get(key)
        if got is not None:
            return got
        idx = [i for i, n in enumerate(self.nodes) if n.device_type in types]
        if inter_only and len(idx) < 2:
            return self._bound(types, inter_only=False)
        links = [] if inter_only else [self.nodes[i].intra_node for i in idx]
        if len(idx) > 1:
            if self.network is None:
                links.append(self.inter_node)
            else:
                classes = sorted({(self.nodes[i].device_type, self.nodes[i].zone or "") for i in idx})
                links += [self.type_link(ta, tb, za or None, zb or None)
                          for (ta, za), (tb, zb) in combinations_with_replacement(classes, 2)
                          if (ta, za) != (tb, zb) or sum(1 for i in idx if (self.nodes[i].device_type,
                                                                             self.nodes[i].zone or "")
                                                         == (ta, za)) > 1]
        got = self._cache[key] = Link(max(l.max_bytes_per_s for l in links), min(l.latency_s for l in links))
        return got

    def unshared(self) -> "Cluster":
        """This cluster with links that share nothing: every link without its aggregate figures, every node without
        a NIC capacity (each flow at its one-flow bandwidth, however many leave a node: the model before shared
        networks, for comparisons)."""
        def bare(link: Link) -> Link:
            return replace(link, aggregate=(), share=1, nic_share_bytes_per_s=math.inf)

        net = self.network
        if net is not None:
            net = NetworkLinks({k: bare(v) for k, v in net.inter.items()},
                               {k: bare(v) for k, v in net.zone_links.items()}, net.zones, net.defaulted)
        return Cluster(self.name, self.device_types,
                       tuple(replace(n, intra_node=bare(n.intra_node), nic_bytes_per_s=math.inf) for n in self.nodes),
                       bare(self.inter_node), net)

    def single_link(self) -> "Cluster":
        """This cluster as version 1: the same nodes, :attr:`inter_node` between every pair of nodes."""
        return Cluster(self.name, self.device_types, tuple(Node(n.device_type, n.num_devices, n.intra_node)
                                                           for n in self.nodes), self.inter_node)
