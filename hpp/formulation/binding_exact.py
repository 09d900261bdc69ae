"""Exact node assignment for small sets of pipeline copies: depth-first branch and bound.

Stages are assigned copy by copy, stage by stage, each to a node of its device type with
room for its TP group. The search minimises the :class:`~hpp.formulation.binding_score.BindingScore`
(crossings first). Pruning: a partial assignment whose crossings plus those still forced (the device-type
changes ahead in its pipeline, and each later pipeline's
:func:`~hpp.formulation.binding_score.forced_crossings`) exceed the incumbent's crossings is cut.
Symmetry: among untouched nodes with equal (group, size, intra-node link) only the
lowest-indexed is tried (swapping two such nodes changes no score).
The search stops after ``max_expansions`` placements; it is exact when it finishes.
"""

from __future__ import annotations

from typing import Sequence

from hpp.formulation.binding_score import BindingScore, BindingScorer, forced_crossings
from hpp.formulation.stage_balance import StageKind
from hpp.profiles.cluster import Cluster

__all__ = ["exact_assign"]


def exact_assign(cluster: Cluster, shapes: Sequence[Sequence[StageKind]], scorer: BindingScorer, *,
                 incumbent: list[list[int]] | None, max_expansions: int
                 ) -> tuple[list[list[int]] | None, BindingScore | None, bool]:
    """Best node assignment ``nodes[p][s]`` by :class:`BindingScore`.

    Parameters
    ----------
    incumbent : a feasible assignment to start from (its score is the first bound), or None.
    max_expansions : placements tried before the search gives up proving optimality.

    Returns
    -------
    (nodes, score, proven)
        The best assignment found (the incumbent if nothing better; None if none), its
        score, and whether the search finished (then it is optimal).
    """
    groups = [(p, s, k) for p, shape in enumerate(shapes) for s, k in enumerate(shape)]
    # crossings still ahead after stage g: the type changes of its pipeline after it, and
    # every later pipeline's forced_crossings (each is a lower bound whatever shares its nodes)
    alone = [forced_crossings(cluster, shape) for shape in shapes]
    changes = [int(s > 0 and k.device_type != shapes[p][s - 1].device_type) for p, s, k in groups]
    forced_after = [sum(changes[h] for h in range(g + 1, len(groups)) if groups[h][0] == groups[g][0])
                    + sum(alone[groups[g][0] + 1:]) for g in range(len(groups))]
    # per device type: its nodes by signature (untouched nodes of one signature are interchangeable)
    by_type: dict[str, dict[tuple, list[int]]] = {}
    for i, n in enumerate(cluster.nodes):
        signature = (scorer.group_of[i], n.num_devices, n.intra_node)
        by_type.setdefault(n.device_type, {}).setdefault(signature, []).append(i)

    free = [n.num_devices for n in cluster.nodes]
    rows = [[-1] * len(shape) for shape in shapes]
    best = {"nodes": incumbent, "score": scorer.score(incumbent) if incumbent is not None else None}
    budget = [max_expansions]

    def options(g: int) -> list[int]:
        """Touched nodes with room, and the first untouched node of each signature: O(stages + signatures)."""
        p, s, k = groups[g]
        out = []
        for nodes in by_type.get(k.device_type, {}).values():
            if cluster.nodes[nodes[0]].num_devices < k.tp_degree:
                continue
            for i in nodes:     # the search takes untouched nodes in order: the touched ones are a prefix
                if free[i] < cluster.nodes[i].num_devices:
                    if free[i] >= k.tp_degree:
                        out.append(i)
                else:
                    out.append(i)
                    break
        prev = rows[p][s - 1] if s > 0 else -1
        out.sort(key=lambda i: (i != prev, free[i], i))          # neighbour first, then best fit
        return out

    def visit(g: int, crossings: int) -> bool:
        """False once the budget is spent."""
        if g == len(groups):
            score = scorer.score(rows)
            if best["score"] is None or score.better_than(best["score"]):
                best["nodes"], best["score"] = [list(r) for r in rows], score
            return True
        p, s, k = groups[g]
        for i in options(g):
            c = crossings + int(s > 0 and rows[p][s - 1] != i)
            if best["score"] is not None and c + forced_after[g] > best["score"].crossings:
                continue
            budget[0] -= 1
            if budget[0] < 0:
                return False
            rows[p][s] = i
            free[i] -= k.tp_degree
            ok = visit(g + 1, c)
            free[i] += k.tp_degree
            rows[p][s] = -1
            if not ok:
                return False
        return True

    proven = visit(0, 0)
    return best["nodes"], best["score"], proven
