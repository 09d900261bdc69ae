"""The copy bound's two columns of a pipeline that fits one node (:class:`~hpp.formulation.composition.copy_bound_levels.
Search`, :func:`~hpp.formulation.composition.bound_model.crossing_times`), checked against the cost model over every
binding of two copies of a 2-stage pipeline on two nodes of two devices (all 24 device orders), not only the
planner's: each copy whole on one node is priced at least at its one-node column (times of any binding, sync floor
with at most ``node devices - copy devices + 1`` ranks of a ring on its node), each copy that crosses nodes at least
at its crossing column (crossing times, the stage's own floor). Control: the one-node floor is no floor of the
bindings that cross (a hierarchical ring with both copies' stage on one node is cheaper), so it may only price the
copies that do not.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hpp.formulation.composition.bound_model import one_node_copy
from hpp.formulation.composition.copy_bound_levels import Search, floor_tables
from hpp.formulation.candidates import SearchSpace
from hpp.formulation.cost_model import CostModelConfig, estimate_plan
from hpp.plan_data import Plan, make_pipeline
from hpp.planner import make_problem
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import LayerProfile, ModelProfile

GB = 10**9
L = 4


def _instance(params_bytes: int, act_bytes: int) -> tuple[Cluster, ModelProfile]:
    """One type T0 on two nodes of two devices: in-node 100 GB/s, across nodes 2 GB/s; 4 equal layers."""
    base = (0.02, 0.02, 0.02, 0.02)
    e = LayerProfile("T0", 1, 1, base, tuple(2 * f for f in base), (0.002,) * L, (params_bytes,) * L,
                     (act_bytes,) * L, (act_bytes,) * L)
    nodes = tuple(Node("T0", 2, Link(100e9, 1e-5)) for _ in range(2))
    cluster = Cluster("two-nodes", {"T0": DeviceType("T0", 80 * GB, 2)}, nodes, Link(2e9, 1e-5))
    return cluster, ModelProfile("toy", L, 128, {e.key: e}, "synthetic", "CC0")


def _all_bindings(cluster: Cluster, profile: ModelProfile, cand, samples: tuple[int, int]):
    """(whole-node flags per copy, PlanEstimate) of every placement of the 4 stages of 2 copies on devices 0-3."""
    bnd = cand.partition.boundaries
    for perm in itertools.permutations(range(4)):
        ids = [[(perm[2 * p],), (perm[2 * p + 1],)] for p in range(2)]
        whole = tuple(cluster.devices[a[0]].node == cluster.devices[b[0]].node for a, b in ids)
        pipes = tuple(make_pipeline(bnd, ["T0", "T0"], [1, 1], ids[p], [False, False], 1, samples[p])
                      for p in range(2))
        plan = Plan(model="toy", num_layers=L, global_batch_size=sum(samples), pipelines=pipes, sequence_length=128,
                    profile_ref={"name": "toy"}, cluster_ref={})
        yield whole, estimate_plan(plan, cluster, profile, config=CostModelConfig(), estimate_missing=False)


@pytest.mark.parametrize("params_bytes,act_bytes", [(800 * 10**6, 10 * 10**6), (200 * 10**6, 200 * 10**6)])
def test_every_binding_of_two_copies_is_above_its_columns(params_bytes, act_bytes):
    cluster, profile = _instance(params_bytes, act_bytes)
    problem, _ = make_problem(cluster, profile, 8, space=SearchSpace(max_stages=2, micro_batch_sizes=(1,)), workers=1)
    bp = problem.bound_problem()
    c = next(i for i, cand in enumerate(problem.candidates) if len(cand.shape) == 2)
    assert one_node_copy(cluster, problem.candidates[c])
    s = Search(bp)
    cols = np.flatnonzero(s.origin == c)
    assert cols.tolist() == [c, len(bp.candidates) + int(np.isfinite(bp.crossed[:c, 0]).sum())]
    one, cross = cols
    pen = s.penalty(2, 2) - s.opt
    # the one-node floor: no ring inside a node (a node holding a whole copy holds 1 rank of its rings), a flat ring
    # across the two nodes at 2 GB/s: 2 (h-1)/h W / peak, W = the largest stage's gradient (2 layers)
    w = 2 * params_bytes
    assert pen[one] == pytest.approx(w / 2e9, rel=0.02)
    assert pen[cross] < 0.2 * pen[one]             # the stage's own floor admits a ring inside one node
    assert floor_tables(bp, 2)[c, 1] == pytest.approx(pen[cross])      # a candidate's floor: any binding's
    assert s.tau[cross] >= s.tau[one] and s.phi[cross] > s.phi[one]
    seen = {True: 0, False: 0}
    cheaper_than_one_node_floor = 0
    for whole, est in _all_bindings(cluster, profile, problem.candidates[c], (4, 4)):
        for p, pipe in enumerate(est.pipelines):
            col = one if whole[p] else cross
            k = pipe.num_micro_batches
            assert pipe.time_s >= (s.phi[col] + (k - 1) * s.tau[col]) * (1 - 1e-9)
            assert est.grad_sync_s >= pen[col] * (1 - 1e-9)
            seen[whole[p]] += 1
        if not all(whole) and est.grad_sync_s < pen[one]:
            cheaper_than_one_node_floor += 1
    assert seen[True] > 0 and seen[False] > 0
    # control: bindings that cross pay less sync than the one-node floor, which therefore prices whole copies only
    assert cheaper_than_one_node_floor > 0
