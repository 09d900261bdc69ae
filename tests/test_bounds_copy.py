"""The copy bound: a lower bound of every plan of the candidates, from an exact-step
capacity LP over pipeline-count ranges and penalty levels, with a sync floor valid for non-monotone
link fits; and the incumbent it improves."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpp.baselines.single_shape import exhaustive_composition
from hpp.errors import HppInputError
from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.composition.copy_bound import copy_bound
from hpp.formulation.composition.step_lp import StepLP, h_ranges
from hpp.formulation.composition.sync_floor import ring_cost_increasing_from, sync_rate_table
from hpp.formulation.collectives import ring_allreduce_s
from hpp.formulation.composition.heuristics import best_incumbent, fill_heuristic, greedy_composition
from hpp.bench.instance_format import InstanceOptions
from hpp.bench.instances import SyntheticSpec, synthetic_instance
from hpp.profiles.cluster import Link

#: A concave fit (GB/s at log2(chunk / 1 MB)) that peaks near 64 MB chunks and falls for larger ones.
FALLING = Link(10e9, 1e-5, (-0.05, 0.6, 2.0))


def _small_problem(seed: int):
    spec = SyntheticSpec(num_types=2, num_gpus=8, num_layers=8, seed=seed, global_batch_size=16, gpus_per_node=4,
                         options=InstanceOptions(max_tp=2, micro_batch_sizes=(1, 2), max_stages=2))
    return synthetic_instance(spec).problem()[0]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.integers(0, 10_000))
def test_copy_bound_never_above_the_exhaustive_optimum(seed):
    problem = _small_problem(seed)
    try:
        _, best, _ = exhaustive_composition(problem, max_evaluations=3000)
    except HppInputError:
        return                                   # too large for the oracle
    got = copy_bound(problem)
    assert got.bound_s <= best * (1 + 1e-9)
    # the incumbent it returns is a plan of the problem, priced as it says
    assert problem.fits(got.counts)
    assert got.objective_s == composition_objective_s(problem, got.counts)
    assert got.objective_s >= best * (1 - 1e-12)
    assert got.bound_s <= got.objective_s


def test_copy_bound_is_tighter_than_the_sync_class_lp_and_deterministic():
    from hpp.formulation.composition.lp_bound import composition_bounds

    problem = _small_problem(3)
    _, best, _ = exhaustive_composition(problem, max_evaluations=3000)
    old = composition_bounds(problem, copies=False)[1]
    a, b = copy_bound(problem), copy_bound(problem)
    assert old <= a.bound_s <= best * (1 + 1e-9)
    assert (a.bound_s, a.counts, a.objective_s) == (b.bound_s, b.counts, b.objective_s)


def test_sync_rate_without_fit_is_the_peak_ring_rate():
    # no fit, no latency: every block size costs 2 (h-1)/h / peak per byte (hand value: h = 4, 1e9 B/s)
    tops, rate = sync_rate_table([Link(1e9, 0.0)], 4, 4, 1e8)
    assert rate[-1] == pytest.approx(1.5e-9)
    assert 1e8 * rate[np.searchsorted(tops, 1e8)] == pytest.approx(ring_allreduce_s(1e8, 4, Link(1e9, 0.0)))


def test_sync_floor_is_below_every_split_of_a_gradient_on_a_falling_fit():
    # the case that broke the old per-stage relaxation: on a fit that falls for large messages, splitting
    # a stage's gradient into blocks is cheaper than one bucket
    W, h = 8e9, 2
    one = ring_allreduce_s(W, h, FALLING)
    split = 8 * ring_allreduce_s(W / 8, h, FALLING)
    assert split < one                                        # the control: one bucket is NOT a floor
    tops, rate = sync_rate_table([FALLING], h, h, W)
    floor = W * rate[min(np.searchsorted(tops, W), len(tops) - 1)]
    for k in (1, 2, 4, 8, 16, 64, 1024):
        assert floor <= k * ring_allreduce_s(W / k, h, FALLING) * (1 + 1e-12)
    # ... and the cost stops growing with the block size somewhere below W (so W's own bytes cannot cap it)
    assert ring_cost_increasing_from(FALLING, W / h) > 0
    assert ring_cost_increasing_from(Link(1e9, 1e-5), W) == 0.0


def test_h_ranges_cover_every_count_once():
    for h_max, split in ((1, 4), (9, 4), (1024, 8), (37, 16)):
        rs = h_ranges(h_max, split)
        covered = [h for a, b in rs for h in range(a, b + 1)]
        assert covered == list(range(1, h_max + 1))
        assert all(not (a <= split < b) for a, b in rs)


def test_step_lp_matches_a_hand_solved_lp():
    # max 3 x0 + 2 x1 s.t. 2 x0 + x1 <= 4 (type A), x0 + x1 <= 3 (type B), x0 + x1 <= 10 (copies)
    lp = StepLP(np.array([[2.0, 1.0], [1.0, 1.0]]), np.array([4.0, 3.0]), 10)
    val, x = lp.solve(np.array([3.0, 2.0]))
    assert val == pytest.approx(7.0) and x == pytest.approx([1.0, 2.0])
    val, x = lp.solve(np.array([3.0, 0.5]))                   # warm start from the last basis
    assert val == pytest.approx(6.0) and x == pytest.approx([2.0, 0.0])


def test_best_incumbent_is_no_worse_than_the_heuristics_and_repeatable():
    problem = _small_problem(5)
    counts, obj = best_incumbent(problem)
    assert obj <= min(greedy_composition(problem)[1], fill_heuristic(problem)[1])
    assert obj == composition_objective_s(problem, counts) and problem.fits(counts)
    assert best_incumbent(problem) == (counts, obj)
    assert math.isfinite(obj)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(h=st.integers(2, 40), node=st.sampled_from([2, 4, 8]), num_nodes=st.integers(1, 12), tp=st.sampled_from([1, 2]),
       w=st.floats(1e6, 4e9), fit=st.sampled_from([None, (-0.05, 0.6, 2.0)]))
def test_stage_sync_floor_is_below_every_all_reduce_the_cost_model_can_price(h, node, num_nodes, tp, w, fit):
    # the floor of a stage synced by h holders on num_nodes nodes of `node` devices (TP groups of tp) is at most
    # the flat ring over any link and every hierarchical form the cost model may take: g ranks on each of
    # h / g nodes, g dividing h, at most g_max = node - tp + 1 per node (a TP-1 holder's device is in every ring),
    # h / g <= num_nodes
    from hpp.formulation.collectives import hierarchical_allreduce_s
    from hpp.formulation.composition.sync_floor import stage_sync_rate
    from hpp.profiles.cluster import Cluster, Node
    from hpp.profiles.devices import BUNDLED_DEVICE_TYPES

    intra, inter = Link(1e11, 1e-6), Link(1e10, 1e-5, fit)
    cl = Cluster("c", dict(BUNDLED_DEVICE_TYPES), tuple(Node("A100-40", node, intra) for _ in range(num_nodes)), inter)
    tops, rate, beta0 = stage_sync_rate(cl, h, h, tp, w)
    floor = w * rate[min(np.searchsorted(tops, min(max(w, beta0), w)), len(tops) - 1)]
    g_max = node - tp + 1
    forms = [ring_allreduce_s(w, h, inter)] if num_nodes > 1 else []
    if h <= g_max:
        forms.append(ring_allreduce_s(w, h, intra))
    forms += [hierarchical_allreduce_s(w, g, h // g, intra, inter)
              for g in range(2, g_max + 1) if h % g == 0 and 2 <= h // g <= num_nodes]
    if not forms:
        return                                   # h holders cannot be placed: nothing to bound
    assert floor <= min(forms) * (1 + 1e-9)
    # the control: on a cluster with no room for h / g nodes the floor is the flat ring's (hierarchical impossible)
    if fit is None and h > g_max and not any(h % g == 0 and 2 <= h // g <= num_nodes for g in range(2, g_max + 1)):
        assert floor >= ring_allreduce_s(w, h, Link(1e10, 0.0)) * (1 - 1e-9)
