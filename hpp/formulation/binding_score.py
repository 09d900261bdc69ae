"""Score of a node assignment: node crossings, gradient-ring links and stage-to-stage links.

A *node assignment* ``nodes[p][s]`` names the node that holds the TP group of stage ``s``
of pipeline copy ``p`` (a TP group never spans nodes). Its :class:`BindingScore` is compared
lexicographically, lower is better:

1. ``crossings``: adjacent stage pairs of a pipeline on different nodes, summed over the
   pipelines (each one is a point-to-point transfer on an inter-node link);
2. ``ring_s_per_byte``: for every gradient block (:func:`~hpp.formulation.cost_model.block_decomposition`),
   the seconds per byte of its ring's slowest adjacent pair, weighted by the block's layers and summed;
3. ``p2p_s_per_byte``: seconds per byte of the link of every crossing, summed.

Rings are scored in one order, not searched over all orders: the holders on one node are
adjacent (the node's intra-node link), the nodes of one *group* (device type, zone) are
adjacent (the group's inter-node link when it has two or more nodes), and the groups go
in the cyclic order whose slowest group-to-group link is fastest (all orders for up to 7
groups, nearest-neighbour beyond). Link speeds are taken at :data:`RING_MESSAGE_BYTES`.

Precondition: the link between two different nodes depends only on their groups
(``Cluster.node_link`` of the per-pair network model, or the single inter-node link of
a version-1 cluster).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple, Sequence

from hpp.formulation.cost_model import block_decomposition
from hpp.profiles.cluster import Cluster, Link

__all__ = ["BindingScore", "BindingScorer", "node_crossings", "forced_crossings", "RING_MESSAGE_BYTES"]

#: Message size [bytes] at which links are compared (a 64 MiB gradient bucket).
RING_MESSAGE_BYTES = 2 ** 26
_EXACT_RING_GROUPS = 7      # cyclic orders of up to this many groups are all tried (720 orders)
_REL_TOL = 1e-9


class BindingScore(NamedTuple):
    """Lexicographic score of a node assignment (lower is better); see the module docstring."""

    crossings: int
    ring_s_per_byte: float
    p2p_s_per_byte: float

    def better_than(self, other: "BindingScore") -> bool:
        """Strictly better, with floats compared to a relative tolerance of 1e-9 (ties keep the other)."""
        if self.crossings != other.crossings:
            return self.crossings < other.crossings
        for a, b in ((self.ring_s_per_byte, other.ring_s_per_byte), (self.p2p_s_per_byte, other.p2p_s_per_byte)):
            if abs(a - b) > _REL_TOL * max(abs(a), abs(b)):
                return a < b
        return False


def node_crossings(nodes: Sequence[Sequence[int]]) -> list[int]:
    """Node boundaries each pipeline crosses: adjacent stages on different nodes, per pipeline.

    >>> node_crossings([[0, 0, 1], [2]])
    [1, 0]
    """
    return [sum(a != b for a, b in zip(row, row[1:])) for row in nodes]


def forced_crossings(cluster: Cluster, shape: Sequence) -> int:
    """Fewest node boundaries one pipeline of ``shape`` crosses on the empty cluster.

    Each change of device type is a crossing, and each run of same-type stages needs at
    least as many nodes as filling the type's largest node, group after group, takes
    (greedy filling is optimal for cutting a sequence into fewest pieces of bounded sum).
    A lower bound for every binding; other copies sharing the nodes can only add to it.

    Parameters
    ----------
    shape : (num_stages,) StageKind (device_type, tp_degree)

    >>> from hpp.profiles.cluster import Link, Node
    >>> from hpp.profiles.devices import DeviceType
    >>> c = Cluster("t", {"A": DeviceType("A", 1, 4)}, (Node("A", 4, Link(1.0)),) * 2, Link(1.0))
    >>> from hpp.formulation.stage_balance import StageKind
    >>> forced_crossings(c, [StageKind("A", 2)] * 3)
    1
    """
    largest: dict[str, int] = {}
    for n in cluster.nodes:
        largest[n.device_type] = max(largest.get(n.device_type, 0), n.num_devices)
    crossings, room = 0, 0
    for s, k in enumerate(shape):
        if s > 0 and k.device_type == shape[s - 1].device_type and k.tp_degree <= room:
            room -= k.tp_degree
            continue
        crossings += s > 0
        room = largest.get(k.device_type, 0) - k.tp_degree
    return crossings


def _node_link(cluster: Cluster, i: int, j: int) -> Link:
    """Link between nodes ``i`` and ``j`` (intra-node when equal); the per-pair model when the cluster has it."""
    per_pair = getattr(cluster, "node_link", None)
    if per_pair is not None:
        return per_pair(i, j)
    return cluster.nodes[i].intra_node if i == j else cluster.inter_node


def _s_per_byte(link: Link) -> float:
    return link.transfer_s(RING_MESSAGE_BYTES) / RING_MESSAGE_BYTES


class BindingScorer:
    """Scores node assignments of one set of pipeline copies on one cluster.

    Parameters
    ----------
    cluster : Cluster
    boundaries : per pipeline copy, its stage boundaries ``(0, hi_0, ..., L)`` (gradient blocks).
    """

    def __init__(self, cluster: Cluster, boundaries: Sequence[Sequence[int]]) -> None:
        self._cluster = cluster
        self.group_of = [(n.device_type, getattr(n, "zone", None)) for n in cluster.nodes]
        ids: dict[tuple, int] = {}
        self._gid = [ids.setdefault(g, len(ids)) for g in self.group_of]       # small int per group
        self._members: dict[int, list[int]] = {}
        for i, g in enumerate(self._gid):
            self._members.setdefault(g, []).append(i)
        self._blocks = [(hi - lo, holders) for lo, hi, holders in block_decomposition(boundaries)] \
            if len(boundaries) > 1 else []
        self._intra: dict[int, float] = {}
        self._inter: dict[tuple[int, int], float] = {}
        self._cycle: dict[frozenset, float] = {}

    def intra_s_per_byte(self, n: int) -> float:
        if n not in self._intra:
            self._intra[n] = _s_per_byte(_node_link(self._cluster, n, n))
        return self._intra[n]

    def inter_s_per_byte(self, a: int, b: int) -> float:
        """Seconds per byte between two different nodes (by their groups)."""
        ga, gb = self._gid[a], self._gid[b]
        key = (ga, gb) if ga <= gb else (gb, ga)
        got = self._inter.get(key)
        if got is None:
            if ga == gb:
                members = self._members[ga]
                got = _s_per_byte(_node_link(self._cluster, members[0], members[1]))
            else:
                got = _s_per_byte(_node_link(self._cluster, a, b))
            self._inter[key] = got
        return got

    def ring_s_per_byte(self, holder_nodes: Sequence[int]) -> float:
        """Seconds per byte of the slowest adjacent pair of the ring over ``holder_nodes`` (one entry per holder)."""
        if len(holder_nodes) < 2:
            return 0.0
        count: dict[int, int] = {}
        for n in holder_nodes:
            count[n] = count.get(n, 0) + 1
        worst = max((self.intra_s_per_byte(n) for n, c in count.items() if c > 1), default=0.0)
        if len(count) == 1:
            return worst
        per_group: dict[int, list[int]] = {}
        for n in count:
            per_group.setdefault(self._gid[n], []).append(n)
        for nodes in per_group.values():
            if len(nodes) > 1:
                worst = max(worst, self.inter_s_per_byte(nodes[0], nodes[1]))
        if len(per_group) > 1:
            worst = max(worst, self._group_cycle_s_per_byte([nodes[0] for nodes in per_group.values()]))
        return worst

    def _group_cycle_s_per_byte(self, reps: list[int]) -> float:
        key = frozenset(self._gid[n] for n in reps)
        if key in self._cycle:
            return self._cycle[key]
        reps = sorted(reps, key=lambda n: self._gid[n])
        if len(reps) == 2:
            best = self.inter_s_per_byte(reps[0], reps[1])
        elif len(reps) <= _EXACT_RING_GROUPS:
            best = min(max(self.inter_s_per_byte(a, b) for a, b in zip((reps[0],) + order, order + (reps[0],)))
                       for order in itertools.permutations(reps[1:]))
        else:                   # nearest neighbour: next group = the fastest link from the current one
            order, left = [reps[0]], set(reps[1:])
            while left:
                nxt = min(left, key=lambda n: (self.inter_s_per_byte(order[-1], n), n))
                order.append(nxt)
                left.remove(nxt)
            best = max(self.inter_s_per_byte(a, b) for a, b in zip(order, order[1:] + order[:1]))
        self._cycle[key] = best
        return best

    def score(self, nodes: Sequence[Sequence[int]]) -> BindingScore:
        """:class:`BindingScore` of the node assignment ``nodes[p][s]``."""
        crossings, p2p = 0, 0.0
        for row in nodes:
            for a, b in zip(row, row[1:]):
                if a != b:
                    crossings += 1
                    p2p += self.inter_s_per_byte(a, b)
        ring = sum(layers * self.ring_s_per_byte([nodes[p][s] for p, s in enumerate(holders)])
                   for layers, holders in self._blocks)
        return BindingScore(crossings, ring, p2p)
