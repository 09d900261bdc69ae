"""``--metrics-jsonl``'s ``step`` is the 1-based global step, the number the
progress line (``step 1/2``), a resumed run's summary (``steps 3..4``) and the checkpoints (``step-K``)
use; the ranks' own ``rank<r>.steps.jsonl`` lines still count from 0."""

from __future__ import annotations

import json

import pytest

from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json
from hpp.runtime.cli import run_main
from hpp.runtime.metrics import StepMonitor

pytestmark = pytest.mark.distributed

CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "cpu-1",
           "device_types": {"cpu": {"memory_bytes": 4 * 2**30, "gpus_per_node": 1}},
           "nodes": [{"device_type": "cpu", "num_devices": 1, "intra_node_bandwidth_bytes_per_s": 1e9}],
           "inter_node_bandwidth_bytes_per_s": 1e9}


def test_resumed_monitor_writes_the_global_step_its_line_prints(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    mon = StepMonitor(tmp_path, world_size=1, steps=2, first_step=3, global_batch_size=2, seq_len=8,
                      peak_flops_per_s=None, jsonl=out, stream=None)
    (tmp_path / "rank0.steps.jsonl").write_text("".join(
        json.dumps({"step": k, "time_s": 0.5, "loss": 1.0, "flops": 1.0, "peak_memory_bytes": 1}) + "\n"
        for k in (3, 4)))                                                      # the ranks count from 0
    mon.close()
    assert [json.loads(x)["step"] for x in out.read_text().splitlines()] == [4, 5]
    lines = [x.split("  ")[0] for x in capsys.readouterr().err.splitlines() if x.startswith("step ")]
    assert lines == ["step 4/5", "step 5/5"]


def _run(capsys, plan: str, *args: str) -> tuple[str, str]:
    code = run_main([plan, "--steps", "2", "--model", "tests.test_runtime_verify:micro", "--launcher", "fork",
                     "--run-timeout", "120", "--group-timeout", "60", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def test_run_and_resume_number_jsonl_steps_as_progress_summary_and_checkpoints(tmp_path, capsys):
    plan = Plan("micro", 4, 2, (Pipeline((Stage(0, 4, "cpu", 1, (0,)),), 1, 2),), sequence_length=8,
                cluster_ref=CLUSTER)
    write_plan_json(plan, tmp_path / "p.json")
    ck, m1, m2 = tmp_path / "ck", tmp_path / "m1.jsonl", tmp_path / "m2.jsonl"
    _, err = _run(capsys, str(tmp_path / "p.json"), "--save", str(ck), "--metrics-jsonl", str(m1))
    assert [x.split("  ")[0] for x in err.splitlines() if x.startswith("step ")] == ["step 1/2", "step 2/2"]
    assert [json.loads(x)["step"] for x in m1.read_text().splitlines()] == [1, 2]
    assert sorted(p.name for p in ck.iterdir()) == ["step-2"]                   # saved after step 2
    out, err = _run(capsys, str(tmp_path / "p.json"), "--resume", str(ck), "--save", str(ck),
                    "--metrics-jsonl", str(m2))
    assert [x.split("  ")[0] for x in err.splitlines() if x.startswith("step ")] == ["step 3/4", "step 4/4"]
    assert "(steps 3..4)" in out, out
    assert [json.loads(x)["step"] for x in m2.read_text().splitlines()] == [3, 4]
    assert sorted(p.name for p in ck.iterdir()) == ["step-2", "step-4"]
