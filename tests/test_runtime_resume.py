"""``hpp run --save`` / ``--resume``: a checkpoint of one plan continues exactly under another.

Plan A: 3 pipelines at TP 1 on 6 CPU "devices" (of two nodes of 4). Plan B, as after losing
device 5: 2 pipelines, other stage boundaries, one pipeline at TP 2 (stages of 2 ranks)
and one single-stage pipeline holding both ends of the tied embedding (5 ranks). The
model is a 4-layer GPT with a tied head (``tests.test_runtime_resume:micro``), float64,
AdamW, cosine schedule with warm-up and clipping, so the optimizer moments, the schedule
position and the tied pair must all survive the change of plan.

A trains 3 steps (``--save --save-every 2``: step-2 and step-3); B resumes from step-3 for
3 more steps with ``--verify``: its parameters equal 6 steps of single-process training
(<= 1e-9). A -> A resumes from step-2. Control: the same resume with the checkpoint's LR
scheduler position reset must FAIL ``--verify``. Bad ``--resume`` input is one line, exit 2.
Ranks are forked (``--launcher fork``): the checkpoint does not depend on the launcher.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json
from hpp.runtime.cli import run_main
from hpp.runtime.models.gpt import GPT, ModelConfig
from hpp.runtime.models.stage import build_stage

pytestmark = pytest.mark.distributed

CFG = ModelConfig("micro", num_blocks=2, hidden_size=16, num_heads=2, seq_len=8, vocab_size=64)
MODEL = "tests.test_runtime_resume:micro"
CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "cpu-2x4",
           "device_types": {"cpu": {"memory_bytes": 4 * 2**30, "gpus_per_node": 4}},
           "nodes": [{"device_type": "cpu", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1e9}] * 2,
           "inter_node_bandwidth_bytes_per_s": 1e9}
TRAIN = ["--lr", "0.01", "--lr-schedule", "cosine", "--lr-warmup-steps", "1", "--clip-grad-norm", "0.5"]
VERIFY = re.compile(r"^verify: max \|difference\| (\S+) over (\d+) parameters", re.M)


def micro() -> GPT:
    """The test model: 4 layers, hidden 16, head tied to the token table."""
    return GPT(CFG, tie_embeddings=True)


def micro6() -> GPT:
    """Another model (6 layers) whose runs must refuse micro's checkpoints."""
    return GPT(ModelConfig("micro6", num_blocks=4, hidden_size=16, num_heads=2, seq_len=8, vocab_size=64))


def _st(lo: int, hi: int, *devices: int) -> Stage:
    return Stage(lo, hi, "cpu", len(devices), tuple(devices))


def plan_a(path: Path) -> str:
    """3 pipelines, TP 1, 2 samples each (G = 6): cuts at 2, 1 and 3."""
    plan = Plan("micro", 4, 6, (Pipeline((_st(0, 2, 0), _st(2, 4, 1)), 1, 2),
                                Pipeline((_st(0, 1, 2), _st(1, 4, 3)), 1, 2),
                                Pipeline((_st(0, 3, 4), _st(3, 4, 5)), 1, 2)), sequence_length=8, cluster_ref=CLUSTER)
    write_plan_json(plan, path)
    return str(path)


def plan_b(path: Path) -> str:
    """Without device 5: TP 2 pipeline cut at 3 (4 samples), one single-stage TP 1 pipeline (2 samples)."""
    plan = Plan("micro", 4, 6, (Pipeline((_st(0, 3, 0, 1), _st(3, 4, 2, 3)), 2, 4),
                                Pipeline((_st(0, 4, 4),), 1, 2)), sequence_length=8, cluster_ref=CLUSTER)
    write_plan_json(plan, path)
    return str(path)


def run(plan: str, *args: str, steps: int = 3) -> int:
    return run_main([plan, "--steps", str(steps), "--model", MODEL, "--launcher", "fork", "--run-timeout", "120",
                     "--group-timeout", "30", "--quiet", *args])


def verify_of(out: str) -> tuple[float, int]:
    m = VERIFY.search(out)
    assert m is not None, out
    print(m.group(0))
    return float(m.group(1)), int(m.group(2))


NUM_PARAMS = len({n for _l, n, _p in build_stage(micro(), 0, 4, seed=0).layer_parameters()} |
                 {b for _a, b in micro().tied_parameters()})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Plan A, 3 steps, --verify (float64), checkpoints at steps 2 and 3; LR schedule over 6 steps."""
    tmp = tmp_path_factory.mktemp("resume")
    t0 = time.perf_counter()
    code = run(plan_a(tmp / "a.json"), "--verify", *TRAIN, "--lr-total-steps", "6", "--save", str(tmp / "ck"),
               "--save-every", "2")
    assert code == 0
    print(f"plan A 3 steps + save: {time.perf_counter() - t0:.1f} s")
    return tmp


def test_plan_a_saved_complete_checkpoints_at_2_and_3(saved):
    ck = saved / "ck"
    assert sorted(p.name for p in ck.iterdir()) == ["step-2", "step-3"]
    meta = json.loads((ck / "step-3" / "hpp_checkpoint.json").read_text())
    assert (meta["model"], meta["num_layers"], meta["step"], meta["world_size"]) == ("micro", 4, 3, 6)
    assert meta["extra"]["training"]["total_steps"] == 6 and meta["extra"]["training"]["dtype"] == "float64"


def test_resume_on_another_plan_with_tp2_equals_one_long_run(saved, tmp_path, capsys):
    t0 = time.perf_counter()
    code = run(plan_b(tmp_path / "b.json"), "--resume", str(saved / "ck"), "--verify",
               "--metrics-jsonl", str(tmp_path / "m.jsonl"))
    out, err = capsys.readouterr()
    assert code == 0, err
    with capsys.disabled():
        print(f"plan B resume 3 steps: {time.perf_counter() - t0:.1f} s")
        diff, n = verify_of(out)
    assert diff <= 1e-9 and n == NUM_PARAMS, out                  # = 6 steps of single-process training
    assert "(steps 4..6)" in out and out.count(str(saved / "ck")) == 1     # said once: the "resumed" line
    assert "resumed          from " in out and "resuming step" not in out   # not also as a note
    assert re.search(r"^\s+0\s+0\s+0\s+0/2 cpu ", out, re.M) and re.search(r"^\s+4\s+1\s+0\s+0/1 cpu ", out, re.M)
    assert [json.loads(x)["step"] for x in (tmp_path / "m.jsonl").read_text().splitlines()] == [4, 5, 6]
    assert "training settings differ" not in out                   # every setting came from the checkpoint


def test_resume_on_the_same_plan_from_the_earlier_checkpoint(saved, tmp_path, capsys):
    """A -> A from step-2 (the --save-every one), 4 more steps, saving on into a new directory."""
    t0 = time.perf_counter()
    code = run(plan_a(tmp_path / "a.json"), "--resume", str(saved / "ck" / "step-2"), "--verify",
               "--save", str(tmp_path / "ck2"), steps=4)
    out, err = capsys.readouterr()
    assert code == 0, err
    with capsys.disabled():
        print(f"plan A resume 4 steps: {time.perf_counter() - t0:.1f} s")
        diff, n = verify_of(out)
    assert diff <= 1e-9 and n == NUM_PARAMS, out
    assert [p.name for p in (tmp_path / "ck2").iterdir()] == ["step-6"]


def test_control_resume_with_the_schedule_position_lost_fails_verify(saved, tmp_path, capsys):
    """The same resume as A -> B, but the checkpoint's LR scheduler restarts at 0: --verify must fail."""
    bad = tmp_path / "ck" / "step-3"
    shutil.copytree(saved / "ck" / "step-3", bad)
    meta = json.loads((bad / "hpp_checkpoint.json").read_text())
    meta["scheduler"].update(last_epoch=0, _step_count=1)
    (bad / "hpp_checkpoint.json").write_text(json.dumps(meta))
    code = run(plan_b(tmp_path / "b.json"), "--resume", str(bad), "--verify")
    out, _err = capsys.readouterr()
    with capsys.disabled():
        diff, _n = verify_of(out)
    assert code == 1 and diff > 1e-6 and "FAILED" in out, out


def _refused(capsys, *argv: str) -> str:
    code = run(*argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("hpp run: error: "), (code, err)
    return err


def test_bad_resume_input_is_one_line_exit_2(saved, tmp_path, capsys):
    a = plan_a(tmp_path / "a.json")
    assert "no such checkpoint directory" in _refused(capsys, a, "--resume", str(tmp_path / "nothing"))
    half = tmp_path / "half" / "step-3"
    shutil.copytree(saved / "ck" / "step-3", half)
    (half / "complete").unlink()                                   # a save that did not finish
    err = _refused(capsys, a, "--resume", str(half))
    assert "incomplete checkpoint (no 'complete' marker" in err, err
    err = _refused(capsys, a, "--resume", str(half.parent))
    assert "no complete checkpoint in this directory: only incomplete ones (step-3)" in err, err
    other = Plan("micro6", 6, 2, (Pipeline((_st(0, 6, 0),), 1, 2),), sequence_length=8, cluster_ref=CLUSTER)
    write_plan_json(other, tmp_path / "o.json")
    err = _refused(capsys, str(tmp_path / "o.json"), "--model", "tests.test_runtime_resume:micro6", "--resume",
                   str(saved / "ck"))
    assert "checkpoint of model 'micro' (4 layers), not of 'micro6' (6 layers)" in err, err
    err = _refused(capsys, a, "--resume", str(saved / "ck"), "--optimizer", "sgd")
    assert "checkpoint has AdamW optimizer state, this run uses SGD" in err, err
    assert "--save-every without --save" in _refused(capsys, a, "--save-every", "2")


def test_verify_on_a_float32_checkpoint_and_a_timeline_in_no_folder_are_refused_up_front(saved, tmp_path, capsys):
    # a float32 run's checkpoint cannot reproduce float64 training: refused before any rank starts (it used to run
    # and report "verify ... FAILED", which reads as a runtime bug)
    f32 = tmp_path / "f32" / "step-3"
    shutil.copytree(saved / "ck" / "step-3", f32)
    meta = json.loads((f32 / "hpp_checkpoint.json").read_text())
    meta["extra"]["training"]["dtype"] = "float32"
    (f32 / "hpp_checkpoint.json").write_text(json.dumps(meta))
    b = plan_b(tmp_path / "b.json")
    err = _refused(capsys, b, "--resume", str(f32), "--verify")
    assert "--verify compares float64 training, but the checkpoint" in err and "float32 run" in err, err
    assert "resume a checkpoint saved by a --verify (float64) run, or drop --verify" in err
    # --timeline into a folder that does not exist: refused before the run (it crashed after the last step)
    err = _refused(capsys, b, "--timeline", str(tmp_path / "nodir" / "t.png"))
    assert "cannot be written (no such folder, or not writable)" in err, err
    assert not (tmp_path / "nodir").exists()


def test_save_into_another_runs_folder_is_refused_and_continuing_names_its_own_step(saved, tmp_path, capsys):
    """A fresh run saving into a folder with another run's checkpoints used to write step-1 there while its summary
    named the old step-3, and --resume then took the old run: now refused; resuming from
    that folder and saving on into it is the one allowed case, and the summary names the step it wrote."""
    ck = tmp_path / "ck"
    shutil.copytree(saved / "ck", ck)
    a = plan_a(tmp_path / "a.json")
    err = _refused(capsys, a, "--save", str(ck))
    assert err == (f"hpp run: error: {ck}: field '--save': holds the checkpoints of another run (step-2, step-3). "
                   f"Fix: give a new folder, or --resume {ck} --save {ck} to continue that run there"), err
    assert sorted(p.name for p in ck.iterdir()) == ["step-2", "step-3"]          # nothing written
    other = tmp_path / "other" / "step-3"                                       # resumed from elsewhere: refused
    shutil.copytree(saved / "ck" / "step-3", other)
    assert "holds the checkpoints of another run" in _refused(capsys, a, "--resume", str(other), "--save", str(ck))
    assert run(a, "--resume", str(ck), "--save", str(ck), "--verify", steps=1) == 0
    out = capsys.readouterr().out
    assert f"checkpoint       {ck / 'step-4'} (complete)" in out, out
    assert sorted(p.name for p in ck.iterdir()) == ["step-2", "step-3", "step-4"]
    # a branch from step-2 saved into the same folder would hide under step-4 (--resume ck takes the latest): refused
    err = _refused(capsys, a, "--resume", str(ck / "step-2"), "--save", str(ck))
    assert err.endswith(f"field '--save': holds later steps (step-3, step-4) than the step-2 this run resumes from. "
                        f"Fix: save this branch in a new folder, or --resume {ck} (its latest step)"), err
