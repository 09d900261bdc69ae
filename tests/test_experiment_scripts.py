"""The experiment scripts on a checkout without the public data: one line saying what they need (exit 2), and
``run_all.py`` leaves docs/RESULTS.md alone when a step failed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _load(name: str, monkeypatch):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)          # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_cost_model_validation_without_the_runs_says_what_it_needs(monkeypatch, tmp_path, capsys):
    mod = _load("cost_model_validation", monkeypatch)
    assert mod.main(["--runs", str(tmp_path / "absent"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no Sailor validation runs" in err and "validation-calibration" in err
    assert "--runs DIR" in err and not (tmp_path / "out").exists()


def test_run_all_does_not_rewrite_the_results_after_a_failed_step(monkeypatch, tmp_path, capsys):
    mod = _load("run_all", monkeypatch)
    readme = tmp_path / "RESULTS.md"
    before = f"intro\n{mod.START}\nold table\n{mod.END}\ntail\n"
    readme.write_text(before)
    monkeypatch.setattr(mod, "RESULTS", readme)
    monkeypatch.setattr(mod, "_run", lambda script, argv: 2 if script == "cost_model_validation" else 0)
    assert mod.main([]) == 2
    assert readme.read_text() == before
    assert "RESULTS.md not rewritten: cost_model_validation (exit 2) failed" in capsys.readouterr().err
    ran = []
    monkeypatch.setattr(mod, "_run", lambda script, argv: ran.append(script) or 0)     # control: every step passes
    monkeypatch.setattr(mod, "results_markdown", lambda folder: "new table")
    assert mod.main([]) == 0
    assert readme.read_text() == f"intro\n{mod.START}\nnew table\n{mod.END}\ntail\n"
    assert ran[-1] == "layout_tree"                                     # and docs/LAYOUT.md's tree follows the code


def test_run_all_quick_leaves_the_published_runtime_validation_files_alone(monkeypatch, tmp_path):
    mod = _load("run_all", monkeypatch)
    calls = {}
    monkeypatch.setattr(mod, "_run", lambda script, argv: calls.setdefault(script, argv) and 0)
    assert mod.main(["--quick", "--no-readme"]) == 0
    assert calls["runtime_validation"][:1] == ["--quick"]
    assert calls["runtime_validation"][-1].endswith("runtime_validation_quick.csv")     # not the published CSV
