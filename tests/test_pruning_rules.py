"""The named pruning rules of :mod:`hpp.pruning.rules` and the one ``StageCostCache.for_cluster`` constructor."""

from __future__ import annotations

import numpy as np
import pytest

from hpp.formulation.candidates import Candidate, remove_dominated
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.collectives import p2p_link_options, pipeline_link
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.stage_balance import StageBalancer, StageKind
from hpp.formulation.stage_costs import StageCostCache
from hpp.planner import make_problem
from hpp.profiles.bundled import load_bundled_profile
from hpp.pruning.rules import (DominanceKeys, PruningOptions, copy_order_pairs, dominance_order, dominates,
                               ends_with_dead_suffix, exceeds_incumbent, holds_no_layers, type_group_orders,
                               undominated_mask)
from hpp.scenarios import get_scenario


def test_holds_no_layers_on_one_row_and_on_rows():
    inf = np.inf
    assert holds_no_layers(np.array([inf, inf, inf])) is True
    assert holds_no_layers(np.array([inf, 1.0, 0.0])) is False
    rows = np.array([[inf, inf], [2.0, inf], [inf, inf]])
    assert holds_no_layers(rows).tolist() == [True, False, True]


def test_ends_with_dead_suffix_looks_at_proper_suffixes_of_the_same_size_only():
    a, b = StageKind("A100", 1), StageKind("V100", 1)
    dead = {(4, (b,))}
    assert ends_with_dead_suffix(dead, 4, (a, b))
    assert not ends_with_dead_suffix(dead, 2, (a, b))         # another micro-batch size
    assert not ends_with_dead_suffix(dead, 4, (b,))           # the suffix itself is not a proper suffix
    assert not ends_with_dead_suffix(dead, 4, (b, a))


def test_type_orders_canonical_is_largest_memory_first():
    mem = {"A100": 80, "V100": 32, "T4": 16}.__getitem__
    assert type_group_orders(("T4", "A100", "V100"), mem, True) == [("A100", "V100", "T4")]
    assert sorted(type_group_orders(("T4", "A100"), mem, False)) == [("A100", "T4"), ("T4", "A100")]


def test_copy_order_pairs():
    assert copy_order_pairs(1) == [] and copy_order_pairs(3) == [(1, 0), (2, 1)]


def test_pruning_options_switch_each_rule_and_refuse_unknown_names():
    for name in PruningOptions.rule_names():
        assert getattr(PruningOptions().without(name), name) is False
    with pytest.raises(ValueError, match="unknown pruning rule"):
        PruningOptions().without("nope")


def test_undominated_mask_equals_the_pairwise_predicate():
    sc = get_scenario("opt350-a100x4-v100x4")
    prof = load_bundled_profile(sc.model)
    problem, _ = make_problem(sc.cluster(), prof, sc.global_batch_size, pruning=PruningOptions(dominated=False),
                              workers=1)
    cands: list[Candidate] = problem.candidates
    keys = DominanceKeys([(c.devices, c.tp_groups) for c in cands])
    bott = np.array([c.partition.bottleneck_s for c in cands])
    fill = np.array([c.partition.fill_s for c in cands])
    size = np.array([c.micro_batch_size for c in cands])
    idx = np.arange(len(cands))
    order = dominance_order(bott, fill, keys.num_devices, idx, size, np.zeros_like(idx))
    pos = np.empty(len(cands), dtype=np.int64)
    pos[order] = idx
    feat = np.column_stack([keys.counts, bott, fill, [c.partition.optimizer_s for c in cands],
                            [max(c.partition.stage_param_bytes) for c in cands]])
    keep = undominated_mask(size, keys.keyset, keys.subsets, feat, pos)
    # sequential: a candidate is dropped when one visited earlier dominates it
    want = [not any(dominates(cands[x], cands[y]) for x in order[:pos[y]]) for y in range(len(cands))]
    assert keep.tolist() == want and not all(want)
    assert [id(c) for c in remove_dominated(cands)] == [id(cands[i]) for i in order if keep[i]]


def test_exceeds_incumbent_compares_the_fill():
    sc = get_scenario("opt350-a100x4-v100x4")
    problem, _ = make_problem(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size, workers=1)
    c = problem.candidates[0]
    assert exceeds_incumbent(c, c.partition.fill_s * 0.5) and not exceeds_incumbent(c, c.partition.fill_s)


@pytest.mark.parametrize("name", ["opt350-a100x4-v100x4", "opt350-3types-40"])
def test_for_cluster_builds_what_the_callers_built_by_hand(name):
    sc = get_scenario(name)
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    cfg = CostModelConfig(memory_headroom=0.1)
    cache = StageCostCache.for_cluster(cl, prof, cfg, global_batch_size=sc.global_batch_size)
    assert cache.capacities == {t: d.memory_bytes for t, d in cl.device_types.items()}
    assert cache.link == pipeline_link(cl) and cache.config is cfg and cache.enabled
    assert (cache.pair_links is not None) == bool(cl.per_pair)
    assert StageCostCache.for_cluster(cl, prof, per_pair=False).pair_links is None
    assert not StageCostCache.for_cluster(cl, prof, enabled=False).enabled
    t, tp = next((t, tp) for t in cl.device_types for tp in prof.tp_degrees(t))
    b = prof.micro_batch_sizes(t, tp)[0]
    # the tables subtract headroom and reserve once (CostModelConfig.usable_memory_bytes)
    assert cache.table(t, tp, b).capacity_bytes == cfg.usable_memory_bytes(cl.device_types[t].memory_bytes)
    if cl.per_pair:
        k = (t, tp)
        assert cache.links(k, k) == tuple(p2p_link_options(cl, k, k))
    # the balancer on it sees the same rows as on a hand-built cache
    space = SearchSpace()
    shape = (StageKind(t, tp),) * 2
    by_hand = StageCostCache(prof, dict(cache.capacities), pipeline_link(cl), cfg,
                             global_batch_size=sc.global_batch_size, pair_links=cache.pair_links)
    got = [StageBalancer(c, allow_recompute=space.allow_recompute).balance(shape, b) for c in (cache, by_hand)]
    assert got[0] == got[1]
