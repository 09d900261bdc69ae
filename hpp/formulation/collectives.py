"""Collective and point-to-point pricing on the cluster's actual links: pure functions.

- :func:`ring_allreduce_s`: one ring all-reduce over one link (Patarasuk & Yuan 2009).
- :func:`allreduce_s`: the all-reduce of a gradient block among the pipelines that hold it,
  priced on the ring its holders form: the best ring order, or hierarchical where cheaper.
- :func:`allreduce_lower_bound_s`: a lower bound of :func:`allreduce_s` from one optimistic link
  (:meth:`~hpp.profiles.cluster.Cluster.link_bound`), for the search's bounds.
- :func:`p2p_link_options`: the links the search assumes between two adjacent stages.
- :func:`p2p_transfer_s`, :func:`stage_p2p_wait_s`: a stage's point-to-point transfers and waits
  (formulas in :mod:`hpp.formulation.cost_model`'s docstring).

Ring model. Holder ``p`` contributes the device ids of its stage (``t_p`` devices, one TP
group); TP shard ``j`` forms one ring of the devices ``j mod t_p`` of every holder, and the
rings of all shards run at the same time (the slowest one counts). A ring of ``n`` ranks moves
``2 (n - 1)`` chunks of ``B / n`` bytes over each of its edges, one after the other, so it takes
``2 (n-1) (latency + (B/n) / bw(B/n))`` on its slowest edge: :func:`ring_allreduce_s` over the
slowest adjacent pair (at the chunk size). Inter-node links are one device to one device
(Sailor's fits at one device per node); rings that share a node's network do not slow each other
down (as before this module).

Best ring order. The ranks of one node are consecutive (their edges use the node's intra-node
link); nodes of one class (device type, zone) are consecutive (their edges use the class's own
inter-node link); the cyclic order of the classes is the one whose slowest edge is fastest,
searched exhaustively up to :data:`EXACT_CLASS_ORDERS_UP_TO` classes, greedily (nearest class
next) beyond. Orders that visit a class twice are not searched (stated rule).

Hierarchical (NCCL-style, for rings whose ``k >= 2`` nodes each hold the same ``g >= 2`` ranks):
reduce-scatter inside each node, ``g`` rings of ``B / g`` bytes across the ``k`` nodes (one per
local rank, in parallel, best node order), all-gather inside each node:
``max_node ring_allreduce_s(B, g, intra) + ring_allreduce_s(B / g, k, slowest inter edge)``
(reduce-scatter + all-gather = one ring all-reduce's traffic). It is used where it is cheaper
than the flat ring.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from itertools import permutations
from typing import Mapping, Sequence

import numpy as np

from hpp.formulation.cost_config import CostModelConfig
from hpp.profiles.cluster import Cluster, Link
from hpp.profiles.model_profile import LayerProfile

__all__ = ["AllReduceCost", "pipeline_link", "ring_allreduce_s", "ring_allreduce_np", "bandwidth_np", "fit_x",
           "fit_gb_per_s", "allreduce_s", "concurrent_allreduces", "edge_link", "p2p_flows", "allreduce_lower_bound_s", "p2p_link_options",
           "p2p_transfer_s", "p2p_waits_per_transfer", "stage_p2p_wait_s", "EXACT_CLASS_ORDERS_UP_TO"]

#: Up to this many node classes the ring's class order is searched exhaustively ((c-1)! orders).
EXACT_CLASS_ORDERS_UP_TO = 7


@dataclass(frozen=True, slots=True)
class AllReduceCost:
    """Price of one all-reduce.

    Attributes
    ----------
    seconds : float
        Time of the all-reduce [s] (the slowest TP shard's ring).
    method : str
        ``"none"`` (one holder or no bytes), ``"ring"`` (flat ring) or ``"hierarchical"``.
    order : tuple of int
        Device ids of the priced (slowest) ring in ring order.
    link : Link or None
        The link the ring's time is priced on: the node's intra-node link (one node), the slowest edge of the
        best order (flat ring across nodes), the ring across nodes' slowest edge (hierarchical); None for "none".
        Across nodes it is one flow's share of the pair's link (:func:`edge_link`).
    flows : int
        The most flows leaving one of the priced ring's nodes at once that its inter-node edges share (1: none
        shared, or inside one node).
    """

    seconds: float
    method: str
    order: tuple[int, ...]
    link: Link | None = None
    flows: int = 1


def ring_allreduce_s(num_bytes: float, num_ranks: int, link: Link) -> float:
    """Ring all-reduce of ``num_bytes`` among ``num_ranks`` ranks over ``link`` [s].

    ``2 (n-1)/n * bytes / bw + 2 (n-1) * latency`` (Patarasuk & Yuan 2009; HPP.md).
    The bandwidth is the link's effective bandwidth for a message of ``bytes / n``
    (one ring chunk). 0 for one rank or no bytes.

    Examples
    --------
    >>> ring_allreduce_s(1e9, 2, Link(1e9, 0.0))
    1.0
    """
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    chunk = num_bytes / num_ranks
    bw = link.bandwidth_bytes_per_s(chunk)
    return 2.0 * (num_ranks - 1) / num_ranks * num_bytes / bw + 2.0 * (num_ranks - 1) * link.latency_s


def fit_x(message_bytes: np.ndarray) -> np.ndarray:
    """The abscissa of a link's bandwidth fit, ``L = log2(max(bytes, 1) / 1e6)`` (elementwise; see
    :class:`~hpp.profiles.cluster.Link`)."""
    return np.log2(np.maximum(message_bytes, 1.0) / 1e6)


def fit_gb_per_s(link: Link, x):
    """``a L^2 + b L + c`` [GB/s], the raw quadratic fit of ``link`` at ``x = L`` (elementwise; not capped;
    ``link.fit_gb_per_s`` must be set)."""
    a, b, c = link.fit_gb_per_s
    return a * x * x + b * x + c


def bandwidth_np(link: Link, message_bytes: np.ndarray) -> np.ndarray:
    """:meth:`Link.bandwidth_bytes_per_s <hpp.profiles.cluster.Link.bandwidth_bytes_per_s>` vectorised over
    ``message_bytes`` [bytes/s] (same floats): the fit capped at the peak, the peak where the fit is not
    positive, where there is none, or for an empty message.

    >>> link = Link(10e9, 0.0, fit_gb_per_s=(0.0, 1.0, 2.0))
    >>> bandwidth_np(link, np.array([0.0, 1e6, 2e6, 1e12])).tolist() == [link.bandwidth_bytes_per_s(v)
    ...                                                                  for v in (0.0, 1e6, 2e6, 1e12)]
    True
    >>> from hpp.profiles.cluster import AggregateFit
    >>> shared = Link(10e9, 0.0, (0.0, 1.0, 2.0), (AggregateFit(4, 2e10, (0.0, 2.0, 3.0)),)).shared(3)
    >>> bandwidth_np(shared, np.array([0.0, 1e6, 2e6, 1e12])).tolist() == [shared.bandwidth_bytes_per_s(v)
    ...                                                                    for v in (0.0, 1e6, 2e6, 1e12)]
    True
    """
    message_bytes = np.asarray(message_bytes, dtype=np.float64)
    one = _fitted_np(link.fit_gb_per_s, link.max_bytes_per_s, message_bytes)
    if link.share > 1 and link.aggregate:
        lo_k, lo_bw, agg = 1, one, None
        for a in link.aggregate:
            bw = _fitted_np(a.fit_gb_per_s, a.max_bytes_per_s, message_bytes)
            if link.share <= a.flows:
                agg = lo_bw + (bw - lo_bw) * ((link.share - lo_k) / (a.flows - lo_k))
                break
            lo_k, lo_bw = a.flows, bw
        one = np.minimum(one, (lo_bw if agg is None else agg) / link.share)
    return np.minimum(one, link.nic_share_bytes_per_s) if link.nic_share_bytes_per_s < math.inf else one


def _fitted_np(fit, peak: float, message_bytes: np.ndarray) -> np.ndarray:
    """``_fitted_bandwidth`` of :mod:`hpp.profiles.cluster` elementwise (the same floats)."""
    if fit is None:
        return np.full(message_bytes.shape, peak)
    a, b, c = fit
    x = fit_x(message_bytes)
    bw = (a * x * x + b * x + c) * 1e9
    return np.where((bw > 0) & (message_bytes > 0), np.minimum(bw, peak), peak)


def ring_allreduce_np(w: np.ndarray, h: np.ndarray, link: Link) -> np.ndarray:
    """:func:`ring_allreduce_s` vectorised over broadcast ``w`` [bytes] and ``h`` (>= 2) ranks [s] (same floats)."""
    bw = bandwidth_np(link, w / h)
    return 2.0 * (h - 1) / h * w / bw + 2.0 * (h - 1) * link.latency_s


def hierarchical_allreduce_s(num_bytes: float, per_node: int, num_nodes: int, intra: Link, inter: Link) -> float:
    """Reduce-scatter and all-gather inside each node (a ring of ``per_node`` over ``intra``) plus a ring of
    ``num_nodes`` over ``inter`` on ``num_bytes / per_node`` [s] (NCCL's tree/ring hierarchy, as priced here)."""
    return ring_allreduce_s(num_bytes, per_node, intra) + ring_allreduce_s(num_bytes / per_node, num_nodes, inter)


def allreduce_lower_bound_s(num_bytes: float, num_ranks: int, link: Link) -> float:
    """A lower bound of :func:`allreduce_s` among ``num_ranks`` holders when ``link`` is never slower than theirs.

    ``2 (n-1)/n * B / peak + 2 (2 sqrt(n) - 2) * latency``: the flat ring and the hierarchical form
    move the same ``2 (n-1)/n B`` bytes through each rank (with ``n = g k``:
    ``(g-1)/g + (k-1)/(g k) = (n-1)/n``), no faster than the peak; the hierarchical form takes
    ``2 (g - 1) + 2 (k - 1) >= 2 (2 sqrt(n) - 2)`` latency steps, the flat one ``2 (n - 1)`` (more).
    Use ``link = cluster.link_bound(types)`` (largest peak, least latency).

    Examples
    --------
    >>> allreduce_lower_bound_s(1e9, 4, Link(1e9, 0.0))
    1.5
    """
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    steps = max(0.0, 2.0 * math.sqrt(num_ranks) - 2.0)
    return 2.0 * (num_ranks - 1) / num_ranks * num_bytes / link.max_bytes_per_s + 2.0 * steps * link.latency_s


def _class_of(cluster: Cluster, node: int) -> tuple[str, str]:
    n = cluster.nodes[node]
    return n.device_type, n.zone or ""


def _best_node_order(cluster: Cluster, nodes: Sequence[int], chunk_bytes: float) -> tuple[tuple[int, ...], Link]:
    """Cyclic order of ``nodes`` (>= 2) and its slowest inter-node edge at ``chunk_bytes`` (module docstring),
    on the links' one-flow figures (the order does not depend on how many flows share them)."""
    by_class: dict[tuple[str, str], list[int]] = {}
    for i in sorted(nodes):
        by_class.setdefault(_class_of(cluster, i), []).append(i)
    classes = sorted(by_class)
    rep = {c: by_class[c][0] for c in classes}

    def cross(a: tuple[str, str], b: tuple[str, str]) -> Link:
        return cluster.node_link(rep[a], rep[b])

    own = [cluster.node_link(by_class[c][0], by_class[c][1]) for c in classes if len(by_class[c]) > 1]

    def cost(link: Link) -> float:
        return link.transfer_s(chunk_bytes)

    def slowest(order: Sequence[tuple[str, str]]) -> Link:
        edges = own + ([cross(a, b) for a, b in zip(order, order[1:] + order[:1])] if len(order) > 1 else [])
        return max(edges, key=cost)

    if len(classes) <= EXACT_CLASS_ORDERS_UP_TO:
        orders = [[classes[0], *rest] for rest in permutations(classes[1:])]
        best = min(orders, key=lambda o: cost(slowest(o)))
    else:                               # greedy: the nearest (fastest-linked) class next
        best, left = [classes[0]], set(classes[1:])
        while left:
            nxt = min(sorted(left), key=lambda c: cost(cross(best[-1], c)))
            best.append(nxt)
            left.remove(nxt)
    return tuple(i for c in best for i in by_class[c]), slowest(best)


def edge_link(cluster: Cluster, a: int, b: int, flows: Mapping[int, int] | None = None) -> Link:
    """The link one flow from node ``a`` to a different node ``b`` sees when ``flows[n]`` flows leave (and enter)
    node ``n`` at once: :meth:`Link.shared <hpp.profiles.cluster.Link.shared>` of the pair's link at
    ``k = max(flows[a], flows[b])`` flows, and the nodes' NIC capacities shared by their own flows
    (``min(nic_a / flows[a], nic_b / flows[b])`` per flow). ``flows`` None or a node missing: one flow.

    Examples
    --------
    >>> from hpp.profiles.cluster import AggregateFit, Node
    >>> from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
    >>> l = Link(2.42e9, 0.0, aggregate=(AggregateFit(4, 6.04e9),))
    >>> c = Cluster("c", dict(BUNDLED_DEVICE_TYPES), (Node("A100-40", 4, Link(1e11, 0.0)),) * 2, l)
    >>> round(edge_link(c, 0, 1, {0: 4, 1: 1}).bandwidth_bytes_per_s(1e9) / 1e9, 2)
    1.51
    """
    link = cluster.node_link(a, b)
    ka = max(1, flows.get(a, 1)) if flows else 1
    kb = max(1, flows.get(b, 1)) if flows else 1
    na, nb = cluster.nodes[a].nic_bytes_per_s, cluster.nodes[b].nic_bytes_per_s
    k = max(ka, kb)
    if (k == 1 or not link.aggregate) and na == nb == math.inf:      # nothing shares: one flow's own link
        return link
    nic = min(na / ka, nb / kb) * k
    return link.shared(k, nic_bytes_per_s=nic)


@dataclass(frozen=True, slots=True)
class _RingShape:
    """One ring of device ids across nodes, in ring order: its nodes' cyclic order, the holders per node, the
    slowest intra-node link among nodes holding two or more, and whether it admits the hierarchical form."""

    order: tuple[int, ...]
    node_order: tuple[int, ...]
    per_node: dict
    intra: Link | None
    hier_g: int                         # g >= 2 when every node holds g ranks (hierarchical admissible), else 0


def _ring_shape(ranks: Sequence[int], cluster: Cluster, num_bytes: float) -> _RingShape:
    node_of = {d: cluster.devices[d].node for d in ranks}
    per_node = Counter(node_of.values())
    node_order = (_best_node_order(cluster, list(per_node), num_bytes / len(ranks))[0] if len(per_node) > 1
                  else tuple(per_node))
    on_node: dict[int, list[int]] = {}
    for d in ranks:
        on_node.setdefault(node_of[d], []).append(d)
    order = tuple(d for i in node_order for d in on_node[i])
    g = next(iter(per_node.values()))
    hier_g = g if g > 1 and all(c == g for c in per_node.values()) else 0
    multi = [cluster.nodes[i].intra_node for i, c in per_node.items() if c > 1]
    chunk = num_bytes / len(ranks)
    intra = max(multi, key=lambda l: l.transfer_s(chunk)) if multi else None
    return _RingShape(order, node_order, dict(per_node), intra, hier_g)


def _flat_ring_s(num_bytes: float, shape: _RingShape, cluster: Cluster,
                 flows: Mapping[int, int] | None) -> tuple[float, Link]:
    """The flat ring in ``shape``'s order: every inter-node edge on :func:`edge_link` with ``flows``."""
    n = len(shape.order)
    chunk = num_bytes / n
    nodes = shape.node_order
    edges = [edge_link(cluster, a, b, flows) for a, b in zip(nodes, nodes[1:] + nodes[:1])]
    if shape.intra is not None:
        edges.append(shape.intra)
    slowest = max(edges, key=lambda l: l.transfer_s(chunk))
    return ring_allreduce_s(num_bytes, n, slowest), slowest


def _hier_ring_s(num_bytes: float, shape: _RingShape, cluster: Cluster,
                 flows: Mapping[int, int] | None) -> tuple[float, Link]:
    """The hierarchical form of ``shape`` (``hier_g`` ranks per node): intra-node reduce-scatter and all-gather,
    ``g`` rings of ``B / g`` across the nodes, each inter-node edge on :func:`edge_link` with ``flows``."""
    g, k = shape.hier_g, len(shape.node_order)
    node_order, _ = _best_node_order(cluster, list(shape.node_order), num_bytes / g / k)
    chunk = num_bytes / g / k
    edges = [edge_link(cluster, a, b, flows) for a, b in zip(node_order, node_order[1:] + node_order[:1])]
    inter = max(edges, key=lambda l: l.transfer_s(chunk))
    slowest_intra = max((cluster.nodes[i].intra_node for i in shape.node_order),
                        key=lambda l: ring_allreduce_s(num_bytes, g, l))
    return hierarchical_allreduce_s(num_bytes, g, k, slowest_intra, inter), inter


def _senders(shape: _RingShape, method: str, cluster: Cluster) -> dict[int, frozenset[int]]:
    """The devices of each node that one ring has send across nodes: for a flat ring across nodes the last rank
    of the node's run (it sends to the next node), for the hierarchical form every rank of the node (one ring
    per local rank); none inside one node."""
    if len(shape.node_order) < 2:
        return {}
    out: dict[int, set[int]] = {}
    for d in shape.order:                       # ring order: a node's run is contiguous
        out.setdefault(cluster.devices[d].node, []).append(d)
    return {i: frozenset(ds if method == "hierarchical" else ds[-1:]) for i, ds in out.items()}


def _flow_counts(senders: dict[int, frozenset[int]]) -> dict[int, int]:
    return {i: len(ds) for i, ds in senders.items()}


def _ring_options(num_bytes: float, shape: _RingShape, cluster: Cluster, *, hierarchical: bool,
                  flows: Mapping[int, int] | None) -> list[tuple[float, str, Link]]:
    """(seconds, form, link) of each form ``shape`` admits, every inter-node edge priced with ``flows``
    (None: the ring alone, each form with its own :func:`_senders`)."""
    out = []
    for m in ("ring", "hierarchical") if hierarchical and shape.hier_g else ("ring",):
        price = _hier_ring_s if m == "hierarchical" else _flat_ring_s
        k = _flow_counts(_senders(shape, m, cluster)) if flows is None else flows
        out.append((*price(num_bytes, shape, cluster, k), m))
    return [(t, m, link) for t, link, m in out]


def _block_cost(num_bytes: float, shapes: Sequence[_RingShape], cluster: Cluster, *, hierarchical: bool,
                flows: Mapping[int, int] | None) -> tuple[AllReduceCost, dict[int, int]]:
    """The all-reduce of one block whose TP-shard rings ``shapes`` run at once (the slowest ring counts; each
    ring flat, or hierarchical where it admits it and it is cheaper), and the flows it sends out of each node.

    ``flows`` None: the block alone. Each ring first picks its form alone; the distinct devices that the
    forms have send across nodes (:func:`_senders`, over all the rings: a device of a lower-TP holder in
    several shard rings sends its pieces one after the other, one flow) are the flows each node sends at
    once, and every ring is priced again with them. Otherwise every ring is priced with ``flows``."""
    one_node = [s for s in shapes if len(s.node_order) == 1]
    multi = [s for s in shapes if len(s.node_order) > 1]
    if not multi:                       # every ring inside one node: the node's intra-node link
        worst = max(one_node, key=lambda s: ring_allreduce_s(num_bytes, len(s.order),
                                                             cluster.nodes[s.node_order[0]].intra_node))
        intra = cluster.nodes[worst.node_order[0]].intra_node
        return AllReduceCost(ring_allreduce_s(num_bytes, len(worst.order), intra), "ring", worst.order, intra), {}
    senders: dict[int, frozenset[int]] = {}
    for s in multi if flows is None else ():    # each ring's form alone, and the devices that then send across nodes
        _, m, _ = min(_ring_options(num_bytes, s, cluster, hierarchical=hierarchical, flows=None),
                      key=lambda r: r[0])
        for i, ds in _senders(s, m, cluster).items():
            senders[i] = senders.get(i, frozenset()) | ds
    sent = _flow_counts(senders)
    k = sent if flows is None else flows
    priced = [(*min(_ring_options(num_bytes, s, cluster, hierarchical=hierarchical, flows=k), key=lambda r: r[0]),
               s) for s in multi]
    t, m, link, shape = max(priced, key=lambda r: r[0])
    for s in one_node:
        t = max(t, ring_allreduce_s(num_bytes, len(s.order), cluster.nodes[s.node_order[0]].intra_node))
    return AllReduceCost(t, m, shape.order, link, max(k.get(i, 1) for i in shape.node_order)), sent


def _shard_rings(groups: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    width = max(len(g) for g in groups)
    return sorted({tuple(sorted(g[j % len(g)] for g in groups)) for j in range(width)})


def _shapes(num_bytes: float, groups: Sequence[Sequence[int]], cluster: Cluster, memo: dict | None) -> list[_RingShape]:
    """The TP-shard rings of ``groups`` (:func:`_ring_shape`); with ``memo``, each ring's shape is kept by its ranks
    (its node order chosen at the first message size priced: the block's, for the block's per-layer pieces)."""
    out = []
    for r in _shard_rings(groups):
        got = memo.get(r) if memo is not None else None
        if got is None:
            got = _ring_shape(r, cluster, num_bytes)
            if memo is not None:
                memo[r] = got
        out.append(got)
    return out


def allreduce_s(num_bytes: float, groups: Sequence[Sequence[int]], cluster: Cluster, *,
                hierarchical: bool = True, flows: Mapping[int, int] | None = None,
                memo: dict | None = None) -> AllReduceCost:
    """All-reduce of ``num_bytes`` (per device) among holders ``groups`` on their actual links.

    Parameters
    ----------
    num_bytes : float
        Bytes each device of a holder all-reduces (the block's gradient per device).
    groups : sequence of device-id tuples
        Per holder (pipeline), the devices of its stage that holds the block (one TP group).
    cluster : Cluster
    hierarchical : bool
        Consider the hierarchical form (module docstring); False: flat ring only.
    flows : mapping node -> int, optional
        Flows that leave each node at once (this all-reduce's own included): every inter-node edge
        is priced on :func:`edge_link`. None: this all-reduce alone, its TP shards' rings sharing the
        nodes they leave together (:func:`concurrent_allreduces` prices several at once).
    memo : dict, optional
        Ring shapes kept by ring (:func:`concurrent_allreduces`' ``memo``): a ring priced again (a block's
        per-layer pieces) keeps the node order chosen the first time.

    Returns
    -------
    AllReduceCost
        The slowest TP shard's ring: flat in the best order, or hierarchical where cheaper.

    Examples
    --------
    >>> from hpp.profiles.cluster import AggregateFit, Node
    >>> from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
    >>> c = Cluster("c", dict(BUNDLED_DEVICE_TYPES), (Node("A100-40", 2, Link(1e11, 0.0)),
    ...             Node("A100-40", 2, Link(1e11, 0.0))), Link(1e9, 0.0))
    >>> r = allreduce_s(1e9, [(0,), (1,), (2,), (3,)], c)     # flat: 1.5 B / 1e9; hier: 1 / 1e11 + 0.5
    >>> r.method, round(r.seconds, 3)
    ('hierarchical', 0.51)
    >>> shared = Link(1e9, 0.0, aggregate=(AggregateFit(2, 1e9),))     # one NIC: 2 flows get 0.5e9 each
    >>> c2 = Cluster("c", dict(BUNDLED_DEVICE_TYPES), c.nodes, shared)
    >>> r2 = allreduce_s(1e9, [(0,), (1,), (2,), (3,)], c2)   # hier: 0.01 + 5e8 / 5e8; flat 1.5: hier
    >>> r2.method, round(r2.seconds, 3), r2.flows
    ('hierarchical', 1.01, 2)
    """
    if len(groups) <= 1 or num_bytes <= 0:
        return AllReduceCost(0.0, "none", tuple(d for g in groups for d in g))
    shapes = _shapes(num_bytes, groups, cluster, memo)
    return _block_cost(num_bytes, shapes, cluster, hierarchical=hierarchical, flows=flows)[0]


def concurrent_allreduces(blocks: Sequence[tuple[float, Sequence[Sequence[int]]]], cluster: Cluster, *,
                          hierarchical: bool = True, memo: dict | None = None
                          ) -> tuple[list[AllReduceCost], dict[int, int]]:
    """The all-reduces of a plan's gradient blocks, priced with the flows that leave each node at once.

    Parameters
    ----------
    blocks : sequence of (bytes, holder groups)
        Per gradient block in layer order (:func:`hpp.formulation.cost_model.block_decomposition`), the bytes
        each holder device all-reduces and the holders' device groups (one TP group per pipeline).
    cluster : Cluster
    hierarchical : bool
        As :func:`allreduce_s`.
    memo : dict, optional
        Filled with the blocks' ring shapes, for :func:`allreduce_s` of the same rings (its ``memo``).

    Returns
    -------
    (list of AllReduceCost, dict node -> flows)
        Each block's all-reduce, and the flows leaving each node at once that it was priced with.

    Model (documented choice). A device all-reduces its blocks one after the other; blocks whose holders share
    no device run at the same time. Pass 1 prices each block alone (its TP shards' rings sharing their
    nodes) and picks its form (flat or hierarchical); it sends ``w_j(n)`` flows out of node ``n``
    (:func:`_senders`). The flows leaving node ``n`` at once are the most that blocks running together can
    send: ``K_n = max over sets of pairwise device-disjoint blocks of sum_j w_j(n)`` (on layer-ordered
    blocks, the blocks that share a device with block ``i`` are a contiguous run around it, so a DP over the
    blocks in order finds the maximum). Pass 2 prices every block's inter-node edges on :func:`edge_link`
    with ``K`` (flat or hierarchical, whichever is cheaper). Each block's price is at least its pass-1 price,
    which is at least its price with unshared links.

    Raises
    ------
    ValueError
        Blocks not in layer order (the blocks sharing a device with one block are not a contiguous run).
    """
    shapes, alone, sent = [], [], []
    for nbytes, groups in blocks:
        if len(groups) <= 1 or nbytes <= 0:
            shapes.append(None)
            alone.append(AllReduceCost(0.0, "none", tuple(d for g in groups for d in g)))
            sent.append({})
            continue
        sh = _shapes(nbytes, groups, cluster, memo)
        cost, out = _block_cost(nbytes, sh, cluster, hierarchical=hierarchical, flows=None)
        shapes.append(sh)
        alone.append(cost)
        sent.append(out)
    flows = _most_concurrent_flows([{d for g in groups for d in g} for _, groups in blocks], sent)
    if not any(k > 1 for k in flows.values()):
        return alone, flows
    out = []
    for (nbytes, _), sh, cost in zip(blocks, shapes, alone):
        out.append(cost if sh is None else
                   _block_cost(nbytes, sh, cluster, hierarchical=hierarchical, flows=flows)[0])
    return out, flows


def _most_concurrent_flows(devices: Sequence[set[int]], sent: Sequence[Mapping[int, int]]) -> dict[int, int]:
    """``K_n`` of :func:`concurrent_allreduces`: per node, the largest sum of ``sent[j][n]`` over blocks whose
    device sets ``devices[j]`` are pairwise disjoint (contiguous conflict runs: a DP over the blocks in order)."""
    n = len(devices)
    reach = []                          # reach[i]: the last block j >= i that shares a device with block i
    for i in range(n):
        j = i
        while j + 1 < n and devices[i] & devices[j + 1]:
            j += 1
        if any(devices[i] & devices[k] for k in range(j + 2, n)):
            raise ValueError("blocks are not in layer order: a block shares devices with a later block past a "
                             "block it does not share any with")
        reach.append(j)
    nodes = sorted({i for s in sent for i in s})
    out: dict[int, int] = {}
    for node in nodes:
        best = [0] * n                  # best[j]: the largest sum over disjoint sets whose last block is j
        for j in range(n):
            w = sent[j].get(node, 0)
            prev = max((best[i] for i in range(j) if reach[i] < j), default=0)
            best[j] = w + prev
        out[node] = max(best, default=0)
    return out


def p2p_flows(crossings: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Flows that leave (or enter) each node at once for point-to-point transfers.

    ``crossings``: every pipeline's adjacent stages on two different nodes, as (node sending the activation,
    node receiving it). In 1F1B's steady state all pipelines' forward transfers run in one phase and their
    backward transfers (the gradients, the other way) in the next, so a node's network carries at once the
    activations it sends (``out``) and receives (``in``), or the gradients of the same boundaries the other
    way: per direction at most ``max(out, in)`` flows (documented choice: the phases of different pipelines
    are taken to coincide, an upper estimate of their overlap). A node a pipeline only passes through (one
    boundary in, one out) has one flow.

    >>> p2p_flows([(0, 1), (0, 1), (1, 2), (3, 3)])
    {0: 2, 1: 2, 2: 1}
    """
    out: dict[int, int] = {}
    into: dict[int, int] = {}
    for a, b in crossings:
        if a != b:
            out[a] = out.get(a, 0) + 1
            into[b] = into.get(b, 0) + 1
    return {n: max(out.get(n, 0), into.get(n, 0)) for n in sorted(out.keys() | into.keys())}


def p2p_link_options(cluster: Cluster, kind_a: tuple[str, int], kind_b: tuple[str, int], *,
                     run: int | None = None) -> tuple[Link, ...]:
    """The links the search assumes from a stage of kind ``a`` = (device type, TP) to the next, of kind ``b``.

    A transfer is priced on the fastest option for its message size.

    - Version-1 cluster: the planner's one pipeline link (the inter-node link; a one-node
      cluster's intra-node link).
    - Two device types: their inter-node link (with zones: every zone pair the two types'
      nodes span, and the type pair's link where they share a zone).
    - One type, ``run=None`` (a valid lower bound of any binding): its own inter-node link(s) and
      the intra-node link of every node of the type with at least ``tp_a + tp_b`` devices.
    - One kind (same type and TP), ``run = r >= 1``: stage a is ``r`` stages before the end of its
      run of equal kinds, and the run is packed onto nodes from its end, ``k`` = (largest node of the
      type) // TP stages per node, as a binding that keeps a pipeline on as few nodes as its stages
      allow does: a and b share a node iff ``r % k != 0`` (intra-node options, else inter-node).
      This prices the ``ceil(run / k) - 1`` node crossings such a binding cannot avoid.
    """
    if run is not None and (kind_a != kind_b or cluster.network is None):
        run = None
    return cluster.memoised(("p2p_options", kind_a, kind_b, run),
                            lambda: _p2p_link_options(cluster, kind_a, kind_b, run))


def _p2p_link_options(cluster: Cluster, kind_a: tuple[str, int], kind_b: tuple[str, int],
                      run: int | None) -> tuple[Link, ...]:
    """:func:`p2p_link_options`, computed (its docstring says what and why)."""
    if cluster.network is None:
        return (cluster.nodes[0].intra_node if len(cluster.nodes) == 1 else cluster.inter_node,)
    (ta, tpa), (tb, tpb) = kind_a, kind_b
    na = [i for i, n in enumerate(cluster.nodes) if n.device_type == ta]
    opts: list[Link] = []
    if ta == tb:
        opts += [cluster.nodes[i].intra_node for i in na if cluster.nodes[i].num_devices >= tpa + tpb]
    if run is not None:
        k = max(cluster.nodes[i].num_devices for i in na) // tpa
        if opts and k >= 2 and run % k != 0:          # packed from the run's end: same node
            return tuple(dict.fromkeys(opts))
        opts = []
    opts.extend(cluster.node_pair_links(ta, tb))        # every pair of two different nodes
    if not opts:            # one node of the type, too small for both stages: they cannot be adjacent
        opts = [cluster.nodes[na[0]].intra_node] if na else [cluster.inter_node]
    return tuple(dict.fromkeys(opts))


def p2p_transfer_s(e: LayerProfile, link: Link, num_bytes: float) -> float:
    """One-way transfer of ``num_bytes`` from a stage of entry ``e`` over ``link`` [s].

    ``link.transfer_s(num_bytes)``; with the runtime step's time terms, at least the
    backend's measured send/recv time (``e.step_time.p2p_s``).
    """
    c = link.transfer_s(num_bytes)
    return max(c, e.step_time.p2p_s(num_bytes)) if e.step_time is not None else c


def p2p_waits_per_transfer(e: LayerProfile, config: CostModelConfig = CostModelConfig()) -> float:
    """k of :func:`stage_p2p_wait_s`: ``p2p_waits_per_transfer_runtime`` with ``e.step_time``, else the calibrated one."""
    return config.p2p_waits_per_transfer_runtime if e.step_time is not None else config.p2p_waits_per_transfer


def stage_p2p_wait_s(e: LayerProfile, lo: int, hi: int, *, link_in: Link | None, link_out: Link | None,
                     config: CostModelConfig = CostModelConfig()) -> float:
    """P_s: seconds per micro-batch a stage of layers [lo, hi) waits for its point-to-point transfers.

    ``k * (c_in + c_out)`` with ``c_in = link_in.transfer_s(output_bytes[lo-1])`` (0 for the
    first stage, ``lo == 0``), ``c_out = link_out.transfer_s(output_bytes[hi-1])`` (0 for the
    last, ``hi == L``) and ``k = config.p2p_waits_per_transfer``; with the runtime step's time
    terms :func:`p2p_transfer_s` and ``k = config.p2p_waits_per_transfer_runtime``.

    Examples
    --------
    >>> from hpp.profiles.cluster import Link
    >>> from hpp.profiles.model_profile import LayerProfile
    >>> e = LayerProfile("X", 1, 1, (1.0,) * 3, (2.0,) * 3, (0.1,) * 3, (100,) * 3, (10,) * 3, (5, 6, 7))
    >>> stage_p2p_wait_s(e, 1, 2, link_in=Link(1000.0, 0.0), link_out=Link(1000.0, 0.0))  # 2 x (5 + 6) / 1000
    0.022
    """
    c_in = p2p_transfer_s(e, link_in, e.output_bytes[lo - 1]) if lo > 0 and link_in is not None else 0.0
    c_out = (p2p_transfer_s(e, link_out, e.output_bytes[hi - 1]) if hi < e.num_layers and link_out is not None
             else 0.0)
    return p2p_waits_per_transfer(e, config) * (c_in + c_out)


def pipeline_link(cluster: Cluster) -> Link:
    """The link the planner assumes between pipeline stages and among gradient holders.

    The inter-node link (the slower one) unless the cluster is a single node.
    """
    if len(cluster.nodes) == 1:
        return cluster.nodes[0].intra_node
    return cluster.inter_node
