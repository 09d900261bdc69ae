"""Bad input added in session 7, through the `hpp` CLI: one line naming the field and the fix, exit 2."""

from __future__ import annotations

import json

from hpp.cli import main
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.profile_format import profile_from_dict, profile_to_dict, save_profile


def test_bad_cpsat_params_text_is_one_line_exit_2(capsys):
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--cpsat-params", "no_such_field:3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cpsat-params" in err[0] and "Traceback" not in err[0], err


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
