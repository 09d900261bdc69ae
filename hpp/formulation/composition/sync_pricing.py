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
    """Per device type: its inter-node link to itself, its slowest intra-node link, least node size, node count."""

    inter: Link
    intra: Link
    node_size: int
    num_nodes: int


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


def type_links(cluster: Cluster, fallback: Link) -> dict[str, TypeLinks]:
    """:class:`TypeLinks` of every device type the cluster's nodes hold (``fallback`` when a type has no
    own inter link, e.g. a single node of it); inter-node links as :func:`pair_link` gives them."""
    out = {}
    for t in sorted({n.device_type for n in cluster.nodes}):
        nodes = [n for n in cluster.nodes if n.device_type == t]
        inter = pair_link(cluster, t, t) or fallback
        intra = min((n.intra_node for n in nodes), key=lambda l: (l.max_bytes_per_s, -l.latency_s))
        out[t] = TypeLinks(inter, intra, min(n.num_devices for n in nodes), len(nodes))
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
    flat = ring_allreduce_s(num_bytes, h, links.inter)
    if g >= 2 and h % g == 0:
        hier = hierarchical_allreduce_s(num_bytes, g, h // g, links.intra, links.inter)
        return min(flat, hier)
    return flat


def mixed_ring_s(num_bytes: float, holders: Sequence[tuple[str, int, int]], cluster: Cluster,
                 links: dict[str, TypeLinks], cache: dict | None = None) -> float:
    """All-reduce of ``num_bytes`` among holders ``(type, g, count)`` of several types: flat ring in the
    best class order (module docstring) [s]; one type: :func:`type_ring_s` with the least ``g``.
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
    key = ("mixed", num_bytes, h, classes, spans)
    if cache is not None and key in cache:
        return cache[key]
    plan = cache.get(("mixed-orders", classes, spans)) if cache is not None else None
    if plan is None:
        plan = _ring_orders(classes, spans, cluster, links)
        if cache is not None:
            cache[("mixed-orders", classes, spans)] = plan
    distinct, orders, extra = plan
    chunk = num_bytes / h
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
    got = ring_allreduce_s(num_bytes, h, distinct[slowest])
    if cache is not None:
        cache[key] = got
    return got


def _ring_orders(classes: tuple[str, ...], spans: tuple[str, ...], cluster: Cluster,
                 links: dict[str, TypeLinks]) -> tuple[list[Link], list[tuple[int, ...]], tuple[int, ...]]:
    """The candidate cyclic class orders of :func:`mixed_ring_s` (each class contiguous, the first class
    first; all of them up to ``_EXACT_ORDERS_UP_TO`` classes, else the sorted order), as indices into a list
    of the distinct links: (links, per order its edges' links in ring order, the spanning classes' own
    links). Depends on the classes only, so kept per (classes, spans)."""
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
            cross[a, b] = cross[b, a] = idx(pair_link(cluster, a, b))
    if len(classes) <= _EXACT_ORDERS_UP_TO:
        orders = [(classes[0], *rest) for rest in permutations(classes[1:])]
    else:
        orders = [classes]
    edges = [tuple(cross[a, b] for a, b in zip(o, (*o[1:], o[0]))) for o in orders]
    return distinct, edges, tuple(idx(links[t].inter) for t in spans)


def ring_table_s(w: np.ndarray, max_pipelines: int, links: TypeLinks, g: int) -> np.ndarray:
    """:func:`type_ring_s` for stage bytes ``w`` (shape (k,)) and h = 1 .. max_pipelines: shape (k, H) [s]."""
    w = np.asarray(w, dtype=np.float64)[:, None]
    h = np.arange(1, max_pipelines + 1, dtype=np.float64)[None, :]
    hh = np.maximum(h, 2.0)
    out = ring_allreduce_np(w, hh, links.inter)
    if g >= 2:
        inside = ring_allreduce_np(w, np.minimum(hh, float(g)), links.intra)
        k = np.maximum(h // g, 2.0)
        hier = ring_allreduce_np(w, np.full_like(h, float(g)), links.intra) + ring_allreduce_np(w / g, k, links.inter)
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
