"""The composition's fast paths equal their plain definitions (same floats, same copies), and CP-SAT's skip."""

import json
import math
import random
import re

import pytest
from hypothesis import given, settings, strategies as st

from hpp.formulation.composition import heuristics as comp
from hpp.formulation.composition.settings import SolverSettings
from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.composition.heuristics import solo_objective_s
from hpp.formulation.data_balance import least_time_s
from hpp.planner import make_problem, plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import get_scenario


def _plain_least_time_s(groups, G):
    """The bisection on the capacity as first written (no early stop, no first-covering search)."""
    if len(groups) == 1:
        tau, phi, b, x = groups[0]
        return phi + (-(-G // (x * b)) - 1) * tau

    def cap(T):
        return sum(x * b * (math.floor((T - phi) / tau + 1e-12) + 1) for tau, phi, b, x in groups if T >= phi)

    hi = min(phi + (-(-G // b) - 1) * tau for tau, phi, b, _ in groups)
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if cap(mid) >= G:
            hi = mid
        else:
            lo = mid
    return max(phi + (min(math.floor((hi - phi) / tau + 1e-12) + 1, -(-G // b)) - 1) * tau
               for tau, phi, b, _ in groups if hi >= phi)


group = st.tuples(st.floats(1e-4, 2.0), st.floats(0.0, 5.0), st.sampled_from([1, 2, 4, 8]), st.integers(1, 16))


@settings(max_examples=400, deadline=None)
@given(st.lists(group, min_size=2, max_size=6), st.integers(1, 4096))
def test_least_time_equals_the_plain_bisection(groups, G):
    assert least_time_s(groups, G) == _plain_least_time_s(groups, G)


def test_least_time_equals_the_plain_bisection_on_ties():
    # equal fills and bottlenecks (many breakpoints at one time), and grid values
    for groups in ([(0.1, 0.5, 2, 3), (0.1, 0.5, 2, 3)], [(0.25, 1.0, 4, 1), (0.5, 0.75, 2, 2), (0.125, 1.0, 1, 8)],
                   [(0.3, 0.3, 1, 1)] * 5):
        for G in (1, 7, 64, 1000, 1024):
            assert least_time_s(groups, G) == _plain_least_time_s(groups, G)


@pytest.fixture(scope="module")
def problem():
    sc = get_scenario("opt350-a100x8-v100x8")
    return make_problem(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size, workers=1)[0]


def test_fill_in_order_equals_one_copy_at_a_time(problem):
    rng = random.Random(0)
    n = len(problem.candidates)
    for _ in range(300):
        order = rng.sample(range(n), rng.randint(1, 12))
        start = {c: rng.randint(1, 2) for c in rng.sample(range(n), rng.randint(0, 2))}
        if start and not problem.fits(start):
            start = {}
        fast = comp._fill_in_order(problem, dict(start), order)
        plain = comp._fill_by_fits(problem, dict(start), order, [])
        assert fast == plain


def test_objective_cutoff_answers_below_cutoff_as_the_full_objective(problem):
    # with cutoff_s the sync is not priced once T_pipe + T_opt >= cutoff: inf then, else the same float
    rng = random.Random(3)
    n = len(problem.candidates)
    cut_off = kept = 0
    for _ in range(300):
        counts = {c: rng.randint(1, 3) for c in rng.sample(range(n), rng.randint(1, 3))}
        if not problem.fits(counts):
            continue
        full = composition_objective_s(problem, counts)
        for cutoff in (full * 0.5, full * (1 - 1e-12), full, full * (1 + 1e-12), math.inf):
            got = composition_objective_s(problem, counts, cutoff_s=cutoff)
            assert (got < cutoff) == (full < cutoff)
            assert got == full or got == math.inf
            cut_off += got == math.inf
            kept += got == full
    assert cut_off > 0 and kept > 0          # both branches ran


def test_solo_objective_equals_the_general_objective(problem):
    for c in range(0, len(problem.candidates), 7):
        x = problem.max_copies(c)
        want = composition_objective_s(problem, {c: x}) if x > 0 else math.inf
        assert solo_objective_s(problem, c) == want


def test_sync_of_every_candidate_equals_one_at_a_time(problem):
    for h in (2, 3, 8):
        assert problem.sync_s_all(h) == [problem.sync_s(c, h) for c in range(len(problem.candidates))]


def test_least_solo_equals_sorting_every_solo_objective(problem):
    rng = random.Random(1)
    n = len(problem.candidates)
    floor = comp._solo_floors_s(problem)
    for c in range(n):                    # each floor is a lower bound of its solo objective
        assert floor[c] <= solo_objective_s(problem, c)
    for _ in range(200):
        members = sorted(rng.sample(range(n), rng.randint(1, min(n, 60))))
        members = [c for c in members if math.isfinite(floor[c])]
        k = rng.randint(1, 6)
        want = sorted(members, key=lambda c: solo_objective_s(problem, c))[:k]
        assert comp._least_solo(problem, members, floor, k) == want


def test_least_solo_keeps_the_first_of_equal_solo_objectives(problem):
    # duplicated members tie exactly: the stable order (position in members) decides, as sorted() does
    c = 0
    members = [c, c + 1, c + 2]
    floor = [0.0] * len(problem.candidates)         # no pruning: every member is evaluated
    want = sorted(members, key=lambda i: solo_objective_s(problem, i))[:2]
    assert comp._least_solo(problem, members, floor, 2) == want


def test_capacity_lp_equals_scipy_linprog_after_every_change_of_t(problem):
    """The model-builder LP (objective cleared and set anew per T) against scipy's HiGHS on a fresh model."""
    import numpy as np
    from scipy.optimize import linprog
    from hpp.formulation.composition.lp_bound import _CapacityLP
    lp = _CapacityLP(problem, range(len(problem.candidates)))
    types = list(problem.inventory)
    A = np.array([[c.devices.get(t, 0) for c in lp.cands] for t in types], dtype=float)
    ub = np.array([problem.inventory[t] for t in types], dtype=float)
    phi = np.array([c.partition.fill_s for c in lp.cands])
    # T from above all fills down to below most of them: columns leave the objective as T falls
    for T in sorted(set(np.quantile(phi, [0.02, 0.3, 0.6, 0.95]).tolist()) | {float(phi.max()) * 3}, reverse=True):
        r = np.array([c.micro_batch_size * ((T - c.partition.fill_s) / c.partition.bottleneck_s + 1.0)
                      if T >= c.partition.fill_s else 0.0 for c in lp.cands])
        want = -linprog(-r, A_ub=A, b_ub=ub, bounds=(0, None), method="highs").fun
        got, x = lp._solve(T)
        assert got == pytest.approx(want, rel=1e-9)
        assert float(np.dot(x, r)) == pytest.approx(got, rel=1e-9)       # the copies are the optimum's
        assert (A @ np.asarray(x) <= ub + 1e-9).all()


def test_cpsat_is_skipped_above_the_candidate_limit_with_the_same_plan():
    sc = get_scenario("opt350-a100x8-v100x8")
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    skip = plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(num_workers=1))
    run = plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(num_workers=1, cpsat_on_subset=True))
    assert skip.stats["num_candidates"] > 200
    assert skip.search.solver_status == "" and "skipped" in skip.search.note and skip.search.source == "heuristic"
    assert run.search.solver_status != "" and " saw " in run.search.note
    # CP-SAT on a subset cannot certify: both report the LP bound over all candidates
    assert skip.search.bound_s == run.search.bound_s and run.search.bound_method == "lp"
    assert run.search.objective_s <= skip.search.objective_s
    assert skip.search.status in ("OPTIMAL", "FEASIBLE")
    # below the limit CP-SAT runs on all candidates (with a budget of 0.3 units its model may hold 600)
    small = plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(
        num_workers=1, max_candidates=10**6, deterministic_time=0.3, portfolio=("cp-sat",)))
    assert small.search.solver_status != "" and " saw " not in small.search.note
    assert small.stats["plan_from"] in ("cp-sat", "heuristic")


def test_cpsat_limit_depends_on_its_budget():
    # at the default budget CP-SAT runs only on small inputs (its presolve takes the budget on larger ones,
    # experiments/cpsat_budget.py); with any larger budget, given either way, it sees every candidate; an explicit
    # limit is kept
    from hpp.formulation.composition.settings import NO_CANDIDATE_LIMIT, SMALL_BUDGET_MAX_CANDIDATES
    assert SolverSettings().candidate_limit == SMALL_BUDGET_MAX_CANDIDATES == 16
    assert SolverSettings(deterministic_time=0.5).candidate_limit == NO_CANDIDATE_LIMIT
    assert SolverSettings(max_time_in_seconds=1.0).candidate_limit == NO_CANDIDATE_LIMIT
    assert SolverSettings(cpsat_params="max_deterministic_time:2").candidate_limit == NO_CANDIDATE_LIMIT
    assert SolverSettings(cpsat_params="num_workers:1").candidate_limit == 16
    assert SolverSettings(max_candidates=5, deterministic_time=9.0).candidate_limit == 5
    sc = get_scenario("llama8-3types-40")          # 284 candidates left after the presolve
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    default = plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(num_workers=1))
    budget = plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(num_workers=1, deterministic_time=0.2))
    assert default.search.solver_status == "" and "skipped: 284 candidates > 16" in default.search.note
    assert budget.search.solver_status != "" and "cp-sat saw" not in budget.search.note    # every candidate, no subset
    assert re.search(r"cp-sat on \d+ of \d+ candidates \(the others dominated in its model\)", budget.search.note)
    # more budget never gives a worse plan or bound
    assert budget.search.objective_s <= default.search.objective_s
    assert budget.search.bound_s >= default.search.bound_s


def test_plan_cli_says_when_cpsat_was_skipped_and_runs_it_with_a_budget(capsys):
    from hpp.cli import main
    assert main(["plan", "--no-baselines", "--workers", "1"]) == 0
    out = capsys.readouterr()
    assert "solver cp-sat" in out.out and "cp-sat skipped: " in out.out and "the LP and copy bound cover all" in out.out
    assert "(the returned plan's predicted time)" in out.out
    # a deterministic budget (a wall-clock one would depend on the host's load)
    assert main(["plan", "--scenario", "opt350-a100x4-v100x4", "--no-baselines", "--workers", "1",
                 "--work-limit", "0.5"]) == 0
    out = capsys.readouterr()
    assert "solver cp-sat" in out.out and re.search(r"cp-sat on \d+ of \d+ candidates", out.out)
    assert re.search(r"\[hpp plan\] \d+\.\d s: cost-model local search \(\d+ plans priced\); plan ", out.err)
    assert "plan returned: the search's, " in out.out


def test_plan_cli_says_when_a_baseline_plan_is_returned(capsys):
    from hpp.cli import main
    assert main(["plan", "--workers", "1", "--json", "--quiet"]) == 0     # the default scenario
    got = json.loads(capsys.readouterr().out)
    search = got["search"]
    if search["source"].startswith("baseline:"):          # the figures are the returned plan's
        assert search["objective_s"] == got["predicted"]["iteration_time_s"]
        assert search["bound_s"] <= search["objective_s"]
    assert main(["plan", "--workers", "1"]) == 0
    out = capsys.readouterr()
    assert "objective, bound and gap above are this plan's" in out.out or "plan returned: the search's" in out.out
    assert "[hpp plan] baselines (together at most 10 s; --baseline-time-limit S, --no-baselines)" in out.err


@pytest.mark.parametrize("flag", ["0", "-1"])
def test_plan_cli_refuses_a_baseline_time_limit_that_is_not_positive(capsys, flag):
    from hpp.cli import main
    assert main(["plan", "--baseline-time-limit", flag]) == 2
    err = capsys.readouterr().err
    assert f"field '--baseline-time-limit': --baseline-time-limit {float(flag)}" in err
    assert "Fix: give a positive number of seconds (--no-baselines skips the baselines)" in err


def test_bound_classes_in_two_processes_equal_one(monkeypatch):
    from hpp.formulation.composition import lp_bound
    sc = get_scenario("opt350-3types-40")
    problem = make_problem(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size, workers=1)[0]
    one = lp_bound.composition_bounds(problem, workers=1)
    monkeypatch.setattr(lp_bound, "PARALLEL_MIN_COLUMNS", 0)
    calls = []
    real = lp_bound._pipes
    monkeypatch.setattr(lp_bound, "_pipes", lambda pr, classes: calls.append(len(classes)) or real(pr, classes))
    two = lp_bound.composition_bounds(problem, workers=2)
    assert two == one and math.isfinite(one[1])
    assert len(calls) == 1 and calls[0] < 5       # this process solved only its share of the classes


def test_the_searches_freeze_the_objects_before_them_and_leave_the_collector_on():
    import gc
    from hpp.gcfreeze import gc_frozen
    seen = []
    sc = get_scenario("cpu-hetero-4")
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    import hpp.planner as planner
    real = planner.make_problem

    def spy(*a, **k):
        seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
        return real(*a, **k)

    planner.make_problem = spy
    try:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(num_workers=1))
        assert seen == [(True, True)]                       # collecting inside, the objects before it frozen
        assert gc.isenabled() and gc.get_freeze_count() == 0    # unfrozen after
        gc.disable()
        with gc_frozen():
            pass
        assert not gc.isenabled()                           # a disabled collector stays disabled
    finally:
        planner.make_problem = real
        gc.enable()
