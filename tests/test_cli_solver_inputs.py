"""Solver and profile input through the `hpp` CLI (CP-SAT parameters as text, the optimality tolerance, emulated CPU
types): bad input gets one line naming the field and the fix, exit 2."""

from __future__ import annotations

import json

from hpp.cli import main
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.profile_format import profile_from_dict, profile_to_dict, save_profile


def test_bad_cpsat_params_text_is_one_line_exit_2(capsys):
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--cpsat-params", "no_such_field:3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cpsat-params" in err[0] and "Traceback" not in err[0], err


def test_cpsat_params_out_of_range_or_a_wall_clock_cut_are_refused(capsys):
    """These ran with exit 0 (CP-SAT's MODEL_INVALID read as NO_SOLUTION; a wall-clock cut the
    result did not report)."""
    for text, says in (("num_workers:-5", "parameter 'num_workers' should be in [0,10000]. Current value is -5"),
                       ("max_deterministic_time:-1", "max_deterministic_time must be non-negative"),
                       ("max_time_in_seconds:0.001", "use --time-limit S")):
        assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--cpsat-params", text]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "field '--cpsat-params'" in err[0] and says in err[0], err
    # control: values in range pass; given to another solver, they are said to be unused
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--quiet", "--cpsat-params",
                 "num_workers:1,max_deterministic_time:0.1"]) == 0
    assert "--cpsat-params unused" not in capsys.readouterr().out
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--quiet", "--solver", "heuristic",
                 "--cpsat-params", "num_workers:1"]) == 0
    assert "note: --cpsat-params unused: --solver heuristic does not run CP-SAT" in capsys.readouterr().out


def test_an_optimal_plan_within_the_tolerance_says_so(capsys):
    """status OPTIMAL with a gap of 0.05 % (llama8-3types-40, one-stage pipelines): the text says the tolerance covers
    it, the JSON gives the tolerance, and the gap is inside it."""
    args = ["plan", "--scenario", "llama8-3types-40", "--max-stages", "1", "--no-baselines", "--workers", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "status OPTIMAL (gap within the 0.1% optimality tolerance), " in out
    assert "(cp-sat not run: the incumbent is within the optimality tolerance of the bound)" in out
    assert main([*args, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["search"]
    assert s["status"] == "OPTIMAL" and 0 < s["gap"] <= s["optimality_rtol"] == 1e-3 and s["optimality_atol_s"] == 1e-5
    assert s["objective_s"] - s["bound_s"] <= s["optimality_atol_s"] + s["optimality_rtol"] * s["objective_s"]
    assert s["solver_status"] is None and s["solver_model_objective_s"] is None


def test_a_missing_emulated_cpu_type_names_the_profile_file_and_the_emulate_fix(tmp_path, capsys):
    d = profile_to_dict(load_bundled_profile("gpt-tiny"))
    d["entries"] = [e for e in d["entries"] if e["device_type"] != "cpu-2x"]
    prof = tmp_path / "prof.json"
    save_profile(profile_from_dict(d), prof)
    assert "cpu-2x" not in json.loads(prof.read_text())["entries"][0]["device_type"]
    assert main(["plan", "--scenario", "cpu-hetero-4", "--profile", str(prof), "--no-baselines"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "cpu-2x" in err[0] and str(prof) in err[0] and "--emulate cpu-2x=2" in err[0], err
