"""Greedy node assignments of pipeline stages (the rules :func:`~hpp.formulation.binding.bind_devices` compares).

Both rules return ``nodes[p][s]`` (the node of stage ``s`` of copy ``p``) or ``None`` when
they cannot place every TP group. Each runs in O(stages x largest node size x zones) with free
devices bucketed per node group and free count (best fit without scanning the nodes).

- :func:`best_fit_assign` is hpp's original rule: TP groups largest first (then copy,
  stage); a group goes to the node of its stage's neighbour in the pipeline when that
  node holds it, else to the best-fitting node (fewest free devices, then lowest index).
  TP sizes are powers of two that divide the node sizes, so placing largest first never
  fails while the composition's per-size capacities hold.
- :func:`packed_assign` keeps pipelines on few nodes: a *run* (maximal range of stages of
  one device type in a pipeline) is placed whole on one node where one holds it. Runs go
  largest TP degree first (the same never-fails argument), then largest run, then copy
  and stage. A run goes to the node that holds it in the zone ranked first (zones by
  devices, most first), fewest free devices, lowest index. A run no node holds is split:
  its longest prefix that fits goes to the node with the most free devices (lowest zone
  rank, then index), and the rest is placed by the same rule.
"""

from __future__ import annotations

import heapq
from typing import Hashable, Sequence

from hpp.formulation.stage_balance import StageKind
from hpp.profiles.cluster import Cluster

__all__ = ["best_fit_assign", "packed_assign", "zone_ranks"]


class _FreeNodes:
    """Free device counts per node, bucketed by (node key, free count) in heaps of node indices.

    Free counts only decrease, so a heap entry is valid while ``free[n]`` still equals its bucket.
    """

    def __init__(self, cluster: Cluster, keys: Sequence[Hashable]) -> None:
        self.free = [n.num_devices for n in cluster.nodes]
        self._key = list(keys)
        self._heaps: dict[Hashable, dict[int, list[int]]] = {}
        self._largest: dict[Hashable, int] = {}
        for i, (k, f) in enumerate(zip(self._key, self.free)):
            self._heaps.setdefault(k, {}).setdefault(f, []).append(i)      # ascending i: already heaps
            self._largest[k] = max(self._largest.get(k, 0), f)

    def take(self, n: int, count: int) -> None:
        self.free[n] -= count
        if self.free[n] > 0:
            heapq.heappush(self._heaps[self._key[n]].setdefault(self.free[n], []), n)

    def _first(self, key: Hashable, f: int) -> int | None:
        heap = self._heaps.get(key, {}).get(f)
        while heap and self.free[heap[0]] != f:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def best_fit(self, key: Hashable, need: int) -> tuple[int, int] | None:
        """(free, node) of the node with the fewest free devices >= need (lowest index among equals)."""
        for f in range(need, self._largest.get(key, 0) + 1):
            n = self._first(key, f)
            if n is not None:
                return f, n
        return None

    def most_free(self, key: Hashable, need: int) -> tuple[int, int] | None:
        """(free, node) of the node with the most free devices >= need (lowest index among equals)."""
        for f in range(self._largest.get(key, 0), need - 1, -1):
            n = self._first(key, f)
            if n is not None:
                return f, n
        return None


def _shape_rows(shapes: Sequence[Sequence[StageKind]]) -> list[list[int]]:
    return [[-1] * len(shape) for shape in shapes]


def best_fit_assign(cluster: Cluster, shapes: Sequence[Sequence[StageKind]]) -> list[list[int]] | None:
    """hpp's original rule (module docstring) as node indices ``nodes[p][s]``; None if a group finds no node."""
    pool = _FreeNodes(cluster, [n.device_type for n in cluster.nodes])
    nodes = _shape_rows(shapes)
    requests = sorted(((p, s, k) for p, shape in enumerate(shapes) for s, k in enumerate(shape)),
                      key=lambda r: (-r[2].tp_degree, r[0], r[1]))
    for p, s, kind in requests:
        pick = None
        for t in (s - 1, s + 1):        # a neighbour stage's node, when it holds this group
            n = nodes[p][t] if 0 <= t < len(nodes[p]) else -1
            if n >= 0 and cluster.nodes[n].device_type == kind.device_type and pool.free[n] >= kind.tp_degree:
                pick = n
                break
        if pick is None:
            fit = pool.best_fit(kind.device_type, kind.tp_degree)
            if fit is None:
                return None
            pick = fit[1]
        pool.take(pick, kind.tp_degree)
        nodes[p][s] = pick
    return nodes


def zone_ranks(cluster: Cluster) -> dict:
    """Rank of each zone (0 first): zones with more devices first, then by name (``None`` = no zone)."""
    size: dict = {}
    for n in cluster.nodes:
        z = getattr(n, "zone", None)
        size[z] = size.get(z, 0) + n.num_devices
    return {z: r for r, z in enumerate(sorted(size, key=lambda z: (-size[z], repr(z))))}


def _runs(shapes: Sequence[Sequence[StageKind]]) -> list[tuple[int, int, int]]:
    """(copy, first stage, stop stage) of every maximal range of same-type stages."""
    out = []
    for p, shape in enumerate(shapes):
        start = 0
        for s in range(1, len(shape) + 1):
            if s == len(shape) or shape[s].device_type != shape[start].device_type:
                out.append((p, start, s))
                start = s
    return out


def packed_assign(cluster: Cluster, shapes: Sequence[Sequence[StageKind]]) -> list[list[int]] | None:
    """The run-packing rule (module docstring), as node indices ``nodes[p][s]``; None if a group finds no node."""
    ranks = zone_ranks(cluster)
    zone_of = [getattr(n, "zone", None) for n in cluster.nodes]
    pool = _FreeNodes(cluster, [(n.device_type, ranks[z]) for n, z in zip(cluster.nodes, zone_of)])
    zones_by_type: dict[str, list[int]] = {}
    for n, z in zip(cluster.nodes, zone_of):
        zones_by_type.setdefault(n.device_type, [])
        if ranks[z] not in zones_by_type[n.device_type]:
            zones_by_type[n.device_type].append(ranks[z])
    for rs in zones_by_type.values():
        rs.sort()
    nodes = _shape_rows(shapes)

    def run_key(run: tuple[int, int, int]) -> tuple:
        p, lo, hi = run
        kinds = shapes[p][lo:hi]
        return (-max(k.tp_degree for k in kinds), -sum(k.tp_degree for k in kinds), p, lo)

    for p, lo, hi in sorted(_runs(shapes), key=run_key):
        dtype = shapes[p][lo].device_type
        s = lo
        while s < hi:
            rest = sum(k.tp_degree for k in shapes[p][s:hi])
            whole = next((fit for r in zones_by_type.get(dtype, ())          # first zone that holds the rest
                          if (fit := pool.best_fit((dtype, r), rest)) is not None), None)
            if whole is not None:
                n = whole[1]
                for t in range(s, hi):
                    nodes[p][t] = n
                pool.take(n, rest)
                break
            # no node holds the rest: its longest prefix goes to the node with the most free devices
            need = shapes[p][s].tp_degree
            fits = [(fit[0], r, fit[1]) for r in zones_by_type.get(dtype, ())
                    if (fit := pool.most_free((dtype, r), need)) is not None]
            if not fits:
                return None
            n = min(fits, key=lambda x: (-x[0], x[1], x[2]))[2]      # most free, first zone, lowest index
            while s < hi and shapes[p][s].tp_degree <= pool.free[n]:
                nodes[p][s] = n
                pool.take(n, shapes[p][s].tp_degree)
                s += 1
    return nodes
