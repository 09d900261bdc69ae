"""``hpp run --verify``: float64 equality with single-device training (<= 1e-9), a control that must fail,
``--data`` with padded samples, and the per-step metrics (stderr lines, ``--metrics-jsonl``, ``--json`` keys).

Long runs: float64 training at lr 0.03 drifts from single-device training within ~50 steps (as single-device
training does from itself when only the order a batch is summed in changes), so ``--verify`` checks each step
from the run's own state: 300 steps pass, and one unsynchronised step after the drift still fails.

The model is a 4-layer GPT given as ``MODULE:FUNCTION`` (:func:`micro`), so this file also runs a user's
model end to end; fork start keeps each launch to seconds.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import re
from dataclasses import replace

import numpy as np
import pytest

from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json
from hpp.runtime.cli import run_main
from hpp.runtime.models.gpt import GPT, ModelConfig
from hpp.runtime.models.stage import build_stage
from hpp.runtime.config import Controls, RunConfig

pytestmark = pytest.mark.distributed

_CFG = ModelConfig("micro", num_blocks=2, hidden_size=16, num_heads=2, seq_len=8, vocab_size=256)
CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "cpu-4",
           "device_types": {"cpu": {"memory_bytes": 4 * 2**30, "gpus_per_node": 4}},
           "nodes": [{"device_type": "cpu", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1e9}],
           "inter_node_bandwidth_bytes_per_s": 1e9}
VERIFY = re.compile(r"^verify: max \|difference\| (\S+) over (\d+) parameters")


def micro() -> GPT:
    """The test model (``--model tests.test_runtime_verify:micro``)."""
    return GPT(_CFG)


def micro_tied() -> GPT:
    """The same model with the head tied to the token table (named ``micro`` too)."""
    return GPT(_CFG, tie_embeddings=True)


def _controls(monkeypatch, **controls) -> None:
    """``hpp run`` with these :class:`Controls` (deliberate faults; no flag sets them)."""
    build = RunConfig.from_args.__func__
    monkeypatch.setattr(RunConfig, "from_args",
                        classmethod(lambda cls, args: replace(build(cls, args), controls=Controls(**controls))))


def _plan(path) -> str:
    """Two pipelines with different boundaries ({2} and {1}) and uneven samples (4 + 2), G = 6."""
    st = lambda lo, hi, d: Stage(lo, hi, "cpu", 1, (d,))  # noqa: E731
    plan = Plan("micro", 4, 6, (Pipeline((st(0, 2, 0), st(2, 4, 1)), 2, 4), Pipeline((st(0, 1, 2), st(1, 4, 3)), 1, 2)),
                sequence_length=8, cluster_ref=CLUSTER)
    write_plan_json(plan, path)
    return str(path)


def _run(capsys, plan: str, *args: str, steps: int = 3) -> tuple[int, str, str]:
    code = run_main([plan, "--steps", str(steps), "--launcher", "fork", "--run-timeout", "600", "--group-timeout", "60",
                     *args])
    out, err = capsys.readouterr()
    return code, out, err


def _verify_line(out: str) -> tuple[float, int]:
    m = next(VERIFY.match(line) for line in out.splitlines() if VERIFY.match(line))
    return float(m.group(1)), int(m.group(2))


def test_verify_passes_with_adamw_cosine_warmup_and_clipping(tmp_path, capsys):
    code, out, err = _run(capsys, _plan(tmp_path / "p.json"), "--model", "tests.test_runtime_verify:micro",
                          "--verify", "--lr", "0.01", "--lr-schedule", "cosine", "--lr-warmup-steps", "1",
                          "--clip-grad-norm", "0.5")
    assert code == 0, err
    diff, n = _verify_line(out)
    assert diff <= 1e-9 and n == len(list(build_stage(micro(), 0, 4, seed=0).layer_parameters())), out
    assert "float64" in out and "adamw" in out


def test_verify_control_without_block_allreduce_fails(tmp_path, capsys, monkeypatch):
    _controls(monkeypatch, skip_block_allreduce=True)
    code, out, _err = _run(capsys, _plan(tmp_path / "p.json"), "--model", "tests.test_runtime_verify:micro",
                           "--verify", "--lr", "0.01")
    diff, _n = _verify_line(out)
    assert code == 1 and diff > 1e-6 and "FAILED" in out


def test_verify_300_chaotic_steps_each_equal_one_single_device_step(tmp_path, capsys):
    """The free-running difference exceeds the tolerance (and single-device training summed in reverse sample order
    drifts alike), while every one of the 300 steps matches one single-device step from the run's state."""
    code, out, err = _run(capsys, _plan(tmp_path / "p.json"), "--model", "tests.test_runtime_verify:micro",
                          "--verify", "--lr", "0.03", "--quiet", "--json", steps=300)
    v = json.loads(out)["verify"]
    print(err.strip().splitlines()[-2:])
    assert code == 0, err
    assert v["steps"] == v["steps_checked"] == 300 and v["passed"]
    assert v["max_abs_difference"] <= 1e-9
    assert v["free_running_difference"] > 1e-9 and v["reordered_difference"] > 1e-9     # the end alone would fail
    assert "summed in reverse order" in err


def test_verify_control_one_unsynchronised_step_after_the_drift_fails(tmp_path, capsys, monkeypatch):
    """No gradient sync in step 55 only (0-based 54), when the free-running difference is already chaos: the check
    fails from that step on (the replicas diverged there) and names it."""
    _controls(monkeypatch, skip_block_allreduce_step=54)
    code, out, err = _run(capsys, _plan(tmp_path / "p.json"), "--model", "tests.test_runtime_verify:micro",
                          "--verify", "--lr", "0.03", "--quiet", "--json", steps=60)
    v = json.loads(out)["verify"]
    assert code == 1 and not v["passed"] and "FAILED" in err
    assert v["first_failed_step"] == 55 and v["max_abs_difference"] > 1e-6 and "first above the tolerance: step 55" in err
    assert v["reordered_difference"] > 1e-9            # the free-running comparison alone could not tell


def test_verify_tied_model_on_padded_npy_data(tmp_path, capsys):
    """Rows padded with -1 (no target there): the loss is normalised by the global count of target tokens."""
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 256, size=(9, _CFG.seq_len + 1))
    for i, keep in enumerate((9, 3, 6, 2, 9, 5, 4, 9, 7)):
        rows[i, keep:] = -1
    np.save(tmp_path / "d.npy", rows)
    code, out, err = _run(capsys, _plan(tmp_path / "p.json"), "--model", "tests.test_runtime_verify:micro_tied",
                          "--verify", "--data", str(tmp_path / "d.npy"), "--optimizer", "sgd", "--lr", "0.5")
    assert code == 0, err
    diff, _n = _verify_line(out)
    assert diff <= 1e-9
    assert "wraps around" in out                              # 9 rows < 3 steps x 6


def test_metrics_lines_jsonl_and_json_keys(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 2)                   # 512 bytes = 63 windows of 8 + 1
    metrics = tmp_path / "m.jsonl"
    code, out, err = _run(capsys, _plan(tmp_path / "p.json"), "--model", "tests.test_runtime_verify:micro",
                          "--data", str(text), "--dtype", "bfloat16", "--metrics-jsonl", str(metrics), "--json")
    assert code == 0, err
    rep = json.loads(out)
    m = rep["measured"]
    for key in ("iteration_time_s", "throughput_samples_per_s", "loss", "tokens_per_s", "mfu"):
        assert key in m
    assert rep["predicted"]["iteration_time_s"] is None and rep["collectives"]["count"] > 0
    assert m["mfu"] is None and m["loss"] > 0 and m["tokens_per_s"] == pytest.approx(6 * 8 / m["iteration_time_s"])
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert {"step", "step_time_s", "loss", "samples_per_s", "tokens_per_s", "mfu", "peak_memory_bytes",
                "peak_memory_bytes_per_rank"} <= set(r)
        assert len(r["peak_memory_bytes_per_rank"]) == 4 and r["loss"] > 0 and r["flops"] > 0
    assert rows[-1]["loss"] == pytest.approx(m["loss"])
    steps = [line for line in err.splitlines() if line.startswith("step ")]
    assert [s.split("  ")[0] for s in steps] == ["step 1/3", "step 2/3", "step 3/3"], err
    assert all("MFU n/a" in s and "tokens/s" in s and "peak mem" in s for s in steps)


def test_run_timeout_exits_1_saying_so(tmp_path, capsys, monkeypatch):
    """A hung rank (fault injection) and --run-timeout 5: every rank is killed, exit 1, one line saying why."""
    _controls(monkeypatch, fail_rank=1, fail_step=0, fail_mode="hang")
    code = run_main([_plan(tmp_path / "p.json"), "--steps", "3", "--launcher", "fork", "--run-timeout", "5",
                     "--model", "tests.test_runtime_verify:micro", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert err.startswith("hpp run: error: run failed: the run timed out after 5 s (--run-timeout) and every rank "
                          "was killed"), err
    assert not mp.active_children()
