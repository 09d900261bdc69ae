"""Costs on the actual links, checked against hand calculations.

A 3-type cluster (X, Y, Z; user-defined types, so no measured defaults) whose three inter-node
type pairs have different links; a plan whose pipelines share blocks across types. Links have no
latency and no fit, so a transfer of x bytes over b bytes/s takes x / b s and a 2-rank ring
all-reduce of B bytes takes 2 (1/2) B / b = B / b.
"""

import pytest

from hpp.formulation.collectives import allreduce_lower_bound_s, allreduce_s, p2p_link_options
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.profiles.cluster import Link
from hpp.profiles.cluster_format import cluster_from_dict
from tests.synthetic import toy_profile

TYPES = {t: {"memory_bytes": 10**12, "gpus_per_node": 2} for t in ("X", "Y", "Z")}
LINKS = {"intra_node": {"X": 1000, "Y": 500, "Z": 2000},
         "inter_node": [{"between": ["X", "Y"], "link": 100}, {"between": ["X", "Z"], "link": 200},
                        {"between": ["Y", "Z"], "link": 400}, {"between": ["Z", "Z"], "link": 800}]}


def three_type_cluster(z_nodes=2, z_size=2):
    nodes = [{"device_type": "X", "num_devices": 2}, {"device_type": "Y", "num_devices": 2}]
    nodes += [{"device_type": "Z", "num_devices": z_size}] * z_nodes
    return cluster_from_dict({"version": 2, "device_types": TYPES, "nodes": nodes, "links": LINKS, "latency_s": 0})


PROFILE = toy_profile({"X": 1.0, "Y": 2.0, "Z": 1.5})       # 3 layers; out (5, 6, 7) B; params (100, 200, 300) B


def _plan(pipes):
    return Plan("toy", 3, sum(p.num_samples for p in pipes), tuple(pipes))


def test_cluster_links_per_pair():
    c = three_type_cluster()                 # devices: X 0-1 (node 0), Y 2-3 (1), Z 4-5 (2), Z 6-7 (3)
    assert [c.link(0, 2).max_bytes_per_s, c.link(0, 4).max_bytes_per_s, c.link(2, 4).max_bytes_per_s,
            c.link(4, 6).max_bytes_per_s, c.link(4, 5).max_bytes_per_s] == [100, 200, 400, 800, 2000]
    assert c.inter_node.max_bytes_per_s == 100                    # the slowest pair: the one-link view
    assert c.link_bound(["Y", "Z"]) == Link(2000.0, 0.0)          # fastest of intra Y/Z, Y-Z, Z-Z
    assert c.link_bound(["X"]) == Link(1000.0, 0.0)


def test_p2p_and_block_allreduce_equal_the_hand_calculation():
    c = three_type_cluster()
    p0 = Pipeline((Stage(0, 1, "X", 1, (0,)), Stage(1, 3, "Z", 1, (4,))), 1, 2)
    p1 = Pipeline((Stage(0, 2, "Y", 1, (2,)), Stage(2, 3, "Z", 1, (6,))), 1, 2)
    est = estimate_plan(_plan([p0, p1]), c, PROFILE)
    # p2p: P0 sends out[0] = 5 B over X-Z (200 B/s); P1 sends out[1] = 6 B over Y-Z (400 B/s)
    assert est.pipelines[0].stages[0].p2p_s == pytest.approx(5 / 200)
    assert est.pipelines[1].stages[0].p2p_s == pytest.approx(6 / 400)
    # blocks: [0,1) held by X dev 0 + Y dev 2 (X-Y link), [1,2) by Z dev 4 + Y dev 2 (Y-Z), [2,3) by Z 4 + Z 6 (Z-Z)
    assert [(b.layer_start, b.num_bytes) for b in est.blocks] == [(0, 100), (1, 200), (2, 300)]
    assert [b.allreduce_s for b in est.blocks] == pytest.approx([100 / 100, 200 / 400, 300 / 800])
    # each block says its form and the link it is priced on (hpp plan prints both, its JSON has them)
    assert [(b.allreduce_method, b.link_bytes_per_s) for b in est.blocks] == [("ring", 100), ("ring", 400),
                                                                               ("ring", 800)]
    # a device serialises its blocks: Y dev 2 holds [0,1) and [1,2): 1.0 + 0.5 s, the slowest device
    assert est.grad_sync_block_s == pytest.approx(1.5)
    # the one-link model priced every block on X-Y (100 B/s): 1 + 2 on dev 2, 2 + 3 on dev 4
    old = estimate_plan(_plan([p0, p1]), c.single_link(), PROFILE)
    assert old.grad_sync_block_s == pytest.approx(5.0)
    assert old.pipelines[0].stages[0].p2p_s == pytest.approx(5 / 100)


def test_best_ring_order_avoids_the_slow_pair():
    c = three_type_cluster()
    # ranks on X, Y, Z, Z nodes: any ring joins X to Y or X to Z and Y to Z or Z to X ...; the best cyclic
    # order X-Z-Z-Y-X has edges X-Z 200, Z-Z 800, Z-Y 400, Y-X 100: the X-Y pair cannot be avoided with
    # 3 classes on a ring of classes (each class is next to both others), so the slowest edge is 100
    r = allreduce_s(400, [(0,), (2,), (4,), (6,)], c)
    assert r.method == "ring" and r.seconds == pytest.approx(2 * 3 / 4 * 400 / 100)
    # without the X rank the ring is Y-Z-Z-Y: the slowest edge is Y-Z (400), not the cluster's slowest
    r = allreduce_s(300, [(2,), (4,), (6,)], c)
    assert r.seconds == pytest.approx(2 * 2 / 3 * 300 / 400)
    assert set(r.order) == {2, 4, 6} and r.order.index(4) + 1 == r.order.index(6)     # Z nodes adjacent


def test_hierarchical_versus_flat_as_calculated():
    c = three_type_cluster()
    B = 1000.0
    # 4 ranks, 2 per Z node: flat ring = 2 (3/4) B / 800 (Z-Z is its slowest edge; intra Z 2000)
    flat = 2 * 3 / 4 * B / 800
    # hierarchical = ring of 2 inside each node (B / 2000) + 2 rings of B/2 across the 2 nodes ((B/2) / 800)
    hier = B / 2000 + (B / 2) / 800
    assert hier < flat
    r = allreduce_s(B, [(4,), (5,), (6,), (7,)], c)
    assert (r.method, r.seconds, r.link) == ("hierarchical", pytest.approx(hier), Link(800, 0.0))
    assert allreduce_s(B, [(4,), (5,), (6,), (7,)], c, hierarchical=False).seconds == pytest.approx(flat)
    # 3 ranks on one Z node and 1 on the other: no equal split, so the flat ring (slowest edge Z-Z)
    c4 = three_type_cluster(z_size=4)       # Z nodes: devices 4-7 and 8-11
    r = allreduce_s(B, [(4,), (5,), (6,), (8,)], c4)
    assert (r.method, r.seconds) == ("ring", pytest.approx(2 * 3 / 4 * B / 800))
    # all ranks on one node: a ring on its intra-node link
    r = allreduce_s(B, [(4,), (5,)], c)
    assert (r.method, r.seconds, r.link) == ("ring", pytest.approx(B / 2000), Link(2000, 0.0))
    # the lower bound from link_bound is below each of them
    bound = c.link_bound(["Z"])
    assert allreduce_lower_bound_s(B, 4, bound) <= hier
    assert allreduce_lower_bound_s(B, 4, bound) == pytest.approx(1.5 * B / 2000)


def test_hierarchical_enters_the_estimate_and_can_be_switched_off():
    c = three_type_cluster()
    pipes = [Pipeline((Stage(0, 3, "Z", 1, (d,)),), 1, 1) for d in (4, 5, 6, 7)]
    on = estimate_plan(_plan(pipes), c, PROFILE)
    off = estimate_plan(_plan(pipes), c, PROFILE, config=CostModelConfig(hierarchical_allreduce=False))
    B = 600.0                                               # the whole model in one block
    assert on.grad_sync_block_s == pytest.approx(B / 2000 + (B / 2) / 800)
    assert off.grad_sync_block_s == pytest.approx(2 * 3 / 4 * B / 800)
    from hpp.cli_output import block_forms
    assert block_forms(on.blocks) == " (1 hierarchical; slowest ring link 8e-07 GB/s peak)"
    assert block_forms(off.blocks) == " (1 flat ring; slowest ring link 8e-07 GB/s peak)"
    assert block_forms(estimate_plan(_plan(pipes[:1]), c, PROFILE).blocks) == ""        # one holder: no sync


def test_tp_shards_form_parallel_rings():
    c = three_type_cluster()
    # two TP-2 holders, one on the Y node and one on a Z node: shard rings (2, 4) and (3, 5), both Y-Z
    r = allreduce_s(400, [(2, 3), (4, 5)], c)
    assert r.seconds == pytest.approx(400 / 400)


def test_search_link_options_per_pair_of_stage_kinds():
    c = three_type_cluster()
    assert p2p_link_options(c, ("X", 1), ("Z", 1)) == (Link(200, 0.0),)
    # two Z stages of TP 1 can share a 2-device Z node: intra (2000) or Z-Z (800); TP 2 + TP 1 cannot
    assert p2p_link_options(c, ("Z", 1), ("Z", 1)) == (Link(2000, 0.0), Link(800, 0.0))
    assert p2p_link_options(c, ("Z", 2), ("Z", 1)) == (Link(800, 0.0),)
    # one-link clusters keep the planner's one link
    assert p2p_link_options(c.single_link(), ("Z", 1), ("Z", 1)) == (c.inter_node,)
