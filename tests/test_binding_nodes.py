"""Node-aware binding: pipelines on few nodes, TP groups inside nodes, exact on small cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hpp.errors import HppInputError
from hpp.formulation.binding import bind_devices, bind_nodes
from hpp.formulation.binding_score import node_crossings
from hpp.formulation.binding_rules import best_fit_assign, packed_assign
from hpp.formulation.binding_score import BindingScorer, forced_crossings
from hpp.formulation.candidates import Candidate
from hpp.formulation.stage_balance import Partition, StageKind
from hpp.profiles.cluster import Cluster, Link, NetworkLinks, Node
from hpp.profiles.devices import DeviceType

TYPES = ("A", "B", "C", "D")


def make_cluster(nodes: list[tuple[str, int]], *, intra: float = 1e11, inter: float = 1e10) -> Cluster:
    types = {t: DeviceType(t, 2 ** 34, 8) for t, _ in nodes}
    return Cluster("t", types, tuple(Node(t, n, Link(intra)) for t, n in nodes), Link(inter))


def cand(kinds: list[tuple[str, int]], num_layers: int = 12) -> Candidate:
    """A copy with ``kinds`` = (device type, TP) per stage and even layer boundaries."""
    S = len(kinds)
    bnd = tuple(round(i * num_layers / S) for i in range(S + 1))
    part = Partition(bnd, (False,) * S, 1.0, float(S), 0.0, (0.0,) * S, (0.0,) * S)
    return Candidate(tuple(StageKind(t, k) for t, k in kinds), 1, part, {}, {})


def stage_nodes(cluster: Cluster, bound: list[list[tuple[int, ...]]]) -> list[list[int]]:
    """Node of each stage; asserts every TP group is inside one node and no device is used twice."""
    used = [d for row in bound for ids in row for d in ids]
    assert len(used) == len(set(used))
    out = []
    for row in bound:
        nodes = []
        for ids in row:
            assert len({cluster.device(d).node for d in ids}) == 1, f"TP group {ids} spans nodes"
            nodes.append(cluster.device(ids[0]).node)
        out.append(nodes)
    return out


def min_crossings(cluster: Cluster, shapes: list[Candidate]) -> int:
    """Oracle: fewest total node crossings over every feasible assignment (plain enumeration)."""
    groups = [(p, s, k) for p, c in enumerate(shapes) for s, k in enumerate(c.shape)]
    free = [n.num_devices for n in cluster.nodes]
    rows = [[-1] * len(c.shape) for c in shapes]
    found: list[int] = []

    def visit(g: int) -> None:
        if g == len(groups):
            found.append(sum(node_crossings(rows)))
            return
        p, s, k = groups[g]
        for i, n in enumerate(cluster.nodes):
            if n.device_type == k.device_type and free[i] >= k.tp_degree:
                free[i] -= k.tp_degree
                rows[p][s] = i
                visit(g + 1)
                free[i] += k.tp_degree

    visit(0)
    assert found
    return min(found)


# ------------------------------------------------------------------ the example


def test_four_stage_tp2_pipeline_stays_in_the_eight_gpu_node():
    cluster = make_cluster([("A100-80", 8), ("A100-80", 4)])
    shapes = [cand([("A100-80", 2)] * 4)]
    old = best_fit_assign(cluster, [c.shape for c in shapes])
    assert node_crossings(old) == [1]           # control: the original rule crossed the nodes
    bound = bind_devices(cluster, shapes)
    assert stage_nodes(cluster, bound) == [[0, 0, 0, 0]]
    assert bound == [[(0, 1), (2, 3), (4, 5), (6, 7)]]
    assert packed_assign(cluster, [c.shape for c in shapes]) == [[0, 0, 0, 0]]


def test_one_node_binding_is_predicted_faster():
    """The issue's example priced: OPT-350 on 8 + 4 A100-80 (scenario links), old vs new device ids."""
    import dataclasses

    from hpp.formulation.binding import build_plan
    from hpp.formulation.cost_model import estimate_plan
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import make_cluster as scenario_cluster

    profile = load_bundled_profile("OPT-350")
    base = scenario_cluster("8+4", {"A100-80": 12})
    cluster = dataclasses.replace(base, nodes=(dataclasses.replace(base.nodes[0], num_devices=8),
                                               dataclasses.replace(base.nodes[0], num_devices=4)), _cache={})
    plan = build_plan(cluster, model=profile.model, num_layers=profile.num_layers,
                      sequence_length=profile.sequence_length, global_batch_size=64,
                      candidates=[cand([("A100-80", 2)] * 4, profile.num_layers)], counts={0: 1},
                      profile_ref={}, cluster_ref={})
    assert [s.device_ids for s in plan.pipelines[0].stages] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert best_fit_assign(cluster, [[StageKind("A100-80", 2)] * 4]) == [[1, 1, 0, 0]]
    old_ids = [(8, 9), (10, 11), (0, 1), (2, 3)]              # what the original rule bound
    pipe = plan.pipelines[0]
    old = dataclasses.replace(plan, pipelines=(dataclasses.replace(pipe, stages=tuple(
        dataclasses.replace(st, device_ids=ids) for st, ids in zip(pipe.stages, old_ids))),))
    t_new = estimate_plan(plan, cluster, profile).iteration_time_s
    t_old = estimate_plan(old, cluster, profile).iteration_time_s
    assert t_new < t_old


def test_ties_keep_the_original_binding():
    cluster = make_cluster([("A", 4), ("A", 4), ("B", 4)])
    shapes = [cand([("A", 1), ("A", 1)]), cand([("A", 2), ("B", 2)]), cand([("B", 2)])]
    nodes, score, rule = bind_nodes(cluster, shapes)
    assert rule == "best-fit" and score.crossings == 1
    assert nodes == best_fit_assign(cluster, [c.shape for c in shapes])


def test_ring_prefers_holders_on_one_node():
    """Two single-stage copies: both on one node make the gradient ring intra-node."""
    cluster = make_cluster([("A", 2), ("A", 4)])
    shapes = [cand([("A", 1)]), cand([("A", 1)])]
    nodes, score, _ = bind_nodes(cluster, shapes)
    assert nodes[0] == nodes[1] and score.crossings == 0
    assert score.ring_s_per_byte == pytest.approx(12 * Link(1e11).transfer_s(2 ** 26) / 2 ** 26)


def test_split_run_uses_fewest_nodes():
    cluster = make_cluster([("A", 2), ("A", 2), ("A", 4)])
    shapes = [cand([("A", 1)] * 6)]
    for nodes in (packed_assign(cluster, [c.shape for c in shapes]), bind_nodes(cluster, shapes)[0]):
        assert node_crossings(nodes) == [1]


def test_full_nodes_refused_with_one_line_error():
    cluster = make_cluster([("A", 2)])
    with pytest.raises(HppInputError, match="cannot place"):
        bind_devices(cluster, [cand([("A", 2)]), cand([("A", 1)])])


def test_greedy_rules_at_scale_cross_only_where_forced():
    """Above the exact search's size: 24 copies on 8- and 4-device nodes cross only where their types force it."""
    cluster = make_cluster([("A", 8), ("A", 4)] * 8 + [("B", 4)] * 8)
    shapes = [cand([("A", 2)] * 4)] * 8 + [cand([("A", 2), ("B", 2)])] * 16
    assert [forced_crossings(cluster, c.shape) for c in shapes[7:9]] == [0, 1]
    nodes, score, rule = bind_nodes(cluster, shapes)
    assert rule == "packed" and score.crossings == 16
    assert node_crossings(stage_nodes(cluster, bind_devices(cluster, shapes))) == [0] * 8 + [1] * 16
    assert sum(node_crossings(best_fit_assign(cluster, [c.shape for c in shapes]))) > 16      # control


def test_gradient_ring_stays_in_one_zone():
    """Two TP-4 copies on nodes z1, z2, z1: the original rule used nodes 0 and 1 (cross-zone ring)."""
    net = NetworkLinks(inter={("A", "A"): Link(1e10)}, zone_links={("z1", "z2"): Link(1e8)}, zones=("z1", "z2"))
    nodes = (Node("A", 4, Link(1e11), "z1"), Node("A", 4, Link(1e11), "z2"), Node("A", 4, Link(1e11), "z1"))
    cluster = Cluster("zones", {"A": DeviceType("A", 2 ** 34, 4)}, nodes, Link(1e8), net)
    shapes = [cand([("A", 4)]), cand([("A", 4)])]
    assert best_fit_assign(cluster, [c.shape for c in shapes]) == [[0], [1]]     # control
    for exact in (True, False):
        got, score, _ = bind_nodes(cluster, shapes, exact=exact)
        assert got == [[0], [2]]
        assert score.ring_s_per_byte == pytest.approx(12 * Link(1e10).transfer_s(2 ** 26) / 2 ** 26)


# ------------------------------------------------------------------ property test against enumeration


@st.composite
def feasible_instances(draw):
    """A random cluster (2-4 nodes of 2-8 devices, 2-4 types) and copies built from a random placement."""
    num_types = draw(st.integers(2, 4))
    nodes = [(TYPES[draw(st.integers(0, num_types - 1))], draw(st.integers(2, 8)))
             for _ in range(draw(st.integers(2, 4)))]
    cluster = make_cluster(nodes)
    free = [n for _, n in nodes]
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        kinds = []
        for _ in range(draw(st.integers(1, 3))):
            room = [i for i, f in enumerate(free) if f >= 1]
            if not room:
                break
            i = draw(st.sampled_from(room))
            tp = draw(st.sampled_from([t for t in (1, 2, 4) if t <= free[i]]))
            free[i] -= tp
            kinds.append((nodes[i][0], tp))
        if kinds:
            shapes.append(cand(kinds))
    if not shapes:
        shapes.append(cand([(nodes[0][0], 1)]))
    return cluster, shapes


@settings(max_examples=60, deadline=None)
@given(feasible_instances())
def test_crossings_equal_the_enumerated_minimum(inst):
    cluster, shapes = inst
    nodes = stage_nodes(cluster, bind_devices(cluster, shapes))
    assert sum(node_crossings(nodes)) == min_crossings(cluster, shapes)
    crossed, forced = node_crossings(nodes), [forced_crossings(cluster, c.shape) for c in shapes]
    assert all(n >= f for n, f in zip(crossed, forced))
    if sum(forced) == sum(crossed):             # then each pipeline crosses exactly what it must
        assert crossed == forced
    scorer = BindingScorer(cluster, [c.partition.boundaries for c in shapes])
    old = best_fit_assign(cluster, [c.shape for c in shapes])
    if old is not None:                         # never worse than the original rule
        assert not scorer.score(old).better_than(scorer.score(nodes))
