"""The search model's per-type gradient-sync price (hpp.formulation.composition.sync_pricing), by hand.

Cluster: types X and Z, two nodes of 2 devices each; inter links X-X 100 B/s, X-Z 200 B/s,
Z-Z 800 B/s; intra X 1000 B/s, Z 2000 B/s; no latency, no fit. A ring all-reduce of B bytes among
n ranks on b B/s takes 2 (n-1)/n B / b.
"""

import pytest

from hpp.formulation.candidates import Candidate
from hpp.formulation.collectives import allreduce_s
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.objective import block_sync_s, composition_objective_s
from hpp.formulation.stage_balance import Partition, StageKind
from hpp.profiles.cluster_format import cluster_from_dict

TYPES = {t: {"memory_bytes": 10**12, "gpus_per_node": 2} for t in ("X", "Z")}
LINKS = {"intra_node": {"X": 1000, "Z": 2000},
         "inter_node": [{"between": ["X", "X"], "link": 100}, {"between": ["X", "Z"], "link": 200},
                        {"between": ["Z", "Z"], "link": 800}]}


def _cluster():
    nodes = [{"device_type": t, "num_devices": 2} for t in ("X", "X", "Z", "Z")]   # X 0-3, Z 4-7
    return cluster_from_dict({"version": 2, "device_types": TYPES, "nodes": nodes, "links": LINKS, "latency_s": 0})


def _cand(types, stage_bytes):
    part = Partition((0, 1, 2), (False, False), 1.0, 2.0, 0.0, tuple(stage_bytes), (0.0, 0.0), tuple(stage_bytes))
    devices = {}
    for t in types:
        devices[t] = devices.get(t, 0) + 1
    return Candidate(tuple(StageKind(t, 1) for t in types), 1, part, devices, {(t, 1): n for t, n in devices.items()})


def _problem(cluster, **kw):
    # A: X stage (100 B) then Z stage (300 B); B: Z stage (100 B) then X stage (300 B)
    cands = [_cand(("X", "Z"), (100.0, 300.0)), _cand(("Z", "X"), (100.0, 300.0))]
    return CompositionProblem(cands, cluster, 8, cluster.inter_node, **kw)


def test_per_type_sync_price_equals_hand_calculation():
    c = _cluster()
    p = _problem(c)
    assert p.per_type_sync and c.inter_node.max_bytes_per_s == 100
    # 2 copies of A: each stage's 2 holders share a node (g = 2 // 1): X 100/1000, Z 300/2000
    assert p.sync_s(0, 2) == pytest.approx(0.15)
    # 4 copies: hierarchical (2 nodes x 2): X 100/1000 + (100/2)/100 = 0.6; Z 300/2000 + 150/800 = 0.3375
    assert p.sync_s(0, 4) == pytest.approx(0.6)
    # ... which is what the cost model's all-reduce gives on X devices 0-3 (2 nodes)
    assert allreduce_s(100, [(0,), (1,), (2,), (3,)], c).seconds == pytest.approx(0.6)
    # 3 copies: unequal ranks per node -> flat on X-X: 2 (2/3) 100 / 100
    assert p.sync_s(0, 3) == pytest.approx(4 / 3)
    assert p.sync_table_us(0, 4) == [0, 150000, 1333334, 600000]
    # one copy each of A and B: blocks [0,1) 100 B (X of A + Z of B), [1,2) 300 B (Z of A + X of B):
    # mixed rings on the X-Z link: 100/200 = 0.5 and 300/200 = 1.5; the slowest device: 1.5
    assert block_sync_s(p, [0, 1], 2, {0: 1, 1: 1}) == pytest.approx(1.5)
    assert allreduce_s(300, [(4,), (0,)], c).seconds == pytest.approx(1.5)
    assert composition_objective_s(p, {0: 1, 1: 1}) == pytest.approx(5.0 + 1.5)   # T_pipe: 4 micro-batches each, 2 + 3 x 1


def test_flat_and_v1_pricing_keep_the_one_link_rule():
    c = _cluster()
    for p in (_problem(c, flat_sync=True), _problem(c.single_link())):
        assert not p.per_type_sync
        # every ring on the slowest inter link (100 B/s): Z stage of 4 copies 2 (3/4) 300 / 100
        assert p.sync_s(0, 4) == pytest.approx(4.5)
        assert block_sync_s(p, [0, 1], 2, {0: 1, 1: 1}) == pytest.approx(3.0)   # 300 / 100


def test_vectorised_tables_match_the_scalar_price_on_a_bundled_per_pair_scenario():
    from hpp.planner import make_problem
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import get_scenario
    sc = get_scenario("opt350-3types-40")
    problem = make_problem(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size, workers=1)[0]
    assert problem.per_type_sync
    cs = list(range(0, len(problem.candidates), 5))
    tables = problem.sync_tables_us(cs, 12)
    for c, row in zip(cs, tables):
        want = [problem.sync_s(c, h) * 1e6 for h in range(1, 13)]
        assert all(abs(got - w) <= 1.0 for got, w in zip(row, want))
        assert all(got >= w - 1e-3 for got, w in zip(row, want))          # rounded up


def test_vectorised_bandwidth_is_the_link_fit_bit_for_bit():
    """bandwidth_np (the one numpy form of Link.bandwidth_bytes_per_s) equals the scalar fit exactly on the
    bundled network's links, fits that fall at large messages and empty messages included."""
    import numpy as np

    from hpp.formulation.collectives import bandwidth_np, ring_allreduce_np, ring_allreduce_s
    from hpp.scenarios import get_scenario
    cluster = get_scenario("opt350-3types-40").cluster()
    links = {n.intra_node for n in cluster.nodes} | {cluster.inter_node}
    links |= {cluster.type_link(a, b) for a in cluster.count_by_type() for b in cluster.count_by_type()}
    sizes = np.r_[0.0, 0.5, 1.0, np.geomspace(1.0, 1e11, 97)]
    assert any(link.fit_gb_per_s is not None for link in links)
    for link in links:
        assert bandwidth_np(link, sizes).tolist() == [link.bandwidth_bytes_per_s(float(v)) for v in sizes]
        w = np.geomspace(1e3, 1e10, 15)
        for h in (2, 3, 8):
            want = [ring_allreduce_s(float(v), h, link) for v in w]
            assert ring_allreduce_np(w, np.float64(h), link).tolist() == want


def test_the_search_follows_the_cost_models_hierarchical_switch():
    """With hierarchical all-reduce off in the cost model the search prices flat rings too (it priced the
    hierarchical form regardless, so switching it off changed no plan)."""
    from hpp.formulation.cost_config import CostModelConfig
    from hpp.formulation.collectives import ring_allreduce_s
    from hpp.planner import make_problem
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import make_cluster
    cl, prof = make_cluster("c", {"A100-40": 8, "V100-16": 8}), load_bundled_profile("OPT-350")
    on, _ = make_problem(cl, prof, 256)
    off, _ = make_problem(cl, prof, 256, config=CostModelConfig(hierarchical_allreduce=False))
    assert on.hierarchical and not off.hierarchical
    w, links = 4e8, off.type_links["A100-40"]
    flat = ring_allreduce_s(w, 4, links.shared(links.inter, links.flows(2, hierarchical=False)))
    assert off.type_ring_s("A100-40", 2, w, 4) == pytest.approx(flat, rel=1e-12)
    assert on.type_ring_s("A100-40", 2, w, 4) < 0.8 * flat            # the hierarchical form where it is cheaper
