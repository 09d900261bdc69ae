"""Flows that leave a node at once share its network: hand-computed all-reduces and point-to-point transfers.

Links here have no bandwidth fit and no latency, so every figure is plain arithmetic on the peaks:
``ring(B, n, bw) = 2 (n-1)/n * B / bw``. The three node kinds of the public ``k -> k`` measurements
(Sailor's ``multizone_bandwidths_het.json``): sub-linear (A100-40: 2.42 GB/s for one flow, 6.04 GB/s for
four in all), flat (RTX-2080: one NIC, 2.86 GB/s to any number) and linear (GH-96: a NIC per GPU,
22.9 GB/s each). Every all-reduce is also checked against the bandwidth bound
``2 (k-1)/k * B / (the node's largest aggregate bandwidth)`` for ``k`` nodes: no algorithm moves a node's
share of the reduction faster than its network.
"""

from __future__ import annotations

import pytest

from hpp.formulation.collectives import allreduce_s, concurrent_allreduces, edge_link, p2p_flows
from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import Plan, make_pipeline
from hpp.profiles.cluster import AggregateFit, Cluster, Link, Node
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES, DeviceType
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import SCENARIOS
from tests.synthetic import toy_profile

B = 1e9                                 # bytes each holder all-reduces
INTRA = Link(1e11, 0.0)
A100 = Link(2.42e9, 0.0, aggregate=(AggregateFit(4, 6.04e9),))                                    # sub-linear
RTX = Link(2.86e9, 0.0, aggregate=(AggregateFit(2, 2.86e9), AggregateFit(4, 2.86e9), AggregateFit(8, 2.86e9)))
GH = Link(22.9e9, 0.0, aggregate=(AggregateFit(2, 45.7e9), AggregateFit(4, 92.6e9)))              # linear


def ring(nbytes: float, n: int, bw: float) -> float:
    return 2 * (n - 1) / n * nbytes / bw


def cluster(link: Link, nodes: int, per_node: int, device_type: str = "A100-40") -> Cluster:
    return Cluster("c", dict(BUNDLED_DEVICE_TYPES), tuple(Node(device_type, per_node, INTRA) for _ in range(nodes)),
                   link)


def bandwidth_bound(nbytes: float, nodes: int, aggregate_bw: float) -> float:
    return 2 * (nodes - 1) / nodes * nbytes / aggregate_bw


def singles(cl: Cluster) -> list[tuple[int, ...]]:
    return [(d.device_id,) for d in cl.devices]


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_a100_hierarchical_all_reduce_shares_the_node_network(nodes):
    cl = cluster(A100, nodes, 4)
    r = allreduce_s(B, singles(cl), cl)
    # 4 rings of B/4 across the nodes, 4 flows leaving each node: 6.04 / 4 = 1.51 GB/s each
    hier = ring(B, 4, 1e11) + ring(B / 4, nodes, 6.04e9 / 4)
    flat = ring(B, 4 * nodes, 2.42e9)                  # one flow leaves each node: its one-flow bandwidth
    assert hier < flat
    assert (r.method, r.flows) == ("hierarchical", 4)
    assert r.seconds == pytest.approx(hier, rel=1e-12)
    assert r.seconds >= bandwidth_bound(B, nodes, 6.04e9) * (1 - 1e-12)
    # the control: without the aggregate figures each of the 4 flows would run at 2.42 GB/s (below the bound)
    unshared = allreduce_s(B, singles(cl), cluster(Link(2.42e9, 0.0), nodes, 4))
    assert unshared.seconds == pytest.approx(ring(B, 4, 1e11) + ring(B / 4, nodes, 2.42e9), rel=1e-12)
    assert unshared.seconds < bandwidth_bound(B, nodes, 6.04e9)


@pytest.mark.parametrize("nodes", [2, 4])
def test_a100_flat_ring_sends_one_flow_per_node(nodes):
    cl = cluster(A100, nodes, 4)
    r = allreduce_s(B, singles(cl), cl, hierarchical=False)
    assert (r.method, r.flows) == ("ring", 1)
    assert r.seconds == pytest.approx(ring(B, 4 * nodes, 2.42e9), rel=1e-12)
    assert r.seconds >= bandwidth_bound(B, nodes, 6.04e9)


@pytest.mark.parametrize("nodes", [2, 3])
def test_rtx_node_gives_any_number_of_flows_the_same_total(nodes):
    cl = cluster(RTX, nodes, 8, "RTX-2080")
    r = allreduce_s(B, singles(cl), cl)
    hier = ring(B, 8, 1e11) + ring(B / 8, nodes, 2.86e9 / 8)         # 8 flows share 2.86 GB/s
    flat = ring(B, 8 * nodes, 2.86e9)
    assert r.seconds == pytest.approx(min(hier, flat), rel=1e-12)
    assert r.method == ("hierarchical" if hier < flat else "ring")
    assert r.seconds >= bandwidth_bound(B, nodes, 2.86e9) * (1 - 1e-12)
    # hierarchical no longer wins 8x: its inter-node part takes as long as one flow moving all of it
    assert ring(B / 8, nodes, 2.86e9 / 8) == pytest.approx(ring(B, nodes, 2.86e9), rel=1e-12)


def test_gh_node_with_a_nic_per_gpu_scales_linearly():
    cl = cluster(GH, 2, 4, "GH-96")
    r = allreduce_s(B, singles(cl), cl)
    # 4 flows: 92.6 / 4 = 23.15 GB/s each, capped by one flow's own 22.9
    assert r.method == "hierarchical"
    assert r.seconds == pytest.approx(ring(B, 4, 1e11) + ring(B / 4, 2, 22.9e9), rel=1e-12)
    assert r.seconds >= bandwidth_bound(B, 2, 92.6e9)


def test_two_data_parallel_groups_on_the_same_nodes_share_them():
    cl = cluster(A100, 2, 4)
    group_a = [(0,), (1,), (4,), (5,)]            # two holders on each node
    group_b = [(2,), (3,), (6,), (7,)]            # the other two devices of each node: runs at the same time
    costs, flows = concurrent_allreduces([(B, group_a), (B, group_b)], cl)
    assert flows == {0: 4, 1: 4}
    for c in costs:                               # 2 rings of B/2 each, 4 flows per node: 1.51 GB/s each
        assert c.method == "hierarchical"
        assert c.seconds == pytest.approx(ring(B, 2, 1e11) + ring(B / 2, 2, 6.04e9 / 4), rel=1e-12)
        assert c.seconds >= bandwidth_bound(B, 2, 6.04e9)
    alone = allreduce_s(B, group_a, cl)           # alone: 2 flows per node, 2.42 + (6.04 - 2.42) / 3 in all
    assert alone.seconds == pytest.approx(ring(B, 2, 1e11) + ring(B / 2, 2, (2.42e9 + 3.62e9 / 3) / 2), rel=1e-12)
    assert alone.seconds < costs[0].seconds
    # the control: blocks that share a device run one after the other, so they do not share the network
    costs, flows = concurrent_allreduces([(B, group_a), (B, [(0,), (3,), (4,), (7,)])], cl)
    assert flows == {0: 2, 1: 2}
    assert costs[0].seconds == pytest.approx(alone.seconds, rel=1e-12)


def test_mixed_tp_holder_sends_its_pieces_as_one_flow():
    cl = cluster(A100, 2, 4)
    # a TP-1 holder on node 0 and a TP-2 holder on node 1: two shard rings through the same TP-1 device
    costs, flows = concurrent_allreduces([(B, [(0,), (4, 5)])], cl)
    assert flows == {0: 1, 1: 2}
    assert costs[0].seconds == pytest.approx(ring(B, 2, (2.42e9 + 3.62e9 / 3) / 2), rel=1e-12)


def test_p2p_of_two_pipelines_leaving_one_node_at_once():
    types = {"X": 1.0}
    prof = toy_profile(types)
    dev = {"X": DeviceType("X", 10 ** 9, 4)}
    link = Link(2e3, 0.0, aggregate=(AggregateFit(2, 3e3),))        # 2 flows: 1.5e3 each (one flow: 2e3)
    cl = Cluster("c", dev, (Node("X", 2, Link(1e6, 0.0)), Node("X", 2, Link(1e6, 0.0))), link)

    def plan(pipes):
        return Plan(model="toy", num_layers=3, global_batch_size=sum(p.num_samples for p in pipes),
                    pipelines=tuple(pipes))

    one = make_pipeline((0, 1, 3), ["X", "X"], [1, 1], [(0,), (2,)], [False, False], 1, 4)
    two = make_pipeline((0, 1, 3), ["X", "X"], [1, 1], [(1,), (3,)], [False, False], 1, 4)
    assert p2p_flows([(0, 1), (0, 1)]) == {0: 2, 1: 2}
    alone = estimate_plan(plan([one]), cl, prof)
    both = estimate_plan(plan([one, two]), cl, prof)
    x = prof.layer_profile("X", 1, 1).output_bytes[0]               # the activation of layer 0: 5 bytes
    assert alone.pipelines[0].stages[0].p2p_s == pytest.approx(x / 2e3, rel=1e-12)
    assert both.pipelines[0].stages[0].p2p_s == pytest.approx(x / 1.5e3, rel=1e-12)
    assert both.pipelines[1].stages[0].p2p_s == pytest.approx(x / 1.5e3, rel=1e-12)
    assert edge_link(cl, 0, 1, {0: 2, 1: 2}).bandwidth_bytes_per_s(x) == pytest.approx(1.5e3)


def test_nic_capacity_caps_the_flows_of_a_node():
    dev = dict(BUNDLED_DEVICE_TYPES)
    nodes = (Node("A100-40", 4, INTRA, nic_bytes_per_s=4e9), Node("A100-40", 4, INTRA))
    cl = Cluster("c", dev, nodes, Link(2.42e9, 0.0))
    r = allreduce_s(B, singles(cl), cl)
    # node 0's 4 flows share 4 GB/s: 1 GB/s each (below one flow's 2.42)
    assert r.seconds == pytest.approx(min(ring(B, 4, 1e11) + ring(B / 4, 2, 1e9), ring(B, 8, 2.42e9)), rel=1e-12)
    assert r.seconds >= bandwidth_bound(B, 2, 4e9)


def test_eight_data_parallel_a100_ranks_on_two_nodes_cost_at_least_the_network_bound():
    """OPT-350's gradients among 8 one-stage A100-40 pipelines on the bundled opt350-a100x8-v100x8 cluster: at
    least ``2 (k-1)/k B / 6.04 GB/s`` with k = 2 nodes and B = 1.63 GB (the A100-40 4 -> 4 aggregate)."""
    sc = SCENARIOS["opt350-a100x8-v100x8"]
    cl, prof = sc.cluster(), load_bundled_profile("OPT-350")
    e = prof.layer_profile("A100-40", 1, 1)
    pipes = [make_pipeline((0, prof.num_layers), ["A100-40"], [1], [(d,)], [True], 1, 8) for d in range(8)]
    plan = Plan(model="OPT-350", num_layers=prof.num_layers, global_batch_size=64, pipelines=tuple(pipes),
                sequence_length=prof.sequence_length)
    est = estimate_plan(plan, cl, prof)
    nbytes = sum(e.param_bytes)
    assert 1.6e9 < nbytes < 1.7e9
    aggregate = max(a.max_bytes_per_s for a in cl.node_link(0, 1).aggregate)         # 6.036 GB/s at 4 flows
    assert aggregate == pytest.approx(6.036e9, rel=1e-3)
    assert est.grad_sync_s >= 2 * (2 - 1) / 2 * nbytes / aggregate >= 0.270
    assert est.blocks[0].concurrent_flows == 4


def _file_with_link(tmp_path, link) -> str:
    import json
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"version": 2, "nodes": [{"device_type": "A100-40", "num_devices": 4},
                                                        {"device_type": "A100-40", "num_devices": 4}],
                                "links": {"intra_node": {"A100-40": 2e11},
                                          "inter_node": [{"between": ["A100-40", "A100-40"], "link": link}]}}))
    return str(path)


@pytest.mark.parametrize("aggregate, field, words", [
    ([{"flows": 4, "max_bytes_per_s": -6e9}], "links.inter_node[0].link.aggregate[0].max_bytes_per_s",
     "positive number of bytes/s"),
    ([{"flows": 4}], "links.inter_node[0].link.aggregate[0].max_bytes_per_s", "no max_bytes_per_s"),
    ([{"max_bytes_per_s": 6e9}], "links.inter_node[0].link.aggregate[0].flows", "no flows"),
    ([{"flows": 1, "max_bytes_per_s": 6e9}], "links.inter_node[0].link.aggregate[0].flows", "2 or more"),
    ([{"flows": "4", "max_bytes_per_s": 6e9}], "links.inter_node[0].link.aggregate[0].flows", "2 or more"),
    ([{"flows": 4, "max_bytes_per_s": 6e9, "flow": 2}], "links.inter_node[0].link.aggregate[0].flow", "unknown key"),
    ([{"flows": 4, "max_bytes_per_s": 6e9}, {"flows": 4, "max_bytes_per_s": 7e9}],
     "links.inter_node[0].link.aggregate", "repeat"),
    ({"flows": 4}, "links.inter_node[0].link.aggregate", "aggregate="),
])
def test_bad_aggregate_figures_are_one_line_errors(tmp_path, capsys, aggregate, field, words):
    from hpp.cli import main
    path = _file_with_link(tmp_path, {"max_bytes_per_s": 2.42e9, "aggregate": aggregate})
    assert main(["plan", "--cluster", path, "--model", "OPT-350", "--no-baselines"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and path in err and f"field '{field}'" in err and words in err, err


@pytest.mark.parametrize("nic", [-1, 0, "fast", None])
def test_a_bad_nic_capacity_is_a_one_line_error(tmp_path, capsys, nic):
    import json
    from hpp.cli import main
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"nodes": [{"device_type": "A100-40", "num_devices": 4, "nic_bytes_per_s": nic,
                                           "intra_node_bandwidth_bytes_per_s": 2e11}],
                                "inter_node_bandwidth_bytes_per_s": 2e9}))
    assert main(["plan", "--cluster", str(path), "--model", "OPT-350", "--no-baselines"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "field 'nodes[0].nic_bytes_per_s'" in err and "bytes/s" in err, err


def test_aggregate_figures_and_nic_capacity_round_trip():
    from hpp.profiles.cluster_format import cluster_from_dict, cluster_to_dict
    d = {"version": 2, "nodes": [{"device_type": "A100-40", "num_devices": 4, "nic_bytes_per_s": 5e9},
                                 {"device_type": "A100-40", "num_devices": 4}],
         "links": {"intra_node": {"A100-40": 2e11}, "nic_bytes_per_s": {"A100-40": 8e9},
                   "inter_node": [{"between": ["A100-40", "A100-40"],
                                   "link": {"max_bytes_per_s": 2.42e9, "aggregate": [
                                       {"flows": 4, "max_bytes_per_s": 6.04e9, "fit_gb_per_s": [0, 0.5, 4]},
                                       {"flows": 2, "max_bytes_per_s": 3.67e9}]}}]}}
    c = cluster_from_dict(d)
    assert [n.nic_bytes_per_s for n in c.nodes] == [5e9, 8e9]            # the node's own wins over its type's
    link = c.node_link(0, 1)
    assert [a.flows for a in link.aggregate] == [2, 4]                   # sorted by flow count
    assert cluster_from_dict(cluster_to_dict(c)) == c


def test_idle_devices_note_says_how_much_slower_the_best_plan_using_them_was(tmp_path, capsys):
    """4 GH-96 + 4 V100-16 at G = 256: the plan leaves the V100s idle; the note gives the time of the best plan found
    that uses all 8 (a number), and that plan, priced by the cost model, is indeed slower."""
    import json
    from hpp.cli import main
    from hpp.planner import plan_using_idle_devices, make_problem
    from hpp.scenarios import make_cluster
    from hpp.profiles.cluster_format import cluster_to_dict
    cl, prof = make_cluster("gh-v100", {"GH-96": 4, "V100-16": 4}), load_bundled_profile("OPT-350")
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cluster_to_dict(cl)))
    assert main(["plan", "--cluster", str(path), "--model", "OPT-350", "--gbs", "256", "--no-baselines",
                 "--workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    alt = out["search"]["idle_alternative"]
    t = out["predicted"]["iteration_time_s"]
    assert out["search"]["idle_devices"] == 4 and alt["devices_used"] == 8 and alt["iteration_time_s"] > t
    assert main(["plan", "--cluster", str(path), "--model", "OPT-350", "--gbs", "256", "--no-baselines",
                 "--workers", "1"]) == 0
    text = capsys.readouterr().out
    pct = (alt["iteration_time_s"] - t) / t
    assert ("4 of 8 devices are idle (4 x V100-16): using them was not predicted faster" in text
            and f"the best plan found that uses them (8 devices) was predicted {pct:+.1%} "
                f"({alt['iteration_time_s']:.4f} s vs {t:.4f} s)" in text)
    # the control: from a plan that already uses every device there is nothing to add
    problem, _ = make_problem(cl, prof, 256)
    full = {c: 1 for c, cand in enumerate(problem.candidates) if cand.devices == {"GH-96": 4, "V100-16": 4}}
    assert full and plan_using_idle_devices(problem, {next(iter(full)): 1}) is None


# --------------------------------------------------------------------------- properties: sharing never speeds up

from hypothesis import given, settings, strategies as st


@st.composite
def shared_clusters(draw):
    nodes = draw(st.integers(2, 4))
    per = draw(st.integers(1, 4))
    one = draw(st.floats(1e8, 1e10))
    counts = sorted(draw(st.lists(st.integers(2, 8), min_size=0, max_size=3, unique=True)))
    # peaks only, each flow's share not growing with the count (the bundled fits break that at some sizes,
    # where a block run beside others can then cost less than alone; never less than with one-flow links)
    shares = sorted(draw(st.lists(st.floats(0.2, 1.0), min_size=len(counts), max_size=len(counts))), reverse=True)
    agg = tuple(AggregateFit(k, f * k * one) for k, f in zip(counts, shares))
    fit = draw(st.none() | st.tuples(st.floats(-0.05, 0.0), st.floats(0.0, 1.0), st.floats(0.1, 5.0)))
    nic = draw(st.none() | st.floats(1e8, 4e10))
    link = Link(one, draw(st.floats(0.0, 1e-4)), fit, agg)
    cl = Cluster("c", dict(BUNDLED_DEVICE_TYPES),
                 tuple(Node("A100-40", per, INTRA, nic_bytes_per_s=nic if (nic and i == 0) else float("inf"))
                       for i in range(nodes)), link)
    return cl


@settings(max_examples=40, deadline=None)
@given(cl=shared_clusters(), data=st.data())
def test_shared_prices_are_never_below_the_unshared_ones(cl, data):
    """Each block's all-reduce with shared links costs at least its price with one-flow links (what keeps every
    bound of the unshared prices a valid bound), and at least the bound of its busiest node's network."""
    devs = [d.device_id for d in cl.devices]
    h = data.draw(st.integers(2, len(devs)))
    picked = data.draw(st.permutations(devs))[:h]
    width = data.draw(st.integers(1, 2))
    groups = [tuple(picked[i:i + width]) for i in range(0, len(picked), width)]
    if len(groups) < 2:
        return
    nbytes = data.draw(st.floats(1e6, 1e9))
    rest = [(d,) for d in devs if d not in picked]
    blocks = [(nbytes, groups)] + ([(nbytes / 2, rest)] if len(rest) >= 2 else [])     # a device-disjoint block
    shared, flows = concurrent_allreduces(blocks, cl)
    for (w, g), cost in zip(blocks, shared):
        alone = allreduce_s(w, g, cl)                       # this block alone, its own rings sharing the nodes
        assert cost.seconds >= alone.seconds * (1 - 1e-12)
        assert alone.seconds >= allreduce_s(w, g, cl.unshared()).seconds * (1 - 1e-12)
    assert all(k >= 1 for k in flows.values())
