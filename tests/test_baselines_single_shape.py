"""Single-shape (Metis) baseline: Metis's device-group orders (merge rule, permutations) and the search."""

import itertools

import pytest

from hpp.baselines.shapes import group_orders, group_splits, metis_merged_blocks
from hpp.baselines.single_shape import _single_shape_candidates, single_shape_baseline
from hpp.errors import HppInputError
from hpp.formulation.space_limits import SearchSpace, common_micro_batch_sizes, stage_kinds
from hpp.formulation.cost_model import estimate_plan
from hpp.formulation.stage_balance import StageKind
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import make_cluster
from hpp.validate import validate_plan

GBS = 64
#: Metis/AMP mix TP degrees inside a pipeline; HPP's default space does not (SearchSpace.mixed_tp_pipelines)
MIXED = SearchSpace(mixed_tp_pipelines=True)


# --- Metis's merge rule and permutations, hand-computed -------------------------------------------

def test_three_groups_under_the_limit_give_every_distinct_order():
    # 3 blocks <= 4: no merging; the multiset {1, 1, 2} has 3!/2! = 3 orders
    assert metis_merged_blocks((2, 1, 1), 4) == [(1,), (1,), (2,)]
    assert list(group_orders((2, 1, 1), 4)) == [(2, 1, 1), (1, 2, 1), (1, 1, 2)]
    assert list(group_orders((1, 2, 1), 4)) == list(group_orders((2, 1, 1), 4))     # the input order does not matter


def test_four_unequal_groups_are_all_permuted():
    orders = list(group_orders((4, 2, 2, 1), 4))
    assert len(orders) == 12                                              # 4! / 2!
    assert set(orders) == set(itertools.permutations((4, 2, 2, 1)))
    assert orders[0] == (4, 2, 2, 1)                                      # non-increasing first


def test_six_ones_and_a_two_merge_into_pairs():
    # 7 blocks, 3 over the limit; 6 leading (1,) blocks, the first other at index 6 -> 7 // 2 = 3 pairs:
    # (1,1) (1,1) (1,1) (2) -> the 2 in each of 4 positions
    assert metis_merged_blocks((2, 1, 1, 1, 1, 1, 1), 4) == [(1, 1), (1, 1), (1, 1), (2,)]
    assert list(group_orders((2, 1, 1, 1, 1, 1, 1), 4)) == [
        (2, 1, 1, 1, 1, 1, 1), (1, 1, 2, 1, 1, 1, 1), (1, 1, 1, 1, 2, 1, 1), (1, 1, 1, 1, 1, 1, 2)]


def test_run_of_smallest_groups_is_merged_evenly_past_the_limit():
    # Metis's own example (max_permute_len 6): 1 block over the limit, but the run of 1s gives 7 // 2 = 3 pairs
    assert metis_merged_blocks((2, 1, 1, 1, 1, 1, 1), 6) == [(1, 1), (1, 1), (1, 1), (2,)]


def test_second_pass_merges_a_pair_block_with_an_equal_group():
    # pass 1: 6 blocks, 2 over; lead = 2 + 1 -> 1 pair, so max(2, 1) = 2 pairs tried: (1,1) merges, (2)(2) do
    # not (not the smallest) -> (1,1) (2) (2) (2) (2); pass 2: smallest sum 2, 1 pair: (1,1)+(2) -> (1,1,2).
    assert metis_merged_blocks((2, 2, 2, 2, 1, 1), 4) == [(1, 1, 2), (2,), (2,), (2,)]
    orders = list(group_orders((2, 2, 2, 2, 1, 1), 4))
    assert orders == [(2, 2, 2, 1, 1, 2), (2, 2, 1, 1, 2, 2), (2, 1, 1, 2, 2, 2), (1, 1, 2, 2, 2, 2)]
    assert (2, 2, 2, 2, 1, 1) not in orders     # a merged block keeps Metis's non-decreasing inner order


def test_max_permute_len_one_merges_equal_groups_but_permutes_unequal_ones():
    assert list(group_orders((4, 2, 1, 1), 1)) == [(1, 1, 2, 4)]               # (1,1) -> (1,1,2) -> (1,1,2,4)
    assert list(group_orders((2, 1), 1)) == [(2, 1), (1, 2)]                   # 1 and 2 never merge


def test_orders_that_flatten_alike_are_kept_as_metis_evaluates_them():
    assert metis_merged_blocks((1, 1, 1, 1, 1), 4) == [(1, 1), (1, 1), (1,)]
    assert list(group_orders((1, 1, 1, 1, 1), 4)) == [(1, 1, 1, 1, 1)] * 3


def test_max_permute_len_must_be_positive():
    cl = make_cluster("tiny", {"A100-40": 4, "V100-16": 4})
    with pytest.raises(HppInputError, match="max_permute_len"):
        single_shape_baseline(cl, load_bundled_profile("OPT-350"), GBS, max_permute_len=0)


# --- the search on a tiny cluster ---------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    cl = make_cluster("tiny", {"A100-40": 4, "V100-16": 4})
    prof = load_bundled_profile("OPT-350")
    return cl, prof, {n: single_shape_baseline(cl, prof, GBS, space=MIXED, max_permute_len=n) for n in (None, 1, 4)}


def _canonical_shapes(cl, prof, space):
    """The enumeration before group orders: one non-increasing order of each type's TP groups."""
    inv = cl.count_by_type()
    kinds = stage_kinds(cl, prof, space)
    out = []
    for dp in range(1, min(inv.values()) + 1):
        if any(n % dp for n in inv.values()):
            continue
        splits = {t: group_splits(n // dp, [k.tp_degree for k in kinds[t]]) for t, n in inv.items()}
        for order in itertools.permutations(sorted(inv)):
            for choice in itertools.product(*(splits[t] for t in order)):
                out.append((dp, tuple(StageKind(t, s) for t, grp in zip(order, choice) for s in grp)))
    return out


def test_group_orders_add_shapes_to_the_canonical_ones(tiny):
    cl, prof, _ = tiny
    space = MIXED
    canonical = set(_canonical_shapes(cl, prof, space))
    shapes = list(_single_shape_candidates(cl, prof, space, 4))
    assert len(set(shapes)) == len(shapes)
    assert canonical < set(shapes)
    # e.g. DP=1, A100 cut into TP 2, 1, 1 with the TP-2 group in the middle of its run
    a, v = StageKind("A100-40", 1), StageKind("V100-16", 4)
    assert (1, (a, StageKind("A100-40", 2), a, v)) in set(shapes) - canonical


def test_default_enumerates_exactly_the_canonical_shapes_in_order(tiny):
    cl, prof, res = tiny
    space = MIXED
    assert list(_single_shape_candidates(cl, prof, space)) == _canonical_shapes(cl, prof, space)
    canonical_cands = sum(len(common_micro_batch_sizes(prof, shape, space))
                          for _, shape in _canonical_shapes(cl, prof, space) if len(shape) <= prof.num_layers)
    assert res[None].candidates == canonical_cands
    assert res[4].iteration_time_s <= res[None].iteration_time_s


def test_more_candidates_and_never_slower_than_without_permutations(tiny):
    cl, prof, res = tiny
    space = MIXED
    canonical_cands = sum(len(common_micro_batch_sizes(prof, shape, space))
                          for _, shape in _canonical_shapes(cl, prof, space) if len(shape) <= prof.num_layers)
    # per-type counts 4, 2, 1 of powers of two merge into one block at max_permute_len=1: one order per split
    assert res[1].candidates == canonical_cands
    assert res[4].candidates > res[1].candidates
    assert res[4].feasible and res[1].feasible
    assert res[4].iteration_time_s <= res[1].iteration_time_s
    assert "truncated" not in res[4].description


def test_plan_validates_and_fits(tiny):
    cl, prof, res = tiny
    plan = res[4].plan
    validate_plan(plan, cl, prof)
    est = estimate_plan(plan, cl, prof)
    assert est.fits_memory
    assert est.iteration_time_s == pytest.approx(res[4].iteration_time_s)
    assert sum(p.num_samples for p in plan.pipelines) == GBS
    assert len({tuple((s.device_type, s.tp_degree) for s in p.stages) for p in plan.pipelines}) == 1


def test_candidate_cap_truncates(tiny):
    cl, prof, _ = tiny
    res = single_shape_baseline(cl, prof, GBS, space=MIXED, max_candidates=10)
    # the cap is checked before each shape, whose micro-batch sizes are then all priced
    assert 10 <= res.candidates < 10 + max(len(common_micro_batch_sizes(prof, shape, MIXED))
                                            for _, shape in _single_shape_candidates(cl, prof, MIXED, 4))
    assert f"truncated after {res.candidates} candidates" in res.description
