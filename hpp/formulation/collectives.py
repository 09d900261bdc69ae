"""Collective and point-to-point pricing on the cluster's actual links (issue 19): pure functions.

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
from typing import Sequence

import numpy as np

from hpp.formulation.cost_config import CostModelConfig
from hpp.profiles.cluster import Cluster, Link
from hpp.profiles.model_profile import LayerProfile

__all__ = ["AllReduceCost", "pipeline_link", "ring_allreduce_s", "ring_allreduce_np", "bandwidth_np", "fit_x",
           "fit_gb_per_s", "allreduce_s", "allreduce_lower_bound_s", "p2p_link_options",
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
    """

    seconds: float
    method: str
    order: tuple[int, ...]
    link: Link | None = None


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
    """
    message_bytes = np.asarray(message_bytes, dtype=np.float64)
    peak = link.max_bytes_per_s
    if link.fit_gb_per_s is None:
        return np.full(message_bytes.shape, peak)
    fit = fit_gb_per_s(link, fit_x(message_bytes)) * 1e9
    return np.where((fit > 0) & (message_bytes > 0), np.minimum(fit, peak), peak)


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
    """Cyclic order of ``nodes`` (>= 2) and its slowest inter-node edge at ``chunk_bytes`` (module docstring)."""
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


def _ring_cost(num_bytes: float, ranks: Sequence[int], cluster: Cluster, hierarchical: bool) -> AllReduceCost:
    """Flat ring (best order) or hierarchical, whichever is cheaper, for one ring of device ids ``ranks``."""
    n = len(ranks)
    node_of = {d: cluster.devices[d].node for d in ranks}
    per_node = Counter(node_of.values())
    if len(per_node) == 1:
        node = next(iter(per_node))
        intra = cluster.nodes[node].intra_node
        return AllReduceCost(ring_allreduce_s(num_bytes, n, intra), "ring", tuple(ranks), intra)
    node_order, inter = _best_node_order(cluster, list(per_node), num_bytes / n)
    on_node: dict[int, list[int]] = {}
    for d in ranks:
        on_node.setdefault(node_of[d], []).append(d)
    order = tuple(d for i in node_order for d in on_node[i])
    chunk = num_bytes / n
    edges = [inter] + [cluster.nodes[i].intra_node for i, g in per_node.items() if g > 1]
    slowest = max(edges, key=lambda l: l.transfer_s(chunk))
    flat = ring_allreduce_s(num_bytes, n, slowest)
    g = next(iter(per_node.values()))
    if hierarchical and g > 1 and all(c == g for c in per_node.values()):
        k = len(per_node)
        _, inter_k = _best_node_order(cluster, list(per_node), num_bytes / g / k)
        slowest_intra = max((cluster.nodes[i].intra_node for i in per_node),
                            key=lambda l: ring_allreduce_s(num_bytes, g, l))
        hier = hierarchical_allreduce_s(num_bytes, g, k, slowest_intra, inter_k)
        if hier < flat:
            return AllReduceCost(hier, "hierarchical", order, inter_k)
    return AllReduceCost(flat, "ring", order, slowest)


def allreduce_s(num_bytes: float, groups: Sequence[Sequence[int]], cluster: Cluster, *,
                hierarchical: bool = True) -> AllReduceCost:
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

    Returns
    -------
    AllReduceCost
        The slowest TP shard's ring: flat in the best order, or hierarchical where cheaper.

    Examples
    --------
    >>> from hpp.profiles.cluster import Node
    >>> from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
    >>> c = Cluster("c", dict(BUNDLED_DEVICE_TYPES), (Node("A100-40", 2, Link(1e11, 0.0)),
    ...             Node("A100-40", 2, Link(1e11, 0.0))), Link(1e9, 0.0))
    >>> r = allreduce_s(1e9, [(0,), (1,), (2,), (3,)], c)     # flat: 1.5 B / 1e9; hier: 1 / 1e11 + 0.5
    >>> r.method, round(r.seconds, 3)
    ('hierarchical', 0.51)
    """
    if len(groups) <= 1 or num_bytes <= 0:
        return AllReduceCost(0.0, "none", tuple(d for g in groups for d in g))
    width = max(len(g) for g in groups)
    rings = {tuple(sorted(g[j % len(g)] for g in groups)) for j in range(width)}
    return max((_ring_cost(num_bytes, r, cluster, hierarchical) for r in sorted(rings)), key=lambda c: c.seconds)


def p2p_link_options(cluster: Cluster, kind_a: tuple[str, int], kind_b: tuple[str, int], *,
                     run: int | None = None) -> tuple[Link, ...]:
    """The links the search assumes from a stage of kind ``a`` = (device type, TP) to the next, of kind ``b``.

    A transfer is priced on the fastest option for its message size.

    - Version-1 cluster: the planner's one pipeline link (the inter-node link; a one-node
      cluster's intra-node link), as before issue 19.
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
    key = ("p2p_options", kind_a, kind_b, run)
    got = cluster._cache.get(key)
    if got is not None:
        return got
    if cluster.network is None:
        got = (cluster.nodes[0].intra_node if len(cluster.nodes) == 1 else cluster.inter_node,)
    else:
        (ta, tpa), (tb, tpb) = kind_a, kind_b
        na = [i for i, n in enumerate(cluster.nodes) if n.device_type == ta]
        opts: list[Link] = []
        if ta == tb:
            opts += [cluster.nodes[i].intra_node for i in na if cluster.nodes[i].num_devices >= tpa + tpb]
        if run is not None:
            k = max(cluster.nodes[i].num_devices for i in na) // tpa
            if opts and k >= 2 and run % k != 0:          # packed from the run's end: same node
                cluster._cache[key] = got = tuple(dict.fromkeys(opts))
                return got
            opts = []
        opts.extend(cluster.node_pair_links(ta, tb))        # every pair of two different nodes
        if not opts:            # one node of the type, too small for both stages: they cannot be adjacent
            opts = [cluster.nodes[na[0]].intra_node] if na else [cluster.inter_node]
        got = tuple(dict.fromkeys(opts))
    cluster._cache[key] = got
    return got


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
