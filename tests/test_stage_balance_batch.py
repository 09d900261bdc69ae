"""The batched stage balance equals the per-shape DP bit for bit (partitions, variants, order, counters)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hpp.formulation.space_limits import SearchSpace, common_micro_batch_sizes, stage_kinds
from hpp.formulation.candidates import enumerate_shapes
from hpp.formulation.stage_balance import StageBalancer
from hpp.formulation.stage_balance_batch import PartitionBatch, balance_pairs
from hpp.formulation.collectives import pipeline_link
from hpp.planner import make_problem
from hpp.profiles.bundled import load_bundled_profile
from hpp.formulation.stage_costs import StageCostCache
from hpp.pruning.rules import PruningOptions
from hpp.scenarios import get_scenario
from tests.test_planner import instances


def _pairs(cl, prof, space, pruning=PruningOptions()):
    shapes = list(enumerate_shapes(cl, stage_kinds(cl, prof, space), space, pruning, prof.num_layers))
    return shapes, [(i, b) for i, s in enumerate(shapes) for b in common_micro_batch_sizes(prof, s, space)]


def _balancer(cl, prof, space):
    caps = {t: d.memory_bytes for t, d in cl.device_types.items()}
    return StageBalancer(StageCostCache(prof, caps, pipeline_link(cl)), allow_recompute=space.allow_recompute)


def _per_shape(cl, prof, space, shapes, pairs):
    bal, rows, infeasible = _balancer(cl, prof, space), [], 0
    for i, b in pairs:
        part, few = bal.balance_both(shapes[i], b)
        if part is None:
            infeasible += 1
            continue
        rows.append((i, b, 0, part))
        if few is not None:
            rows.append((i, b, 1, few))
    return rows, infeasible


def _rows(batch):
    return [(int(i), int(b), int(v), p) for i, b, v, p in zip(batch.shape_index, batch.micro_batch_size,
                                                              batch.variant, batch.partitions())]


def _check_equal(cl, prof, space):
    shapes, pairs = _pairs(cl, prof, space)
    want, infeasible = _per_shape(cl, prof, space, shapes, pairs)
    for prune in (True, False):
        batch, stats = balance_pairs(_balancer(cl, prof, space), shapes, pairs, prune_dead_suffixes=prune)
        assert _rows(batch) == want
        assert stats["balanced"] + stats["shapes_pruned_memory"] == len(pairs)
        assert stats["infeasible"] + stats["shapes_pruned_memory"] == infeasible
        assert stats["fill_variants"] == sum(v for _, _, v, _ in want)
        if not prune:
            assert stats["shapes_pruned_memory"] == 0
    return want, infeasible


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.booleans(), st.integers(1, 8))
def test_batched_equals_per_shape_dp_on_random_instances(inst, recompute, max_stages):
    prof, cl, _ = inst
    _check_equal(cl, prof, SearchSpace(max_stages=max_stages, allow_recompute=recompute))


@pytest.mark.parametrize("name, recompute", [("llama8-3types-40", True), ("llama8-3types-40", False),
                                             ("opt350-a100x8-v100x8", True)])
def test_batched_equals_per_shape_dp_on_bundled_scenarios(name, recompute):
    sc = get_scenario(name)
    want, infeasible = _check_equal(sc.cluster(), load_bundled_profile(sc.model), SearchSpace(allow_recompute=recompute))
    assert want
    if name.startswith("llama8"):
        assert infeasible > 0          # memory-infeasible shapes are part of what is checked


def test_dead_suffixes_are_pruned_and_counted():
    sc = get_scenario("llama8-3types-40")
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    space = SearchSpace(allow_recompute=False)
    shapes, pairs = _pairs(cl, prof, space)
    on, s_on = balance_pairs(_balancer(cl, prof, space), shapes, pairs, prune_dead_suffixes=True)
    off, s_off = balance_pairs(_balancer(cl, prof, space), shapes, pairs, prune_dead_suffixes=False)
    assert s_on["shapes_pruned_memory"] > 0 and s_off["shapes_pruned_memory"] == 0
    assert s_on["infeasible"] < s_off["infeasible"]
    assert _rows(on) == _rows(off)


def test_memoised_candidates_equal_the_unmemoised_ones():
    """Batched (memoise on) and one shape at a time with nothing shared (memoise off): same candidates."""
    sc = get_scenario("opt350-a100x4-v100x4")
    prof = load_bundled_profile(sc.model)
    a, sa = make_problem(sc.cluster(), prof, 1024, workers=1)
    b, sb = make_problem(sc.cluster(), prof, 1024, pruning=PruningOptions(memoise=False), workers=1)
    key = lambda p: [(c.shape, c.micro_batch_size, c.partition, c.devices, c.tp_groups) for c in p.candidates]  # noqa
    assert key(a) == key(b) and len(a.candidates) > 100
    for k in ("balanced", "infeasible", "dominated", "fill_variants"):
        assert sa[k] == sb[k], k


def test_partition_batch_round_trip_take_and_concat():
    sc = get_scenario("opt350-a100x4-v100x4")
    cl, prof, space = sc.cluster(), load_bundled_profile(sc.model), SearchSpace()
    shapes, pairs = _pairs(cl, prof, space)
    batch, _ = balance_pairs(_balancer(cl, prof, space), shapes, pairs)
    rows = _rows(batch)
    again = PartitionBatch.from_partitions(rows, prof.num_layers)
    assert _rows(again) == rows
    short = batch.take(batch.num_stages <= 2)           # narrower stage columns, padded back by concat
    assert _rows(PartitionBatch.concat([short, batch], prof.num_layers)) == _rows(short) + rows
    assert len(PartitionBatch.concat([], prof.num_layers)) == 0
    assert np.all(batch.boundaries[:, 0] == 0) and np.all(batch.boundaries[:, -1] == prof.num_layers)
