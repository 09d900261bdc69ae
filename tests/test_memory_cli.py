"""``--memory-headroom`` and the per-stage memory breakdown of ``hpp estimate``."""

from __future__ import annotations

import json

from hpp.cli import main
from hpp.formulation.cost_config import CostModelConfig
from hpp.scenarios import get_scenario


def test_headroom_keeps_every_stage_below_the_reduced_capacity(capsys, tmp_path):
    out = tmp_path / "p.json"
    assert main(["plan", "--no-baselines", "--workers", "1", "--memory-headroom", "0.3", "--json",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["estimate", str(out), "--memory-headroom", "0.3", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["predicted"]
    caps = {t: d.memory_bytes for t, d in get_scenario("opt350-a100x8-v100x8").cluster().device_types.items()}
    cfg = CostModelConfig(memory_headroom=0.3)
    stages = [s for p in est["pipelines"] for s in p["stages"]]
    for s in stages:
        assert s["capacity_bytes"] == cfg.usable_memory_bytes(caps[s["device_type"]])
        assert s["memory_bytes"] <= s["capacity_bytes"]
        assert s["memory_breakdown"]["peak"] == s["memory_bytes"]
        assert set(s["memory_breakdown"]) >= {"framework", "weights_and_states", "activations"}
    # control: the same plan against the full capacity has more room on every stage
    assert main(["estimate", str(out), "--json"]) == 0
    full = [s for p in json.loads(capsys.readouterr().out)["predicted"]["pipelines"] for s in p["stages"]]
    assert all(f["capacity_bytes"] > s["capacity_bytes"] for f, s in zip(full, stages))


def test_a_headroom_outside_0_1_is_one_line_exit_2(capsys):
    assert main(["plan", "--no-baselines", "--memory-headroom", "1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "memory headroom 1.5" in err and "[0, 1)" in err and "\n" not in err
