"""A user's model given as ``path/to/file.py:FUNCTION`` is recorded with an absolute path (profile, and so every
plan made from it), so that ``hpp run PLAN.json`` finds it from any folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hpp.cli import main                                                     # noqa: E402
from hpp.runtime.cli import profile_main, run_main                           # noqa: E402
from hpp.runtime.models.zoo import portable_model_spec                              # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "two-cpus",
           "device_types": {"cpu": {"memory_bytes": 2**30, "gpus_per_node": 2}},
           "nodes": [{"device_type": "cpu", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1e9}],
           "inter_node_bandwidth_bytes_per_s": 1e9}


def test_a_file_path_is_made_absolute_and_other_specs_are_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert portable_model_spec("examples/user_model.py:build") == f"{ROOT / 'examples' / 'user_model.py'}:build"
    assert portable_model_spec("examples.user_model:build") == "examples.user_model:build"
    assert portable_model_spec("llama-tiny") == "llama-tiny"


def test_a_plan_of_a_model_file_runs_from_another_folder(tmp_path, monkeypatch, capsys):
    planned, elsewhere = tmp_path / "planned", tmp_path / "elsewhere"
    planned.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(ROOT)                     # profiled from the repository root, with a relative path
    assert profile_main(["--model", "examples/user_model.py:build", "--micro-batch-sizes", "1", "--no-time-terms",
                         "--no-memory-terms", "--repeats", "1", "--warmup", "0",
                         "--out", str(planned / "user.json")]) == 0
    recorded = json.loads((planned / "user.json").read_text())["meta"]["runtime_model"]
    assert recorded == f"{ROOT / 'examples' / 'user_model.py'}:build"
    (planned / "cluster.json").write_text(json.dumps(CLUSTER))
    monkeypatch.chdir(planned)
    assert main(["plan", "--cluster", "cluster.json", "--profile", "user.json", "--gbs", "2", "--no-baselines",
                 "--quiet", "--out", "plan.json"]) == 0
    monkeypatch.chdir(elsewhere)               # where examples/user_model.py does not resolve
    capsys.readouterr()
    assert run_main([str(planned / "plan.json"), "--steps", "1", "--launcher", "fork", "--dry-run", "dry",
                     "--json"]) == 0, capsys.readouterr().err
    cfg = json.loads((elsewhere / "dry" / "worker_config.json").read_text())
    assert cfg["facts"]["model"] == recorded                               # what every rank loads
    # control: the path as given at the root (what the profile recorded before) does not resolve from here
    assert run_main([str(planned / "plan.json"), "--steps", "1", "--launcher", "fork",
                     "--model", "examples/user_model.py:build", "--dry-run", "dry2"]) == 2
    assert "no file" in capsys.readouterr().err
