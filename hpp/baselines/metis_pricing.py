"""Pricing of Metis configurations on HPP's cost model (helper of :mod:`hpp.baselines.metis`).

Costing is HPP's cost model, not Metis's estimator. Stage s holds layers [u, v) on dp_s replicas of
tp_s devices, each running micro-batches of b_s samples: its time per micro-batch is the stage-cost
table entry (:class:`~hpp.formulation.stage_costs.StageCostTable`) of (GPU type, tp_s, b_s), its memory the
table's with min(m, S - s) micro-batches in flight (1F1B). A group that straddles two GPU types
runs at its slowest type's speed and must fit every type's memory (an even data split inside the
stage; Metis splits by speed). Iteration time = 1F1B over m micro-batches
(:func:`~hpp.formulation.cost_model.pipeline_time_1f1b_s`) + the slowest stage's ring all-reduce of
its gradient among its dp_s replicas + the slowest optimizer step. With dp_s = d on every stage and
one GPU type per stage this equals :func:`~hpp.formulation.composition.objective.composition_objective_s` of d
copies of the pipeline (tested).

Layer partition: Metis assigns layers in proportion to stage speed and then moves layers off stages
that run out of memory (up to 3 attempts). Here: the least-bottleneck partition with the least fill
(the stage-balance objective of :mod:`hpp.formulation.stage_balance`) by a DP over the stage-cost
tables, first ignoring memory (Metis's first attempt) and, if that does not fit, within memory
(its repartitions). Every partition is computed anew (no DP memo; the stage-cost tables are built
once per (type, TP, micro-batch size), as Metis loads its profiles once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hpp.formulation.space_limits import SearchSpace, stage_kinds
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.collectives import ring_allreduce_s
from hpp.formulation.stage_balance import least_fill_within
from hpp.formulation.stage_costs import StageCostCache
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile

__all__ = ["MetisPricer", "price_metis_config"]


@dataclass
class MetisPricer:
    """Stage tables and the layer-partition DP of one (cluster, profile).

    The helper of :func:`~hpp.baselines.metis.metis_search`.

    ``max_tp`` / ``max_micro_batch_size`` None: Metis's caps derived from the profile (see
    :func:`~hpp.baselines.metis.metis_search`).
    """

    cluster: Cluster
    profile: ModelProfile
    space: SearchSpace
    config: CostModelConfig
    max_tp: int | None = None
    max_micro_batch_size: int | None = None
    tps: dict[str, set[int]] = field(init=False)
    cache: StageCostCache = field(init=False)
    link: object = field(init=False)
    _valid: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        kinds = stage_kinds(self.cluster, self.profile, self.space)
        self.tps = {t: {k.tp_degree for k in ks} for t, ks in kinds.items()}
        if self.max_tp is None:
            self.max_tp = min(max(tps) for tps in self.tps.values())
        if self.max_micro_batch_size is None:
            self.max_micro_batch_size = min(max(self.profile.micro_batch_sizes(t, tp))
                                            for t, tps in self.tps.items() for tp in tps if tp <= self.max_tp)
        self.cache = StageCostCache.for_cluster(self.cluster, self.profile, self.config, per_pair=False)
        self.link = self.cache.link

    def valid(self, types: tuple[str, ...], tp: int, b: int) -> bool:
        """A stage of ``types`` at TP ``tp`` and micro-batch ``b`` is allowed and profiled."""
        key = (types, tp, b)
        got = self._valid.get(key)
        if got is None:
            sizes = self.space.micro_batch_sizes
            got = self._valid[key] = (tp <= self.max_tp and b <= self.max_micro_batch_size
                                      and all(tp in self.tps[t] and b in self.profile.micro_batch_sizes(t, tp)
                                              for t in types) and (sizes is None or b in sizes))
        return got

    def stage(self, types: tuple[str, ...], tp: int, b: int, in_flight: int, memory: bool):
        """(C, use_full, p2p, tables): per-micro-batch time of [u, v) (inf where it does not fit if ``memory``)."""
        tabs = [self.cache.table(t, tp, b) for t in types]
        none = tabs[0].compute_none_s if len(tabs) == 1 else np.max([t.compute_none_s for t in tabs], axis=0)
        full = np.zeros(none.shape, dtype=bool)
        if not memory:
            C = none
        else:      # one mode for the whole stage: without recomputation if every type fits so, else full
            fits = np.logical_and.reduce([t.memory_bytes(in_flight, False) <= t.capacity_bytes for t in tabs])
            C = np.where(fits, none, np.inf)
            if self.space.allow_recompute:
                full = ~fits & np.logical_and.reduce([t.memory_bytes(in_flight, True) <= t.capacity_bytes
                                                      for t in tabs])
                C = np.where(full, np.max([t.compute_full_s for t in tabs], axis=0), C)
        p2p = tabs[0].p2p_s if len(tabs) == 1 else np.max([t.p2p_s for t in tabs], axis=0)
        return C, full, p2p, tabs

    def partition(self, stages: list) -> tuple[list[int], float, float] | None:
        """Least-bottleneck, then least-fill boundaries over the stages' (C, _, p2p, _); None if none fits.

        The fill pass is the stage balancer's (:func:`~hpp.formulation.stage_balance.least_fill_within`).
        """
        L = self.profile.num_layers
        f = np.full(L + 1, np.inf)
        f[L] = 0.0
        for C, _, _, _ in reversed(stages):
            f = np.maximum(C, f[None, :]).min(axis=1)
        tau = float(f[0])
        if not math.isfinite(tau):
            return None
        phi, ends = least_fill_within([(C, p2p) for C, _, p2p, _ in reversed(stages)], tau * (1 + 1e-12), L)
        bounds = [0]
        for v in ends:
            bounds.append(int(v[bounds[-1]]))
        return bounds, tau, phi


def price_metis_config(pricer: MetisPricer, strategies, m: int, bounds, stages
                       ) -> tuple[float, tuple[bool, ...], list[float]]:
    """(iteration time [s], recompute per stage, memory headroom per stage [bytes]) of a partitioned strategy.

    T_pipe = fill + (m - 1) tau, T_sync = max_s ring all-reduce of stage s's gradient among dp_s replicas
    over the pipeline link, T_opt = the slowest stage's optimizer step (see the module docstring).
    """
    S = len(stages)
    fill, tau, sync, opt, recompute, headroom = 0.0, 0.0, 0.0, 0.0, [], []
    for s, ((C, full, p2p, tabs), (dp, _)) in enumerate(zip(stages, strategies)):
        lo, hi = bounds[s], bounds[s + 1]
        d = float(C[lo, hi])
        tau = max(tau, d)
        fill += d + 2.0 * float(p2p[hi])
        rec = bool(full[lo, hi])
        recompute.append(rec)
        k = min(m, S - s)
        headroom.append(min(t.capacity_bytes - float(t.memory_bytes(k, rec)[lo, hi]) for t in tabs))
        sync = max(sync, ring_allreduce_s(float(tabs[0].param_bytes[lo, hi]), dp, pricer.link))
        opt = max(opt, max(float(t.optimizer_s[lo, hi]) for t in tabs))
    return fill + (m - 1) * tau + sync + opt, tuple(recompute), headroom

