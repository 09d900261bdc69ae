"""A plan ``hpp plan --profile FILE`` returns names its profile so that ``hpp estimate`` finds it, also when the
returned plan is a baseline's (a seed, which names the profile by model name)."""

from __future__ import annotations

import dataclasses
import json

import hpp.planner as planner_mod
from hpp.cli import main
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.profile_format import save_profile


def _baseline_wins(monkeypatch):
    """Price the baselines' plans (they name their profile by model name) at half their time, so that one wins."""
    real = planner_mod.estimate_plan

    def half_for_seeds(plan, *a, **k):
        est = real(plan, *a, **k)
        return dataclasses.replace(est, iteration_time_s=est.iteration_time_s / 2) if "name" in plan.profile_ref \
            else est
    monkeypatch.setattr(planner_mod, "estimate_plan", half_for_seeds)


def test_a_returned_baseline_plan_embeds_the_profile_file(tmp_path, monkeypatch, capsys):
    prof = tmp_path / "my-profile.json"            # a model without a bundled profile
    save_profile(dataclasses.replace(load_bundled_profile("gpt-tiny"), model="my-gpt"), prof)
    _baseline_wins(monkeypatch)
    out = tmp_path / "plan.json"
    assert main(["plan", "--scenario", "cpu-hetero-4", "--profile", str(prof), "--baseline-time-limit", "5",
                 "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["search"]["source"].startswith("baseline:")                # the case of the fix
    doc = json.loads(out.read_text())
    assert list(doc["profile"]) == ["embedded"] and doc["profile"]["embedded"]["model"] == "my-gpt"
    monkeypatch.undo()
    assert main(["estimate", str(out), "--json"]) == 0                    # before: exit 2, no bundled 'my-gpt'
    assert json.loads(capsys.readouterr().out)["model"] == "my-gpt"
