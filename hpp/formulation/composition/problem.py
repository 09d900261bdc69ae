"""The composition problem: candidate pipelines, the device inventory and the global batch, with the
memoised quantities the solvers read (sync times, TP-group capacity, copy bounds).

The composition model (what the heuristics and the exhaustive oracle minimise; the objective
functions are in :mod:`hpp.formulation.composition.objective`) prices a multiset of candidate
copies as

    T = T_pipe + T_sync + T_opt
    T_pipe = least T with sum_c x_c * cap_c(T) >= G      (data balance, exact)
    T_sync = block-wise ring all-reduces of the used candidates' blocks (h = sum_c x_c), the
             slowest stage's sum
    T_opt  = max over used c of its slowest optimizer step

where ``ring`` is :func:`hpp.formulation.collectives.ring_allreduce_s` over ``sync_link`` (the
inter-node link; the intra-node link on a one-node cluster). On a per-pair (version 2) cluster
each ring is priced on its holders' links instead (:mod:`hpp.formulation.composition.sync_pricing`: the stage
type's own links, hierarchical when copies pack into nodes; the best class order for a block held
by several types); ``flat_sync=True`` keeps the one-link rule. The reported objective of a plan is
the cost model's (:func:`hpp.formulation.cost_model.estimate_plan` of the bound plan), which
prices the binding's actual links; the composition model is the search's approximation of it.

Bounds are computed on the *bound problem* (:meth:`CompositionProblem.bound_problem`): the same
candidates with lower-bound times (stage point-to-point at the cheapest link a binding could give,
:mod:`hpp.formulation.composition.bound_model`) and a gradient-sync floor
(:class:`~hpp.formulation.composition.sync_floor.SyncFloor`) that holds for any link model,
non-monotone bandwidth fits included. Any bound of the bound problem's model is a lower bound of
the cost model's iteration time of every plan of the candidates, under any binding.

The CP-SAT model is in :mod:`hpp.formulation.composition.cpsat`, the heuristics in
:mod:`hpp.formulation.composition.heuristics`, the LP bound in :mod:`hpp.formulation.composition.lp_bound`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np

from hpp.formulation.candidates import Candidate
from hpp.formulation.space_limits import tp_capacity
from hpp.formulation.collectives import ring_allreduce_np, ring_allreduce_s
from hpp.formulation.composition.sync_floor import SyncFloor
from hpp.formulation.composition.sync_pricing import holders_per_node, ring_table_s, type_links
from hpp.formulation.composition.sync_pricing import type_ring_s as _type_ring_s
from hpp.profiles.cluster import Cluster, Link

__all__ = ["US_PER_S", "CompositionProblem", "ProblemCaches", "to_us"]

US_PER_S = 1_000_000


def to_us(x_s: float, *, down: bool = False) -> int:
    """Seconds to integer microseconds: rounded up (the search model), or down (``down``: a bound model,
    whose every term must stay at most the true value)."""
    if down:
        return int(math.floor(x_s * US_PER_S))
    return int(math.ceil(x_s * US_PER_S - 1e-6))


@dataclass
class ProblemCaches:
    """The memos of one :class:`CompositionProblem` (plain dicts; values depend only on the keys).

    Shared by a problem and its :meth:`~CompositionProblem.restricted` copies (keys do not depend on
    candidate indices; the same cluster and sync link), which keeps the search's restrictions fast:

    solo
        solo objective per candidate object, keyed by ``id(candidate)``
        (:func:`~hpp.formulation.composition.heuristics.solo_objective_s`).
    ring
        sync times keyed by what they price: ring all-reduce by (bytes, holders) and by (stage bytes
        tuple, holders) (:meth:`~CompositionProblem.ring_s`, :meth:`~CompositionProblem.sync_s`),
        per-type rings (``("type", ...)``), block rings
        (:func:`~hpp.formulation.composition.sync_pricing.block_rings_s`), and the copy bound's
        stage sync-rate tables and the token naming their list of stage kinds
        (:mod:`hpp.formulation.composition.copy_bound`).

    Per problem (keyed by candidate index, so never shared with a restriction):

    sync
        :meth:`~CompositionProblem.sync_s` by (index, h), stage specs by ("spec", index), and per block
        (lo, hi) of a candidate the (type, holders per node) of its stage and its bytes, in a dict per candidate
        by ("hold", index), keyed by the block (lo, hi)
        (:func:`~hpp.formulation.composition.sync_pricing.block_rings_s`).
    tp
        TP groups the nodes hold by (device type, TP degree).
    copies
        :meth:`~CompositionProblem.max_copies` by index.
    rows
        :meth:`~CompositionProblem._copy_rows` by index.
    by_usage
        both by usage key (``("copies", key)``, ``("rows", key)``), and max_copies by candidate object (``id``):
        shared with restrictions (same inventory, the same candidate objects).
    """

    solo: dict = field(default_factory=dict)
    ring: dict = field(default_factory=dict)
    sync: dict = field(default_factory=dict)
    tp: dict = field(default_factory=dict)
    copies: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)
    by_usage: dict = field(default_factory=dict)

    def for_restriction(self) -> "ProblemCaches":
        """The caches of a restricted copy: ``solo``, ``ring`` and ``by_usage`` shared (the same dicts), the rest
        new."""
        return ProblemCaches(solo=self.solo, ring=self.ring, by_usage=self.by_usage)


_PER_COPY_MAX_VARS = 3000   # "auto": per-copy variables while sum of copy bounds stays below this


@dataclass
class CompositionProblem:
    """Candidates, inventory and global batch of one composition instance.

    ``sync_floor`` set: a *bound problem* (see the module docstring): :meth:`sync_s` and the sync
    tables give :class:`SyncFloor` values, and the solver models built on it round every time
    down. ``bound``: the bound problem of this one (:meth:`bound_problem`), ``estimator``: a
    function ``counts -> (plan, PlanEstimate)`` (the binding and the cost model, set by
    :func:`hpp.planner.make_problem`) that judges answers; without it answers are judged by
    :func:`~hpp.formulation.composition.objective.composition_objective_s`.
    """

    candidates: list[Candidate]
    cluster: Cluster
    global_batch_size: int
    sync_link: Link
    sync_floor: SyncFloor | None = None
    bound: "CompositionProblem | None" = field(default=None, repr=False)
    estimator: Callable[[dict], Any] | None = field(default=None, repr=False)
    #: the memos (see :class:`ProblemCaches`: which are shared with restrictions)
    caches: ProblemCaches = field(default_factory=ProblemCaches, repr=False)
    #: True: price every ring on ``sync_link`` (the version-1 rule) even on a per-pair cluster
    flat_sync: bool = False
    #: A bound problem's stronger per-candidate sync floors [s], (candidates, H) for h = 1 .. H pipelines, or None:
    #: where set, :meth:`sync_s` and the sync tables take the larger of them and the :class:`SyncFloor` (both are
    #: lower bounds; :func:`~hpp.formulation.composition.copy_bound_levels.floor_tables` computes them)
    floor_table: np.ndarray | None = field(default=None, repr=False)
    #: False: the search prices flat rings only, as the cost model with ``hierarchical_allreduce`` off
    hierarchical: bool = True
    crossed: np.ndarray | None = field(default=None, repr=False)   # a bound problem's bound_model.crossing_times

    @cached_property
    def per_type_sync(self) -> bool:
        """True when rings are priced on their holders' type links (:mod:`hpp.formulation.composition.sync_pricing`):
        a per-pair cluster, not a bound problem, ``flat_sync`` off."""
        return self.sync_floor is None and not self.flat_sync and bool(getattr(self.cluster, "per_pair", False))

    @cached_property
    def type_links(self) -> dict:
        """:func:`~hpp.formulation.composition.sync_pricing.type_links` of the cluster (computed once)."""
        return type_links(self.cluster, self.sync_link, hierarchical=self.hierarchical)

    def stage_sync_specs(self, c: int) -> list[tuple[str, int, float]]:
        """Per stage of candidate ``c``: (device type, holders per node g, gradient bytes) (memoised)."""
        key = ("spec", c)
        got = self.caches.sync.get(key)
        if got is None:
            cand = self.candidates[c]
            got = [(k.device_type, holders_per_node(self.type_links[k.device_type], cand.devices.get(k.device_type, 0)),
                    w) for k, w in zip(cand.shape, cand.partition.stage_param_bytes)]
            self.caches.sync[key] = got
        return got

    def type_ring_s(self, device_type: str, g: int, num_bytes: float, h: int) -> float:
        """:func:`~hpp.formulation.composition.sync_pricing.type_ring_s` on ``device_type``'s links (memoised)."""
        key = ("type", device_type, g, num_bytes, h)
        got = self.caches.ring.get(key)
        if got is None:
            got = self.caches.ring[key] = _type_ring_s(num_bytes, h, self.type_links[device_type], g)
        return got

    def bound_problem(self) -> "CompositionProblem":
        """The bound problem of this one (same candidate indices; see the module docstring), made once.

        :func:`hpp.planner.make_problem` sets it with the candidates' point-to-point lower bounds; a
        problem built directly (tests, instance files without profile) gets the same candidates, whose
        times are then taken as exact, with the :class:`SyncFloor` of its cluster.
        """
        if self.sync_floor is not None:
            return self
        if self.bound is None:
            self.bound = CompositionProblem(self.candidates, self.cluster, self.global_batch_size, self.sync_link,
                                            sync_floor=SyncFloor.of(self.cluster))
        return self.bound

    @cached_property
    def heuristic_indices(self) -> list[int]:
        """Indices of the candidates the search's heuristics use: those no heuristic pruning rule leaves out
        (:attr:`~hpp.formulation.candidates.Candidate.pruned_by`). The bounds and the exact solvers use every
        candidate."""
        return [i for i, c in enumerate(self.candidates) if not c.pruned_by]

    def restricted(self, keep: Sequence[int]) -> "CompositionProblem":
        """The problem restricted to candidates ``keep`` (indices; order kept), its bound problem likewise;
        the memo of solo objectives and ring times is shared."""
        sub = CompositionProblem([self.candidates[i] for i in keep], self.cluster, self.global_batch_size,
                                 self.sync_link, sync_floor=self.sync_floor, caches=self.caches.for_restriction(),
                                 flat_sync=self.flat_sync, hierarchical=self.hierarchical,
                                 crossed=None if self.crossed is None else self.crossed[list(keep)],
                                 floor_table=None if self.floor_table is None else self.floor_table[list(keep)])
        if self.sync_floor is None and self.bound is not None:
            sub.bound = self.bound.restricted(keep)
        if self.estimator is not None:
            est = self.estimator
            sub.estimator = lambda counts, _est=est, _keep=list(keep): _est({_keep[c]: x for c, x in counts.items()})
        return sub

    @cached_property
    def inventory(self) -> dict[str, int]:
        """Devices per type (computed once)."""
        return self.cluster.count_by_type()

    def tp_capacity(self, device_type: str, tp_degree: int) -> int:
        """TP groups of ``tp_degree`` devices of ``device_type`` the nodes hold (memoised)."""
        key = (device_type, tp_degree)
        got = self.caches.tp.get(key)
        if got is None:
            got = self.caches.tp[key] = tp_capacity(self.cluster, device_type, tp_degree)
        return got

    def sync_s(self, c: int, h: int) -> float:
        """Gradient sync of one copy of candidate ``c`` among ``h`` pipelines [s] (memoised).

        The slowest stage's ring all-reduce of its whole gradient (one bucket) among the h
        holders, :func:`~hpp.formulation.collectives.ring_allreduce_s` (bandwidth at the ring's
        chunk size, as in the cost model; the cost model splits a stage's gradient further
        into blocks).
        """
        key = (c, h)
        got = self.caches.sync.get(key)
        if got is None and self.sync_floor is not None:
            got = self.sync_floor.seconds(max(self.candidates[c].partition.stage_param_bytes, default=0.0), h)
            if self.floor_table is not None and 1 <= h <= self.floor_table.shape[1]:
                got = max(got, float(self.floor_table[c, h - 1]))
            self.caches.sync[key] = got
        if got is None and self.per_type_sync:
            got = self.caches.sync[key] = max((self.type_ring_s(t, g, w, h) for t, g, w in self.stage_sync_specs(c)),
                                              default=0.0)
        if got is None:
            stage_bytes = self.candidates[c].partition.stage_param_bytes
            got = self.caches.ring.get((stage_bytes, h))       # candidates share stage gradients
            if got is None:
                got = self.caches.ring[stage_bytes, h] = max(self.ring_s(w, h) for w in stage_bytes)
            self.caches.sync[key] = got
        return got

    def sync_s_all(self, h: int) -> list[float]:
        """``[sync_s(c, h) for every candidate c]`` [s], the same floats: :meth:`ring_s` once per distinct
        stage gradient size, then each candidate's largest (max is exact)."""
        if self.sync_floor is not None or self.per_type_sync:
            return [self.sync_s(c, h) for c in range(len(self.candidates))]
        owner, sizes = [], []
        for c, cand in enumerate(self.candidates):
            stage_bytes = cand.partition.stage_param_bytes
            owner.extend([c] * len(stage_bytes))
            sizes.extend(stage_bytes)
        if not sizes:
            return [0.0] * len(self.candidates)
        distinct, inverse = np.unique(np.array(sizes, dtype=np.float64), return_inverse=True)
        ring = np.array([self.ring_s(w, h) for w in distinct.tolist()])
        out = np.full(len(self.candidates), -np.inf)
        np.maximum.at(out, np.array(owner), ring[inverse.reshape(-1)])
        return out.tolist()

    def ring_s(self, num_bytes: float, h: int) -> float:
        """Ring all-reduce of ``num_bytes`` among ``h`` holders over the sync link [s] (memoised).

        :func:`~hpp.formulation.collectives.ring_allreduce_s`; candidates share stage gradients of the
        same size, so the memo answers most calls. (The memo also holds :meth:`sync_s` per tuple of
        stage bytes.)
        """
        key = (num_bytes, h)
        got = self.caches.ring.get(key)
        if got is None:
            got = self.caches.ring[key] = ring_allreduce_s(num_bytes, h, self.sync_link)
        return got

    def sync_table_us(self, c: int, max_pipelines: int) -> list[int]:
        """``[sync_s(c, h) in integer microseconds for h = 1 .. max_pipelines]`` (rounded up; down on a bound
        problem), vectorised."""
        return self.sync_tables_us([c], max_pipelines)[0]

    def sync_tables_us(self, cs: Sequence[int], max_pipelines: int) -> list[list[int]]:
        """:meth:`sync_table_us` of each candidate of ``cs``, vectorised over all their stages at once."""
        if self.sync_floor is not None:        # a bound problem: floors (linear in W), rounded down
            per_byte = np.array([self.sync_floor.seconds(1.0, hh) for hh in range(1, max_pipelines + 1)])
            w = np.array([max(self.candidates[c].partition.stage_param_bytes, default=0.0) for c in cs], dtype=float)
            floor = w[:, None] * per_byte[None, :]
            if self.floor_table is not None:   # the stronger per-candidate floors where given
                H = min(max_pipelines, self.floor_table.shape[1])
                floor[:, :H] = np.maximum(floor[:, :H], self.floor_table[list(cs), :H])
            return np.floor(floor * US_PER_S).astype(np.int64).tolist()
        if self.per_type_sync:                 # per stage on its type's links, grouped by (type, g)
            worst = np.zeros((len(cs), max_pipelines))
            groups: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
            for i, c in enumerate(cs):
                for t, g, w in self.stage_sync_specs(c):
                    if w > 0:
                        rows = groups.setdefault((t, g), ([], []))
                        rows[0].append(i)
                        rows[1].append(w)
            for (t, g), (owner, ws) in groups.items():
                np.maximum.at(worst, np.array(owner), ring_table_s(np.array(ws), max_pipelines, self.type_links[t], g))
            return np.ceil(worst * US_PER_S - 1e-6).astype(np.int64).tolist()
        h = np.arange(1, max_pipelines + 1, dtype=np.float64)
        owner, stage_bytes = [], []           # one row per stage with a gradient
        for i, c in enumerate(cs):
            for w in self.candidates[c].partition.stage_param_bytes:
                if w > 0:
                    owner.append(i)
                    stage_bytes.append(w)
        worst = np.zeros((len(cs), len(h)))
        if stage_bytes:
            t = ring_allreduce_np(np.array(stage_bytes, dtype=np.float64)[:, None], h, self.sync_link)
            owner = np.array(owner)
            first = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])   # each owner's first row
            worst[owner[first]] = np.maximum(0.0, np.maximum.reduceat(t, first, axis=0))
        us = np.ceil(worst * US_PER_S - 1e-6)
        if not np.isfinite(us).all():
            return [[int(v) for v in row] for row in us]     # int() raises on them, as it did
        return us.astype(np.int64).tolist()

    def max_copies(self, c: int) -> int:
        """Most copies of candidate ``c`` the inventory and the nodes' TP-group capacity hold alone (memoised)."""
        ub = self.caches.copies.get(c)
        if ub is None:
            cand = self.candidates[c]
            ub = self.caches.by_usage.get(id(cand))           # the same candidate in a restriction
            if ub is not None:
                self.caches.copies[c] = ub
                return ub
            usage = _usage_key(cand)
            ub = self.caches.by_usage.get(("copies", usage))    # candidates of the same counts share it
            if ub is None:
                inv = self.inventory
                ub = min(inv.get(t, 0) // n for t, n in cand.devices.items())
                for (t, s), n in cand.tp_groups.items():
                    ub = min(ub, self.tp_capacity(t, s) // n)
                self.caches.by_usage[("copies", usage)] = ub
            self.caches.copies[c] = self.caches.by_usage[id(cand)] = ub
        return ub

    def fits(self, counts: dict[int, int]) -> bool:
        """True if ``counts`` copies fit the device inventory and the nodes' TP-group capacity."""
        inv = self.inventory
        used: dict[str, int] = {}
        for c, x in counts.items():
            for t, n in self.candidates[c].devices.items():
                used[t] = used.get(t, 0) + x * n
        if any(used[t] > inv.get(t, 0) for t in used):
            return False
        for t in used:
            for s in sorted({k[1] for c in counts for k in self.candidates[c].tp_groups if k[0] == t and k[1] > 1}):
                need = sum(x * n * k[1] for c, x in counts.items() for k, n in self.candidates[c].tp_groups.items()
                           if k[0] == t and k[1] >= s)
                if need > self.tp_capacity(t, s) * s:
                    return False
        return True

    def _copy_rows(self, c: int) -> tuple[tuple, dict, frozenset] | None:
        """What one copy of candidate ``c`` adds to the rows :meth:`fits` checks (memoised).

        ``(devices, groups, sizes)``: ``devices`` the (type, devices) pairs; ``groups`` maps each
        (type, TP size > 1) row it adds to, to its devices in groups of that size or larger; ``sizes``
        the rows of the group sizes it has (the TP rows fits checks once it is used). None when the
        copy does not fit this bookkeeping (a TP group of a type it has no devices of, a count that is
        not positive, or no device at all); the callers then use :meth:`fits`.
        """
        if c in self.caches.rows:
            return self.caches.rows[c]
        cand = self.candidates[c]
        usage = _usage_key(cand)
        key = ("rows", usage)
        if key not in self.caches.by_usage:    # candidates of the same device and TP-group counts share rows
            self.caches.by_usage[key] = _usage_rows(cand)
        rows = self.caches.rows[c] = self.caches.by_usage[key]
        return rows


def _usage_key(cand: Candidate) -> tuple[tuple, tuple]:
    """(devices, TP groups) of one copy as a hashable key: candidates with equal keys fit alike."""
    return tuple(cand.devices.items()), tuple(cand.tp_groups.items())


def _usage_rows(cand: Candidate) -> tuple[tuple, dict, frozenset] | None:
    """:meth:`CompositionProblem._copy_rows` of a candidate (computed)."""
    groups = cand.tp_groups
    if not (cand.devices and all(n > 0 for n in cand.devices.values()) and all(n > 0 for n in groups.values())
            and all(t in cand.devices for t, _ in groups)):
        return None
    largest: dict[str, int] = {}
    for t, s in groups:
        largest[t] = max(largest.get(t, 0), s)
    coefs = {(t, s): sum(n * g[1] for g, n in groups.items() if g[0] == t and g[1] >= s)
             for t, top in largest.items() for s in range(2, top + 1)}
    return tuple(cand.devices.items()), coefs, frozenset(g for g in groups if g[1] > 1)
