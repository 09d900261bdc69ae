"""Candidate pipelines: shapes enumerated over the inventory, each stage-balanced by the DP.

A pipeline shape is an ordered tuple of :class:`StageKind`. The search space
(:class:`~hpp.formulation.space_limits.SearchSpace`, re-exported here with the stage kinds
and micro-batch sizes it allows) holds shapes made of at most ``max_types_per_pipeline``
device types, with one TP degree per device type inside a pipeline, at most
``max_stages`` stages, and stages of one type contiguous (type groups). With the
``canonical_order`` rule the groups are ordered by device memory, largest first;
without it every order of the groups is searched.

A :class:`Candidate` is (shape, micro-batch size, best partition) plus the devices
and TP groups one copy uses, so that the composition can count copies.
"""

from __future__ import annotations

import itertools
import logging
import time

import numpy as np
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

from hpp.errors import HppInputError
from hpp.forkshare import can_fork, run_shares, usable_cores
from hpp.formulation.space_limits import (SearchSpace, common_micro_batch_sizes, stage_kinds, tp_capacity)
from hpp.formulation.stage_balance import Partition, StageBalancer, StageKind
from hpp.formulation.stage_balance_batch import PartitionBatch, balance_pairs
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.pruning.rules import (DominanceKeys, PruningOptions, dominance_order, ends_with_dead_suffix,
                                type_group_orders, undominated_mask)

__all__ = ["Candidate", "enumerate_shapes", "build_candidates", "build_candidates_bounded", "remove_dominated",
           "PARALLEL_MIN_PAIRS"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stage-balanced pipeline shape at one micro-batch size.

    Attributes
    ----------
    shape : tuple[StageKind, ...]
    micro_batch_size : int
    partition : Partition
    devices : dict[str, int]
        Devices of each type one copy uses.
    tp_groups : dict[tuple[str, int], int]
        TP groups of each (type, size) one copy uses.
    pruned_by : str
        ``""``: the search's heuristics use it; else the heuristic pruning rule that leaves it out of their
        set (``"dominated"``, ``"canonical_order"``). Every candidate counts for the bound and the exact
        solvers, whatever this says (:mod:`hpp.pruning.rules`).
    """

    shape: tuple[StageKind, ...]
    micro_batch_size: int
    partition: Partition
    devices: dict
    tp_groups: dict
    pruned_by: str = ""

    @property
    def num_devices(self) -> int:
        return sum(self.devices.values())

    def label(self) -> str:
        groups = [(k, len(list(g))) for k, g in itertools.groupby(self.shape)]
        return "+".join(f"{n}x{k.device_type}" + (f"(tp{k.tp_degree})" if k.tp_degree > 1 else "")
                        for k, n in groups) + f" b={self.micro_batch_size}"


def enumerate_shapes(cluster: Cluster, kinds: dict[str, tuple[StageKind, ...]], space: SearchSpace,
                     pruning: PruningOptions, num_layers: int) -> Iterator[tuple[StageKind, ...]]:
    """Yield every shape of the search space (see the module docstring), shortest groups first."""
    types = tuple(kinds)
    max_stages = min(space.max_stages, num_layers)
    for r in range(1, min(space.max_types_per_pipeline, len(types)) + 1):
        for subset in itertools.combinations(types, r):
            orders = type_group_orders(subset, lambda t: cluster.device_types[t].memory_bytes,
                                       pruning.canonical_order)
            for kind_choice in itertools.product(*(kinds[t] for t in subset)):
                if not space.mixed_tp_pipelines and len({k.tp_degree for k in kind_choice}) > 1:
                    continue                          # one TP degree per pipeline (see SearchSpace)
                by_type = dict(zip(subset, kind_choice))
                most = max_stages if r <= 2 else min(max_stages, space.max_stages_mixed)
                limits = [min(most, tp_capacity(cluster, t, by_type[t].tp_degree)) for t in subset]
                for counts in itertools.product(*(range(1, lim + 1) for lim in limits)):
                    if sum(counts) > most:
                        continue
                    count_of = dict(zip(subset, counts))
                    for order in orders:
                        yield tuple(k for t in order for k in [by_type[t]] * count_of[t])


def _is_canonical(shape: tuple[StageKind, ...], memory_bytes: dict[str, int]) -> bool:
    """True if the shape's type groups are in the canonical order (largest memory first, ties by name)."""
    order = list(dict.fromkeys(k.device_type for k in shape))
    return order == sorted(order, key=lambda t: (-memory_bytes[t], t))


def _balance_shapes(shapes: list[tuple[StageKind, ...]], sizes: list[list[int]], balancer: StageBalancer,
                    pruning: PruningOptions, keep_b: frozenset | None) -> tuple[PartitionBatch, dict[str, int]]:
    """Stage-balance ``shapes[i]`` at each size of ``sizes[i]`` (only those in ``keep_b`` if given).

    Returns (partitions, rows in enumeration order (shape, size, variant); counters). With
    memoisation the pairs are balanced together (:func:`~hpp.formulation.stage_balance_batch.balance_pairs`);
    without it (the ablation) one by one, nothing shared. The dead suffixes of the
    ``memory_infeasible`` rule are keyed by micro-batch size, so any split of the sizes over
    workers prunes exactly what one pass would.
    """
    pairs = [(i, b) for i, row in enumerate(sizes) for b in row if keep_b is None or b in keep_b]
    if balancer.memoise:
        return balance_pairs(balancer, shapes, pairs, prune_dead_suffixes=pruning.memory_infeasible)
    stats = {"shapes_pruned_memory": 0, "balanced": 0, "infeasible": 0, "fill_variants": 0}
    rows: list[tuple[int, int, int, Partition]] = []
    dead: set = set()
    for i, b in pairs:
        shape = shapes[i]
        if pruning.memory_infeasible and dead and ends_with_dead_suffix(dead, b, shape):
            stats["shapes_pruned_memory"] += 1                # a suffix whose row is empty kills the shape
            continue
        stats["balanced"] += 1
        part, few = balancer.balance_both(shape, b)
        if part is None:
            stats["infeasible"] += 1
            if pruning.memory_infeasible and balancer.suffix_infeasible(shape, b):
                dead.add((b, shape))
            continue
        rows.append((i, b, 0, part))
        # the least-fill partition is better when a pipeline gets few micro-batches
        if few is not None:
            rows.append((i, b, 1, few))
            stats["fill_variants"] += 1
    return PartitionBatch.from_partitions(rows, balancer.num_layers), stats


def _usage(shape: tuple[StageKind, ...]) -> tuple[dict[str, int], dict[tuple[str, int], int]]:
    """(devices per type, TP groups per (type, TP degree)) of one copy of ``shape``."""
    devices: dict[str, int] = {}
    groups: dict[tuple[str, int], int] = {}
    for k in shape:
        devices[k.device_type] = devices.get(k.device_type, 0) + k.tp_degree
        groups[(k.device_type, k.tp_degree)] = groups.get((k.device_type, k.tp_degree), 0) + 1
    return devices, groups


def _split_sizes(sizes: list[list[int]], workers: int) -> list[frozenset]:
    """Micro-batch sizes in ``workers`` groups of about equal (shape, size) counts (largest count first)."""
    count: dict[int, int] = {}
    for row in sizes:
        for b in row:
            count[b] = count.get(b, 0) + 1
    bins: list[tuple[int, set]] = [(0, set()) for _ in range(min(workers, len(count)))]
    for b in sorted(count, key=lambda x: (-count[x], x)):
        j = min(range(len(bins)), key=lambda k: bins[k][0])
        bins[j] = (bins[j][0] + count[b], bins[j][1] | {b})
    return [frozenset(s) for _, s in bins if s]


def _visit_order(batch: PartitionBatch, num_devices: np.ndarray) -> np.ndarray:
    """Rows in the order dominance visits them (:func:`hpp.pruning.rules.dominance_order`)."""
    return dominance_order(batch.bottleneck_s, batch.fill_s, num_devices[batch.shape_index], batch.shape_index,
                           batch.micro_batch_size, batch.variant)


def _undominated(batch: PartitionBatch, usage: DominanceKeys) -> np.ndarray:
    """Boolean mask of the rows no earlier row (in :func:`_visit_order`) dominates (rule ``dominated``,
    :func:`hpp.pruning.rules.undominated_mask` on the rows' TP-group counts, bottleneck, fill, optimizer
    step and largest stage gradient)."""
    R = len(batch)
    if not R:
        return np.zeros(0, dtype=bool)
    si = batch.shape_index
    pos = np.empty(R, dtype=np.int64)
    pos[_visit_order(batch, usage.num_devices)] = np.arange(R)
    feat = np.column_stack([usage.counts[si], batch.bottleneck_s, batch.fill_s, batch.optimizer_s,
                            batch.stage_param_bytes.max(axis=1)])
    return undominated_mask(batch.micro_batch_size, usage.keyset[si], usage.subsets, feat, pos)


def _candidates(batch: PartitionBatch, shapes: list[tuple[StageKind, ...]], usage: DominanceKeys,
                why: np.ndarray | None = None) -> list[Candidate]:
    """The rows of ``batch`` as candidates, in row order (``why``: their :attr:`Candidate.pruned_by`)."""
    marks = why.tolist() if why is not None else [""] * len(batch)
    return [Candidate(shapes[i], b, part, *usage.of[i], w)
            for i, b, part, w in zip(batch.shape_index.tolist(), batch.micro_batch_size.tolist(), batch.partitions(),
                                     marks)]


#: Bound model: candidates -> the same candidates with lower-bound times (same order), e.g.
#: :func:`hpp.formulation.composition.bound_model.lower_bound_candidates` with its links bound.
BoundFn = Callable[[Sequence[Candidate]], Sequence[Candidate]]


def _marks(batch: PartitionBatch, usage: DominanceKeys, pruning: PruningOptions, canonical: np.ndarray) -> np.ndarray:
    """(R,) object array: per row ``""`` (the heuristics use it) or the heuristic rule that leaves it out of their set
    (:attr:`Candidate.pruned_by`). Dominance compares rows of one micro-batch size only, so a share of the sizes
    marks exactly what one pass over all of them marks."""
    why = np.full(len(batch), "", dtype=object)
    if pruning.canonical_order:
        why[~canonical[batch.shape_index]] = "canonical_order"
    if pruning.dominated and len(batch):
        why[~_undominated(batch, usage) & (why == "")] = "dominated"
    return why


def _share(shapes, sizes, balancer, pruning, keep_b, usage: DominanceKeys, canonical: np.ndarray,
           bound: BoundFn | None = None):
    """One worker's share: its sizes balanced, its rows marked (:func:`_marks`), then (``bound`` given) each row's
    lower-bound (bottleneck, fill, optimizer step) [s] as an (R, 3) array (else None).

    Every feasible row is kept: the heuristic rules (``dominated``, ``canonical_order``) only mark rows. The bound
    model prices each candidate on its own (its memos only cache), so any split gives the same values.
    """
    batch, stats = _balance_shapes(shapes, sizes, balancer, pruning, keep_b)
    why = _marks(batch, usage, pruning, canonical)
    lb = None
    if bound is not None:
        t0 = time.process_time()
        lb = np.array([(c.partition.bottleneck_s, c.partition.fill_s, c.partition.optimizer_s)
                       for c in bound(_candidates(batch, shapes, usage, why))], dtype=np.float64).reshape(-1, 3)
        stats["bound_model_s"] = time.process_time() - t0
    return batch, stats, lb, why


def _balance_in_workers(shapes, sizes, balancer, pruning, groups: list[frozenset], usage: DominanceKeys,
                        canonical: np.ndarray, finish, bound: BoundFn | None = None):
    """The shares of ``groups`` side by side (:func:`hpp.forkshare.run_shares`); ``finish(batch, stats, lb)``
    of their rows, counters and lower-bound rows, merged (it runs while the children exit)."""
    def counters():
        return [balancer.rows_computed, balancer.rows_reused, balancer.cache.hits, balancer.cache.misses]

    def share(keep_b):      # the counters it adds, so that a child's reach the parent
        before = counters()
        batch, stats, lb, why = _share(shapes, sizes, balancer, pruning, keep_b, usage, canonical, bound)
        return batch, stats, [a - b for a, b in zip(counters(), before)], lb, why

    def merge(results):
        total = [s + sum(r[2][i] for r in results) for i, s in enumerate(start)]
        balancer.rows_computed, balancer.rows_reused, balancer.cache.hits, balancer.cache.misses = total
        stats = dict(results[0][1])
        for _, got, _, _, _ in results[1:]:
            for k, v in got.items():
                stats[k] += v
        lb = None if bound is None else np.concatenate([r[3] for r in results])
        why = np.concatenate([r[4] for r in results])
        return finish(PartitionBatch.concat([r[0] for r in results], balancer.num_layers), stats, lb, why)

    start = counters()
    return run_shares(share, groups, merge=merge)


def _in_one_process_order(batch: PartitionBatch, shapes: list[tuple[StageKind, ...]], usage: DominanceKeys,
                          pruning: PruningOptions, why: np.ndarray, lb: np.ndarray | None,
                          bound: BoundFn | None, stats: dict) -> tuple[list[Candidate], list[Candidate]]:
    """Every candidate, marked (``why``, :func:`_marks`) and ordered: first those the heuristics use, then those a
    heuristic rule leaves out of their set (:attr:`Candidate.pruned_by`), each part in the dominance visiting
    order with the rule on (ties by enumeration order), else in enumeration order (shape, micro-batch size,
    variant); and the same candidates with lower-bound times: from the workers' rows ``lb`` (R, 3), else from
    ``bound`` run here on them (its CPU seconds added to ``stats``), else [].
    """
    stats["dominated"] = int((why == "dominated").sum())
    stats["heuristic_candidates"] = int((why == "").sum())
    if pruning.dominated:
        order = _visit_order(batch, usage.num_devices)
    else:
        order = np.lexsort((batch.variant, batch.micro_batch_size, batch.shape_index))
    order = np.concatenate([order[why[order] == ""], order[why[order] != ""]])
    cands = _candidates(batch.take(order), shapes, usage, why[order])
    if lb is not None:
        return cands, [Candidate(c.shape, c.micro_batch_size,
                                 c.partition._replace(bottleneck_s=t, fill_s=f, optimizer_s=o), c.devices, c.tp_groups,
                                 c.pruned_by)
                       for c, (t, f, o) in zip(cands, lb[order].tolist())]
    if bound is None:
        return cands, []
    t0 = time.process_time()
    out = list(bound(cands))
    stats["bound_model_s"] = time.process_time() - t0
    return cands, out


#: (shape, micro-batch size) pairs below which the candidates are built in one process (a fork costs ~10 ms).
PARALLEL_MIN_PAIRS = 1000


def build_candidates(cluster: Cluster, profile: ModelProfile, balancer: StageBalancer, space: SearchSpace,
                     pruning: PruningOptions, *, workers: int = 1) -> tuple[list[Candidate], dict[str, int]]:
    """Stage-balance every shape of the space at every common measured micro-batch size:
    :func:`build_candidates_bounded` without a bound model, returning (candidates, stats)."""
    cands, _, stats = build_candidates_bounded(cluster, profile, balancer, space, pruning, workers=workers)
    return cands, stats


def build_candidates_bounded(cluster: Cluster, profile: ModelProfile, balancer: StageBalancer, space: SearchSpace,
                             pruning: PruningOptions, *, workers: int = 1, bound: BoundFn | None = None
                             ) -> tuple[list[Candidate], list[Candidate], dict[str, int]]:
    """Stage-balance every shape of the space at every common measured micro-batch size.

    Each (shape, micro-batch size) gives its least-bottleneck partition and, when different,
    its least-fill partition (the better one for pipelines with few micro-batches).

    Parameters
    ----------
    workers : int
        Processes to use (1: this one; 0: one per usable core; negative: HppInputError). With more
        than one, on a platform with ``fork`` and at least :data:`PARALLEL_MIN_PAIRS` (shape, size)
        pairs, the micro-batch sizes are split over forked workers (the DP memo and the dominance
        test are keyed by size, so nothing is shared or lost) and the candidates come back in the
        same order as from one process: the result is identical (tested).

    bound : callable, optional
        The bound model (candidates -> lower-bound candidates, same order). With workers, applied inside
        each worker to its share (its values do not depend on the split: each candidate is priced on its
        own), so that it runs in parallel; in one process, once on the final candidates.

    Returns
    -------
    (candidates, bound_candidates, stats)
        Every feasible candidate of the space (the ``memory_infeasible`` rule is exact): first those the
        heuristics use, then those a heuristic rule (``dominated``, ``canonical_order``) leaves out of their
        set, marked (:attr:`Candidate.pruned_by`); ``bound(candidates)`` (same order; [] without ``bound``);
        counters: shapes, shapes_pruned_memory, infeasible, dominated, heuristic_candidates, workers, and
        with ``bound`` bound_model_s (CPU seconds of the bound model, summed over workers).
    """
    if workers < 0:
        raise HppInputError(f"workers={workers}", field="--workers", fix="give 0 (one per core) or more")
    kinds = stage_kinds(cluster, profile, space)
    # every order of the type groups: ``canonical_order`` only marks the others (heuristic, see PruningOptions)
    shapes = list(enumerate_shapes(cluster, kinds, space, replace(pruning, canonical_order=False),
                                   profile.num_layers))
    memory = {t: cluster.device_types[t].memory_bytes for t in cluster.device_types}
    canonical = np.array([_is_canonical(s, memory) for s in shapes], dtype=bool)
    by_kinds: dict[frozenset, list[int]] = {}          # shapes of one kind set share their sizes
    sizes = [by_kinds[ks] if ks in by_kinds else by_kinds.setdefault(ks, common_micro_batch_sizes(profile, s, space))
             for s in shapes for ks in [frozenset(s)]]
    usage = DominanceKeys([_usage(s) for s in shapes])
    n = usable_cores() if workers == 0 else max(1, workers)
    groups = _split_sizes(sizes, n) if n > 1 else []
    parallel = len(groups) > 1 and sum(map(len, sizes)) >= PARALLEL_MIN_PAIRS and can_fork()

    def finish(batch: PartitionBatch, part_stats: dict[str, int], lb: np.ndarray | None, why: np.ndarray):
        return _in_one_process_order(batch, shapes, usage, pruning, why, lb, bound, part_stats), part_stats

    if parallel:
        (out, out_lb), part_stats = _balance_in_workers(shapes, sizes, balancer, pruning, groups, usage, canonical,
                                                        finish, bound)
    else:           # no share to split: the bound model runs once, on the final candidates (finish)
        (out, out_lb), part_stats = finish(*_share(shapes, sizes, balancer, pruning, None, usage, canonical))
    stats = {"shapes": len(shapes), **part_stats, "workers": len(groups) if parallel else 1}
    log.debug("candidates: %s", stats)
    return out, out_lb, stats


def remove_dominated(cands: list[Candidate]) -> list[Candidate]:
    """Drop every candidate dominated by another (rule ``dominated``; ties: keep the first in a stable order).

    Vectorised form of :func:`hpp.pruning.rules.dominates` (see :func:`_undominated`). Candidates are
    visited by (bottleneck, fill, devices, position in ``cands``); one is dropped when an earlier one
    dominates it. Returns the kept candidates in that visiting order.
    """
    if not cands:
        return []
    L = max(c.partition.boundaries[-1] for c in cands)
    batch = PartitionBatch.from_partitions([(i, c.micro_batch_size, 0, c.partition) for i, c in enumerate(cands)], L)
    usage = DominanceKeys([(c.devices, c.tp_groups) for c in cands])
    keep = _undominated(batch, usage)
    return [cands[i] for i in _visit_order(batch, usage.num_devices).tolist() if keep[i]]
