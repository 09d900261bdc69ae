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

import numpy as np
from dataclasses import dataclass
from typing import Iterator

from hpp.errors import HppInputError
from hpp.formulation.stage_balance import Partition, StageBalancer, StageKind
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.pruning.rules import PruningOptions

__all__ = ["SearchSpace", "Candidate", "stage_kinds", "enumerate_shapes", "build_candidates",
           "remove_dominated", "tp_capacity", "common_micro_batch_sizes"]

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


def build_candidates(cluster: Cluster, profile: ModelProfile, balancer: StageBalancer, space: SearchSpace,
                     pruning: PruningOptions) -> tuple[list[Candidate], dict[str, int]]:
    """Stage-balance every shape of the space at every common measured micro-batch size.

    Each (shape, micro-batch size) gives its least-bottleneck partition and, when different,
    its least-fill partition (the better one for pipelines with few micro-batches).

    Returns
    -------
    (candidates, stats)
        Feasible candidates (dominated ones removed if the rule is on) and counters:
        shapes, shapes_pruned_memory, infeasible, dominated.
    """
    kinds = stage_kinds(cluster, profile, space)
    stats = {"shapes": 0, "shapes_pruned_memory": 0, "balanced": 0, "infeasible": 0, "dominated": 0,
             "fill_variants": 0}
    out: list[Candidate] = []
    dead: set = set()
    for shape in enumerate_shapes(cluster, kinds, space, pruning, profile.num_layers):
        stats["shapes"] += 1
        for b in common_micro_batch_sizes(profile, shape, space):
            if pruning.memory_infeasible and dead:
                # every suffix whose row is empty kills all shapes ending with it
                if any((b, shape[i:]) in dead for i in range(1, len(shape))):
                    stats["shapes_pruned_memory"] += 1
                    continue
            stats["balanced"] += 1
            part, few = balancer.balance_both(shape, b)
            if part is None:
                stats["infeasible"] += 1
                if pruning.memory_infeasible and balancer.suffix_infeasible(shape, b):
                    dead.add((b, shape))
                continue
            devices: dict[str, int] = {}
            groups: dict[tuple[str, int], int] = {}
            for k in shape:
                devices[k.device_type] = devices.get(k.device_type, 0) + k.tp_degree
                groups[(k.device_type, k.tp_degree)] = groups.get((k.device_type, k.tp_degree), 0) + 1
            out.append(Candidate(shape, b, part, devices, groups))
            # the least-fill partition is better when a pipeline gets few micro-batches
            if few is not None:
                out.append(Candidate(shape, b, few, devices, groups))
                stats["fill_variants"] += 1
    if pruning.dominated:
        before = len(out)
        out = remove_dominated(out)
        stats["dominated"] = before - len(out)
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
