"""Sync floors: the least time any gradient sync of h pipelines can take, for the all-reduce forms the cost
model prices (:mod:`hpp.formulation.collectives`: flat ring, hierarchical) and ANY bandwidth fit.

A device's blocks of one stage (bytes beta_j, summing to at least its own W) cost sum_j beta_j r_h(beta_j)
with r_h the ring's seconds per byte, so at least W times the least r over the block sizes possible (the
cheapest way W could be split: the case a per-stage bucket got wrong for fits that fall at large messages). :func:`stage_sync_rate` tabulates that least rate per block-size cap for a range of pipeline
counts; :mod:`hpp.formulation.composition.copy_bound` uses it as the penalty of each candidate.
:class:`SyncFloor` is the coarser per-stage floor of the bound problem's sync tables (one peak per cluster).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from hpp.formulation.collectives import fit_x
from hpp.profiles.cluster import Cluster, Link

__all__ = ["SyncFloor", "sync_rate_table", "stage_sync_rate", "stage_sync_rates", "ring_cost_increasing_from",
           "cluster_links", "cross_type_links"]

_GRID_RATIO = 1.03          # block-size grid of the sync floor (each cell priced at its least) ...
_GRID_FROM = 1e4            # ... from (0, 10 kB], priced at the peak with one latency at 10 kB


@dataclass(frozen=True)
class SyncFloor:
    """A lower bound of any gradient sync of h pipelines, valid for every link model [s].

    Whatever the binding, the block split and the all-reduce algorithm (ring over the slowest
    link, hierarchical, any bandwidth fit, monotone or not), each holder of a stage of W bytes per
    device sends at least 2 (h-1)/h W bytes over links whose bandwidth never exceeds their peak
    (Patarasuk and Yuan 2009, the all-reduce bandwidth floor; ``Link.bandwidth_bytes_per_s`` is
    at most ``max_bytes_per_s`` at every message size). So

        floor(W, h) = max(2 (h-1)/h * W / peak_any,
                          [h > g] 2 (h-g)/h * W / (g * peak_inter))

    with ``peak_any`` the largest peak of any link among the cluster's devices, and, when the h
    ranks cannot share one node (h > g = most devices of a node, several nodes), the inter-node
    part of a hierarchical all-reduce with at most g ranks per node at the largest inter-node peak
    ``peak_inter`` (a flat ring over an inter-node link costs more). Latency is left out (0 is a
    valid floor). The floor is linear in W and nondecreasing in h.

    Attributes
    ----------
    peak_any_bytes_per_s, peak_inter_bytes_per_s : float
    node_devices : int
        g, most devices of one node.
    multi_node : bool
    """

    peak_any_bytes_per_s: float
    peak_inter_bytes_per_s: float
    node_devices: int
    multi_node: bool

    @staticmethod
    def of(cluster: Cluster) -> "SyncFloor":
        """The floor of ``cluster``'s links (N1's ``link_bound`` / ``inter_link_bound`` where the cluster has them)."""
        types = sorted(cluster.count_by_type())
        if hasattr(cluster, "link_bound"):
            peak_any = cluster.link_bound(types).max_bytes_per_s
        else:
            peak_any = max([n.intra_node.max_bytes_per_s for n in cluster.nodes] + [cluster.inter_node.max_bytes_per_s])
        if hasattr(cluster, "inter_link_bound"):
            peak_inter = cluster.inter_link_bound(types).max_bytes_per_s
        else:
            peaks = [cluster.inter_node.max_bytes_per_s]
            net = getattr(cluster, "network", None)
            for links in (getattr(net, "inter", None), getattr(net, "zone_links", None)):
                peaks.extend(link.max_bytes_per_s for link in (links or {}).values())
            peak_inter = max(peaks)
        return SyncFloor(float(peak_any), float(max(peak_inter, 0.0) or peak_any),
                         max(n.num_devices for n in cluster.nodes), len(cluster.nodes) > 1)

    def seconds(self, num_bytes: float, h: int) -> float:
        """floor(W, h) [s] of the class docstring."""
        if h <= 1 or num_bytes <= 0:
            return 0.0
        t = 2.0 * (h - 1) / h * num_bytes / self.peak_any_bytes_per_s
        g = self.node_devices
        if self.multi_node and h > g:
            t = max(t, 2.0 * (h - g) / h * num_bytes / (g * self.peak_inter_bytes_per_s))
        return t


def _max_bw(link: Link, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """Most bandwidth [bytes/s] ``link`` gives to any message in [c0, c1] bytes (elementwise), as
    :meth:`Link.bandwidth_bytes_per_s` prices it (peak where the fit is not positive, capped at peak;
    the fit of :func:`~hpp.formulation.collectives.fit_gb_per_s`, at both ends and its vertex):
    :func:`_max_bw_rows` of the one link."""
    return _max_bw_rows([link], fit_x(c0), fit_x(c1))[0]


def _max_bw_rows(links: Sequence[Link], x0: np.ndarray, x1: np.ndarray) -> np.ndarray:
    """(len(links), n): :func:`_max_bw` of each link over [c0, c1] with ``x0``, ``x1`` = ``fit_x(c0)``, ``fit_x(c1)``
    (they do not depend on the link), all links in one batch: the same element-wise operations, the fit's
    coefficients as columns (a link without fit as the fit 0, which is not positive: its peak)."""
    A, B, C = (np.array(col, dtype=np.float64)[:, None] for col in zip(*(l.fit_gb_per_s or (0.0, 0.0, 0.0)
                                                                         for l in links)))
    peak = np.array([l.max_bytes_per_s for l in links], dtype=np.float64)[:, None]
    q0, q1 = _fit(A, B, C, x0), _fit(A, B, C, x1)
    qmax, qmin = np.maximum(q0, q1), np.minimum(q0, q1)
    curved = A != 0.0
    if curved.all():                            # the vertex
        xv = -B / (2.0 * A)
        qv, inside = _fit(A, B, C, xv), (x0 <= xv) & (xv <= x1)
    elif curved.any():
        with np.errstate(divide="ignore", invalid="ignore"):        # rows without curvature: masked out
            xv = -B / (2.0 * A)
            qv, inside = _fit(A, B, C, xv), (x0 <= xv) & (xv <= x1) & curved
    if curved.any():
        np.maximum(qmax, qv, out=qmax, where=inside)
        np.minimum(qmin, qv, out=qmin, where=inside)
    qmax *= 1e9
    bw = np.minimum(qmax, peak, out=qmax)
    np.copyto(bw, peak, where=qmin <= 0.0)
    return bw


def _fit(a, b, c, x: np.ndarray) -> np.ndarray:
    """``a x^2 + b x + c`` as :func:`~hpp.formulation.collectives.fit_gb_per_s` evaluates it (the same floats)."""
    q = a * x
    q *= x
    q += b * x
    q += c
    return q


def sync_rate_table(links: list[Link], a: int, b: int, beta_max: float, *, factor: float | None = None,
                    latency_steps: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Least sync seconds per byte of a gradient split into blocks of at most ``beta`` bytes [s/byte].

    A device's blocks of one stage (bytes beta_j, summing to at least its W) cost, on a flat ring
    of h ranks, sum_j ring(beta_j, h) = sum_j beta_j r_h(beta_j) with
    r_h(beta) = 2 (h-1)/h / bw(beta/h) + 2 (h-1) lat / beta
    (:func:`~hpp.formulation.collectives.ring_allreduce_s`), so at least W * min r over the block
    sizes possible, for ANY bandwidth fit (non-monotone ones included): the cheapest way W could
    be split. The sizes are cut into a geometric grid; each cell [beta_i, beta_i+1] gets r's least
    over the cell and over h in [a, b], term by term: ``factor`` (default 2 (a-1)/a) over the
    most bandwidth of any chunk in [beta_i / b, beta_i+1 / a] on any of ``links``, plus
    ``latency_steps`` (default 2 (a-1)) latencies over beta_i+1. Returns (grid tops (M,), running
    least rate (M,)): the rate for blocks of at most beta bytes is the running least at the first
    grid top >= beta.
    """
    factor = 2.0 * (a - 1) / a if factor is None else factor
    steps = 2.0 * (a - 1) if latency_steps is None else latency_steps
    n = max(2, int(math.ceil(math.log(max(beta_max, 2.0) / _GRID_FROM) / math.log(_GRID_RATIO))) + 2)
    tops = _GRID_FROM * _GRID_RATIO ** np.arange(n, dtype=np.float64)
    bots = np.r_[0.0, tops[:-1]]
    if a < 2 or factor <= 0 or not links:
        return tops, np.zeros(n)
    rate = np.full(n, math.inf)
    for link in links:
        bw = _max_bw(link, bots / b, tops / a)
        rate = np.minimum(rate, factor / bw + steps * link.latency_s / tops)
    return tops, np.minimum.accumulate(rate)


def _roots(a: float, b: float, c: float) -> list[float]:
    """Real roots of a x^2 + b x + c (a or b may be 0)."""
    if a == 0.0:
        return [] if b == 0.0 else [-c / b]
    d = b * b - 4.0 * a * c
    if d < 0:
        return []
    r = math.sqrt(d)
    return sorted(((-b - r) / (2.0 * a), (-b + r) / (2.0 * a)))


_RISE_LO = math.log2(1.0 / 1e6)          # x = log2(chunk / 1 MB) of a 1-byte chunk: where the search starts


@lru_cache(maxsize=512)
def _rise_parts(link: Link) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """What :func:`ring_cost_increasing_from` needs of a fitted link, whatever the chunks, in x = log2(chunk / 1 MB)
    above ``_RISE_LO``: ``(falls, cuts, ends, flags)``.

    ``falls``: the fit's roots where it falls through 0, sorted. ``cuts``: C_0 = _RISE_LO < C_1 < ..., every root
    of the fit, of fit - peak and of g = ln 2 fit - fit'. ``flags[i]``: 1.0 if the cost falls on the interval
    (C_i, C_i+1) (the last one unbounded), else 0.0. ``ends[i]``: the largest C_j+1 (j < i) with ``flags[j]``, -inf
    if none. Between consecutive cuts neither the fit's position against 0 and the peak nor g's sign changes, so
    one point of each interval decides it."""
    a, b, c = link.fit_gb_per_s
    peak = link.max_bytes_per_s / 1e9
    ga, gb, gc = math.log(2) * a, math.log(2) * b - 2.0 * a, math.log(2) * c - b
    falls = tuple(sorted(r for r in _roots(a, b, c) if 2.0 * a * r + b < 0 and r > _RISE_LO))
    cuts = sorted({_RISE_LO, *[r for r in _roots(a, b, c) + _roots(a, b, c - peak) + _roots(ga, gb, gc)
                               if r > _RISE_LO]})
    flags, ends, bad = [], [], -math.inf
    for i, x0 in enumerate(cuts):
        x1 = cuts[i + 1] if i + 1 < len(cuts) else x0 + 2.0
        xm = 0.5 * (x0 + x1)
        fm = a * xm * xm + b * xm + c
        flags.append(1.0 if 0.0 < fm < peak and ga * xm * xm + gb * xm + gc < 0 else 0.0)
        ends.append(bad)
        if flags[-1] and i + 1 < len(cuts):
            bad = x1
    return falls, tuple(cuts), tuple(ends), tuple(flags)


def ring_cost_increasing_from(link: Link, max_chunk_bytes: float) -> float:
    """The least chunk [bytes] from which a ring's cost 2 (h-1)/h * B / bw(B/h) + latency grows with B, for
    chunks up to ``max_chunk_bytes``, as :meth:`Link.bandwidth_bytes_per_s` prices it (exact, from the fit).

    The cost grows where B / bw(B/h) never falls: in x = log2(chunk / 1 MB) the bandwidth's log-slope
    is at most 1 where the fit prices it (ln 2 fit(x) - fit'(x) >= 0, a quadratic), and the fit does not
    drop from positive to non-positive (below 0 the peak applies, a fall in price). Returns 0 when it
    grows everywhere, ``max_chunk_bytes`` when it still falls at the top. The roots and the intervals where
    the cost falls are the link's (:func:`_rise_parts`, cached); a call looks ``max_chunk_bytes`` up in them.
    """
    if link.fit_gb_per_s is None:
        return 0.0
    hi = math.log2(max(max_chunk_bytes, 1.0) / 1e6)
    if hi <= _RISE_LO:
        return 0.0
    falls, cuts, ends, flags = _rise_parts(link)
    k = bisect.bisect_left(cuts, hi) - 1           # cuts[k] < hi <= cuts[k + 1]: the interval hi ends in
    bad = hi if flags[k] else ends[k]               # the largest x where the cost can fall
    j = bisect.bisect_right(falls, hi)              # the fit falls through 0 at or below hi: the price drops
    if j:
        bad = max(bad, falls[j - 1])
    if bad == -math.inf:
        return 0.0
    return min(max_chunk_bytes, 2.0 ** bad * 1e6)


def _inter_links(cluster, device_type: str | None = None, *, own: bool = True) -> list[Link]:
    """The inter-node links a ring through a node of ``device_type`` can have (None: every inter-node link).

    A ring across nodes has an edge at each of its nodes, so it is no faster than the fastest link
    that touches a node of that type: on v2 clusters, the link (:meth:`Cluster.type_link`, zone-aware) of every
    pair of two different nodes the cluster holds, one of ``device_type`` (a type pair's link where both lie in
    one zone, the zone pair's where they do not; the type's link to itself only where it has two nodes; never
    with ``own`` False). A link no such pair of nodes uses is left out.
    """
    net = getattr(cluster, "network", None)
    if net is None:
        return [cluster.inter_node]
    links = []
    if device_type is not None and hasattr(cluster, "type_link"):
        for u in sorted(cluster.count_by_type()):
            if u != device_type or own:                # the pairs of two different nodes the cluster holds
                links.extend(cluster.node_pair_links(device_type, u))
        if not links:
            links.append(cluster.inter_node)
    else:
        links.append(cluster.inter_node)
        links.extend((getattr(net, "inter", None) or {}).values())
        links.extend((getattr(net, "zone_links", None) or {}).values())
    return list(dict.fromkeys(links))


def cluster_links(cluster, device_type: str | None = None) -> tuple[int, list[Link], list[Link]]:
    """(most devices of a node, its distinct intra-node links, the distinct inter-node links ([] on one node)),
    over the nodes of ``device_type`` (None: all nodes)."""
    nodes = [nd for nd in cluster.nodes if device_type is None or nd.device_type == device_type] or cluster.nodes
    node_max = max(nd.num_devices for nd in nodes)
    intra = list(dict.fromkeys(nd.intra_node for nd in nodes))
    inter = _inter_links(cluster, device_type) if len(cluster.nodes) > 1 else []
    return node_max, intra, inter


def cross_type_links(cluster, device_type: str) -> tuple[int, list[Link], list[Link]]:
    """:func:`cluster_links` of a stage of ``device_type`` whose every gradient ring also holds a device of another
    type (the plans of :mod:`hpp.formulation.composition.type_classes`' class B): no in-node link (nodes hold one
    device type, so such a ring spans two nodes at least) and, across nodes, only the links from a node of
    ``device_type`` to a node of another type (the type pair's links and every zone link).

    Why that is a floor: the cost model orders a ring's nodes by class (device type, zone) and prices a flat ring
    at its slowest edge, a hierarchical one at its ring across nodes plus in-node parts (>= 0)
    (:mod:`hpp.formulation.collectives`). A cyclic order of nodes of two types or more has an edge from a node of
    ``device_type`` to a node of another type, whose link is one of these; the ring costs at least that edge's.
    Version 1 clusters: the one inter-node link.
    """
    return cluster_links(cluster, device_type)[0], [], _inter_links(cluster, device_type, own=False)


def stage_sync_rate(cluster, a: int, b: int, tp: int, beta_max: float, *, hierarchical: bool = True,
                    links: tuple[int, list[Link], list[Link]] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, float]:
    """:func:`sync_rate_table` of a stage with TP degree ``tp`` synced among h in [a, b] holders, over
    the all-reduce forms the cost model prices (:mod:`hpp.formulation.collectives`).

    Ring j of a block has one rank per holder stage; a node of n devices holding this stage's TP
    group (tp devices) holds at most g_max = n - tp + 1 ranks of it (its own device and, at most, one of each
    other device of the node: holders of other TP degrees put a device in every ring) (``links``: the nodes of the
    stage's device type, :func:`cluster_links`). So: a flat ring on one node
    (h <= g_max: any link), a flat ring across nodes (no faster than the fastest inter-node link at
    the chunk size), or hierarchical with g ranks on each of h / g >= 2 nodes (g divides h: the cost model
    takes this form only when every node holds the same number of ranks; g <= g_max; h / g <= the cluster's
    nodes, of any type, since a ring may mix types), whose inter-node
    ring moves 2 (h-g)/h * W/g bytes per rank at chunk W/h with 2 (h/g - 1) latencies (its
    in-node parts are left out). The least of the forms possible is taken; each is at its least
    over h in [a, b]: with g' the largest such g of any h in the range (:func:`_hier_group`),
    2/g - 2/h >= 2/g' - 2/a. ``hierarchical=False``: flat rings only (a cost model
    without the hierarchical form). The third value, beta_0 [bytes]: from it up the cost of a block
    grows with its bytes on every link used (:func:`ring_cost_increasing_from`), so a block of own
    bytes w >= beta_0 costs at least a block of exactly w: a stage of W own bytes then costs at least
    W times the least rate up to max(W, beta_0) (the blocks below beta_0 at the least rate up to
    beta_0), not up to the most bytes any candidate holds there.
    """
    return stage_sync_rates(cluster, a, b, [(tp, links or cluster_links(cluster))], beta_max,
                            hierarchical=hierarchical)[0]


def _hier_group(a: int, b: int, g_max: int, num_nodes: int | None = None) -> int:
    """The most ranks per node g (2 <= g <= g_max) of a hierarchical all-reduce of some h in [a, b]: g divides h
    and the ring spans 2 <= h / g <= ``num_nodes`` nodes (None: no limit); 0 if none.

    >>> _hier_group(10, 10, 4), _hier_group(12, 12, 4), _hier_group(7, 7, 8), _hier_group(17, 25, 8)
    (2, 4, 0, 8)
    >>> _hier_group(22, 22, 4, num_nodes=8), _hier_group(22, 22, 4, num_nodes=11), _hier_group(17, 25, 4, num_nodes=4)
    (0, 2, 0)
    """
    for g in range(min(g_max, b // 2), 1, -1):
        hi = b if num_nodes is None else min(b, num_nodes * g)
        if -(-max(a, 2 * g) // g) * g <= hi:       # the least multiple of g that is >= max(a, 2g) lies in [a, hi]
            return g
    return 0


def stage_sync_rates(cluster, a: int, b: int, kinds: Sequence[tuple[int, tuple[int, list[Link], list[Link]]]],
                     beta_max: float, *, hierarchical: bool = True) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """:func:`stage_sync_rate` of several stage kinds ``(tp, links)`` at once, same values: the kinds share
    the grid and the range [a, b], so each distinct link's bandwidth over the grid (all links in one batch,
    :func:`_max_bw_rows`), its rate terms and its :func:`ring_cost_increasing_from` are computed once rather than
    once per kind and form."""
    n = max(2, int(math.ceil(math.log(max(beta_max, 2.0) / _GRID_FROM) / math.log(_GRID_RATIO))) + 2)
    tops = _GRID_FROM * _GRID_RATIO ** np.arange(n, dtype=np.float64)
    bots = np.concatenate(([0.0], tops[:-1]))
    plans, needed = [], {}                  # per kind: (flat links, g, hierarchical?); the links the tables use
    for tp, (node_max, intra, inter) in kinds:
        g_max = max(1, node_max - tp + 1)
        flat_links = intra + inter if a <= g_max else (inter or intra)
        g = _hier_group(a, b, g_max, len(cluster.nodes))
        hier = bool(hierarchical and inter and g >= 2)
        plans.append((flat_links, g, hier))
        for link in (*flat_links, *(inter if hier else ())):
            needed.setdefault(id(link), link)       # by id: the kinds' links are the cluster's (hashing is slow)
    row = {i: r for r, i in enumerate(needed)}
    if a >= 2 and needed:                   # their bandwidths over the grid, in one batch
        bw = _max_bw_rows(list(needed.values()), fit_x(bots / b), fit_x(tops / a)) if len(needed) > 1 else \
            _max_bw(next(iter(needed.values())), bots / b, tops / a)[None, :]
        lat = np.array([link.latency_s for link in needed.values()], dtype=np.float64)[:, None]
    terms: dict[tuple, np.ndarray] = {}
    tables: dict[tuple, np.ndarray] = {}

    def table(used: list[Link], factor: float, steps: float) -> np.ndarray:
        """:func:`sync_rate_table`'s running least rate on the shared grid (kinds with the same links share it)."""
        if a < 2 or factor <= 0 or not used:
            return np.zeros(n)
        rows = [row[id(link)] for link in used]
        key = (tuple(rows), factor, steps)
        got = tables.get(key)
        if got is None:
            term = terms.get((factor, steps))
            if term is None:                # factor / bw + steps * latency / tops of each link (row)
                term = terms[(factor, steps)] = factor / bw + (steps * lat) / tops
            got = tables[key] = np.minimum.accumulate(term[rows].min(axis=0) if len(rows) > 1 else term[rows[0]])
        return got

    rises: dict[int, float] = {}
    out = []
    for (flat_links, g, hier), (tp, (node_max, intra, inter)) in zip(plans, kinds):
        rate = table(flat_links, 2.0 * (a - 1) / a, 2.0 * (a - 1))
        used = list(flat_links)
        if hier:
            rate = np.minimum(rate, table(inter, max(0.0, 2.0 / g - 2.0 / a), max(0.0, 2.0 * (a / g - 1.0))))
            used += inter
        chunk0 = 0.0
        for link in used:
            r = rises.get(id(link))
            if r is None:
                r = rises[id(link)] = ring_cost_increasing_from(link, beta_max / max(a, 1))
            chunk0 = max(chunk0, r)
        out.append((tops, rate, min(beta_max, chunk0 * b)))
    return out
