"""Named pruning rules of the HPP search, each switchable for ablation.

What the search certifies (``OPTIMAL``, ``bound_s``) is about the cost model's predicted iteration time
(:func:`hpp.formulation.cost_model.estimate_plan`, gradient sync on the bound devices' links and blocks and
point-to-point on theirs included) of every plan of the search space: every composition of the candidates
(:mod:`hpp.formulation.candidates`) bound to devices. A rule is either **exact** (it never removes every optimum
of that model: its docstring gives the argument) and may shrink what the bounds and the exact solvers see, or
**heuristic** (no such argument holds): it only shrinks the set the search's heuristics walk
(:attr:`hpp.formulation.candidates.Candidate.pruned_by`), while the bounds and the exact solvers keep every
candidate, so that nothing a heuristic rule removes can make a bound or an OPTIMAL false. Each rule is switched
by the field of :class:`PruningOptions` of its name. The functions take plain arrays, tuples and callables: this
module imports nothing from :mod:`hpp.formulation`.

- ``memory_infeasible`` (exact): a shape suffix that cannot hold layers [u, L) for any u (with the in-flight
  micro-batches of its positions) makes every shape ending with it infeasible: a stage's memory depends on its
  own layers, micro-batch size, recomputation and position from the end only (the cost model's memory formula:
  no link, binding or other pipeline enters it), and adding stages in front never changes the suffix's
  positions from the end. So no candidate is lost, and with it no plan. :func:`holds_no_layers` (a suffix's DP
  row), :func:`dead_suffix_mask` (the batched search's trie level), :func:`ends_with_dead_suffix` (the
  one-shape-at-a-time ablation: a shape is skipped when a proper suffix was found dead at its micro-batch size).
- ``dominated`` (heuristic): candidate c dominates c' when both have the same micro-batch size, c uses no more
  devices of any type and no more TP groups of any size, and c is no worse in the search model's bottleneck,
  fill, optimizer step and largest stage gradient. Replacing every copy of c' by a copy of c keeps the plan
  feasible and no slower *in the search model*, but not in the cost model: a copy's point-to-point time depends
  on the links its binding gives it (two stages of a type on one node, or not), and the plan's gradient sync on
  which device types hold which layer blocks, on the links between the holders' nodes and on the blocks the
  union of all pipelines' boundaries cuts, none of which the rule compares (found by the differential test
  against the exhaustive oracle, ``tests/test_search_truth.py``: instance ``inverted`` seed 68 at 4 GPUs per
  type, where c' = T0 then 2 x T1 costs 3.905 s and its dominator, the same stages in the other order, 4.015 s).
  So the rule only marks c' for the heuristics. :func:`dominates` (one pair), :func:`undominated_mask` (all rows
  at once, visited in :func:`dominance_order`, keys from :class:`DominanceKeys`).
- ``incumbent_bound`` (exact): a candidate whose lower-bound single-micro-batch time (its fill on the bound
  problem, :mod:`hpp.formulation.composition.bound_model`: at most the cost model's pipeline time with one
  micro-batch under any binding) exceeds the incumbent's predicted iteration time cannot be in a better plan:
  every pipeline of a plan gets >= 1 micro-batch (pipelines the data split leaves empty are dropped), a
  pipeline's time grows with its micro-batches, and sync and optimizer time are >= 0; a network model that
  only raises link prices keeps it so. :func:`exceeds_incumbent`.
- ``symmetry`` (exact): identical pipelines are one integer count instead of one boolean per copy, and devices of
  one type are counted, not enumerated (devices of a type are interchangeable up to the node packing, which the
  binding does exactly). :func:`copy_order_pairs` (the copies' order in a model with variables per copy).
- ``canonical_order`` (heuristic, off by default): the heuristics see only shapes whose device-type groups are
  ordered by memory capacity, largest first (the first stage holds the most in-flight micro-batches). It can
  remove every optimum (e.g. when the head layer's memory makes a small device better at the front), so the
  bounds and the exact solvers still see every order. :func:`type_group_orders`.
- ``memoise`` (not a pruning rule): stage-cost tables and DP rows are cached; the DP rows of all shapes' shared
  suffixes are computed once, together (batched). Off, each shape is balanced on its own with nothing shared
  (the ablation).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Callable, Hashable, Sequence

import numpy as np

__all__ = ["PruningOptions", "dominates", "exceeds_incumbent", "holds_no_layers", "dead_suffix_mask",
           "ends_with_dead_suffix", "type_group_orders", "DominanceKeys", "dominance_order",
           "undominated_mask", "copy_order_pairs"]


@dataclass(frozen=True, slots=True)
class PruningOptions:
    """Switches for the pruning rules and memoisation (module docstring): all on by default but ``canonical_order``.
    Exact rules shrink what the bounds and exact solvers see; heuristic ones only the heuristics' set."""

    memory_infeasible: bool = True
    dominated: bool = True
    incumbent_bound: bool = True
    symmetry: bool = True
    canonical_order: bool = False
    memoise: bool = True

    def without(self, name: str) -> "PruningOptions":
        """A copy with rule ``name`` switched off (for ablations)."""
        if name not in {f.name for f in fields(self)}:
            raise ValueError(f"unknown pruning rule {name!r}; known: {[f.name for f in fields(self)]}")
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs[name] = False
        return PruningOptions(**kwargs)

    @staticmethod
    def rule_names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(PruningOptions))


def dominates(a, b) -> bool:
    """True if candidate ``a`` dominates candidate ``b`` in the search model (rule ``dominated``; heuristic: see
    the module docstring for why the cost model can still price ``b``'s plans below ``a``'s).

    Both are :class:`hpp.formulation.candidates.Candidate`.
    """
    if a.micro_batch_size != b.micro_batch_size:
        return False
    if any(a.devices.get(k, 0) > v for k, v in b.devices.items()) or any(k not in b.devices for k in a.devices):
        return False
    if any(a.tp_groups.get(k, 0) > b.tp_groups.get(k, 0) for k in a.tp_groups):
        return False
    pa, pb = a.partition, b.partition
    return (pa.bottleneck_s <= pb.bottleneck_s and pa.fill_s <= pb.fill_s and pa.optimizer_s <= pb.optimizer_s
            and max(pa.stage_param_bytes) <= max(pb.stage_param_bytes))


def exceeds_incumbent(candidate, incumbent_s: float) -> bool:
    """True if even one micro-batch on ``candidate`` takes longer than ``incumbent_s`` (rule ``incumbent_bound``;
    exact when ``candidate`` has lower-bound times, from the bound problem)."""
    return candidate.partition.fill_s > incumbent_s


# --- rule ``memory_infeasible`` (and its sequential form, the dead suffix) -------------------------------

def holds_no_layers(bottleneck_rows: np.ndarray) -> np.ndarray | bool:
    """True for each suffix whose least-bottleneck DP row (last axis: first layer u) is inf everywhere.

    Such a suffix cannot hold layers [u, L) for any u, so every shape ending with it is infeasible
    (rule ``memory_infeasible``). One row (1-D) gives a bool; (N, L+1) rows give an (N,) mask.
    """
    dead = ~np.isfinite(bottleneck_rows).any(axis=-1)
    return bool(dead) if np.ndim(dead) == 0 else dead


def dead_suffix_mask(parent_dead: np.ndarray, parent_rows: np.ndarray) -> np.ndarray:
    """(N,) trie nodes to skip: the parent suffix (one stage shorter) is dead or holds no layers.

    ``parent_dead`` (N,) bool, ``parent_rows`` (N, L+1) the parents' least-bottleneck rows.
    """
    return parent_dead | holds_no_layers(parent_rows)


def ends_with_dead_suffix(dead: set, micro_batch_size: int, shape: Sequence[Hashable]) -> bool:
    """True if a proper suffix ``shape[j:]`` (j >= 1) is in ``dead`` (keys ``(micro_batch_size, suffix)``)."""
    return any((micro_batch_size, shape[j:]) in dead for j in range(1, len(shape)))


# --- rule ``canonical_order`` (heuristic) ----------------------------------------------------------------

def type_group_orders(types: tuple[str, ...], memory_bytes: Callable[[str], int], canonical: bool
                ) -> list[tuple[str, ...]]:
    """The orders of a pipeline's device-type groups to search.

    ``canonical``: only the largest-memory-first order (ties by name); else every permutation.
    """
    if canonical:
        return [tuple(sorted(types, key=lambda t: (-memory_bytes(t), t)))]
    return list(itertools.permutations(types))


# --- rule ``dominated`` ----------------------------------------------------------------------------------

class DominanceKeys:
    """Per shape: TP groups per (type, TP degree) as a count vector, the id of its key set, its devices.

    Built from ``usage``: one ``(devices per type, TP groups per (type, TP))`` pair of dicts per shape
    (kept as ``of``). ``subsets[j]``: ids of the key sets contained in key set j (itself included): only
    rows whose key set is a subset of y's can have no more TP groups of every key than y.
    """

    def __init__(self, usage: list[tuple[dict[str, int], dict[tuple[str, int], int]]]) -> None:
        self.of = usage
        keys = sorted({k for _, g in usage for k in g})
        col = {k: j for j, k in enumerate(keys)}
        self.counts = np.zeros((len(usage), len(keys)))
        sets: dict[frozenset, int] = {}
        self.keyset = np.zeros(len(usage), dtype=np.int64)
        for i, (_, g) in enumerate(usage):
            for k, n in g.items():
                self.counts[i, col[k]] = n
            self.keyset[i] = sets.setdefault(frozenset(g), len(sets))
        self.num_devices = np.array([sum(d.values()) for d, _ in usage], dtype=np.int64)
        by_id = list(sets)
        self.subsets = [np.array([i for i, a in enumerate(by_id) if a <= b], dtype=np.int64) for b in by_id]


def dominance_order(bottleneck_s: np.ndarray, fill_s: np.ndarray, num_devices: np.ndarray,
                    shape_index: np.ndarray, micro_batch_size: np.ndarray, variant: np.ndarray) -> np.ndarray:
    """Row indices by (bottleneck, fill, devices, shape index, size, variant): the order dominance visits."""
    return np.lexsort((variant, micro_batch_size, shape_index, num_devices, fill_s, bottleneck_s))


def undominated_mask(micro_batch_size: np.ndarray, keyset: np.ndarray, subsets: list[np.ndarray],
                     features: np.ndarray, visit_pos: np.ndarray) -> np.ndarray:
    """(R,) bool: the rows that no row visited earlier dominates (rule ``dominated``; heuristic).

    Row x dominates row y when both have the same micro-batch size, x's key set (id ``keyset``) is a
    subset of y's (``subsets``, :class:`DominanceKeys`) and x is no larger in every column of
    ``features`` (R, F): TP-group counts, bottleneck, fill, optimizer step, largest stage gradient
    (:func:`dominates`). ``visit_pos``: each row's rank in :func:`dominance_order`. Dominance is
    transitive, so "dominated by an earlier row" equals "dominated by an earlier kept row", which is
    what a sequential pass keeps (tested).
    """
    R = len(micro_batch_size)
    if not R:
        return np.zeros(0, dtype=bool)
    nks = len(subsets)
    gid = micro_batch_size * nks + keyset
    order = np.argsort(gid, kind="stable")
    bounds = np.flatnonzero(np.diff(gid[order])) + 1
    members = {int(gid[seg[0]]): seg for seg in np.split(order, bounds)}
    dominated = np.zeros(R, dtype=bool)
    for g, ys in members.items():
        b, ks = divmod(g, nks)
        xs = np.concatenate([members[b * nks + j] for j in subsets[ks].tolist() if b * nks + j in members])
        fx, fy = features[xs], features[ys]
        le = visit_pos[xs][None, :] < visit_pos[ys][:, None]   # (ys, xs): x visited earlier and no worse in ...
        for f in range(features.shape[1]):                     # ... every feature (one 2-D pass per feature)
            le &= fx[:, f][None, :] <= fy[:, f][:, None]
        dominated[ys] = le.any(axis=1)
    return ~dominated


# --- rule ``symmetry`` -----------------------------------------------------------------------------------

def copy_order_pairs(num_copies: int) -> list[tuple[int, int]]:
    """(later, earlier) copy index pairs that order identical copies (present first, most micro-batches first).

    With the rule on, a model with one variable set per copy adds ``later <= earlier`` for each pair.

    >>> copy_order_pairs(3)
    [(1, 0), (2, 1)]
    """
    return [(j, j - 1) for j in range(1, num_copies)]
