"""The search model's gradient-sync price on a per-pair (version 2) cluster.

On a version-1 cluster the composition model prices every ring on one link
(:attr:`CompositionProblem.sync_link`); this module is used only when ``cluster.per_pair``.
It prices a ring on the links its holders will use, assuming the binding packs holders of the
same stage onto nodes (as :mod:`hpp.formulation.binding` places whole pipeline copies):

* **One type** ``t`` (every copy of one candidate, or a block held only by stages of type ``t``):
  a copy uses ``d`` devices of ``t``, so a node of ``n`` devices holds ``g = n // d`` copies' holders
  (``g = 1`` when ``d > n``). With ``h`` holders: ``h <= g``: a ring inside one node (intra link);
  otherwise the flat ring on the type's own inter-node link (:func:`pair_link`: zone-aware), or, when ``g >= 2`` divides ``h``, the
  hierarchical form ``ring(W, g, intra) + ring(W / g, h / g, inter)`` where cheaper -- the two forms
  :func:`hpp.formulation.collectives.allreduce_s` chooses between.
* **Mixed types** (a block held by stages of several types): a flat ring whose slowest adjacent
  pair is as fast as possible over the cyclic orders of the type classes (each class contiguous;
  its own inter link counts when its holders span two or more nodes), as
  :func:`hpp.formulation.collectives._best_node_order` orders nodes.

Shared networks (:meth:`hpp.profiles.cluster.Link.shared`): when copies pack into nodes, every device of a
node syncs across nodes at once, so a ring's inter-node edges are priced as one of ``K`` concurrent flows:
``K = n // g`` for a flat ring (one flow per stage of the node's ``g`` packed copies per TP shard: ``n / g``
devices' worth) and ``K = n`` for the hierarchical form (every device of a full node of ``n`` sends), the
nodes' NIC capacities shared likewise; a mixed ring's edge between two types at the larger of their ``K``.
The cost model counts the flows of the actual binding
(:func:`hpp.formulation.collectives.concurrent_allreduces`).

``ring(W, h, link)`` is :func:`hpp.formulation.collectives.ring_allreduce_s`. These are estimates
(the search's approximation); the reported time is the cost model's, and bounds use
:class:`hpp.formulation.composition.sync_floor.SyncFloor`, not this module.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from itertools import permutations
from typing import Sequence

import numpy as np

from hpp.errors import HppInputError
from hpp.formulation.collectives import hierarchical_allreduce_s, ring_allreduce_np, ring_allreduce_s
from hpp.profiles.cluster import Cluster, Link

__all__ = ["TypeLinks", "pair_link", "type_links", "holders_per_node", "type_ring_s", "mixed_ring_s", "ring_table_s", "block_rings_s"]

_EXACT_ORDERS_UP_TO = 6


@dataclass(frozen=True)
class TypeLinks:
    """Per device type: its inter-node link to itself, its slowest intra-node link, least node size, node count,
    and the least NIC capacity of its nodes [bytes/s] (inf: none given); ``hierarchical`` False prices flat rings
    only (the cost model's ``hierarchical_allreduce`` switch)."""

    inter: Link
    intra: Link
    node_size: int
    num_nodes: int
    nic_bytes_per_s: float = math.inf
    hierarchical: bool = True

    def flows(self, g: int, *, hierarchical: bool) -> int:
        """Flows leaving one of the type's nodes at once when its copies pack ``g`` holders of a stage per node
        (module docstring): ``n`` for the hierarchical form, ``n // g`` for a flat ring."""
        return self.node_size if hierarchical else max(1, self.node_size // max(1, g))

    def shared(self, link: Link, flows: int) -> Link:
        """``link`` as one of ``flows`` concurrent flows out of this type's nodes sees it."""
        if flows <= 1 and self.nic_bytes_per_s == math.inf:
            return link
        return link.shared(flows, nic_bytes_per_s=self.nic_bytes_per_s)


def pair_link(cluster: Cluster, type_a: str, type_b: str) -> Link | None:
    """The link the search prices a ring edge between a node of ``type_a`` and another node of ``type_b`` at
    (None when no two such nodes exist): the type pair's link when two such nodes share a zone (or the cluster
    has no zones), since a binding keeps a ring inside a zone where it can; otherwise every such pair crosses
    zones and :meth:`Cluster.type_link` gives the zone pair's link: the slowest of those (the pairs:
    :meth:`Cluster.node_pair_links`, memoised).

    Examples
    --------
    >>> from hpp.scenarios import SCENARIOS
    >>> cl = SCENARIOS["opt350-a100x4-v100x4"].cluster()
    >>> pair_link(cl, "A100-40", "V100-16") == cl.type_link("A100-40", "V100-16")
    True
    >>> pair_link(cl, "A100-40", "A100-40") is None           # one A100 node: no two of them
    True
    """
    pairs = cluster.node_pair_links(type_a, type_b)
    try:
        same_zone = cluster.type_link(type_a, type_b)      # what every pair of nodes in one zone uses
    except HppInputError:                                  # the two types meet across zones only
        same_zone = None
    if same_zone in pairs:
        return same_zone
    return min(pairs, key=lambda l: l.max_bytes_per_s, default=None)


def type_links(cluster: Cluster, fallback: Link, *, hierarchical: bool = True) -> dict[str, TypeLinks]:
    """:class:`TypeLinks` of every device type the cluster's nodes hold (``fallback`` when a type has no
    own inter link, e.g. a single node of it); inter-node links as :func:`pair_link` gives them; ``hierarchical``
    as the cost model's switch."""
    out = {}
    for t in sorted({n.device_type for n in cluster.nodes}):
        nodes = [n for n in cluster.nodes if n.device_type == t]
        inter = pair_link(cluster, t, t) or fallback
        intra = min((n.intra_node for n in nodes), key=lambda l: (l.max_bytes_per_s, -l.latency_s))
        out[t] = TypeLinks(inter, intra, min(n.num_devices for n in nodes), len(nodes),
                           min(n.nic_bytes_per_s for n in nodes), hierarchical)
    return out


def holders_per_node(links: TypeLinks, devices_per_copy: int) -> int:
    """``g``: holders of one stage that a node of the type holds when copies pack (>= 1)."""
    if devices_per_copy <= 0 or devices_per_copy > links.node_size:
        return 1
    return max(1, links.node_size // devices_per_copy)


def type_ring_s(num_bytes: float, h: int, links: TypeLinks, g: int) -> float:
    """All-reduce of ``num_bytes`` among ``h`` holders of one type, ``g`` per node (module docstring) [s].

    Examples
    --------
    >>> tl = TypeLinks(Link(1e9, 0.0), Link(1e11, 0.0), 8, 4)
    >>> type_ring_s(1e9, 4, tl, 1)                    # flat inter ring: 1.5 * 1e9 / 1e9
    1.5
    >>> round(type_ring_s(1e9, 4, tl, 2), 4)          # hierarchical: 1e9 / 1e11 + 1 * 5e8 / 1e9
    0.51
    >>> round(type_ring_s(1e9, 2, tl, 2), 4)          # one node: 1e9 / 1e11
    0.01
    """
    if h <= 1 or num_bytes <= 0:
        return 0.0
    if h <= g:
        return ring_allreduce_s(num_bytes, h, links.intra)
    flat = ring_allreduce_s(num_bytes, h, links.shared(links.inter, links.flows(g, hierarchical=False)))
    if links.hierarchical and g >= 2 and h % g == 0:
        hier = hierarchical_allreduce_s(num_bytes, g, h // g, links.intra,
                                        links.shared(links.inter, links.flows(g, hierarchical=True)))
        return min(flat, hier)
    return flat


def mixed_ring_s(num_bytes: float, holders: Sequence[tuple[str, int, int]], cluster: Cluster,
                 links: dict[str, TypeLinks], cache: dict | None = None) -> float:
    """All-reduce of ``num_bytes`` among holders ``(type, g, count)`` of several types: flat ring in the
    best class order (module docstring), or the hierarchical form where every type packs the same ``g >= 2``
    holders per node and fills its nodes, whichever is cheaper [s]; one type: :func:`type_ring_s` with the
    least ``g``.
    ``cache``: optional memo (keyed by bytes, ranks, classes and which classes span nodes)."""
    by_type: dict[str, list[int]] = {}
    for t, g, n in holders:
        if n > 0:
            got = by_type.setdefault(t, [g, 0])
            got[0], got[1] = min(got[0], g), got[1] + n
    h = sum(n for _, n in by_type.values())
    if h <= 1 or num_bytes <= 0:
        return 0.0
    if len(by_type) == 1:
        (t, (g, n)), = by_type.items()
        return type_ring_s(num_bytes, n, links[t], g)
    classes = tuple(sorted(by_type))
    spans = tuple(t for t in classes if math.ceil(by_type[t][1] / by_type[t][0]) >= 2)
    gs = {by_type[t][0] for t in classes}
    g = next(iter(gs))
    hier = (len(gs) == 1 and g >= 2 and all(by_type[t][1] % g == 0 for t in classes)
            and all(links[t].hierarchical for t in classes))
    key = ("mixed", num_bytes, h, classes, spans, tuple(by_type[t][0] for t in classes))
    if cache is not None and key in cache:
        return cache[key]
    flat_flows = tuple(links[t].flows(by_type[t][0], hierarchical=False) for t in classes)
    got = ring_allreduce_s(num_bytes, h, _slowest_ring_edge(classes, spans, flat_flows, num_bytes / h, cluster, links,
                                                           cache))
    if hier:                            # every node holds g holders: NCCL's hierarchical form, as the cost model
        hier_flows = tuple(links[t].flows(g, hierarchical=True) for t in classes)
        intra = max((links[t].intra for t in classes), key=lambda l: ring_allreduce_s(num_bytes, g, l))
        across = _slowest_ring_edge(classes, spans, hier_flows, num_bytes / h, cluster, links, cache)
        got = min(got, hierarchical_allreduce_s(num_bytes, g, h // g, intra, across))
    if cache is not None:
        cache[key] = got
    return got


def _slowest_ring_edge(classes: tuple[str, ...], spans: tuple[str, ...], flows: tuple[int, ...], chunk: float,
                       cluster: Cluster, links: dict[str, TypeLinks], cache: dict | None) -> Link:
    """The slowest edge at ``chunk`` bytes of the best cyclic class order (:func:`_ring_orders`, memoised in
    ``cache`` per classes, spans and flows)."""
    plan = cache.get(("mixed-orders", classes, spans, flows)) if cache is not None else None
    if plan is None:
        plan = _ring_orders(classes, spans, cluster, links, flows)
        if cache is not None:
            cache[("mixed-orders", classes, spans, flows)] = plan
    distinct, orders, extra = plan
    cost = [l.transfer_s(chunk) for l in distinct]
    # the first order of least worst edge (min's tie rule), then the first slowest of its edges and the
    # spanning classes' own links (max's tie rule)
    best, best_worst = orders[0], max(cost[i] for i in orders[0])
    for edges in orders[1:]:
        worst = max(cost[i] for i in edges)
        if worst < best_worst:
            best, best_worst = edges, worst
    slowest = best[0]
    for i in best + extra:
        if cost[i] > cost[slowest]:
            slowest = i
    return distinct[slowest]


def _ring_orders(classes: tuple[str, ...], spans: tuple[str, ...], cluster: Cluster,
                 links: dict[str, TypeLinks], flows: tuple[int, ...]
                 ) -> tuple[list[Link], list[tuple[int, ...]], tuple[int, ...]]:
    """The candidate cyclic class orders of :func:`mixed_ring_s` (each class contiguous, the first class
    first; all of them up to ``_EXACT_ORDERS_UP_TO`` classes, else the sorted order), as indices into a list
    of the distinct links: (links, per order its edges' links in ring order, the spanning classes' own
    links), each shared by the flows leaving its nodes at once (``flows``, per class: an edge between two
    classes at the larger). Depends on the classes and flows only, so kept per (classes, spans, flows)."""
    k = dict(zip(classes, flows))
    distinct: list[Link] = []
    index: dict[Link, int] = {}

    def idx(link: Link) -> int:
        got = index.get(link)
        if got is None:
            got = index[link] = len(distinct)
            distinct.append(link)
        return got

    cross = {}
    for i, a in enumerate(classes):
        for b in classes[i + 1:]:
            slower = min((links[a], links[b]), key=lambda tl: tl.nic_bytes_per_s)
            cross[a, b] = cross[b, a] = idx(slower.shared(pair_link(cluster, a, b), max(k[a], k[b])))
    if len(classes) <= _EXACT_ORDERS_UP_TO:
        orders = [(classes[0], *rest) for rest in permutations(classes[1:])]
    else:
        orders = [classes]
    edges = [tuple(cross[a, b] for a, b in zip(o, (*o[1:], o[0]))) for o in orders]
    return distinct, edges, tuple(idx(links[t].shared(links[t].inter, k[t])) for t in spans)


def ring_table_s(w: np.ndarray, max_pipelines: int, links: TypeLinks, g: int) -> np.ndarray:
    """:func:`type_ring_s` for stage bytes ``w`` (shape (k,)) and h = 1 .. max_pipelines: shape (k, H) [s]."""
    w = np.asarray(w, dtype=np.float64)[:, None]
    h = np.arange(1, max_pipelines + 1, dtype=np.float64)[None, :]
    hh = np.maximum(h, 2.0)
    out = ring_allreduce_np(w, hh, links.shared(links.inter, links.flows(g, hierarchical=False)))
    if g >= 2:
        inside = ring_allreduce_np(w, np.minimum(hh, float(g)), links.intra)
        k = np.maximum(h // g, 2.0)
        across = links.shared(links.inter, links.flows(g, hierarchical=True))
        hier = ring_allreduce_np(w, np.full_like(h, float(g)), links.intra) + ring_allreduce_np(w / g, k, across)
        if links.hierarchical:
            out = np.where((h % g == 0) & (h > g), np.minimum(out, hier), out)
        out = np.where(h <= g, inside, out)
    return np.where((h > 1) & (w > 0), out, 0.0)


def block_rings_s(problem, used: list[int], h: int, counts: dict[int, int] | None,
                  blocks: list[tuple[int, int]]) -> list[float]:
    """Per block ``(lo, hi)`` of ``blocks``: the all-reduce among its holders on their links [s].

    ``problem``: a :class:`~hpp.formulation.composition.problem.CompositionProblem` with ``per_type_sync``;
    holders of a block are the stages of the ``used`` candidates holding its first layer, each
    ``counts[c]`` copies (see :func:`hpp.formulation.composition.objective.block_sync_s`); the bytes are the
    largest holder's. One type: :func:`type_ring_s` (least ``g``), several: :func:`mixed_ring_s`.
    """
    memo, rings = problem.caches.sync, problem.caches.ring
    key = ("blocks", tuple(used), tuple(blocks))
    static = memo.get(key)
    if static is None:
        static = memo[key] = _block_holders(problem, used, blocks)
    if counts is not None:
        copies = [counts.get(c, 0) for c in used]
    else:
        copies = [h if len(used) == 1 else max(1, h // len(used))] * len(used)
    out = []
    for w, hold, one in static:
        if one is not None:             # holders of one type: its ring at the least g among all their copies
            out.append(problem.type_ring_s(one[0], one[1], w, sum(copies[j] for j, _ in hold)))
            continue
        holders = [(*tg, copies[j]) for j, tg in hold]
        key = ("block", w, *holders)
        ring = rings.get(key)
        if ring is None:
            ring = rings[key] = mixed_ring_s(w, holders, problem.cluster, problem.type_links, rings)
        out.append(ring)
    return out


def _block_holders(problem, used: list[int], blocks: list[tuple[int, int]]) -> list[tuple]:
    """Per block of :func:`block_rings_s`, what does not depend on the copies: (the largest holder's bytes,
    ((index into ``used``, (type, g)) of each holder), (type, least g) when all holders have one type, else
    None). Per candidate and block, the (type, g) of its stage holding the block's first layer and the block's
    bytes are kept in the problem's ``("hold", c)`` memo."""
    memo = problem.caches.sync
    holds = []                          # per used candidate: {block: ((type, g) of its holder or None, bytes)}
    for c in used:
        got = memo.get(("hold", c))
        if got is None:
            got = memo[("hold", c)] = {}
        holds.append(got)
    out = []
    for blk in blocks:
        hold = []
        w = -math.inf
        for j, (c, per) in enumerate(zip(used, holds)):
            got = per.get(blk)
            if got is None:             # (type, holders per node) of the stage holding layer lo, and [lo, hi)'s bytes
                lo, hi = blk
                cand = problem.candidates[c]
                bnd, spec = cand.partition.boundaries, problem.stage_sync_specs(c)
                st = bisect_right(bnd, lo) - 1           # the stage holding layer lo (empty stages skipped)
                got = per[blk] = (spec[st][:2] if 0 <= st < len(spec) else None,
                                  sum(cand.partition.layer_param_bytes[lo:hi]))
            if got[0] is not None:
                hold.append((j, got[0]))
            if got[1] > w:
                w = got[1]
        types = {tg[0] for _, tg in hold}
        one = (hold[0][1][0], min(tg[1] for _, tg in hold)) if len(types) == 1 else None
        out.append((w, tuple(hold), one))
    return out
