"""Candidate pipelines: shapes enumerated over the inventory, each stage-balanced by the DP.

A pipeline shape is an ordered tuple of :class:`StageKind`. The search space
(:class:`SearchSpace`) holds shapes made of at most ``max_types_per_pipeline``
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
import multiprocessing
import os

import numpy as np
from dataclasses import dataclass
from typing import Iterator

from hpp.errors import HppInputError
from hpp.formulation.stage_balance import Partition, StageBalancer, StageKind
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.pruning.rules import PruningOptions

__all__ = ["SearchSpace", "Candidate", "stage_kinds", "enumerate_shapes", "build_candidates",
           "remove_dominated", "tp_capacity", "common_micro_batch_sizes", "usable_cores", "PARALLEL_MIN_PAIRS"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """What the planner may build.

    Attributes
    ----------
    micro_batch_sizes : tuple[int, ...] or None
        Micro-batch sizes to consider; None = every size the profile measured.
    max_tp : int or None
        Largest TP degree; None = the largest measured that fits a node.
    max_stages : int
        Most stages in one pipeline.
    max_types_per_pipeline : int
        Most device types in one pipeline.
    allow_recompute : bool
        Stages may use full activation recomputation (``--no-recompute`` forbids it).
    """

    micro_batch_sizes: tuple[int, ...] | None = None
    max_tp: int | None = None
    max_stages: int = 8
    max_types_per_pipeline: int = 2
    allow_recompute: bool = True

    def __post_init__(self) -> None:
        if self.max_stages < 1 or self.max_types_per_pipeline < 1:
            raise HppInputError(f"max_stages={self.max_stages}, max_types_per_pipeline={self.max_types_per_pipeline}",
                                field="search space", fix="both must be >= 1")


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
    """

    shape: tuple[StageKind, ...]
    micro_batch_size: int
    partition: Partition
    devices: dict
    tp_groups: dict

    @property
    def num_devices(self) -> int:
        return sum(self.devices.values())

    def label(self) -> str:
        groups = [(k, len(list(g))) for k, g in itertools.groupby(self.shape)]
        return "+".join(f"{n}x{k.device_type}" + (f"(tp{k.tp_degree})" if k.tp_degree > 1 else "")
                        for k, n in groups) + f" b={self.micro_batch_size}"


def tp_capacity(cluster: Cluster, device_type: str, tp_degree: int) -> int:
    """How many TP groups of ``tp_degree`` devices of ``device_type`` the nodes can hold."""
    return sum(n.num_devices // tp_degree for n in cluster.nodes if n.device_type == device_type)


def stage_kinds(cluster: Cluster, profile: ModelProfile, space: SearchSpace) -> dict[str, tuple[StageKind, ...]]:
    """Stage kinds per device type of the cluster: every measured TP degree that fits a node and ``max_tp``.

    Raises
    ------
    HppInputError
        A device type of the cluster has no profile (named), or no usable TP degree.
    """
    out: dict[str, tuple[StageKind, ...]] = {}
    for dtype in sorted(cluster.count_by_type()):
        if dtype not in profile.device_types:
            raise HppInputError(f"GPU type {dtype!r} of the cluster has no profile for {profile.model}",
                                field="nodes[*].device_type",
                                fix=f"profile {dtype} or use types in {list(profile.device_types)}")
        largest_node = max(n.num_devices for n in cluster.nodes if n.device_type == dtype)
        tps = [t for t in profile.tp_degrees(dtype) if t <= largest_node and (space.max_tp is None or t <= space.max_tp)]
        if not tps:
            raise HppInputError(f"{profile.model} on {dtype} is profiled only at TP {list(profile.tp_degrees(dtype))}, "
                                f"which does not fit nodes of {largest_node} devices or --max-tp",
                                field="max_tp", fix="raise --max-tp or use larger nodes")
        out[dtype] = tuple(StageKind(dtype, t) for t in tps)
    return out


def _type_order(cluster: Cluster, types: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(types, key=lambda t: (-cluster.device_types[t].memory_bytes, t)))


def enumerate_shapes(cluster: Cluster, kinds: dict[str, tuple[StageKind, ...]], space: SearchSpace,
                     pruning: PruningOptions, num_layers: int) -> Iterator[tuple[StageKind, ...]]:
    """Yield every shape of the search space (see the module docstring), shortest groups first."""
    types = tuple(kinds)
    max_stages = min(space.max_stages, num_layers)
    for r in range(1, min(space.max_types_per_pipeline, len(types)) + 1):
        for subset in itertools.combinations(types, r):
            orders = [_type_order(cluster, subset)] if pruning.canonical_order else list(itertools.permutations(subset))
            for kind_choice in itertools.product(*(kinds[t] for t in subset)):
                by_type = dict(zip(subset, kind_choice))
                limits = [min(max_stages, tp_capacity(cluster, t, by_type[t].tp_degree)) for t in subset]
                for counts in itertools.product(*(range(1, lim + 1) for lim in limits)):
                    if sum(counts) > max_stages:
                        continue
                    count_of = dict(zip(subset, counts))
                    for order in orders:
                        yield tuple(k for t in order for k in [by_type[t]] * count_of[t])


def common_micro_batch_sizes(profile: ModelProfile, shape: tuple[StageKind, ...], space: SearchSpace) -> list[int]:
    """Micro-batch sizes measured for every stage kind of ``shape`` (and allowed by ``space``), ascending."""
    common = None
    for k in set(shape):
        sizes = set(profile.micro_batch_sizes(k.device_type, k.tp_degree))
        common = sizes if common is None else common & sizes
    sizes = sorted(common or ())
    if space.micro_batch_sizes is not None:
        sizes = [b for b in sizes if b in space.micro_batch_sizes]
    return sizes


def _balance_shapes(shapes: list[tuple[StageKind, ...]], sizes: list[list[int]], balancer: StageBalancer,
                    pruning: PruningOptions, keep_b: frozenset | None
                    ) -> tuple[list[tuple[int, int, Candidate]], dict[str, int]]:
    """Stage-balance ``shapes[i]`` at each size of ``sizes[i]`` (only those in ``keep_b`` if given).

    Returns ((shape index, variant, candidate) in enumeration order, counters). The dead-suffix
    set of the ``memory_infeasible`` rule is keyed by micro-batch size, so any split of the sizes
    over workers prunes exactly what one pass would.
    """
    stats = {"shapes_pruned_memory": 0, "balanced": 0, "infeasible": 0, "fill_variants": 0}
    out: list[tuple[int, int, Candidate]] = []
    dead: set = set()
    for i, shape in enumerate(shapes):
        for b in sizes[i]:
            if keep_b is not None and b not in keep_b:
                continue
            if pruning.memory_infeasible and dead:
                # every suffix whose row is empty kills all shapes ending with it
                if any((b, shape[j:]) in dead for j in range(1, len(shape))):
                    stats["shapes_pruned_memory"] += 1
                    continue
            stats["balanced"] += 1
            part, few = balancer.balance_both(shape, b)
            if part is None:
                stats["infeasible"] += 1
                if pruning.memory_infeasible and balancer.suffix_infeasible(shape, b):
                    dead.add((b, shape))
                continue
            devices, groups = _usage(shape)
            out.append((i, 0, Candidate(shape, b, part, devices, groups)))
            # the least-fill partition is better when a pipeline gets few micro-batches
            if few is not None:
                out.append((i, 1, Candidate(shape, b, few, devices, groups)))
                stats["fill_variants"] += 1
    return out, stats


def _usage(shape: tuple[StageKind, ...]) -> tuple[dict[str, int], dict[tuple[str, int], int]]:
    """(devices per type, TP groups per (type, TP degree)) of one copy of ``shape``."""
    devices: dict[str, int] = {}
    groups: dict[tuple[str, int], int] = {}
    for k in shape:
        devices[k.device_type] = devices.get(k.device_type, 0) + k.tp_degree
        groups[(k.device_type, k.tp_degree)] = groups.get((k.device_type, k.tp_degree), 0) + 1
    return devices, groups


_PARTITION_FIELDS = tuple(Partition.__slots__)


def _pack(out: list[tuple[int, int, Candidate]]) -> list[tuple]:
    """Candidates as plain tuples for the pipe: (shape index, variant, size, partition fields); the
    shape and its device counts are rebuilt from the index (pickling them costs more than the DP)."""
    return [(i, v, c.micro_batch_size, tuple(getattr(c.partition, f) for f in _PARTITION_FIELDS)) for i, v, c in out]


def _unpack(packed: list[tuple], shapes: list[tuple[StageKind, ...]]) -> list[tuple[int, int, Candidate]]:
    usage: dict[int, tuple] = {}
    out = []
    for i, v, b, fields in packed:
        if i not in usage:
            usage[i] = _usage(shapes[i])
        out.append((i, v, Candidate(shapes[i], b, Partition(*fields), *usage[i])))
    return out


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


def _share(shapes, sizes, balancer, pruning, keep_b):
    """One worker's share: its sizes balanced, then (rule on) its dominated candidates removed.

    Dominance compares candidates of the same micro-batch size only, so removing it per share of
    the sizes drops exactly the candidates that one pass over all of them drops.
    """
    out, stats = _balance_shapes(shapes, sizes, balancer, pruning, keep_b)
    stats["dominated"] = 0
    if pruning.dominated:
        kept = {id(c) for c in remove_dominated([c for _, _, c in out])}
        stats["dominated"] = len(out) - len(kept)
        out = [t for t in out if id(t[2]) in kept]
    return out, stats


def _worker_main(conn, shapes, sizes, balancer, pruning, keep_b) -> None:     # pragma: no cover (child process)
    try:
        r0, u0, h0, m0 = balancer.rows_computed, balancer.rows_reused, balancer.cache.hits, balancer.cache.misses
        out, stats = _share(shapes, sizes, balancer, pruning, keep_b)
        counters = (balancer.rows_computed - r0, balancer.rows_reused - u0, balancer.cache.hits - h0,
                    balancer.cache.misses - m0)
        conn.send(("ok", _pack(out), stats, counters))
    except BaseException as exc:       # noqa: BLE001 - sent to the parent, which re-raises it
        conn.send(("error", exc, None, None))
    finally:
        conn.close()


def _balance_in_workers(shapes, sizes, balancer, pruning, groups: list[frozenset]):
    """Fork one child per group but the first (the parent runs that one); the shares' (tagged
    candidates, counters), merged."""
    ctx = multiprocessing.get_context("fork")
    children = []
    for keep_b in groups[1:]:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker_main, args=(send, shapes, sizes, balancer, pruning, keep_b), daemon=True)
        proc.start()
        send.close()
        children.append((proc, recv, keep_b))
    try:
        out, stats = _share(shapes, sizes, balancer, pruning, groups[0])
    except BaseException:
        for proc, _, _ in children:      # nobody will read their results
            proc.terminate()
            proc.join()
        raise
    for proc, recv, keep_b in children:
        try:
            kind, got, got_stats, counters = recv.recv()
        except EOFError:                     # the child died: do its share here
            kind, got = "lost", None
        proc.join()
        if kind == "error":
            raise got
        if kind == "lost":
            got, got_stats = _share(shapes, sizes, balancer, pruning, keep_b)
        else:
            got = _unpack(got, shapes)
            balancer.rows_computed += counters[0]
            balancer.rows_reused += counters[1]
            balancer.cache.hits += counters[2]
            balancer.cache.misses += counters[3]
        out.extend(got)
        for k, v in got_stats.items():
            stats[k] += v
    return out, stats


def _in_one_process_order(tagged: list[tuple[int, int, Candidate]], dominated: bool) -> list[Candidate]:
    """The candidates in the order one pass gives: :func:`remove_dominated`'s visiting order with the
    rule on (ties by enumeration order), else enumeration order (shape, micro-batch size, variant)."""
    def tag(t):
        return t[0], t[2].micro_batch_size, t[1]

    if dominated:
        key = lambda t: (t[2].partition.bottleneck_s, t[2].partition.fill_s, t[2].num_devices, tag(t))  # noqa: E731
    else:
        key = tag
    return [c for _, _, c in sorted(tagged, key=key)]


#: (shape, micro-batch size) pairs below which the candidates are built in one process (a fork costs ~10 ms).
PARALLEL_MIN_PAIRS = 1000


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:        # pragma: no cover (macOS, Windows)
        return os.cpu_count() or 1


def build_candidates(cluster: Cluster, profile: ModelProfile, balancer: StageBalancer, space: SearchSpace,
                     pruning: PruningOptions, *, workers: int = 1) -> tuple[list[Candidate], dict[str, int]]:
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

    Returns
    -------
    (candidates, stats)
        Feasible candidates (dominated ones removed if the rule is on) and counters:
        shapes, shapes_pruned_memory, infeasible, dominated, workers.
    """
    if workers < 0:
        raise HppInputError(f"workers={workers}", field="--workers", fix="give 0 (one per core) or more")
    kinds = stage_kinds(cluster, profile, space)
    shapes = list(enumerate_shapes(cluster, kinds, space, pruning, profile.num_layers))
    sizes = [common_micro_batch_sizes(profile, shape, space) for shape in shapes]
    n = usable_cores() if workers == 0 else max(1, workers)
    groups = _split_sizes(sizes, n) if n > 1 else []
    parallel = (len(groups) > 1 and sum(map(len, sizes)) >= PARALLEL_MIN_PAIRS
                and "fork" in multiprocessing.get_all_start_methods())
    if parallel:
        tagged, part_stats = _balance_in_workers(shapes, sizes, balancer, pruning, groups)
    else:
        tagged, part_stats = _share(shapes, sizes, balancer, pruning, None)
    stats = {"shapes": len(shapes), **part_stats, "workers": len(groups) if parallel else 1}
    out = _in_one_process_order(tagged, pruning.dominated)
    log.debug("candidates: %s", stats)
    return out, stats


def remove_dominated(cands: list[Candidate]) -> list[Candidate]:
    """Drop every candidate dominated by another (rule ``dominated``; ties: keep the first in a stable order).

    Vectorised form of :func:`hpp.pruning.rules.dominates`. Candidates are visited by (bottleneck,
    fill, devices); each is compared at once with every kept candidate of its micro-batch size whose
    device types are a subset of its own (no other can use no more devices of every type), on
    TP groups per (type, size) (which fix the devices per type), bottleneck, fill, optimizer step
    and largest stage gradient, all <=.
    """
    if not cands:
        return []
    order = sorted(range(len(cands)), key=lambda i: (cands[i].partition.bottleneck_s, cands[i].partition.fill_s,
                                                     cands[i].num_devices, i))
    # kept candidates per (micro-batch size, device-type set): features over that set's TP keys, preallocated
    keys_of: dict[frozenset, set] = {}         # TP-group keys per device-type set, in one pass
    for c in cands:
        keys_of.setdefault(frozenset(c.devices), set()).update(c.tp_groups)
    groups: dict[tuple, list] = {}
    kept: list[Candidate] = []
    for i in order:
        c = cands[i]
        types = frozenset(c.devices)
        p = c.partition
        tail = (p.bottleneck_s, p.fill_s, p.optimizer_s, max(p.stage_param_bytes))
        dominated = False
        for r in range(1, len(types) + 1):
            for sub in itertools.combinations(sorted(types), r):
                grp = groups.get((c.micro_batch_size, frozenset(sub)))
                if grp is None or grp[1] == 0:
                    continue
                arr, n, keys = grp
                f = np.array([c.tp_groups.get(k, 0) for k in keys] + list(tail))
                if np.any(np.all(arr[:n] <= f, axis=1)):
                    dominated = True
                    break
            if dominated:
                break
        if dominated:
            continue
        gkey = (c.micro_batch_size, types)
        grp = groups.get(gkey)
        if grp is None:
            keys = sorted(keys_of[types])
            grp = groups[gkey] = [np.empty((len(cands), len(keys) + 4)), 0, keys]
        arr, n, keys = grp
        arr[n] = [c.tp_groups.get(k, 0) for k in keys] + list(tail)
        grp[1] = n + 1
        kept.append(c)
    return kept
