"""The one solve path (hpp/formulation/composition/solve.py): interchangeable solvers, the MILP, the bench and its CLI."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from google.protobuf import text_format
from ortools.sat import cp_model_pb2
from ortools.sat.python import cp_model

from hpp.baselines.single_shape import exhaustive_composition
from hpp.bench.cli import main as bench_main
from hpp.errors import HppInputError, InfeasibleError
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.composition.problem import US_PER_S
from hpp.formulation.composition.objective import composition_objective_s
from hpp.bench.instances import get_instance, library
from hpp.planner import make_problem
from hpp.bench.solvers import check_consistency, run_bench, summary_table
from hpp.formulation.composition.exact_step import export_cpsat_model
from hpp.formulation.composition.settings import SOLVER_NAMES, SolverSettings, bench_settings
from hpp.formulation.composition.solve import model_objective_s, solve, within_tolerance
from tests.synthetic import toy_cluster, toy_profile

# The small quick-suite instances every exact solver closes in about a second (the test subset of
# "the heuristic never beats a proven optimum"; the whole quick suite runs in bench-solvers).
SMALL = ("opt350-a100x4-v100x4-s3b2", "syn-t2-g16-l16-m4-s3-r1", "syn-t3-g8-l16-m4-s3-r1",
         "syn-t3-g16-l8-m4-s3-r1", "syn-t3-g16-l16-m4-s1.5-r1")


@st.composite
def tiny(draw):
    L = draw(st.integers(3, 6))
    fwd = tuple(draw(st.lists(st.floats(0.5, 5.0), min_size=L, max_size=L)))
    params = tuple(draw(st.lists(st.integers(1, 100), min_size=L, max_size=L)))
    prof = toy_profile({"A": 1.0, "B": draw(st.floats(1.0, 3.0))}, fwd=fwd, act=(5,) * L, params=params,
                       out=(3,) * L, opt=(0.01,) * L, sizes=(1, 2))
    total_w = 4 * sum(params)
    cl = toy_cluster([("A", draw(st.integers(1, 3))), ("B", draw(st.integers(1, 3)))],
                     memory={"A": 4 * total_w + 1000, "B": draw(st.integers(total_w // 2, 2 * total_w + 400))},
                     bw=draw(st.sampled_from([50.0, 1000.0])), latency=draw(st.sampled_from([0.0, 0.01])))
    return prof, cl, draw(st.integers(1, 30))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny(), st.booleans())
def test_exact_solvers_match_the_exhaustive_oracle(inst, warm):
    prof, cl, gbs = inst
    try:
        problem, _ = make_problem(cl, prof, gbs, space=SearchSpace(max_stages=2, allow_recompute=False))
    except InfeasibleError:
        return
    problem.estimator = None             # judged by the composition model, as the oracle
    _, oracle, _ = exhaustive_composition(problem)
    # two CP-SAT workers (interleaved, deterministic): one worker is seed-sensitive on some of these instances
    opts = SolverSettings(warm_start=warm, num_workers=2, deterministic_time=5.0, max_time_in_seconds=10.0)
    heur = solve(problem, SolverSettings(solver="heuristic"))
    assert heur.objective_s >= oracle - 1e-9 and heur.bound_s <= oracle * (1 + 1e-9)
    closed = {}
    for name in ("cp-sat", "milp"):
        r = solve(problem, SolverSettings(**{**opts.__dict__, "solver": name}))
        assert r.status in ("OPTIMAL", "FEASIBLE")
        assert r.objective_s == pytest.approx(composition_objective_s(problem, r.counts))
        assert r.bound_s <= oracle * (1 + 1e-9)                     # a valid bound on the judged objective
        assert r.objective_s >= oracle * (1 - 1e-12)
        if r.proven_optimal:
            assert within_tolerance(r.objective_s, oracle)
        if r.solver_status == "OPTIMAL":
            closed[name] = r.solver_model_objective_s
            if "not used" not in r.note:     # a bound problem that mispriced the instance: its bound is dropped
                assert r.bound_s >= min(r.solver_model_objective_s, heur.objective_s) * (1 - 1e-3) - 1e-5
    if len(closed) == 2:                  # differential: both close the same bound model -> same optimum
        assert within_tolerance(closed["cp-sat"], closed["milp"])


def test_solvers_agree_and_heuristic_never_beats_a_proven_optimum_on_quick_subset():
    rows = run_bench([get_instance(n) for n in SMALL], options=bench_settings("cp-sat", 10.0))
    assert check_consistency(rows) == []
    by = {(r.instance, r.solver): r for r in rows}
    for n in SMALL:
        cp, mi, he = by[(n, "cp-sat")], by[(n, "milp")], by[(n, "heuristic")]
        for e in (cp, mi):
            assert e.bound_s <= e.objective_s * (1 + 1e-9) and he.bound_s <= he.objective_s * (1 + 1e-9)
            if e.proven_optimal:
                assert he.objective_s >= e.objective_s or within_tolerance(he.objective_s, e.objective_s)
    assert "proven opt" in summary_table(rows)


def test_time_limit_returns_best_solution_and_bound_never_raises():
    problem, _ = get_instance("opt350-a100x4-v100x4").problem()      # 185+ candidates: not closed in 0.2 s
    for warm in (True, False):
        for name in ("cp-sat", "milp"):
            r = solve(problem, SolverSettings(solver=name, max_time_in_seconds=0.2, warm_start=warm, num_workers=1))
            assert r.status in ("OPTIMAL", "FEASIBLE")           # the incumbent is always judged
            assert math.isfinite(r.objective_s) and r.bound_s <= r.objective_s
            assert r.gap == pytest.approx((r.objective_s - r.bound_s) / r.objective_s)


def test_unknown_solver_and_bad_options():
    problem, _ = get_instance("syn-t2-g16-l16-m4-s3-r1").problem()
    with pytest.raises(HppInputError) as exc:
        solve(problem, SolverSettings(solver="gurobi"))
    assert "unknown solver 'gurobi'" in str(exc.value) and "['cp-sat', 'milp', 'heuristic']" in str(exc.value)
    with pytest.raises(HppInputError, match="time limit -1"):
        SolverSettings(max_time_in_seconds=-1)
    assert SOLVER_NAMES == ("cp-sat", "milp", "heuristic")


def test_exported_cpsat_model_is_the_solved_model(tmp_path):
    problem, _ = get_instance("syn-t3-g8-l16-m4-s3-r1").problem()
    budget = SolverSettings(warm_start=False, deterministic_time=20.0)     # the model with a budget, as solve builds it
    desc = export_cpsat_model(problem, tmp_path / "m.pb", settings=budget)
    assert (tmp_path / "m.pb").stat().st_size > 0 and desc["objective_unit"] == "microseconds"
    proto = cp_model_pb2.CpModelProto()                  # what another solver's reader sees
    proto.ParseFromString((tmp_path / "m.pb").read_bytes())
    model = cp_model.CpModel()
    model.proto.parse_text_format(text_format.MessageToString(proto))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 20.0
    assert solver.solve(model) == cp_model.OPTIMAL
    counts = {c["problem_index"]: int(solver.value(model.get_int_var_from_proto_index(
        next(i for i, v in enumerate(model.proto.variables) if v.name == c["variable"]))))
        for c in desc["candidates"]}
    ref = solve(problem, SolverSettings(solver="milp", warm_start=False, deterministic_time=20.0))
    assert ref.solver_status == "OPTIMAL"
    # the exported model is the one the budgeted solve solved (times rounded down to whole microseconds); its
    # per-type sync floors only raise the plain bound problem's
    assert within_tolerance(solver.objective_value / US_PER_S, ref.solver_model_objective_s)
    assert model_objective_s(problem.bound_problem(), counts) <= ref.solver_model_objective_s * (1 + 1e-9)


def test_cli_instances_and_bench(tmp_path, capsys):
    assert bench_main(["instances", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in listed["instances"]] == [i.name for i in library("quick")]
    out = tmp_path / "g.json"
    assert bench_main(["instances", "generate", "--types", "2", "--gpus", "8", "--layers", "8", "--max-stages", "2",
                       "--micro-batch-sizes", "2", "--max-tp", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert bench_main(["instances", "solve", str(out), "--solver", "milp", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "OPTIMAL"
    assert bench_main(["instances", "solve", str(out), "--solver", "gurobi"]) == 2
    assert "unknown solver 'gurobi'" in capsys.readouterr().err
    bad = json.loads(out.read_text())
    bad["profile"] = {"bundled": "GPT-9"}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert bench_main(["instances", "solve", str(tmp_path / "bad.json")]) == 2
    assert "names a missing profile" in capsys.readouterr().err
    assert bench_main(["instances", "export", "syn-t2-g16-l16-m4-s3-r1", "--out", str(tmp_path / "lib"),
                       "--cpsat-model"]) == 0
    assert (tmp_path / "lib" / "syn-t2-g16-l16-m4-s3-r1.json").exists()
    assert (tmp_path / "lib" / "syn-t2-g16-l16-m4-s3-r1.cpsat.pb").exists()
    capsys.readouterr()
    # a second export into the same folder would overwrite: refused without --force, like bench-solvers
    assert bench_main(["instances", "export", "syn-t2-g16-l16-m4-s3-r1", "--out", str(tmp_path / "lib")]) == 2
    assert "syn-t2-g16-l16-m4-s3-r1.json exists. Fix: give another --out, or --force" in capsys.readouterr().err
    assert bench_main(["instances", "export", "syn-t2-g16-l16-m4-s3-r1", "--out", str(tmp_path / "lib"),
                       "--force"]) == 0
    assert bench_main(["bench-solvers", "--instances", "syn-t2-g16-l16-m4-s3-r1", "--time-limit", "5",
                       "--out-dir", str(tmp_path / "res")]) == 0
    for f in ("bench_solvers.csv", "bench_solvers_time_to_best.png", "bench_solvers_profile.png"):
        assert (tmp_path / "res" / f).stat().st_size > 0
    assert bench_main(["bench-solvers", "--solvers", "cp-sat,nope"]) == 2
    assert "field '--solvers': unknown solver 'nope'" in capsys.readouterr().err


def test_an_exact_bound_above_a_feasible_plan_is_not_used():
    """An instance hypothesis found where the MILP's bound problem is no relaxation: it proves 68.1150 s while the
    exhaustive optimum of the composition model is 68.0958 s. The bound reported must stay below the optimum: the
    MILP's is dropped (said in the note) and the LP bound kept, so the answer is FEASIBLE, not a false OPTIMAL."""
    L = 5
    prof = toy_profile({"A": 1.0, "B": 3.2265625 / 1.75}, fwd=(1.75, 2.0, 4.0, 3.0, 1.5), act=(5,) * L,
                       params=(17, 92, 79, 1, 3), out=(3,) * L, opt=(0.01,) * L, sizes=(1, 2))
    cl = toy_cluster([("A", 3), ("B", 3)], memory={"A": 4072, "B": 990}, bw=1000.0, latency=0.0)
    problem, _ = make_problem(cl, prof, 5, space=SearchSpace(max_stages=2, allow_recompute=False))
    problem.estimator = None
    _, oracle, _ = exhaustive_composition(problem)
    r = solve(problem, SolverSettings(warm_start=False, num_workers=2, deterministic_time=5.0, max_time_in_seconds=10.0,
                                      solver="milp"))
    assert oracle == pytest.approx(68.0958125) and r.objective_s == pytest.approx(oracle)
    assert r.solver_status == "OPTIMAL" and r.solver_model_objective_s > oracle * (1 + 1e-6)   # the mispriced proof
    assert r.bound_s <= oracle and r.status == "FEASIBLE"
    assert "milp's bound 68.1150 s lies above a plan of 68.0958 s: not used" in r.note
