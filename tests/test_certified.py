"""Certified plans: the bound is a lower bound of the returned plan's predicted time
over every plan of the candidates, OPTIMAL means equal to it, the figures describe the returned plan, runs
are deterministic and the limits hold.

The property test draws random small instances (2-4 device types, 11-96 GB memory, 6-12 layers, 2-8 GPUs per
type, node sizes 2-4, intra- and inter-node links drawn from the bundled public network fits, non-monotone ones
included) and compares the reported bound with an exhaustive oracle: every multiset of the UNPRUNED candidates
(all pruning rules off) bound to devices and priced by the cost model. ``experiments/certify_check.py`` runs
the same check on >= 2,000 instances.
"""

from __future__ import annotations

import json
import math
import random
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpp.baselines.single_shape import exhaustive_composition
from hpp.errors import HppInputError, InfeasibleError
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.composition.sync_floor import SyncFloor
from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.collectives import ring_allreduce_s
from hpp.formulation.composition.settings import SolverSettings
from hpp.formulation.space_limits import space_violations
from hpp.plan_data import plan_to_dict
from hpp.planner import make_problem, plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.cluster_format import cluster_from_dict
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.pruning.rules import PruningOptions
from hpp.scenarios import SCENARIOS
from hpp.formulation.composition.solve import OPTIMUM_ATOL_S, OPTIMUM_RTOL, gap, solve, status_of

GB = 10**9
NO_PRUNING = PruningOptions(memory_infeasible=False, dominated=False, incumbent_bound=False, symmetry=False,
                            canonical_order=False)


@lru_cache(maxsize=1)
def public_fits() -> tuple[tuple[tuple[float, float, float], float], ...]:
    """Every (fit, peak) of the bundled network file (Sailor's measurements), intra- and inter-node."""
    from importlib import resources
    data = json.loads(resources.files("hpp.profiles").joinpath("data/network.json").read_text())
    out = []
    for per_count in data["intra_node"].values():
        out.extend(tuple(v) for v in per_count.values())
    for per_count in data["inter_node"].values():
        for per_dst in per_count.values():
            out.extend(tuple(v) for v in per_dst.values())
    return tuple(sorted({(tuple(f), float(p)) for f, p in out}))


def is_non_monotone(fit: tuple[float, float, float], peak: float) -> bool:
    """True if the link's effective bandwidth falls somewhere between 1 KB and 4 GB messages."""
    link = Link(peak, 0.0, fit)
    bws = [link.bandwidth_bytes_per_s(2.0 ** k) for k in range(10, 33)]
    return any(b < a * (1 - 1e-9) for a, b in zip(bws, bws[1:]))


def random_instance(seed: int, *, max_gpus_per_type: int = 8, max_types: int = 4, per_pair: bool = False,
                    zoned: bool = False):
    """(cluster, profile, global batch, space) of a random small instance (see the module docstring).

    ``per_pair``: a version-2 cluster instead: one intra-node link per type and one inter-node link
    per pair of types (same type included), each drawn from the public fits; the rest is the same instance.
    ``zoned`` (with ``per_pair``): each node also in one of two zones at random, with a zone link drawn the same
    way (type pairs that only meet across zones keep a link no pair of nodes uses).
    """
    rng = random.Random(seed)
    fits = public_fits()
    n_types = rng.randint(2, max_types)
    L = rng.randint(6, 12)
    params = [rng.randint(100, 900) * 10**6 for _ in range(L)]      # bytes per layer: 0.1-0.9 GB
    act = [rng.randint(50, 400) * 10**6 for _ in range(L)]
    out = [rng.randint(1, 64) * 10**6 for _ in range(L)]
    base = [rng.uniform(0.01, 0.1) for _ in range(L)]
    types, entries, nodes = {}, {}, []
    for i in range(n_types):
        name = f"T{i}"
        mem = rng.choice([11, 16, 24, 40, 48, 80, 96]) * GB
        per_node = rng.choice([2, 4])
        types[name] = DeviceType(name, mem, per_node)
        slow = rng.uniform(0.5, 3.0)
        for b in (1, 2):
            e = LayerProfile(name, 1, b, tuple(f * slow * b for f in base), tuple(2 * f * slow * b for f in base),
                             tuple(0.002 * slow for _ in range(L)), tuple(params), tuple(a * b for a in act),
                             tuple(o * b for o in out))
            entries[e.key] = e
        count = rng.randint(2, max_gpus_per_type)
        while count > 0:
            n = min(per_node, count)
            fit, peak = rng.choice(fits)
            nodes.append(Node(name, n, Link(peak, rng.choice([0.0, 1e-5]), fit)))
            count -= n
    fit, peak = rng.choice(fits)
    cluster = Cluster(f"rand-{seed}", types, tuple(nodes), Link(peak, rng.choice([0.0, 1e-5]), fit))
    if per_pair:
        cluster = _per_pair_cluster(cluster, rng, fits, zoned=zoned)
    profile = ModelProfile("rand", L, 128, entries, "synthetic", "CC0")
    space = SearchSpace(max_stages=rng.choice([2, 3]), micro_batch_sizes=(1, 2) if rng.random() < 0.5 else (2,))
    return cluster, profile, rng.randint(4, 48), space


def _per_pair_cluster(cluster: Cluster, rng: random.Random, fits, *, zoned: bool = False) -> Cluster:
    """The version-2 form of ``cluster`` (same types and node sizes) with links per type and per pair of types;
    ``zoned``: every node in zone z0 or z1 (drawn), and a link between the two zones."""
    def link() -> dict:
        fit, peak = rng.choice(fits)
        return {"max_bytes_per_s": peak, "latency_s": rng.choice([0.0, 1e-5]), "fit_gb_per_s": list(fit)}

    names = sorted(cluster.device_types)
    types = {t: {"memory_bytes": cluster.device_types[t].memory_bytes,
                 "gpus_per_node": cluster.device_types[t].gpus_per_node} for t in names}
    pairs = [{"between": [a, b], "link": link()} for i, a in enumerate(names) for b in names[i:]]
    nodes = [{"device_type": n.device_type, "num_devices": n.num_devices} for n in cluster.nodes]
    links = {"intra_node": {t: link() for t in names}, "inter_node": pairs}
    extra = {}
    if zoned:
        for nd in nodes:
            nd["zone"] = rng.choice(["z0", "z1"])
        extra = {"zones": ["z0", "z1"]}
        links["zones"] = [{"between": ["z0", "z1"], "link": link()}]
    return cluster_from_dict({"version": 2, "name": cluster.name, "device_types": types, **extra, "nodes": nodes,
                              "links": links})


def check_instance(seed: int, *, solver: str, judge: str = "estimate", max_evaluations: int = 3000,
                   max_gpus_per_type: int = 8, max_types: int = 4, work: float = 0.5,
                   per_pair: bool = False, type_classes: bool = False, zoned: bool = False) -> dict | None:
    """Solve the instance of ``seed`` and compare with the exhaustive oracle; None when it is infeasible.

    ``judge="estimate"``: answers and oracle priced by the cost model of the bound plan (what ``hpp plan``
    reports; ~30 ms per multiset); ``"composition"``: by the search's composition model (block-wise ring
    all-reduces over the sync link with its fit; ~0.1 ms), the problem then has no estimator. Returns the
    figures (bound, objective, oracle, status; ``oracle_s`` None when the oracle needed more than
    ``max_evaluations`` multisets); raises AssertionError on a violation. ``work``: the exact solvers'
    deterministic work limit. ``type_classes``: the search also runs the type-class bound.
    """
    cluster, profile, gbs, space = random_instance(seed, max_gpus_per_type=max_gpus_per_type, max_types=max_types,
                                                   per_pair=per_pair, zoned=zoned)
    try:
        problem, _ = make_problem(cluster, profile, gbs, space=space)
        full, _ = make_problem(cluster, profile, gbs, space=space, pruning=NO_PRUNING)
    except (InfeasibleError, HppInputError):
        return None
    if judge == "composition":
        problem.estimator = full.estimator = None
        price = None
    else:
        def price(counts):
            return full.estimator(counts)[1].iteration_time_s
    # the exact solvers see up to 200 candidates whatever the budget (the default skips them above 16 at 0.05)
    res = solve(problem, SolverSettings(solver=solver, num_workers=1, deterministic_time=work, max_candidates=200,
                                        type_classes=type_classes))
    try:
        _, oracle, evals = exhaustive_composition(full, max_evaluations=max_evaluations, price=price)
    except HppInputError:
        oracle, evals = None, 0
    if math.isfinite(res.objective_s):
        own = (problem.estimator(res.counts)[1].iteration_time_s if problem.estimator is not None
               else composition_objective_s(problem, res.counts))
        assert own == res.objective_s
        assert res.bound_s <= res.objective_s * (1 + 1e-9), (seed, res)
    if oracle is not None:
        assert res.bound_s <= oracle * (1 + 1e-9), (seed, solver, judge, res.bound_s, oracle)
        if res.status == "OPTIMAL":
            assert res.objective_s - oracle <= OPTIMUM_ATOL_S + OPTIMUM_RTOL * oracle, (seed, res, oracle)
    links = [n.intra_node for n in cluster.nodes] + [cluster.inter_node] + list(
        (getattr(cluster.network, "inter", None) or {}).values() if getattr(cluster, "network", None) else [])
    return {"seed": seed, "solver": solver, "judge": judge, "status": res.status, "objective_s": res.objective_s,
            "bound_s": res.bound_s, "gap": res.gap, "oracle_s": oracle, "evaluations": evals,
            "candidates": len(problem.candidates), "unpruned_candidates": len(full.candidates),
            "non_monotone_links": sum(is_non_monotone(k.fit_gb_per_s, k.max_bytes_per_s) for k in links)}


def test_public_fits_include_non_monotone_ones():
    fits = public_fits()
    assert len(fits) > 10
    assert any(is_non_monotone(f, p) for f, p in fits)      # the case the old relaxation got wrong
    assert any(not is_non_monotone(f, p) for f, p in fits)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.integers(0, 2**31 - 1))
def test_bound_never_above_the_exhaustive_oracle(seed):
    """300 instances (at most 2 GPUs of each of 2-3 types in CI: ~0.1 s each) judged by the composition model
    (block-wise sync over non-monotone fits: the case of the old false OPTIMAL), heuristic incumbent + LP bound;
    the exact solvers and the cost-model judge below on fewer (their work and the cost-model oracle, ~30 ms per
    plan, are what cost). ``experiments/certify_check.py`` covers 2-4 types x 2-8 GPUs."""
    check_instance(seed, solver="heuristic", judge="composition", max_evaluations=200, max_gpus_per_type=2,
                   max_types=3)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["cp-sat", "milp"]))
def test_exact_solver_bounds_never_above_the_exhaustive_oracle(seed, solver):
    check_instance(seed, solver=solver, judge="composition", max_evaluations=200, max_gpus_per_type=3,
                   max_types=3, work=0.05)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["heuristic", "cp-sat", "milp"]))
def test_bound_never_above_the_exhaustive_oracle_cost_model_judge(seed, solver):
    check_instance(seed, solver=solver, judge="estimate", max_evaluations=60, max_gpus_per_type=2, max_types=2,
                   work=0.05)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["composition", "estimate"]))
def test_bound_never_above_the_exhaustive_oracle_per_pair_links(seed, judge):
    """On version-2 clusters (a link per pair of types, drawn from the public fits) the search's
    per-pair pricing, its dominance rule and the bound's per-type sync floors keep the bound below the oracle."""
    check_instance(seed, solver="heuristic", judge=judge, max_evaluations=60 if judge == "estimate" else 200,
                   max_gpus_per_type=2 if judge == "estimate" else 3, max_types=3, per_pair=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["composition", "estimate"]))
def test_bound_never_above_the_exhaustive_oracle_zoned_clusters(seed, judge):
    """Nodes in two zones: a pair of nodes in different zones uses the zone link, and a type pair that only meets
    across zones keeps a link no ring uses; the search's zone-aware pricing and floors stay below the oracle."""
    check_instance(seed, solver="heuristic", judge=judge, max_evaluations=60 if judge == "estimate" else 200,
                   max_gpus_per_type=2 if judge == "estimate" else 3, max_types=3, per_pair=True, zoned=True)


def test_zoned_control_floors_on_the_zone_link_alone_exceed_the_oracle(monkeypatch):
    """Control: floors that price every inter-node edge on the zone link (same-zone pairs too) are not bounds;
    the zoned property above catches it (on seed 28 among the first 60, and 2 of 120 checks)."""
    import hpp.formulation.composition.sync_floor as sf
    real = sf._inter_links

    def zone_link_only(cluster, device_type=None, *, own=True):
        return list(cluster.network.zone_links.values()) or real(cluster, device_type, own=own)

    monkeypatch.setattr(sf, "_inter_links", zone_link_only)
    with pytest.raises(AssertionError):
        check_instance(28, solver="heuristic", judge="composition", max_evaluations=200, max_gpus_per_type=3,
                       max_types=3, per_pair=True, zoned=True)


def test_sync_floor_is_below_every_split_ring_and_grows_with_h():
    rng = random.Random(3)
    fits = public_fits()
    links = [Link(p, 1e-5, f) for f, p in rng.sample(fits, 6)]
    nodes = tuple(Node("A", 4, link) for link in links[:5])
    cl = Cluster("c", {"A": DeviceType("A", 40 * GB, 4)}, nodes, links[5])
    floor = SyncFloor.of(cl)
    for w in (1e5, 3e7, 2e8, 5e9):
        prev = 0.0
        for h in range(1, 40):
            f = floor.seconds(w, h)
            assert f >= prev                                       # nondecreasing in h
            prev = f
            if h == 1:
                continue
            for link in links:                                     # any split into blocks, any link of the cluster
                for parts in (1, 2, 7):
                    cuts = sorted(rng.uniform(0, w) for _ in range(parts - 1))
                    pieces = [b - a for a, b in zip([0.0, *cuts], [*cuts, w])]
                    assert sum(ring_allreduce_s(x, h, link) for x in pieces) >= f * (1 - 1e-12)


def test_status_and_gap_vocabulary():
    assert gap(10.0, 9.0) == pytest.approx(0.1) and math.isnan(gap(math.inf, 1.0))
    assert status_of(10.0, 10.0 - 1e-6) == "OPTIMAL"
    assert status_of(10.0, 9.0) == "FEASIBLE"
    assert status_of(math.inf, math.nan) == "NO_SOLUTION"
    assert status_of(math.inf, math.nan, infeasible=True) == "INFEASIBLE"


def test_cpsat_params_text_is_parsed_and_bad_text_refused():
    s = SolverSettings(cpsat_params="num_workers:1,random_seed:7")
    from hpp.formulation.composition.cpsat import cpsat_solver
    assert cpsat_solver(s).parameters.random_seed == 7
    with pytest.raises(HppInputError, match="cpsat-params|CP-SAT parameters"):
        SolverSettings(cpsat_params="no_such_field:3")
    with pytest.raises(HppInputError, match="heuristic"):          # the old name is refused, the fix names the new
        SolverSettings(solver="greedy")


SCENARIOS_3 = ("opt350-a100x4-v100x4", "opt350-a100x8-v100x8", "llama8-3types-40")


@pytest.mark.parametrize("name", SCENARIOS_3)
def test_bundled_scenarios_bound_below_prediction_and_runs_identical(name):
    sc = SCENARIOS[name]
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    runs = [plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(num_workers=1, random_seed=1))
            for _ in range(2)]
    a, b = runs
    assert a.search.objective_s == a.estimate.iteration_time_s
    assert a.estimate.iteration_time_s >= a.search.bound_s
    assert a.search.gap == pytest.approx(gap(a.search.objective_s, a.search.bound_s))
    assert json.dumps(plan_to_dict(a.plan)) == json.dumps(plan_to_dict(b.plan))
    assert (a.search.bound_s, a.search.gap, a.search.status) == (b.search.bound_s, b.search.gap, b.search.status)
    assert space_violations(a.plan, SearchSpace(), cluster=cl, profile=prof) == []


def test_limits_hold_for_baselines_seeds_and_the_returned_plan():
    from hpp.baselines.single_shape import run_baselines
    from hpp.baselines.uniform import uniform_baseline
    sc = SCENARIOS["opt350-a100x4-v100x4"]
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    wide = uniform_baseline(cl, prof, sc.global_batch_size, space=SearchSpace(max_stages=8))
    deep = max(p.num_stages for p in wide.plan.pipelines)
    space = SearchSpace(max_stages=min(3, deep - 1))
    assert space_violations(wide.plan, space, cluster=cl, profile=prof)      # the control: outside the space
    for b in run_baselines(cl, prof, sc.global_batch_size, space=space, time_budget_s=5).values():
        assert b.plan is None or space_violations(b.plan, space, cluster=cl, profile=prof) == []
    res = plan_hpp(cl, prof, sc.global_batch_size, space=space, settings=SolverSettings(num_workers=1),
                   seed_plans={"outside": wide.plan})
    assert max(p.num_stages for p in res.plan.pipelines) <= space.max_stages
    assert res.stats.get("seeded_from") != "outside"
    assert res.search.objective_s == res.estimate.iteration_time_s


def test_control_the_old_per_stage_sync_relaxation_is_not_a_bound():
    """The issue's false OPTIMAL: on this instance (non-monotone fits) the old CP-SAT model's per-stage sync prices
    the best plan 2 % ABOVE its block-wise objective; the bound model's sync floor does not (found by
    experiments/certify_check.py)."""
    from hpp.formulation.composition.solve import model_objective_s
    cluster, profile, gbs, space = random_instance(91)
    full, _ = make_problem(cluster, profile, gbs, space=space, pruning=NO_PRUNING)
    full.estimator = None
    counts, oracle, _ = exhaustive_composition(full, max_evaluations=1000)
    assert model_objective_s(full, counts) > oracle * 1.01             # old relaxation: above a feasible objective
    assert model_objective_s(full.bound_problem(), counts) <= oracle    # the floor: below it
    problem, _ = make_problem(cluster, profile, gbs, space=space)
    problem.estimator = None
    res = solve(problem, SolverSettings(solver="cp-sat", num_workers=1, deterministic_time=0.5))
    assert res.bound_s <= oracle * (1 + 1e-9) and res.objective_s >= oracle * (1 - 1e-12)
