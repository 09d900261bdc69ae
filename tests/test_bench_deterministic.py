"""``hpp bench-solvers --work-limit`` (deterministic budgets: the same rows on any host) and ``--no-hint`` (the exact
solvers cold, each row the solver's own plan), and ``SolverSettings.solver_answer_only`` under them."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from hpp.bench.cli import main as bench_main
from hpp.bench.instances import get_instance
from hpp.bench.solvers import BenchRow, summary_table
from hpp.errors import HppInputError
from hpp.formulation.composition.solve import SolveResult, solve
from hpp.formulation.composition.settings import bench_settings

# two quick-suite instances on which both exact solvers end in well under a second at 0.2 work units
INSTANCES = "opt350-a100x4-v100x4-s3b2,syn-t3-g8-l16-m4-s3-r1"
#: row fields that are measured on the host (the rest must repeat exactly)
TIMED = {"wall_s", "time_to_best_s", "build_s"}


def _bench(tmp_path, name: str, *extra: str, capsys) -> dict:
    args = ["bench-solvers", "--instances", INSTANCES, "--out-dir", str(tmp_path / name), "--json", *extra]
    assert bench_main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_work_limit_rows_repeat_exactly_and_say_so(tmp_path, capsys):
    a = _bench(tmp_path, "a", "--work-limit", "0.2", capsys=capsys)
    b = _bench(tmp_path, "b", "--work-limit", "0.2", capsys=capsys)
    assert a["work_limit"] == 0.2 and a["time_limit_s"] is None and a["hint"] is True
    assert len(a["rows"]) == 6
    for ra, rb in zip(a["rows"], b["rows"]):
        assert {k: v for k, v in ra.items() if k not in TIMED} == {k: v for k, v in rb.items() if k not in TIMED}
        assert ra["hit_time_limit"] is False                # no wall limit was set
    summary = (tmp_path / "a" / "bench_solvers.txt").read_text()
    assert summary.startswith("suite quick, work limit 0.2 units (deterministic), 2 instances")
    assert "its work limit (--work-limit) stopped it before it closed its model" in summary


def test_no_hint_rows_are_the_solvers_own_plans(tmp_path, capsys):
    """On opt350-a100x4-v100x4-s3b2 both exact solvers find plans of their bound model cold (HiGHS closes it), and
    its optimum is not the cost model's best plan (the model is a relaxation): without a hint their own plan is
    slower than the heuristic's; with it (the control) they never return worse than the heuristic's plan."""
    cold = _bench(tmp_path, "cold", "--work-limit", "0.2", "--no-hint", capsys=capsys)
    warm = _bench(tmp_path, "warm", "--work-limit", "0.2", capsys=capsys)
    assert cold["hint"] is False
    rows = {r["solver"]: r for r in cold["rows"] if r["instance"] == "opt350-a100x4-v100x4-s3b2"}
    heur = rows["heuristic"]["objective_s"]
    for s in ("cp-sat", "milp"):
        assert rows[s]["source"] == s and rows[s]["solver_status"] in ("OPTIMAL", "FEASIBLE")
        assert rows[s]["objective_s"] > heur * 1.001 and rows[s]["reached_best"] is False
        assert rows[s]["bound_s"] <= heur                       # the bound still holds for every plan
    assert rows["milp"]["solver_status"] == "OPTIMAL"
    rows_w = {r["solver"]: r for r in warm["rows"] if r["instance"] == "opt350-a100x4-v100x4-s3b2"}
    for s in ("cp-sat", "milp"):
        assert rows_w[s]["objective_s"] <= heur * (1 + 1e-12) < rows[s]["objective_s"]
    summary = (tmp_path / "cold" / "bench_solvers.txt").read_text()
    assert ", no hint, 2 instances" in summary.splitlines()[0]
    assert "each row's plan is the solver's own" in summary


def test_solver_answer_only_reports_no_solution_rather_than_the_heuristics_plan():
    problem, _ = get_instance("opt350-a100x4-v100x4").problem()        # 216 candidates: CP-SAT finds nothing cold
    tiny = replace(bench_settings("cp-sat", None, work_units=0.001), warm_start=False)
    own = solve(problem, replace(tiny, solver_answer_only=True))
    mixed = solve(problem, tiny)
    assert own.solver_status == "NO_SOLUTION" and own.status == "NO_SOLUTION"
    assert own.counts == {} and math.isinf(own.objective_s) and own.source == ""
    assert mixed.status == "FEASIBLE" and mixed.source != "cp-sat" and mixed.counts     # the heuristic's plan
    assert own.bound_s == mixed.bound_s


def _row(solver: str, solver_status: str, hit: bool, gap: float) -> BenchRow:
    res = SolveResult(solver, "FEASIBLE", 10.0, 10.0 * (1 - gap), gap, 1.0, {0: 1}, 1, solver, "lp", hit, -1, 10.0,
                      solver_status, 9.0, "")
    return BenchRow("i", "f/types", 8, 2, 4, 1, 0.0, res)


def test_gap_at_limit_counts_budget_stops_in_deterministic_runs():
    rows = [_row("cp-sat", "FEASIBLE", False, 0.04), _row("cp-sat", "OPTIMAL", False, 0.01),
            _row("cp-sat", "NO_SOLUTION", False, 0.08), _row("milp", "FEASIBLE", True, 0.02)]
    det = {line.split()[0]: line.split() for line in summary_table(rows, deterministic=True).splitlines()[1:3]}
    wall = {line.split()[0]: line.split() for line in summary_table(rows).splitlines()[1:3]}
    # columns: solver inst proven model median-s median-gap gap@limit ...
    assert det["cp-sat"][6] == "6.00%" and wall["cp-sat"][6:8] == ["none", "hit"]     # median of 4 % and 8 %
    assert det["milp"][6] == "2.00%" and wall["milp"][6] == "2.00%"


@pytest.mark.parametrize("args, words", [
    (["--work-limit", "1", "--time-limit", "3"], "field '--work-limit': --time-limit and --work-limit both given. "
                                                 "Fix: give one"),
    (["--work-limit", "0"], "field '--work-limit': 0 work units. Fix: give a positive number"),
    (["--work-limit", "nan"], "field '--work-limit': nan work units. Fix: give a positive number"),
    (["--time-limit", "-1"], "field '--time-limit': -1 s. Fix: give a positive number"),
])
def test_bad_limits_are_refused_before_any_file_is_written(tmp_path, capsys, args, words):
    out = tmp_path / "out"
    assert bench_main(["bench-solvers", "--out-dir", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hpp bench-solvers: error: ") and words in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert bench_main(["instances", "solve", "syn-t3-g8-l16-m4-s3-r1", *args]) == 2
    assert words in capsys.readouterr().err


def test_bench_settings_limits():
    s = bench_settings("milp", None, work_units=2.0)
    assert s.max_time_in_seconds is None and s.deterministic_time == 2.0
    w = bench_settings("cp-sat", 5.0)
    assert w.max_time_in_seconds == 5.0 and w.deterministic_time == 5.0
    with pytest.raises(HppInputError) as e:
        bench_settings("cp-sat", None)
    assert str(e.value) == ("field '--time-limit': no solver limit given. Fix: give --time-limit S (wall clock) or "
                            "--work-limit UNITS (deterministic)")
