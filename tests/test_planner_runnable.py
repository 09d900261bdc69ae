"""The planner emits only plans ``hpp run`` can execute: one TP degree per pipeline, TP dividing the heads."""

from __future__ import annotations

from dataclasses import replace

from hpp.formulation.space_limits import SearchSpace, model_head_counts, runnable_tp_degrees, stage_kinds
from hpp.formulation.candidates import enumerate_shapes
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.pruning.rules import PruningOptions
from hpp.scenarios import get_scenario, make_cluster


def _tp_sets(space: SearchSpace) -> set[frozenset[int]]:
    cluster = make_cluster("t", {"A100-40": 8, "V100-16": 8})
    profile = load_bundled_profile("OPT-350")
    kinds = stage_kinds(cluster, profile, space)
    return {frozenset(k.tp_degree for k in shape)
            for shape in enumerate_shapes(cluster, kinds, space, PruningOptions(), profile.num_layers)}


def test_shapes_have_one_tp_degree_unless_mixed_is_asked_for():
    default = _tp_sets(SearchSpace(max_stages=4))
    assert default and all(len(s) == 1 for s in default)
    assert {1, 2, 4} <= set().union(*default)            # every degree is still used, pipeline by pipeline
    wider = _tp_sets(SearchSpace(max_stages=4, mixed_tp_pipelines=True))
    assert any(len(s) > 1 for s in wider)                 # control: the wider space has mixed pipelines
    assert default < wider


def test_plans_of_a_scenario_have_one_tp_degree_per_pipeline():
    sc = get_scenario("llama8-3types-40")
    res = plan_hpp(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size)
    assert all(len({s.tp_degree for s in p.stages}) == 1 for p in res.plan.pipelines)


def test_tp_degrees_that_do_not_divide_the_heads_are_never_planned():
    profile = load_bundled_profile("OPT-350")
    assert model_head_counts(profile) == (16,)
    assert runnable_tp_degrees(profile) == (1, 2, 4, 8)
    six_heads = replace(profile, meta=dict(profile.meta, heads=6))        # 6 heads: TP 4 and 8 cannot run
    assert runnable_tp_degrees(six_heads) == (1, 2)
    cluster = make_cluster("t", {"A100-40": 8})
    kinds = stage_kinds(cluster, six_heads, SearchSpace())
    assert {k.tp_degree for k in kinds["A100-40"]} == {1, 2}
    kv = replace(profile, meta={"hyper_parameters": {"num_heads": 8, "num_kv_heads": 2}})
    assert runnable_tp_degrees(kv) == (1, 2)
