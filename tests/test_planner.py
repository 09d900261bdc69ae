"""Planner: stage balance vs brute force, exact data balance, CP-SAT vs the exhaustive oracle, invariants."""

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hpp.baselines.single_shape import exhaustive_composition, single_shape_baseline
from hpp.baselines.uniform import uniform_baseline
from hpp.errors import HppInputError, InfeasibleError
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.composition.settings import SolverSettings
from hpp.formulation.data_balance import balance_data
from hpp.formulation.stage_balance import StageBalancer, StageKind
from hpp.formulation.collectives import pipeline_link
from hpp.planner import make_problem, plan_hpp
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan
from hpp.formulation.composition.bound_model import lower_bound_candidates
from hpp.formulation.stage_costs import StageCostCache
from hpp.pruning.rules import PruningOptions
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import get_scenario
from hpp.validate import validate_plan
from tests.synthetic import toy_cluster, toy_profile

FAST = SolverSettings(max_time_in_seconds=30.0, deterministic_time=30.0, num_workers=1, random_seed=0)


@st.composite
def instances(draw):
    L = draw(st.integers(3, 8))
    fwd = tuple(draw(st.lists(st.floats(0.5, 5.0), min_size=L, max_size=L)))
    act = tuple(draw(st.lists(st.integers(1, 50), min_size=L, max_size=L)))
    params = tuple(draw(st.lists(st.integers(1, 100), min_size=L, max_size=L)))
    out = tuple(draw(st.lists(st.integers(1, 10), min_size=L, max_size=L)))
    slow = draw(st.floats(1.0, 3.0))
    prof = toy_profile({"A": 1.0, "B": slow}, fwd=fwd, act=act, params=params, out=out, opt=(0.01,) * L,
                       sizes=(1, 2))
    na, nb = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    total_w = 4 * sum(params)
    mem_b = draw(st.integers(total_w // 3, 2 * total_w + 400))
    cl = toy_cluster([("A", na), ("B", nb)], memory={"A": 4 * total_w + 1000, "B": mem_b}, bw=1000.0)
    gbs = draw(st.integers(1, 40))
    return prof, cl, gbs


def _brute_partitions(cache, shape, b, L):
    """All memory-feasible partitions as (bottleneck, fill) pairs (no recomputation)."""
    out = []
    S = len(shape)
    for cuts in itertools.combinations(range(1, L), S - 1):
        bnd = (0, *cuts, L)
        times, fill = [], 0.0
        ok = True
        for i, k in enumerate(shape):
            tab = cache.table(k.device_type, k.tp_degree, b)
            lo, hi = bnd[i], bnd[i + 1]
            if tab.memory_bytes(S - i, False)[lo, hi] > tab.capacity_bytes:
                ok = False
                break
            times.append(tab.compute_none_s[lo, hi])
            fill += tab.compute_none_s[lo, hi] + 2 * tab.p2p_s[hi]
        if ok:
            out.append((max(times), fill))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.integers(1, 3))
def test_stage_balance_equals_brute_force(inst, S):
    prof, cl, _ = inst
    cache = StageCostCache(prof, {t: d.memory_bytes for t, d in cl.device_types.items()}, pipeline_link(cl))
    bal = StageBalancer(cache, allow_recompute=False)
    shape = tuple([StageKind("A", 1)] * (S // 2) + [StageKind("B", 1)] * (S - S // 2))
    if len(shape) > prof.num_layers:
        return
    part = bal.balance(shape, 1)
    few = bal.balance(shape, 1, objective="fill")
    brute = _brute_partitions(cache, shape, 1, prof.num_layers)
    if not brute:
        assert part is None and few is None
    else:
        tau = min(t for t, _ in brute)
        phi_at_tau = min(f for t, f in brute if t <= tau * (1 + 1e-12))
        assert part.bottleneck_s == pytest.approx(tau, rel=1e-9)
        assert part.fill_s == pytest.approx(phi_at_tau, rel=1e-9)
        phi = min(f for _, f in brute)
        tau_at_phi = min(t for t, f in brute if f <= phi * (1 + 1e-12))
        assert few.fill_s == pytest.approx(phi, rel=1e-9)
        assert few.bottleneck_s == pytest.approx(tau_at_phi, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 5.0), st.floats(0.0, 10.0), st.integers(1, 4)), min_size=1, max_size=5),
       st.integers(1, 200))
def test_data_balance_exact_and_optimal(pipes, G):
    tau = [p[0] for p in pipes]
    phi = [p[0] + p[1] for p in pipes]
    b = [p[2] for p in pipes]
    res = balance_data(tau, phi, b, G)
    assert sum(res.num_samples) == G
    assert all(n >= 0 for n in res.num_samples)
    assert all(m == -(-n // bb) for n, m, bb in zip(res.num_samples, res.num_micro_batches, b))
    # optimal: brute force over micro-batch counts for small G
    if G <= 20 and len(pipes) <= 3:
        best = math.inf
        for ms in itertools.product(*(range(0, -(-G // bb) + 1) for bb in b)):
            if sum(m * bb for m, bb in zip(ms, b)) >= G:
                best = min(best, max((ph + (m - 1) * t) if m else 0.0 for m, t, ph in zip(ms, tau, phi)))
        assert res.time_s == pytest.approx(best, rel=1e-9)


def test_data_balance_prime_global_batch():
    res = balance_data([1.0, 1.5], [2.0, 3.0], [4, 2], 997)
    assert sum(res.num_samples) == 997


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_planner_equals_exhaustive_oracle(inst):
    prof, cl, gbs = inst
    space = SearchSpace(max_stages=3, allow_recompute=False)
    try:
        problem, _ = make_problem(cl, prof, gbs, space=space, pruning=PruningOptions())
    except InfeasibleError:
        return
    full, _ = make_problem(cl, prof, gbs, space=space, pruning=PruningOptions(
        memory_infeasible=False, dominated=False, incumbent_bound=False, canonical_order=False))
    _, oracle_obj, _ = exhaustive_composition(full, price=lambda c: full.estimator(c)[1].iteration_time_s)
    res = plan_hpp(cl, prof, gbs, space=space, settings=FAST)
    # one latency-free link everywhere: the bound model is exact on one-bucket syncs, CP-SAT closes it
    assert res.search.bound_s <= oracle_obj * (1 + 1e-9)
    assert res.search.status == "OPTIMAL"
    assert res.search.objective_s == pytest.approx(oracle_obj, rel=1e-3, abs=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_plan_invariants(inst):
    prof, cl, gbs = inst
    try:
        res = plan_hpp(cl, prof, gbs, space=SearchSpace(max_stages=3), settings=FAST)
    except InfeasibleError as exc:
        assert "falls short by" in str(exc)
        return
    plan = res.plan
    assert res.estimate.iteration_time_s == pytest.approx(res.search.objective_s, rel=1e-6)
    validate_plan(plan, cl, prof)                       # layers, devices, samples, TP fit
    for p in plan.pipelines:
        covered = [l for s in p.stages for l in range(s.layer_start, s.layer_stop)]
        assert covered == list(range(prof.num_layers))  # every layer exactly once
        assert all(s.layer_stop > s.layer_start for s in p.stages)
    assert sum(p.num_samples for p in plan.pipelines) == gbs
    ids = plan.device_ids
    assert len(ids) == len(set(ids))
    est = estimate_plan(plan, cl, prof)
    assert est.fits_memory
    # never slower than the baselines it can express. The search's stage balance keeps, per shape, the
    # least-bottleneck and least-fill partitions only; a pipeline with slack could prefer a partition with
    # less gradient sync (found by a fuzz: 103.664 s vs uniform's 103.632 s), so unseeded it is within 1 %,
    # and seeded with the baselines' plans (as `hpp plan` runs it) never slower.
    space = SearchSpace(max_stages=3)
    bases = [uniform_baseline(cl, prof, gbs, space=SearchSpace(max_stages=3, allow_recompute=False)),
             single_shape_baseline(cl, prof, gbs, space=space)]
    expressible = {b.name: b for b in bases if b.feasible and all(
        p.num_stages <= 3 and len({s.device_type for s in p.stages}) <= 2 for p in b.plan.pipelines)}
    for base in expressible.values():
        assert res.estimate.iteration_time_s <= base.iteration_time_s * 1.01
    seeded = plan_hpp(cl, prof, gbs, space=space, settings=FAST,
                      seed_plans={k: b.plan for k, b in expressible.items()})
    validate_plan(seeded.plan, cl, prof)
    assert estimate_plan(seeded.plan, cl, prof).fits_memory
    for base in expressible.values():
        assert seeded.estimate.iteration_time_s <= base.iteration_time_s * (1 + 1e-9)


def test_default_scenario_beats_uniform_and_matches_or_beats_single_shape():
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import get_scenario
    sc = get_scenario("opt350-a100x4-v100x4")
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    settings_ = SolverSettings(max_time_in_seconds=5, num_workers=2)
    res = plan_hpp(cl, prof, sc.global_batch_size, settings=settings_)
    validate_plan(res.plan, cl, prof)
    uni = uniform_baseline(cl, prof, sc.global_batch_size)
    single = single_shape_baseline(cl, prof, sc.global_batch_size)
    assert res.estimate.iteration_time_s < uni.iteration_time_s / 1.5
    # the search's own model prices links and sync more coarsely than the cost model (see planner notes):
    # unseeded it stays within 2 % of single-shape; seeded with the baselines (as `hpp plan` does) never worse
    assert res.estimate.iteration_time_s <= single.iteration_time_s * 1.02
    seeded = plan_hpp(cl, prof, sc.global_batch_size, settings=settings_,
                      seed_plans={"uniform": uni.plan, "single-shape": single.plan})
    assert seeded.estimate.iteration_time_s <= min(uni.iteration_time_s, single.iteration_time_s) * (1 + 1e-12)


def test_infeasible_cluster_reports_shortfall():
    prof = toy_profile({"A": 1.0}, params=(1000, 1000, 1000))
    cl = toy_cluster([("A", 2)], memory={"A": 3000})
    with pytest.raises(InfeasibleError, match=r"falls short by .* GiB"):
        plan_hpp(cl, prof, 8, settings=FAST)


def test_device_type_missing_from_profile_is_named():
    prof = toy_profile({"A": 1.0})
    cl = toy_cluster([("A", 1), ("B", 1)], memory={"A": 10**6, "B": 10**6})
    with pytest.raises(HppInputError, match="'B'.*no profile"):
        plan_hpp(cl, prof, 8, settings=FAST)


def test_global_batch_smaller_than_pipelines_uses_fewer_pipelines():
    prof = toy_profile({"A": 1.0})
    cl = toy_cluster([("A", 4)], memory={"A": 10**6})
    res = plan_hpp(cl, prof, 2, settings=FAST)
    assert sum(p.num_samples for p in res.plan.pipelines) == 2
    assert all(p.num_samples > 0 for p in res.plan.pipelines)
    assert res.plan.num_pipelines <= 2


def test_time_limit_returns_best_so_far_with_gap():
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import get_scenario
    sc = get_scenario("opt350-a100x8-v100x8")
    res = plan_hpp(sc.cluster(), load_bundled_profile(sc.model), 1024,
                   settings=SolverSettings(max_time_in_seconds=0.5, num_workers=1))
    assert res.search.status in ("OPTIMAL", "FEASIBLE")
    assert 0.0 <= res.search.gap < 1.0
    assert res.plan.num_pipelines >= 1


def test_vectorised_dominance_equals_the_named_rule():
    from hpp.formulation.candidates import remove_dominated
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.pruning.rules import dominates
    from hpp.scenarios import get_scenario
    sc = get_scenario("opt350-a100x4-v100x4")
    problem, _ = make_problem(sc.cluster(), load_bundled_profile(sc.model), 1024,
                              pruning=PruningOptions(dominated=False))
    c = problem.candidates
    order = sorted(range(len(c)), key=lambda i: (c[i].partition.bottleneck_s, c[i].partition.fill_s,
                                                 c[i].num_devices, i))
    kept, by_b = [], {}
    for i in order:
        if not any(dominates(k, c[i]) for k in by_b.get(c[i].micro_batch_size, ())):
            kept.append(c[i])
            by_b.setdefault(c[i].micro_batch_size, []).append(c[i])
    fast = remove_dominated(c)
    assert [id(x) for x in fast] == [id(x) for x in kept]
    assert len(fast) < len(c)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_recomputation_only_grows_the_space(inst):
    prof, cl, gbs = inst
    space = SearchSpace(max_stages=3)
    try:
        without = plan_hpp(cl, prof, gbs, space=SearchSpace(max_stages=3, allow_recompute=False), settings=FAST)
    except InfeasibleError:
        without = None
    try:
        with_rec = plan_hpp(cl, prof, gbs, space=space, settings=FAST)
    except InfeasibleError:
        assert without is None          # recomputation can only make more shapes fit
        return
    if without is not None and without.search.status == with_rec.search.status == "OPTIMAL":
        assert with_rec.search.objective_s <= without.search.objective_s * (1 + 1e-9)
    if without is None:                 # whatever fits now needs recomputation somewhere
        assert any(s.recompute == "full" for p in with_rec.plan.pipelines for s in p.stages)


def test_llama8_needs_recomputation():
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import get_scenario
    sc = get_scenario("llama8-3types-40")
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    # without recomputation only deep pipelines whose first stage holds 1-2 layers fit (one pipeline);
    # with it, many more pipelines fit and the plan is much faster
    without = plan_hpp(cl, prof, sc.global_batch_size, space=SearchSpace(allow_recompute=False), settings=FAST)
    res = plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(max_time_in_seconds=3, num_workers=1))
    validate_plan(res.plan, cl, prof)
    assert any(s.recompute == "full" for p in res.plan.pipelines for s in p.stages)
    assert estimate_plan(res.plan, cl, prof).fits_memory
    assert res.estimate.iteration_time_s < without.estimate.iteration_time_s / 1.2
    # and with fewer stages allowed, nothing fits without recomputation: the shortfall is reported
    with pytest.raises(InfeasibleError, match=r"does not fit in memory.*falls short by"):
        plan_hpp(cl, prof, sc.global_batch_size, space=SearchSpace(allow_recompute=False, max_stages=2),
                 settings=FAST)


# --- candidates built in forked workers equal one process's -------------------------------------------

def _cand_keys(problem):
    return [(c.shape, c.micro_batch_size, c.partition, c.devices, c.tp_groups) for c in problem.candidates]


@pytest.mark.parametrize("rule_off", [None, "dominated", "memory_infeasible"])
def test_candidates_from_workers_equal_one_process(monkeypatch, rule_off):
    from hpp.formulation import candidates as cmod
    monkeypatch.setattr(cmod, "PARALLEL_MIN_PAIRS", 0)
    sc = get_scenario("opt350-a100x8-v100x8")
    prof = load_bundled_profile(sc.model)
    pruning = PruningOptions() if rule_off is None else PruningOptions().without(rule_off)
    one, s1 = make_problem(sc.cluster(), prof, sc.global_batch_size, pruning=pruning, workers=1)
    two, s2 = make_problem(sc.cluster(), prof, sc.global_batch_size, pruning=pruning, workers=2)
    assert s1["workers"] == 1 and s2["workers"] == 2
    assert _cand_keys(one) == _cand_keys(two)
    # the bound model ran inside the workers on their shares: the same lower-bound records as one call on all
    assert _cand_keys(one.bound) == _cand_keys(two.bound)
    cache = StageCostCache.for_cluster(sc.cluster(), prof, CostModelConfig(), global_batch_size=sc.global_batch_size)
    direct = lower_bound_candidates(sc.cluster(), prof, one.candidates, pipeline_link=cache.link,
                                    priced_links=cache.links)
    assert [(c.shape, c.micro_batch_size, c.partition) for c in direct] == \
        [(c.shape, c.micro_batch_size, c.partition) for c in one.bound.candidates]
    assert any(b.partition != c.partition for b, c in zip(one.bound.candidates, one.candidates))
    for k in ("shapes", "balanced", "infeasible", "dominated", "fill_variants", "shapes_pruned_memory",
              "dp_rows_computed", "dp_rows_reused"):
        assert s1[k] == s2[k], k
    assert s1["cache"]["misses"] == s2["cache"]["misses"]


def test_an_error_in_a_worker_reaches_the_caller(monkeypatch):
    from hpp.formulation import candidates as cmod
    monkeypatch.setattr(cmod, "PARALLEL_MIN_PAIRS", 0)
    real = cmod._balance_shapes

    def failing(shapes, sizes, balancer, pruning, keep_b):
        if keep_b is not None and 1 not in keep_b:
            raise HppInputError("profile entry missing", field="profile", fix="profile it")
        return real(shapes, sizes, balancer, pruning, keep_b)

    monkeypatch.setattr(cmod, "_balance_shapes", failing)
    sc = get_scenario("opt350-a100x8-v100x8")
    with pytest.raises(HppInputError, match="profile entry missing"):
        make_problem(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size, workers=2)


def test_a_negative_worker_count_is_refused_by_the_library():
    sc = get_scenario("opt350-a100x8-v100x8")
    with pytest.raises(HppInputError) as ei:
        make_problem(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size, workers=-5)
    assert str(ei.value) == "field '--workers': workers=-5. Fix: give 0 (one per core) or more"


def test_plan_hpp_names_a_cluster_that_is_not_one():
    sc = get_scenario("opt350-a100x4-v100x4")
    prof = load_bundled_profile(sc.model)
    with pytest.raises(TypeError, match=r"cluster must be a Cluster, got method; call it \(e.g. scenario.cluster\(\)\)"):
        plan_hpp(sc.cluster, prof, sc.global_batch_size)
