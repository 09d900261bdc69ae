"""Memoised stage costs: prefix sums and dense (L+1, L+1) cost tables, cached per profile.

For one (device type, TP degree, micro-batch size) a :class:`StageCostTable` holds,
for every layer range [u, v) (``u < v``), the stage's per-micro-batch compute
seconds and its memory parts, computed once from prefix sums so that any stage cost
is an O(1) lookup (alpa's stage construction uses the same trick). The formulas are
those of :mod:`hpp.formulation.cost_model` (``tests/test_cost_model.py`` checks equality
with :func:`~hpp.formulation.cost_model.stage_time_s` and
:func:`~hpp.formulation.cost_model.stage_memory_bytes` for every range, in-flight count
and recomputation mode, with the table's link on both sides of the stage).

:class:`StageCostCache` (built for a cluster by :meth:`StageCostCache.for_cluster`) is scoped to
one profile, one cost-model config and one pipeline link, or the link options per pair of
adjacent stage kinds (version-2 clusters, :func:`hpp.formulation.collectives.p2p_link_options`);
it counts hits and misses (``cache_info()``) for the experiments.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable

import numpy as np

from hpp.formulation.collectives import p2p_link_options, pipeline_link
from hpp.formulation.cost_config import OPTIMIZER_STATES, CostModelConfig
from hpp.formulation.collectives import p2p_transfer_s, p2p_waits_per_transfer
from hpp.formulation.cost_model import stage_fixed_s
from hpp.formulation.step_memory import StepMemoryTables, step_memory_peak, step_memory_tables
from hpp.profiles.cluster import Cluster, Link
from hpp.profiles.model_profile import LayerProfile, ModelProfile

__all__ = ["StageCostTable", "StageCostCache", "build_stage_cost_table", "table_on_links", "times_on_links",
           "p2p_on_links", "stacked_costs_on_links"]


@dataclass(frozen=True)
class StageCostTable:
    """Dense stage-cost tables of one (device type, TP, micro-batch size); entries with u >= v are inf.

    Attributes (all numpy arrays)
    ----------
    compute_none_s, compute_full_s : (L+1, L+1)
        Stage time D = F + B + P per micro-batch of layers [u, v) without / with full
        recomputation [s]; P = k (c(out[u-1]) + c(out[v-1])) are the point-to-point waits over
        the table's link (no c_in at u = 0, no c_out at v = L; ``stage_time_s``).
    weights_bytes : (L+1, L+1)
        state factor x parameter bytes of [u, v) [bytes].
    act_none_bytes, act_full_bytes : (L+1, L+1)
        Activation bytes kept per in-flight micro-batch without / with full recomputation.
    work_none_bytes, work_full_bytes : (L+1, L+1)
        Working set without / with full recomputation: w x the largest layer's activations
        (backward workspace), plus that layer's activations while recomputing [bytes].
    buffer_bytes : (L+1, L+1)
        Point-to-point buffers: 2 x input of layer u (if u > 0) + 2 x output of layer v-1 (if v < L).
    p2p_s : (L+1,)
        One-way transfer time of the output of layer v-1 to the next stage over the pipeline link [s]
        (0 at v = L).
    optimizer_s : (L+1, L+1)
        Optimizer step of layers [u, v) [s].
    param_bytes : (L+1, L+1)
        Parameter bytes of [u, v) per device (for the gradient all-reduce).
    capacity_bytes : int
        Device capacity minus the config's reserve [bytes].
    estimated : bool
    framework_bytes : int
        The framework's own memory on this device type [bytes] (``CostModelConfig.framework_bytes``).
    """

    compute_none_s: np.ndarray
    compute_full_s: np.ndarray
    weights_bytes: np.ndarray
    act_none_bytes: np.ndarray
    act_full_bytes: np.ndarray
    work_none_bytes: np.ndarray
    work_full_bytes: np.ndarray
    buffer_bytes: np.ndarray
    p2p_s: np.ndarray
    optimizer_s: np.ndarray
    param_bytes: np.ndarray
    capacity_bytes: int
    estimated: bool
    framework_bytes: int = 0
    step: StepMemoryTables | None = None
    max_micro_batches: int = 1
    _mem_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def layer_param_bytes(self) -> tuple[float, ...]:
        """(L,) parameter bytes of each single layer [bytes] (the diagonal above the main one; cached)."""
        got = self._mem_cache.get("layer_params")
        if got is None:
            got = self._mem_cache["layer_params"] = tuple(np.diagonal(self.param_bytes, offset=1).tolist())
        return got

    def memory_bytes(self, in_flight: int, recompute: bool) -> np.ndarray:
        """(L+1, L+1) peak memory of a stage holding ``in_flight`` micro-batches [bytes]."""
        key = (in_flight, recompute)
        m = self._mem_cache.get(key)
        if m is None and self.step is not None:
            # the runtime step's terms (profiles measured by hpp profile): the pipelining library keeps one
            # receive buffer per micro-batch, so the stage is priced at the most micro-batches a pipeline of
            # this micro-batch size can have (ceil(G / b)): an upper bound, so a range that fits here fits
            # in every plan (estimate_plan prices the plan's own count)
            m = step_memory_peak(self.step, in_flight=in_flight,
                                 num_micro_batches=max(self.max_micro_batches, in_flight), recompute=recompute)
            self._mem_cache[key] = m
        if m is None:
            if recompute:
                m = self.weights_bytes + in_flight * self.act_full_bytes + self.work_full_bytes + self.buffer_bytes
            else:
                m = self.weights_bytes + in_flight * self.act_none_bytes + self.work_none_bytes + self.buffer_bytes
            m = m + self.framework_bytes
            self._mem_cache[key] = m
        return m


def _range_sum(values: np.ndarray) -> np.ndarray:
    prefix = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    out = prefix[None, :] - prefix[:, None]
    return out


def build_stage_cost_table(e: LayerProfile, *, capacity_bytes: int, link: Link,
                           config: CostModelConfig = CostModelConfig(),
                           global_batch_size: int | None = None) -> StageCostTable:
    """Build the dense tables of one profile entry (see :class:`StageCostTable`).

    For an entry with the runtime step's memory terms (``e.has_step_memory``) the memory
    tables are :func:`hpp.formulation.step_memory.step_memory_tables`, priced at
    ``ceil(global_batch_size / b)`` micro-batches (``None``: at the in-flight count only,
    a lower bound); with its time terms (``e.step_time``) the stage times include the
    loss and the schedule's fixed time per micro-batch (``cost_model.stage_fixed_s``) and
    the runtime's transfer waits (``cost_model.p2p_transfer_s`` / ``p2p_waits_per_transfer``),
    as :func:`hpp.formulation.cost_model.stage_time_s` prices them.
    """
    L = e.num_layers
    upper = np.triu(np.ones((L + 1, L + 1), dtype=bool), k=1)  # u < v
    inf = np.inf
    fwd = np.asarray(e.forward_s, dtype=np.float64)
    bwd = np.asarray(e.backward_s, dtype=np.float64)
    F = _range_sum(fwd)
    B = _range_sum(bwd)
    act = np.asarray(e.activation_bytes, dtype=np.float64)
    out = np.asarray(e.output_bytes, dtype=np.float64)
    inputs = np.concatenate([[0.0], out[:-1]])           # input of layer l = output of l-1
    largest = np.full((L + 1, L + 1), 0.0)               # largest layer activation of [u, v)
    for u in range(L):
        largest[u, u + 1:] = np.maximum.accumulate(act[u:])
    w = config.backward_workspace_layers
    buf = np.zeros((L + 1, L + 1))
    buf += (2.0 * np.concatenate([[0.0], out]))[:, None] * (np.arange(L + 1) > 0)[:, None]   # 2 x out[u-1]
    send = 2.0 * np.concatenate([[0.0], out])                                                   # index v -> out[v-1]
    send[L] = 0.0
    buf += send[None, :]
    p2p = _p2p_s(e, (link,), out)
    wait = p2p_waits_per_transfer(e, config) * (p2p[:, None] + p2p[None, :])  # c_in = p2p[u], c_out = p2p[v]
    fixed = 0.0
    if e.step_time is not None:          # loss + the schedule's fixed time per micro-batch (runtime time terms)
        fixed = np.array([[stage_fixed_s(e, u, v) if u < v else 0.0 for v in range(L + 1)] for u in range(L + 1)])
    step = None
    if e.has_step_memory:
        step = step_memory_tables(e, optimizer_states=OPTIMIZER_STATES[config.optimizer],
                                  optimizer_transient_params=config.optimizer_transient_params,
                                  framework_bytes=config.framework_bytes_of(e.device_type))

    def masked(x: np.ndarray) -> np.ndarray:
        return np.where(upper, x, inf)

    FB, FB2 = F + B, 2.0 * F + B
    table = StageCostTable(
        compute_none_s=masked(FB + wait + fixed), compute_full_s=masked(FB2 + wait + fixed),
        weights_bytes=masked(config.state_bytes_per_param_byte * _range_sum(np.asarray(e.param_bytes, float))),
        act_none_bytes=masked(_range_sum(act)), act_full_bytes=masked(_range_sum(inputs)),
        work_none_bytes=masked(np.floor(w * largest)), work_full_bytes=masked(largest + np.floor(w * largest)),
        buffer_bytes=masked(buf), p2p_s=p2p,
        optimizer_s=masked(_range_sum(np.asarray(e.optimizer_s, float))),
        param_bytes=masked(_range_sum(np.asarray(e.param_bytes, float))),
        capacity_bytes=config.usable_memory_bytes(capacity_bytes), estimated=e.estimated,
        framework_bytes=config.framework_bytes_of(e.device_type), step=step,
        max_micro_batches=-(-global_batch_size // e.micro_batch_size) if global_batch_size else 1)
    table._mem_cache["link_parts"] = (e, FB, FB2, fixed, upper, out)
    return table


def _p2p_s(e: LayerProfile, links: tuple[Link, ...], out: np.ndarray, memo: dict | None = None) -> np.ndarray:
    """(L+1,) one-way transfer of the output of layer v-1 on the fastest of ``links`` [s] (0 at v = 0 and L).

    ``memo``: {links: {bytes: seconds}} shared by the entries of one cache (without the runtime step's
    time terms a transfer depends on the links and the bytes only, and most layers send equal bytes)."""
    L = len(out)
    if memo is not None and e.step_time is None:
        per = memo.get(links)
        if per is None:
            per = memo[links] = {}
        vals = [0.0] * (L + 1)
        for v, x in enumerate(out[:-1].tolist(), start=1):
            c = per.get(x)
            if c is None:
                c = per[x] = min(link.transfer_s(x) for link in links)   # = p2p_transfer_s without step time
            vals[v] = c
        return np.array(vals)
    if len(links) == 1:
        return np.array([p2p_transfer_s(e, links[0], out[v - 1]) if 0 < v < L else 0.0 for v in range(L + 1)])
    return np.array([min(p2p_transfer_s(e, l, out[v - 1]) for l in links) if 0 < v < L else 0.0
                     for v in range(L + 1)])


def table_on_links(base: StageCostTable, link_in: tuple[Link, ...], link_out: tuple[Link, ...], *,
                   config: CostModelConfig = CostModelConfig(), transfer_memo: dict | None = None) -> StageCostTable:
    """``base`` with its stage times and transfers priced on other links (links per pair of stages).

    ``link_in``: the options for the transfer into the stage (from the previous stage), ``link_out``: into
    the next; each transfer costs the fastest option for its size. The memory tables are shared with ``base``.
    """
    none, full, p_out = times_on_links(base, link_in, link_out, config=config, transfer_memo=transfer_memo)
    return replace(base, compute_none_s=none, compute_full_s=full, p2p_s=p_out, _mem_cache=base._mem_cache)


def times_on_links(base: StageCostTable, link_in: tuple[Link, ...], link_out: tuple[Link, ...], *,
                   config: CostModelConfig = CostModelConfig(), transfer_memo: dict | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(compute_none_s, compute_full_s, p2p_s)`` of :func:`table_on_links` (the same arrays, bit for bit),
    without building the table: all that the links change. ``transfer_memo``: see ``_p2p_s``."""
    e, FB, FB2, fixed, upper, out = base._mem_cache["link_parts"]
    p_in, p_out = p2p_on_links(base, link_in, transfer_memo), p2p_on_links(base, link_out, transfer_memo)
    wait = p2p_waits_per_transfer(e, config) * (p_in[:, None] + p_out[None, :])
    return np.where(upper, FB + wait + fixed, np.inf), np.where(upper, FB2 + wait + fixed, np.inf), p_out


def p2p_on_links(base: StageCostTable, links: tuple[Link, ...], transfer_memo: dict | None = None) -> np.ndarray:
    """(L+1,) the ``p2p_s`` of ``base``'s stage on the fastest of ``links`` [s] (kept per links with ``base``)."""
    p2p = base._mem_cache.setdefault("p2p_by_links", {})        # per link options: shared by all variants
    got = p2p.get(links)
    if got is None:
        e, out = base._mem_cache["link_parts"][0], base._mem_cache["link_parts"][5]
        got = p2p[links] = _p2p_s(e, links, out, transfer_memo)
    return got


def stacked_costs_on_links(bases: list[StageCostTable], which: np.ndarray, p_in: np.ndarray, p_out: np.ndarray,
                           time_of: np.ndarray, fits: np.ndarray, use_full: np.ndarray | None, mask_of: np.ndarray,
                           *, config: CostModelConfig = CostModelConfig(), rows: int = 32) -> np.ndarray:
    """(M, L+1, L+1) DP stage costs: cost i has the times t = ``time_of[i]`` (:func:`times_on_links` of
    ``bases[which[t]]`` on transfers ``p_in[t]`` / ``p_out[t]``, :func:`p2p_on_links`; the same operations, so
    the same values bit for bit): ``compute_full_s`` where ``use_full[mask_of[i]]``, else ``compute_none_s`` where
    ``fits[mask_of[i]]`` (masks limited to u < v), else inf; gathered ``rows`` costs at a time (small temporaries)."""
    parts = [b._mem_cache["link_parts"] for b in bases]
    FB, FB2 = np.stack([p[1] for p in parts]), np.stack([p[2] for p in parts])
    k = np.array([p2p_waits_per_transfer(p[0], config) for p in parts])[which]
    none = p_in[:, :, None] + p_out[:, None, :]
    none *= k[:, None, None]                                  # the waits k (c_in + c_out) ...
    full = np.take(FB2, which, axis=0) + none if use_full is not None else None
    none += np.take(FB, which, axis=0)                        # ... plus F + B (x + y == y + x)
    if any(not (np.ndim(p[3]) == 0 and p[3] == 0.0) for p in parts):      # else + 0.0: no change for x >= 0
        fixed = np.stack([np.broadcast_to(np.asarray(p[3], dtype=np.float64), FB.shape[1:]) for p in parts])[which]
        none += fixed
        if full is not None:
            full += fixed
    M = len(time_of)
    C = np.empty((M, *FB.shape[1:]))
    tmp = np.empty((min(rows, M), *FB.shape[1:]))
    for lo in range(0, M, rows):
        hi = min(M, lo + rows)
        t, m, out = time_of[lo:hi], mask_of[lo:hi], C[lo:hi]
        np.take(none, t, axis=0, out=out)
        np.copyto(out, np.inf, where=~fits[m])
        if full is not None:
            use = use_full[m]
            if use.any():
                np.copyto(out, np.take(full, t, axis=0, out=tmp[:hi - lo]), where=use)
    return C


@dataclass
class StageCostCache:
    """Stage-cost tables keyed by (device_type, tp_degree, micro_batch_size), scoped to one profile.

    Parameters
    ----------
    profile : ModelProfile
    capacities : dict[str, int]
        Memory capacity per device type [bytes], as the cluster gives it: each table subtracts the
        headroom and reserve (:meth:`CostModelConfig.usable_memory_bytes`, the one definition of
        "capacity minus reserve", also the one :func:`~hpp.formulation.cost_model.estimate_plan` uses).
    link : Link
        Link assumed between consecutive stages when ``pair_links`` is None (version-1 clusters:
        the planner's inter-node link).
    config : CostModelConfig
    enabled : bool
        False = recompute tables on every request (ablation of the memoisation).
    global_batch_size : int or None
        Bounds the micro-batches of any pipeline (``ceil(G / b)``), for profiles with the
        runtime step's memory terms (see :func:`build_stage_cost_table`).
    pair_links : callable or None
        ``pair_links((type_a, tp_a), (type_b, tp_b), run=r) -> tuple of Link``: the link options between a
        stage of kind a and the next, of kind b (:func:`hpp.formulation.collectives.p2p_link_options`);
        None: ``(link,)`` everywhere.
    """

    profile: ModelProfile
    capacities: dict[str, int]
    link: Link
    config: CostModelConfig = CostModelConfig()
    enabled: bool = True
    global_batch_size: int | None = None
    pair_links: Callable[..., tuple[Link, ...]] | None = None
    hits: int = 0
    misses: int = 0
    _tables: dict = field(default_factory=dict, repr=False)
    _links: dict = field(default_factory=dict, repr=False)
    _transfers: dict = field(default_factory=dict, repr=False)

    @classmethod
    def for_cluster(cls, cluster: Cluster, profile: ModelProfile, config: CostModelConfig = CostModelConfig(), *,
                    enabled: bool = True, global_batch_size: int | None = None,
                    per_pair: bool = True) -> "StageCostCache":
        """The cache for planning on ``cluster``: its device capacities, its pipeline link
        (:func:`~hpp.formulation.collectives.pipeline_link`, as ``link``) and, with ``per_pair`` on a
        cluster with per-pair links (version 2), the link options per pair of adjacent stage kinds
        (:func:`~hpp.formulation.collectives.p2p_link_options`); ``per_pair=False``: the one link
        everywhere (the reference planners). ``enabled``, ``global_batch_size``: as the fields.
        """
        caps = {t: d.memory_bytes for t, d in cluster.device_types.items()}
        pair_links = partial(p2p_link_options, cluster) if per_pair and cluster.per_pair else None
        return cls(profile, caps, pipeline_link(cluster), config, enabled=enabled,
                   global_batch_size=global_batch_size, pair_links=pair_links)

    def links(self, kind_a: tuple[str, int], kind_b: tuple[str, int], run: int | None = None) -> tuple[Link, ...]:
        """The link options from a stage of kind a to the next, of kind b, ``run`` stages before the end of a
        run of equal kinds (``(link,)`` without ``pair_links``; see ``collectives.p2p_link_options``)."""
        if self.pair_links is None:
            return (self.link,)
        key = (kind_a, kind_b, run)
        got = self._links.get(key)
        if got is None:
            got = self._links[key] = tuple(self.pair_links(kind_a, kind_b, run=run))
        return got

    def table(self, device_type: str, tp_degree: int, micro_batch_size: int,
              link_in: tuple[Link, ...] | None = None, link_out: tuple[Link, ...] | None = None) -> StageCostTable:
        """The (memoised) table, its times priced on ``link_in`` / ``link_out`` (None: ``(link,)``).

        Raises HppInputError if the profile lacks the entry.
        """
        key = (device_type, tp_degree, micro_batch_size)
        if self.enabled and key in self._tables:
            self.hits += 1
            t = self._tables[key]
        else:
            self.misses += 1
            e = self.profile.layer_profile(device_type, tp_degree, micro_batch_size, estimate=False)
            t = build_stage_cost_table(e, capacity_bytes=self.capacities[device_type], link=self.link,
                                       config=self.config, global_batch_size=self.global_batch_size)
            if self.enabled:
                self._tables[key] = t
        default = (self.link,)
        link_in, link_out = link_in or default, link_out or default
        if link_in == default and link_out == default:
            return t
        vkey = (key, link_in, link_out)
        got = self._tables.get(vkey) if self.enabled else None
        if got is None:
            got = table_on_links(t, link_in, link_out, config=self.config,
                                 transfer_memo=self._transfers if self.enabled else None)
            if self.enabled:
                self._tables[vkey] = got
        return got

    def times(self, device_type: str, tp_degree: int, micro_batch_size: int,
              link_in: tuple[Link, ...] | None = None, link_out: tuple[Link, ...] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(compute_none_s, compute_full_s, p2p_s)`` of :meth:`table` with the same arguments (the same
        values), without building (or keeping) a table per link options: the batched search prices a stage
        from these and reads everything else from the links' common table (not memoised here; the
        :class:`~hpp.formulation.stage_balance.StageBalancer` keeps them per link options id)."""
        base = self.table(device_type, tp_degree, micro_batch_size)
        default = (self.link,)
        link_in, link_out = link_in or default, link_out or default
        if link_in == default and link_out == default:
            return base.compute_none_s, base.compute_full_s, base.p2p_s
        got = self._tables.get(((device_type, tp_degree, micro_batch_size), link_in, link_out)) if self.enabled \
            else None
        if got is not None:
            return got.compute_none_s, got.compute_full_s, got.p2p_s
        return times_on_links(base, link_in, link_out, config=self.config,
                              transfer_memo=self._transfers if self.enabled else None)

    def p2p(self, device_type: str, tp_degree: int, micro_batch_size: int,
            links: tuple[Link, ...] | None = None) -> np.ndarray:
        """(L+1,) ``p2p_s`` of :meth:`table` with ``link_out=links`` (the same values)."""
        base = self.table(device_type, tp_degree, micro_batch_size)
        if links is None or links == (self.link,):
            return base.p2p_s
        return p2p_on_links(base, links, self._transfers if self.enabled else None)

    def cache_info(self) -> dict[str, float]:
        """Hits, misses and hit rate of the table cache."""
        total = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hits / total if total else 0.0}
