"""The bound model's forced node crossings: tighter, still a lower bound of the cost model.

A run of n stages of one kind (TP t) on nodes of at most K devices crosses nodes at least
ceil(n / (K // t)) - 1 times (:mod:`hpp.formulation.composition.bound_model`). Checked per pipeline against the
cost model of bound plans (random plans of random small instances with up to 4 stages on 2-4 GPU nodes),
and against the search's own prices; a control shows the crossings are what makes it tighter.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from hpp.formulation.composition.bound_model import _inter_links, lower_bound_candidates
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.stage_balance import StageKind
from hpp.planner import make_problem
from hpp.profiles.cluster import Node
from tests.test_certified import random_instance

SEEDS = (1, 5, 7, 28)          # instances with 2-GPU nodes: 3-4 stage runs must cross


def _instance(seed: int):
    cluster, profile, gbs, _ = random_instance(seed, max_gpus_per_type=8, max_types=2)
    space = SearchSpace(max_stages=4, micro_batch_sizes=(1, 2))
    problem, _ = make_problem(cluster, profile, gbs, space=space)
    return cluster, profile, gbs, problem


def _forced(cluster, shape) -> int:
    """Least node crossings of the pipeline's runs of equal kinds (the module's rule, by hand)."""
    out, i = 0, 0
    while i < len(shape):
        n = 1
        while i + n < len(shape) and shape[i + n] == shape[i]:
            n += 1
        k = max(nd.num_devices for nd in cluster.nodes if nd.device_type == shape[i].device_type) // shape[i].tp_degree
        out += -(-n // k) - 1
        i += n
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_bound_times_never_above_the_cost_model_of_a_bound_plan(seed):
    cluster, _, _, problem = _instance(seed)
    bound = {}
    for c, b in zip(problem.candidates, problem.bound.candidates):
        assert b.partition.bottleneck_s <= c.partition.bottleneck_s      # never above the search's price
        assert b.partition.fill_s <= c.partition.fill_s * (1 + 1e-9)
        bound[(tuple(c.shape), c.micro_batch_size, c.partition.boundaries)] = b.partition
    rng = random.Random(seed)
    crossing = [i for i, c in enumerate(problem.candidates) if _forced(cluster, c.shape) > 0]
    checked = forced = 0
    for _ in range(25):
        counts = {rng.choice(crossing): 1}
        counts.update({rng.randrange(len(problem.candidates)): rng.randint(1, 2) for _ in range(rng.randint(0, 2))})
        try:
            plan, est = problem.estimator(counts)
        except Exception:          # counts that do not fit the cluster
            continue
        for p, pe in zip(plan.pipelines, est.pipelines):
            shape = tuple(StageKind(s.device_type, s.tp_degree) for s in p.stages)
            part = bound[(shape, p.micro_batch_size, tuple(p.boundaries))]
            fill = pe.time_s - (pe.num_micro_batches - 1) * pe.bottleneck_s
            assert part.bottleneck_s <= pe.bottleneck_s * (1 + 1e-12), (seed, shape)
            assert part.fill_s <= fill * (1 + 1e-9), (seed, shape)
            checked += 1
            forced += _forced(cluster, shape) > 0
    assert checked >= 10
    assert forced >= 1                     # the instances do exercise forced crossings


def test_crossings_tighten_the_bound_control():
    """Control: on the same candidates with nodes made big enough for every run (no crossing forced), the
    bound is never higher, and lower on some candidate with a forced crossing (the cheapest link everywhere)."""
    tighter = 0
    for seed in SEEDS:
        cluster, profile, gbs, problem = _instance(seed)
        big = replace(cluster, nodes=tuple(replace(n, num_devices=max(n.num_devices, 64)) for n in cluster.nodes),
                      _cache={})                     # replace() would share the link-options cache
        loose = lower_bound_candidates(big, profile, problem.candidates, pipeline_link=cluster.inter_node)
        tight = lower_bound_candidates(cluster, profile, problem.candidates, pipeline_link=cluster.inter_node)
        for c, lo, hi in zip(problem.candidates, loose, tight):
            assert lo.partition.fill_s <= hi.partition.fill_s * (1 + 1e-12)
            assert lo.partition.bottleneck_s <= hi.partition.bottleneck_s * (1 + 1e-12)
            if _forced(cluster, c.shape) and hi.partition.fill_s > lo.partition.fill_s * (1 + 1e-6):
                tighter += 1
    assert tighter >= 1


def test_inter_links_of_a_version_1_cluster():
    cluster, _, _, _ = random_instance(3, max_gpus_per_type=8, max_types=2)
    t = cluster.nodes[0].device_type
    many = sum(n.device_type == t for n in cluster.nodes) >= 2
    assert _inter_links(cluster, t) == ((cluster.inter_node,) if many else ())
    one = replace(cluster, nodes=(Node(t, 2, cluster.nodes[0].intra_node),), _cache={})
    assert _inter_links(one, t) == ()
