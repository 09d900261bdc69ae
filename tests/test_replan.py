"""Re-planning without some devices (hpp.replan): renumbered clusters, warm seeds, one-line errors."""

from __future__ import annotations

import pytest

from hpp.errors import HppInputError
from hpp.formulation.composition.settings import SolverSettings
from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.replan import (exclude_devices, exclude_nodes, excluded_ids, parse_id_list, replan, seed_from_previous,
                        shrink_cluster)
from hpp.scenarios import get_scenario
from hpp.validate import validate_plan

FAST = SolverSettings(num_workers=1)          # the default, deterministic budget


def small():
    """opt350-a100x4-v100x4: nodes 0 (A100-40, ids 0-3) and 1 (V100-16, ids 4-7)."""
    sc = get_scenario("opt350-a100x4-v100x4")
    return sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size


def test_exclude_devices_renumbers_node_by_node() -> None:
    cluster, _, _ = small()
    out, id_map = shrink_cluster(cluster, excluded_ids(cluster, devices=[1, 6]))
    assert [(n.device_type, n.num_devices) for n in out.nodes] == [("A100-40", 3), ("V100-16", 3)]
    assert id_map == {0: 0, 2: 1, 3: 2, 4: 3, 5: 4, 7: 5}
    assert all(out.devices[new].device_type == cluster.devices[old].device_type for old, new in id_map.items())
    assert out.nodes[1].intra_node == cluster.nodes[1].intra_node and out.inter_node == cluster.inter_node
    assert exclude_devices(cluster, [1, 6]) == out


def test_exclude_nodes_drops_them_and_empty_nodes() -> None:
    cluster, _, _ = small()
    out = exclude_nodes(cluster, [0])
    assert [(n.device_type, n.num_devices) for n in out.nodes] == [("V100-16", 4)]
    assert exclude_devices(cluster, [0, 1, 2, 3]) == out              # a node left empty is dropped


@pytest.mark.parametrize("call, match", [
    (lambda c: exclude_devices(c, [8]), r"device id 8 is not in the cluster \(valid: 0\.\.7\)"),
    (lambda c: exclude_devices(c, [-1]), r"device id -1 is not in the cluster \(valid: 0\.\.7\)"),
    (lambda c: exclude_nodes(c, [2]), r"node index 2 is not in the cluster \(valid: 0\.\.1\)"),
    (lambda c: exclude_devices(c, range(8)), r"excluding 8 devices leaves none of the cluster's 8"),
    (lambda c: exclude_nodes(c, [0, 1]), r"excluding 8 devices leaves none"),
    (lambda c: excluded_ids(c, devices=[0, 1, 2, 3], nodes=[1]), r"leaves none"),
    (lambda c: parse_id_list("3,x", field_name="--exclude-devices"), r"'3,x' is not a list of ids"),
])
def test_bad_exclusions_are_one_line_errors(call, match) -> None:
    cluster, _, _ = small()
    with pytest.raises(HppInputError, match=match) as exc:
        call(cluster)
    assert "\n" not in str(exc.value) and exc.value.fix
    assert parse_id_list(" 3, 7 ", field_name="--exclude-devices") == (3, 7)


def test_replan_without_devices_is_valid_and_uses_none_of_them() -> None:
    cluster, profile, gbs = small()
    previous = plan_hpp(cluster, profile, gbs, settings=FAST).plan
    r = replan(cluster, profile, gbs, exclude_devices=[3, 7], previous=previous, settings=FAST)
    validate_plan(r.result.plan, r.cluster, profile)
    assert r.cluster.num_devices == 6 and r.excluded == {3, 7}
    assert set(r.result.plan.device_ids) <= set(range(6))
    assert sum(p.num_samples for p in r.result.plan.pipelines) == gbs
    assert r.wall_s >= r.search_s > 0 and r.seed_s >= 0
    # the seed: exactly the previous pipelines that avoid devices 3 and 7, rebound, the batch re-split over them
    survivors = [p for p in previous.pipelines if not {3, 7} & set(p.device_ids)]
    assert r.seed is not None and 0 < len(r.seed.pipelines) <= len(survivors) < len(previous.pipelines)
    validate_plan(r.seed, r.cluster, profile)
    assert sum(p.num_samples for p in r.seed.pipelines) == gbs
    assert [[(s.layer_start, s.layer_stop, s.device_type) for s in p.stages] for p in r.seed.pipelines] == \
        [[(s.layer_start, s.layer_stop, s.device_type) for s in p.stages] for p in survivors][:len(r.seed.pipelines)]
    seed_s = estimate_plan(r.seed, r.cluster, profile).iteration_time_s
    assert r.result.estimate.iteration_time_s <= seed_s * (1 + 1e-12)  # never worse than what survived
    # control: on the old cluster the previous plan is faster than anything without two devices
    assert estimate_plan(previous, cluster, profile).iteration_time_s < r.result.estimate.iteration_time_s


def test_seed_is_returned_when_it_is_the_better_plan() -> None:
    """Nothing excluded: the seed is the previous plan re-split on the binding-aware cost model (the search
    prices every stage link as inter-node on a one-link cluster), priced below the greedy search's plan, so it is
    returned. (On the per-pair cluster the search prices a same-node pair intra-node and finds that plan itself.)"""
    _, profile, gbs = small()
    cluster = get_scenario("opt350-a100x4-v100x4").cluster(per_pair=False)
    previous = plan_hpp(cluster, profile, gbs, settings=FAST).plan
    heuristic = SolverSettings(solver="heuristic")
    greedy_s = plan_hpp(cluster, profile, gbs, settings=heuristic).estimate.iteration_time_s
    r = replan(cluster, profile, gbs, exclude_devices=[], previous=previous, settings=heuristic)
    seed_s = estimate_plan(r.seed, r.cluster, profile).iteration_time_s
    assert seed_s < greedy_s                                          # control: the search alone is slower
    assert r.seeded and r.result.plan == r.seed and r.result.estimate.iteration_time_s == seed_s


def test_previous_plan_of_another_model_or_cluster_is_refused() -> None:
    cluster, profile, gbs = small()
    smaller, id_map = shrink_cluster(cluster, {7})
    other = Plan("GPT-Neo-2.7", profile.num_layers, gbs,
                 (Pipeline((Stage(0, profile.num_layers, "A100-40", 1, (0,)),), 1, gbs),))
    with pytest.raises(HppInputError, match="previous plan is of GPT-Neo-2.7"):
        seed_from_previous(other, cluster, smaller, id_map, profile, gbs)
    wrong_type = Plan(profile.model, profile.num_layers, gbs,
                      (Pipeline((Stage(0, profile.num_layers, "V100-16", 1, (0,)),), 1, gbs),))
    with pytest.raises(HppInputError, match=r"puts a V100-16 stage on device 0 \(A100-40 in this cluster\)"):
        seed_from_previous(wrong_type, cluster, smaller, id_map, profile, gbs)


def test_opt350_3types_40_without_one_node() -> None:
    sc = get_scenario("opt350-3types-40")
    cluster, profile = sc.cluster(), load_bundled_profile(sc.model)
    previous = plan_hpp(cluster, profile, sc.global_batch_size, settings=FAST).plan
    r = replan(cluster, profile, sc.global_batch_size, exclude_nodes=[1], previous=previous, settings=FAST)
    validate_plan(r.result.plan, r.cluster, profile)
    assert r.cluster.num_devices == cluster.num_devices - cluster.nodes[1].num_devices
    assert r.seed is not None and r.result.estimate.iteration_time_s <= \
        estimate_plan(r.seed, r.cluster, profile).iteration_time_s * (1 + 1e-12)
