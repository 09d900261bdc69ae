"""How often a binding crosses a node boundary that a better binding avoids (issue 19, item 3).

Random feasible cases: 2-6 nodes of 2-8 devices of 2-4 device types; 1-4 pipeline copies of
1-4 stages whose (type, TP degree) come from a random placement (so the copies fit).
``--planner-like``: copies as the planner builds them by default instead (one TP degree per
copy, at most 2 device types, each type's stages together). For
each case the fewest total node crossings is found by the exact search with an unlimited
budget (checked finished), and each rule's crossings are compared with it:

- ``best-fit``: hpp's original rule (before issue 19);
- ``packed``: the run-packing rule alone (what large inputs get besides best-fit);
- ``greedy``: the better of the two (``bind_nodes(..., exact=False)``, the rule at scale);
- ``bind_devices``: the default (adds the exact search on small inputs).

Usage: ``python experiments/binding_check.py [--cases 200] [--seed 0] [--planner-like]``; prints one JSON
row per rule and a summary line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from typing import Sequence

from hpp.formulation.binding import bind_nodes
from hpp.formulation.binding_exact import exact_assign
from hpp.formulation.binding_rules import best_fit_assign, packed_assign
from hpp.formulation.binding_score import BindingScorer, node_crossings
from hpp.formulation.candidates import Candidate
from hpp.formulation.stage_balance import Partition, StageKind
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.devices import DeviceType

_TYPES = ("A", "B", "C", "D")


@dataclasses.dataclass(frozen=True)
class RuleRow:
    rule: str
    cases: int
    worse_than_min: int          # cases where the rule crosses more node boundaries than the minimum
    extra_crossings: int         # crossings above the minimum, summed over the cases
    failed: int                  # cases the rule could not place


def random_case(rng: random.Random, *, planner_like: bool = False) -> tuple[Cluster, list[Candidate]]:
    """A random cluster and copies that fit it (built from a random placement)."""
    num_types = rng.randint(2, 4)
    nodes = [(_TYPES[rng.randrange(num_types)], rng.randint(2, 8)) for _ in range(rng.randint(2, 6))]
    types = {t: DeviceType(t, 2 ** 34, 8) for t, _ in nodes}
    cluster = Cluster("random", types, tuple(Node(t, n, Link(1e11)) for t, n in nodes), Link(1e10))
    free = [n for _, n in nodes]
    shapes = []
    for _ in range(rng.randint(1, 4)):
        kinds: list[StageKind] = []
        tp = rng.choice((1, 2, 4))
        for _ in range(rng.randint(1, 4)):
            if planner_like:        # one TP degree; at most 2 types, the second after the first
                allowed = {k.device_type for k in kinds} if len({k.device_type for k in kinds}) == 2 else None
                room = [i for i, f in enumerate(free) if f >= tp and (allowed is None or nodes[i][0] in allowed)
                        and (not kinds or nodes[i][0] == kinds[-1].device_type
                             or nodes[i][0] not in {k.device_type for k in kinds})]
            else:
                room = [i for i, f in enumerate(free) if f >= 1]
            if not room:
                break
            i = rng.choice(room)
            t = tp if planner_like else rng.choice([t for t in (1, 2, 4) if t <= free[i]])
            free[i] -= t
            kinds.append(StageKind(nodes[i][0], t))
        if kinds:
            S = len(kinds)
            part = Partition(tuple(round(j * 12 / S) for j in range(S + 1)), (False,) * S, 1.0, float(S), 0.0,
                             (0.0,) * S, (0.0,) * S)
            shapes.append(Candidate(tuple(kinds), 1, part, {}, {}))
    if not shapes:
        i = max(range(len(nodes)), key=lambda j: free[j])
        part = Partition((0, 12), (False,), 1.0, 1.0, 0.0, (0.0,), (0.0,))
        shapes.append(Candidate((StageKind(nodes[i][0], 1),), 1, part, {}, {}))
    return cluster, shapes


def check(num_cases: int, seed: int, *, planner_like: bool = False) -> list[RuleRow]:
    rng = random.Random(seed)
    rules = {
        "best-fit": lambda c, s: best_fit_assign(c, [x.shape for x in s]),
        "packed": lambda c, s: packed_assign(c, [x.shape for x in s]),
        "greedy": lambda c, s: bind_nodes(c, s, exact=False)[0],
        "bind_devices": lambda c, s: bind_nodes(c, s)[0],
    }
    worse = dict.fromkeys(rules, 0)
    extra = dict.fromkeys(rules, 0)
    failed = dict.fromkeys(rules, 0)
    for _ in range(num_cases):
        cluster, shapes = random_case(rng, planner_like=planner_like)
        scorer = BindingScorer(cluster, [c.partition.boundaries for c in shapes])
        _, best, proven = exact_assign(cluster, [c.shape for c in shapes], scorer, incumbent=None,
                                       max_expansions=10 ** 8)
        assert proven and best is not None
        for name, rule in rules.items():
            nodes = rule(cluster, shapes)
            if nodes is None:
                failed[name] += 1
                continue
            c = sum(node_crossings(nodes))
            worse[name] += c > best.crossings
            extra[name] += c - best.crossings
    return [RuleRow(r, num_cases, worse[r], extra[r], failed[r]) for r in rules]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="binding_check")
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--planner-like", action="store_true")
    args = parser.parse_args(argv)
    rows = check(args.cases, args.seed, planner_like=args.planner_like)
    for row in rows:
        print(json.dumps(dataclasses.asdict(row)))
    print("; ".join(f"{r.rule}: {r.worse_than_min} of {r.cases} cases cross a node boundary a better binding avoids"
                    for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
