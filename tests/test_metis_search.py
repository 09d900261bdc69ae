"""Metis's search on HPP's cost model: device groups, the intra-stage walk, the partition DP, pricing."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hpp.baselines.single_shape import _bind_replicas
from hpp.errors import HppInputError
from hpp.formulation.candidates import Candidate
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan
from hpp.formulation.stage_balance import StageBalancer, StageKind
from hpp.baselines.metis_pricing import MetisPricer, price_metis_config
from hpp.baselines.metis import _next_strategy, metis_device_groups, metis_search
from hpp.formulation.collectives import pipeline_link
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import make_cluster

GBS = 64


@pytest.fixture(scope="module")
def opt350():
    return load_bundled_profile("OPT-350")


# --- device groups: Metis's "Key idea 1" and "Key idea 2", hand-computed -------------------------------

def test_device_groups_of_eight_devices():
    # Metis's README runs with SCALE_VARIANCE=1: sizes >= max(8 // S, S // 8)
    assert metis_device_groups(8, 1) == [(8,)]
    assert metis_device_groups(8, 2) == [(4, 4)]                 # sizes >= 4
    assert metis_device_groups(8, 3) == [(4, 2, 2), (2, 4, 2), (2, 2, 4)]   # sizes >= 2: (2, 2, 4) in 3 orders
    assert metis_device_groups(8, 4) == [(2, 2, 2, 2)]           # sizes >= 2
    # variance 0.5 (the generator's own default): sizes >= 1 -> (1,1,2,4) in 12 orders and (2,2,2,2)
    four = metis_device_groups(8, 4, variance=0.5)
    assert len(four) == 13 and (2, 2, 2, 2) in four and set(four) - {(2, 2, 2, 2)} == set(
        itertools.permutations((1, 1, 2, 4)))


def test_variance_drops_small_groups():
    assert metis_device_groups(16, 2) == [(8, 8)]
    # 3 stages: sizes >= 16 // 3 = 5, i.e. 8 and 16: no three sum to 16; with 0.5 (>= 2.5): (4, 4, 8) in 3 orders
    assert metis_device_groups(16, 3) == []
    assert sorted(metis_device_groups(16, 3, variance=0.5)) == sorted(set(itertools.permutations((4, 4, 8))))
    # 64 devices, 22 stages: sizes >= 64 // 22 = 2; 32 devices, 22 stages: sizes >= 1
    assert all(min(dg) >= 2 for dg in metis_device_groups(64, 22))
    assert any(min(dg) == 1 for dg in metis_device_groups(32, 22))


def test_every_group_sequence_sums_to_the_devices():
    for n, s in [(16, 5), (32, 7), (32, 12)]:
        for dg in metis_device_groups(n, s):
            assert len(dg) == s and sum(dg) == n and all(g & (g - 1) == 0 for g in dg)


# --- the intra-stage walk ------------------------------------------------------------------------------

def test_next_strategy_halves_the_largest_dp_first_without_a_memory_state():
    # 1 / dp: the stage with the largest dp has the smallest value
    assert _next_strategy([(4, 1), (8, 1)], None) == [(4, 1), (4, 2)]
    assert _next_strategy([(1, 4), (1, 8)], None) is None
    # with a memory state: the stage with the least headroom that still has dp > 1
    assert _next_strategy([(4, 1), (1, 8), (2, 2)], [5.0, -1.0, 3.0]) == [(4, 1), (1, 8), (1, 4)]


# --- the layer-partition DP equals brute force ---------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_partition_dp_equals_brute_force(data):
    L = data.draw(st.integers(2, 7))
    S = data.draw(st.integers(1, min(L, 4)))
    rng = np.random.default_rng(data.draw(st.integers(0, 10_000)))
    stages = []
    for _ in range(S):
        C = np.full((L + 1, L + 1), np.inf)
        for u in range(L):
            for v in range(u + 1, L + 1):
                if rng.random() > 0.15:
                    C[u, v] = float(rng.integers(1, 9))
        p2p = np.concatenate([rng.integers(0, 3, L).astype(float), [0.0]])
        stages.append((C, None, p2p, None))
    pricer = MetisPricer.__new__(MetisPricer)
    pricer.profile = type("P", (), {"num_layers": L})()
    got = pricer.partition(stages)
    best = None
    for cuts in itertools.combinations(range(1, L), S - 1):
        b = (0, *cuts, L)
        ds = [stages[s][0][b[s], b[s + 1]] for s in range(S)]
        if not all(math.isfinite(d) for d in ds):
            continue
        key = (max(ds), sum(ds) + 2 * sum(stages[s][2][b[s + 1]] for s in range(S)))
        best = key if best is None or key < best else best
    if best is None:
        assert got is None
    else:
        assert got is not None and (got[1], got[2]) == pytest.approx(best)


# --- pricing agrees with HPP's composition model and the full cost model --------------------------------

def test_equal_dp_price_equals_composition_and_full_cost_model(opt350):
    # one inter-node link for every pair (v1): the ported Metis search prices that network
    cl = make_cluster("t", {"A100-40": 8, "V100-16": 8}, per_pair=False)
    space, config = SearchSpace(), CostModelConfig()
    pricer = MetisPricer(cl, opt350, space, config)
    # 4 replicas of [V100 TP2 | A100 TP2] (groups of 8 = 4 x 2), m = 8 micro-batches of 64/8 = 8 -> b = 2
    types = [("V100-16",), ("A100-40",)]
    strategies, m, b = [(4, 2), (4, 2)], 8, 2
    stages = [pricer.stage(ts, tp, b, min(m, 2 - s), memory=True) for s, (ts, (_, tp)) in
              enumerate(zip(types, strategies))]
    bounds, _, _ = pricer.partition(stages)
    t, rec, head = price_metis_config(pricer, strategies, m, bounds, stages)
    assert min(head) >= 0 and not any(rec)
    # HPP's stage balance of the same shape gives the same boundaries (its DP assumes S - s in flight, = here)
    shape = (StageKind("V100-16", 2), StageKind("A100-40", 2))
    part = StageBalancer(pricer.cache).balance(shape, b)
    assert tuple(bounds) == part.boundaries
    cand = Candidate(shape, b, part, {}, {})
    assert t == pytest.approx(composition_objective_s(CompositionProblem([cand], cl, GBS, pipeline_link(cl)), {0: 4}),
                              rel=1e-9)
    plan = _bind_replicas(cl, opt350, GBS, shape, part, b, 4)
    # the cost model prices the binding's actual links and the cheaper of ring / hierarchical
    # all-reduce: never above the search models' price (every stage link and sync ring at the inter-node link)
    assert estimate_plan(plan, cl, opt350, config=config).iteration_time_s <= t * (1 + 1e-9)


def test_a_straddling_group_runs_at_its_slowest_type(opt350):
    cl = make_cluster("t", {"A100-40": 4, "V100-16": 4})
    pricer = MetisPricer(cl, opt350, SearchSpace(), CostModelConfig())
    both = pricer.stage(("A100-40", "V100-16"), 1, 2, 1, memory=False)[0]
    a = pricer.stage(("A100-40",), 1, 2, 1, memory=False)[0]
    v = pricer.stage(("V100-16",), 1, 2, 1, memory=False)[0]
    assert np.array_equal(both, np.maximum(a, v))


# --- the search ----------------------------------------------------------------------------------------

def test_search_finds_a_fitting_configuration_and_counts_its_work(opt350):
    cl = make_cluster("t", {"A100-40": 4, "V100-16": 4})
    res = metis_search(cl, opt350, GBS)
    assert res.best is not None and not res.truncated
    b = res.best
    assert sum(b.device_groups) == 8 and all(dp * tp == g for (dp, tp), g in zip(b.strategies, b.device_groups))
    assert b.boundaries[0] == 0 and b.boundaries[-1] == opt350.num_layers
    assert list(b.boundaries) == sorted(set(b.boundaries))                 # every stage holds >= 1 layer
    # 2 node sequences x 7 divisors of 64 x device groups: S = 1: (8); 2: (4,4); 3: (2,2,4) in 3 orders;
    # 4: (2,2,2,2); 5-8 stages: sizes >= 1, power-of-two sequences summing to 8, in Metis's orders
    per_s = [len(metis_device_groups(8, s)) for s in range(1, 9)]
    assert per_s[:4] == [1, 1, 3, 1]
    assert res.inter_stage_plans == 2 * 7 * sum(per_s) == 336
    assert 0 < res.candidates <= res.inter_stage_plans * 3       # at most log2(8) + 1 strategies per plan
    # Metis's caps from the profile: TP 4 (A100-40 has 1, 2, 4), micro-batch 4 (V100-16 at TP 1 has 1, 2, 4)
    assert all(tp <= 4 for _, tp in b.strategies) and not any(b.recompute)
    assert math.isfinite(res.iteration_time_s) and res.wall_s > 0


def test_hpp_is_never_slower_than_metis_on_small_clusters(opt350):
    for gpus in ({"A100-40": 4, "V100-16": 4}, {"A100-40": 8, "V100-16": 4}):
        cl = make_cluster("t", gpus)
        ref = metis_search(cl, opt350, GBS)
        hpp = plan_hpp(cl, opt350, GBS)
        assert hpp.estimate.iteration_time_s <= ref.iteration_time_s * (1 + 1e-9)


def test_budget_and_candidate_limits_truncate(opt350):
    cl = make_cluster("t", {"A100-40": 4, "V100-16": 4})
    assert metis_search(cl, opt350, GBS, time_budget_s=0.0).truncated
    for k in range(1, 12):
        res = metis_search(cl, opt350, GBS, max_candidates=k)
        assert res.truncated and res.candidates == k and f"truncated after {k} candidates" in res.description


def test_caps_shrink_the_search_and_recomputation_is_one_mode_per_stage(opt350):
    cl = make_cluster("t", {"A100-40": 4, "V100-16": 4})
    small = metis_search(cl, opt350, GBS, max_tp=2, max_micro_batch_size=2)
    full = metis_search(cl, opt350, GBS)
    assert small.candidates < full.candidates
    assert all(tp <= 2 for _, tp in small.best.strategies)
    # a straddling stage recomputes on every type or on none: with recomputation allowed, the stage's
    # time is the slowest type's in the one mode where every type fits
    pricer = MetisPricer(cl, opt350, SearchSpace(), CostModelConfig(), 4, 4)
    C, full_mask, _, tabs = pricer.stage(("A100-40", "V100-16"), 1, 4, 8, memory=True)
    fits = [t.memory_bytes(8, False) <= t.capacity_bytes for t in tabs]
    both = fits[0] & fits[1]
    assert np.array_equal(np.isfinite(C) & ~full_mask, both & np.isfinite(tabs[0].compute_none_s))
    assert full_mask.any()                    # V100-16 cannot hold 8 micro-batches of many ranges without it
    slowest_full = np.maximum(tabs[0].compute_full_s, tabs[1].compute_full_s)
    assert np.array_equal(C[full_mask], slowest_full[full_mask])
    fits_full = [t.memory_bytes(8, True) <= t.capacity_bytes for t in tabs]
    assert not (full_mask & ~(fits_full[0] & fits_full[1])).any()


@pytest.mark.parametrize("kw,field", [({"variance": 0.0}, "variance"), ({"max_permute_len": 0}, "max_permute_len")])
def test_bad_settings_are_refused(opt350, kw, field):
    with pytest.raises(HppInputError) as ei:
        metis_search(make_cluster("t", {"A100-40": 4}), opt350, GBS, **kw)
    assert ei.value.field == field


@pytest.mark.parametrize("kw,field", [
    ({"global_batch_size": 0}, "global_batch_size"), ({"global_batch_size": 64.0}, "global_batch_size"),
    ({"variance": float("nan")}, "variance"), ({"max_permute_len": 1.5}, "max_permute_len"),
    ({"max_candidates": 0}, "max_candidates"), ({"time_budget_s": -1.0}, "time_budget_s"),
    ({"max_tp": 0}, "max_tp"), ({"space": SearchSpace(micro_batch_sizes=(3,))}, "--micro-batch-sizes")])
def test_bad_inputs_name_their_field(opt350, kw, field):
    args = {"global_batch_size": GBS, **kw}
    gbs = args.pop("global_batch_size")
    with pytest.raises(HppInputError) as ei:
        metis_search(make_cluster("t", {"A100-40": 4, "V100-16": 4}), opt350, gbs, **args)
    assert ei.value.field == field
    assert str(ei.value).startswith(f"field '{field}': ") and "Fix: " in str(ei.value)


def test_the_budget_holds_while_device_groups_are_generated(opt350):
    # 1024 GPUs with a tiny variance: millions of group sequences; the budget is checked as they come
    res = metis_search(make_cluster("t", {"A100-40": 512, "V100-16": 512}), opt350, 1024, variance=0.01,
                       time_budget_s=0.5)
    assert res.truncated and res.wall_s < 5.0
