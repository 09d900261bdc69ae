"""What the command line says: unknown flags named by their subcommand with the closest
flag, ``--max-tp`` that is no measured TP degree said in a note, ``hpp run`` with too few steps after the
warm-up said in a note, and an exact solver named with ``--solver`` run above the default budget's limit."""

from __future__ import annotations


import json

import pytest

from hpp import load_cluster, load_profile
from hpp.cli import main


def _one_line_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err and "Traceback" not in err, err
    return err.strip()


# --------------------------------------------------------------------------- 1. unknown flags and commands

@pytest.mark.parametrize("argv, expected", [
    (["run", "p.json", "--stepz", "3"],
     "hpp run: error: unknown option --stepz (did you mean --steps?). Fix: see hpp run --help"),
    (["plan", "--gbz", "8"], "hpp plan: error: unknown option --gbz (did you mean --gbs?). Fix: see hpp plan --help"),
    (["-v", "plan", "--max-tpp", "2"],
     "hpp plan: error: unknown option --max-tpp (did you mean --max-tp?). Fix: see hpp plan --help"),
    (["plan", "--max-tp=2", "--quiett"],
     "hpp plan: error: unknown option --quiett (did you mean --quiet?). Fix: see hpp plan --help"),
    (["instances", "list", "--suitte", "quick"],
     "hpp instances list: error: unknown option --suitte (did you mean --suite?). Fix: see hpp instances list --help"),
    (["bench-solvers", "--suitt", "quick"],
     "hpp bench-solvers: error: unknown option --suitt (did you mean --suite?). Fix: see hpp bench-solvers --help"),
    (["plan", "stray"], "hpp plan: error: unrecognized arguments: stray. Fix: see hpp plan --help"),
    (["plna"], "hpp: error: unknown command plna (did you mean plan?); the commands: plan, estimate, scenarios, profiles, run, "
               "profile, profile-network, instances, bench-solvers. Fix: see hpp --help"),
    (["plan", "--gbs", "x"], "hpp plan: error: argument --gbs: invalid int value: 'x'. Fix: see hpp plan --help"),
    (["run", "p.json", "--steps", "x"],
     "hpp run: error: argument --steps: invalid int value: 'x'. Fix: see hpp run --help"),
])
def test_unknown_flag_is_named_by_its_subcommand_with_the_closest_flag(argv, expected, capsys):
    assert _one_line_error(argv, capsys) == expected


def test_unknown_flag_check_keeps_values_and_negative_numbers():   # prefixes: the runtime CLI tests
    from hpp.runtime.cli import _run_parser

    ns = _run_parser().parse_args(["p.json", "--steps", "3", "--lr", "-0.5", "--data", "-odd name.txt"])
    assert (ns.steps, ns.lr, ns.data) == (3, -0.5, "-odd name.txt")
    assert _run_parser().parse_args(["p.json", "--steps=2", "--warmup-steps", "1"]).warmup_steps == 1


# --------------------------------------------------------------------------- 2. --max-tp is a cap

def test_max_tp_that_is_no_measured_degree_is_said_with_the_degrees_used():
    from hpp.cli_inputs import max_tp_note
    from hpp.formulation.space_limits import SearchSpace
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import get_scenario

    sc = get_scenario("opt350-a100x8-v100x8")
    cluster, profile = sc.cluster(), load_bundled_profile(sc.model)
    measured = sorted({tp for t in cluster.count_by_type() for tp in profile.tp_degrees(t)})
    assert 2 in measured and 3 not in measured, measured
    note = max_tp_note(cluster, profile, SearchSpace(max_tp=3))
    assert note is not None and note.startswith("--max-tp 3 is a cap, not a TP degree")
    assert f"profiled at TP {measured}" in note and "the search uses TP [1, 2]" in note, note
    assert max_tp_note(cluster, profile, SearchSpace(max_tp=2)) is None
    assert max_tp_note(cluster, profile, SearchSpace()) is None


def test_plan_with_max_tp_3_says_so_in_its_notes(capsys):
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--max-tp", "3", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith("--max-tp 3 is a cap, not a TP degree") and "TP [1]" in n for n in notes), notes


# --------------------------------------------------------------------------- 3. hpp run with few steps

def test_few_steps_after_the_warm_up_are_said():
    from hpp.runtime.cli import few_steps_note

    assert "median of 1 step after the warm-up of 1" in few_steps_note(2, 1)
    assert "--steps 4 or more" in few_steps_note(2, 1)
    assert "median of 2 steps after the warm-up of 2" in few_steps_note(4, 2) and "--steps 5" in few_steps_note(4, 2)
    assert "--steps 4 or more" in few_steps_note(1, 1)
    assert few_steps_note(4, 1) is None and few_steps_note(3, 0) is None


def test_run_with_two_steps_adds_the_note_and_keeps_the_numbers(monkeypatch, capsys):
    from hpp.runtime import cli as rcli

    rep = {"notes": ["plan note"], "measured": {"iteration_time_s": 0.25}, "verify": None}
    monkeypatch.setattr(rcli, "_run", lambda args, run_plan: json.loads(json.dumps(rep)))
    assert rcli.run_main(["p.json", "--steps", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"] == rep["measured"] and out["notes"][0] == "plan note"
    assert len(out["notes"]) == 2 and "median of 1 step" in out["notes"][1] and "--steps 4" in out["notes"][1]
    assert rcli.run_main(["p.json", "--steps", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == ["plan note"]


# --------------------------------------------------------------------------- 4. a named solver runs

def test_named_exact_solver_gets_the_larger_candidate_limit():
    from hpp.formulation.composition.settings import MAX_CANDIDATES, SMALL_BUDGET_MAX_CANDIDATES
    from hpp.request import build_request

    cl, prof = load_cluster("cpu-hetero-4"), load_profile("gpt-tiny")

    def settings(**kw):
        return build_request(cl, prof, 8, **kw).planner.solver

    assert settings().candidate_limit == SMALL_BUDGET_MAX_CANDIDATES
    assert settings().solver == "cp-sat"
    for name in ("milp", "cp-sat"):
        s = settings(solver=name)
        assert s.solver == name and s.candidate_limit == MAX_CANDIDATES
    assert settings(solver="heuristic").max_candidates is None


@pytest.mark.parametrize("solver", ["milp", "cp-sat"])
def test_plan_with_a_named_solver_runs_it_above_16_candidates(solver, capsys):
    # cpu-hetero-4 has 35 candidates: above the default budget's 16, so CP-SAT is skipped without --solver
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--quiet", "--solver", solver]) == 0
    out = capsys.readouterr().out
    assert f"solver {solver}, status" in out and "not run" not in out and "skipped" not in out, out


def test_plan_without_solver_keeps_the_default_limit(capsys):
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "solver cp-sat not run" in out and "cp-sat skipped: 48 candidates > 16" in out
    assert "note: --solver" not in out


def test_named_solver_above_its_limit_says_how_to_run_it(capsys):
    assert main(["plan", "--no-baselines", "--quiet", "--solver", "milp", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith("--solver milp did not run: ") and "> 200" in n and "--cpsat-on-subset" in n
               for n in notes), notes


def test_an_unknown_cluster_key_unlike_any_valid_one_gets_no_misleading_suggestion(tmp_path, capsys):
    # {"colour": ...} was answered "did you mean 'format'?"; a typo still gets its suggestion
    import json
    from hpp.cli import main
    from hpp.scenarios import get_scenario
    from hpp.profiles.cluster_format import cluster_to_dict
    d = cluster_to_dict(get_scenario("opt350-a100x4-v100x4").cluster())
    for key, want in (("colour", "remove it; valid keys here:"), ("formatt", "did you mean 'format'?")):
        bad = dict(d, **{key: 1})
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(bad))
        assert main(["plan", "--cluster", str(path), "--model", "OPT-350", "--no-baselines"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"unknown key '{key}'" in err[0] and want in err[0], err
        assert key != "colour" or "did you mean" not in err[0]


def test_an_unknown_model_names_the_profile_flag(capsys):
    from hpp.cli import main
    assert main(["plan", "--model", "nope", "--no-baselines"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no bundled profile for model 'nope'" in err[0] and "--profile FILE" in err[0], err


# --------------------------------------------------------------------------- 5. small front-door facts

def test_version_flag_and_python_dash_m(capsys):
    import subprocess
    import sys

    import hpp
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"hpp {hpp.__version__}"
    got = subprocess.run([sys.executable, "-m", "hpp", "--version"], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and got.stdout.strip() == f"hpp {hpp.__version__}"


def test_an_unknown_scenario_names_the_argument_that_named_it(capsys):
    assert main(["scenarios", "--cluster", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "field '--cluster'" in err and "opt350-a100x8-v100x8" in err
    from hpp import HppInputError, load_cluster
    with pytest.raises(HppInputError, match="unknown scenario 'opt350-a100x8'") as e:     # a typo lists the names
        load_cluster("opt350-a100x8")
    assert e.value.field == "cluster" and "opt350-a100x8-v100x8" in e.value.fix
    with pytest.raises(HppInputError, match="cannot read cluster file"):                 # a path stays a path
        load_cluster("no/such/cluster")


def test_idle_devices_check_has_its_progress_line_and_time(capsys):
    assert main(["plan", "--scenario", "cpu-hetero-4", "--model", "llama-tiny", "--gbs", "8", "--max-tp", "2",
                 "--no-baselines", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "[hpp plan] 2 devices idle: pricing the best plans found that use them" in err
    assert "HPP search (cp-sat where at most 16 candidates are left;" in err
