"""hpp run: refusals before any process starts, and end-to-end runs (fork and torchrun)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json
from hpp.profiles.profile_format import profile_to_dict
from hpp.runtime import run as run_mod
from hpp.runtime import run_setup
from hpp.runtime.cli import run_main
from hpp.runtime.profile.profiler import profile_model, scale_profile

CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "cpu-hetero-4",
           "device_types": {"cpu": {"memory_bytes": 4 * 2**30, "gpus_per_node": 2},
                            "cpu-2x": {"memory_bytes": 4 * 2**30, "gpus_per_node": 2, "slowdown": 2.0}},
           "nodes": [{"device_type": "cpu", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1e9},
                     {"device_type": "cpu-2x", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1e9}],
           "inter_node_bandwidth_bytes_per_s": 1e9}


@pytest.fixture(scope="module")
def profile_ref():
    prof = profile_model("gpt-tiny", micro_batch_sizes=(2,), warmup=1, repeats=2)
    return {"embedded": profile_to_dict(scale_profile(prof, {"cpu-2x": 2.0}, base_device_type="cpu"))}


def _plan(path, *, profile=None, stages0=((0, 3), (3, 6)), tp=1, num_layers=6, model="gpt-tiny", recompute="none"):
    s0 = tuple(Stage(lo, hi, "cpu", 1, (i,), recompute) for i, (lo, hi) in enumerate(stages0))
    p0 = Pipeline(s0, 2, 10)
    p1 = Pipeline((Stage(0, 2, "cpu-2x", 1, (2,)), Stage(2, num_layers, "cpu-2x", 1, (3,))), 2, 6)
    cluster = CLUSTER
    if tp > 1:      # one node of 4 cpu devices: a TP-tp stage, then a one-device pipeline
        cluster = dict(CLUSTER, device_types={"cpu": {"memory_bytes": 4 * 2**30, "gpus_per_node": 4}},
                       nodes=[{"device_type": "cpu", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1e9}])
        p0 = Pipeline((Stage(0, num_layers, "cpu", tp, tuple(range(tp))),), 2, 10)
        p1 = Pipeline((Stage(0, num_layers, "cpu", 1, (tp,)),), 2, 6)
    plan = Plan(model, num_layers, 16, (p0, p1), sequence_length=128, profile_ref=profile or {}, cluster_ref=cluster)
    write_plan_json(plan, path)
    return str(path)



def not_a_model():
    """``--model tests.test_runtime_cli:not_a_model``: no runtime model protocol."""
    return object()


def other_six_layers():
    """A 6-layer model named differently from the plan's gpt-tiny."""
    from hpp.runtime.models.gpt import GPT, ModelConfig
    return GPT(ModelConfig("other", num_blocks=4, hidden_size=16, num_heads=2, seq_len=8, vocab_size=256))


@pytest.mark.parametrize("case,args,needle", [
    ("world", ["--world-size", "3"], "the plan has 4 devices but the world size is 3"),
    ("tp", [], "TP degree 3 does not divide gpt-tiny's 4 attention heads"),
    ("invalid", [], "skips layers"),
    ("model", ["--model", "gpt-nope"], "the runtime has no model 'gpt-nope'. Fix: use one of gpt-tiny, gpt-small, "
                                       "opt-tiny, gpt-neo-tiny, llama-tiny"),
    ("import", ["--model", "no_such_module_h3:build"], "cannot import 'no_such_module_h3' (ModuleNotFoundError"),
    ("object", ["--model", "tests.test_runtime_cli:not_a_model"], "returned a object, which has no 'spec'"),
    ("layers", [], "model gpt-tiny has 6 layers but the plan"),
    ("profile-layers", [], "the plan has num_layers=7 but the profile of gpt-tiny has 6 layers"),
    ("name", ["--model", "tests.test_runtime_cli:other_six_layers"],
     "the plan is for model 'gpt-tiny' but the runtime model is 'other'"),
    ("steps", ["--steps", "0"], "run at least 1 step"),
    ("selective", [], "selective activation recomputation is not supported by hpp run"),
    ("data-missing", ["--data", "no-such-file.txt"], "--data file 'no-such-file.txt' does not exist"),
    ("data-short", ["--data", "SHORT"], "is too short for one global batch: 1000 tokens = 7 windows of 128 + 1, "
                                        "the plan's global batch needs 16 samples"),
    ("optimizer", ["--lr", "-1"], "training lr = -1.0"),
])
def test_bad_input_is_refused_before_any_process(tmp_path, capsys, no_launch, profile_ref, case, args, needle):
    kw = {"tp": {"tp": 3},
          "layers": {"num_layers": 7, "stages0": ((0, 3), (3, 7))},
          "profile-layers": {"num_layers": 7, "stages0": ((0, 3), (3, 7)), "profile": profile_ref},
          "selective": {"recompute": "selective"}}.get(case, {})
    path = _plan(tmp_path / "p.json", **kw)
    if case == "invalid":           # a file a Plan cannot hold (stages [0, 2) then [3, 6)): refused on load
        doc = json.loads(Path(path).read_text())
        doc["pipelines"][0]["stages"][0]["layers"] = [0, 2]
        Path(path).write_text(json.dumps(doc))
    if "SHORT" in args:
        (tmp_path / "short.txt").write_bytes(b"x" * 1000)
        args = [a if a != "SHORT" else str(tmp_path / "short.txt") for a in args]
    steps = [] if "--steps" in args else ["--steps", "2"]
    assert run_main([path, *steps, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_a_user_models_plan_runs_without_model_flag(tmp_path, profile_ref):
    """The profile of ``hpp profile --model MODULE:FUNCTION`` names it (meta.runtime_model); hpp run loads it."""
    emb = copy.deepcopy(profile_ref["embedded"])
    emb["model"] = "other"
    emb.setdefault("meta", {})["runtime_model"] = "tests.test_runtime_cli:other_six_layers"
    path = _plan(tmp_path / "p.json", profile={"embedded": emb}, model="other")
    plan, _cluster, profile = run_setup.load_run_inputs(path)
    assert run_setup.model_source(plan, profile, None) == "tests.test_runtime_cli:other_six_layers"
    assert run_setup.resolve_run_model(plan, profile, None, source=path).spec.name == "other"


def test_more_devices_than_the_host_can_run(tmp_path, capsys, no_launch, monkeypatch):
    monkeypatch.setattr(run_mod, "MAX_RANKS_PER_CORE", 1)
    monkeypatch.setattr(run_mod.os, "cpu_count", lambda: 2)
    assert run_main([_plan(tmp_path / "p.json"), "--steps", "1"]) == 2
    assert "needs 4 devices but this host can run at most 2 CPU ranks" in capsys.readouterr().err


@pytest.fixture(scope="module")
def emulated_run(tmp_path_factory, profile_ref):
    """One emulated fork run (3 steps, --json, --timeline), shared by the tests below."""
    import contextlib
    import io
    tmp = tmp_path_factory.mktemp("emulated")
    path = _plan(tmp / "p.json", profile=profile_ref)
    png = tmp / "t.png"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_main([path, "--steps", "3", "--emulate-speed", "--launcher", "fork", "--json", "--quiet",
                         "--timeline", str(png)])
    assert code == 0
    return json.loads(out.getvalue()), png, tmp


@pytest.mark.distributed
def test_fork_run_emulated_json_and_timeline(emulated_run):
    rep, png, tmp = emulated_run
    assert rep["measured"]["iteration_time_s"] > 0 and rep["measured"]["throughput_samples_per_s"] > 0
    assert rep["predicted"]["iteration_time_s"] > 0
    for key in ("loss", "tokens_per_s", "mfu"):                                    # CONTRACT.md's run keys
        assert key in rep["measured"]
    assert rep["measured"]["mfu"] is None and rep["measured"]["loss"] > 0          # CPU: no peak FLOP/s
    assert rep["collectives"]["count"] == 3 and rep["collectives"]["bytes"] > 0     # 3 shared blocks
    assert len(rep["ranks"]) == 4 and all(r["peak_memory_bytes"] > 0 for r in rep["ranks"])
    assert png.stat().st_size > 10_000 and not list(tmp.glob("*.tmp*"))
    pred = [st["memory_bytes"] for p in rep["predicted"]["pipelines"] for st in p["stages"]]
    assert rep["device"] == "cpu" and len(pred) == 4 and all(m > 0 for m in pred)


def test_summary_puts_each_rank_predicted_memory_beside_its_peak():
    from hpp.runtime.cli import _human_run
    rank = {"rank": 0, "pipeline": 1, "stage": 0, "device_type": "cpu", "layers": [0, 2], "recompute": None,
            "num_micro_batches": 2, "peak_memory_bytes": 300 * 2**20, "compute_s": 0.1, "padding_s": 0.0}
    stages = [{"memory_bytes": 5 * 2**20}, {"memory_bytes": 7 * 2**20}]
    rep = {"plan": "p.json", "model": "m", "world_size": 1, "steps": 2, "launcher": "fork", "emulate_speed": False,
           "measured": {"iteration_time_s": 1.0, "throughput_samples_per_s": 2.0, "tokens_per_s": 16.0},
           "predicted": {"iteration_time_s": 1.0, "pipelines": [{"stages": stages}, {"stages": stages[::-1]}]},
           "collectives": {"count": 1, "bytes": 8, "mode": "block-bucketed", "num_blocks": 1},
           "ranks": [rank], "notes": []}
    lines = _human_run({**rep, "device": "cuda"}).splitlines()
    head = next(i for i, line in enumerate(lines) if "rank pipe" in line)
    assert lines[head].split()[-4:] == ["peak_mem_MB", "pred_mem_MB", "compute_s", "padding_s"]
    assert lines[head + 1].split()[-4:] == ["300.0", "7.0", "0.1000", "0.0000"]     # pipeline 1, stage 0: 7 MiB
    cpu = _human_run({**rep, "device": "cpu"})
    assert "peak_RSS_MB" in cpu and "not the device memory that pred_mem_MB predicts" in cpu
    assert "n/a" in _human_run({**rep, "device": "cuda", "predicted": {"iteration_time_s": None}}).splitlines()[-1]


@pytest.mark.distributed
@pytest.mark.timing
def test_emulated_slow_ranks_are_padded(emulated_run):
    """Needs an unloaded host: the emulation's padding is wall-clock."""
    slow = [r for r in emulated_run[0]["ranks"] if r["device_type"] == "cpu-2x"]
    assert all(r["padding_s"] > 0.25 * r["compute_s"] for r in slow)


def test_timeline_has_a_legend_in_every_panel(tmp_path):
    from hpp.plan_data import plan_from_dict, read_plan_json
    from hpp.runtime.timeline import write_timeline_png
    plan = plan_from_dict(read_plan_json(_plan(tmp_path / "p.json")))
    ev = [{"kind": k, "micro_batch": 0, "start_s": t, "stop_s": t + 0.1} for k, t in (("F", 0.0), ("B", 0.2))]
    results = [{"pipeline": p, "stage": s, "device_type": "cpu", "events": ev} for p in range(2) for s in range(2)]
    stages = {"stages": [{"forward_s": 0.1, "backward_s": 0.2}] * 2}
    fig = write_timeline_png(tmp_path / "t.png", plan=plan, results=results,
                             predicted={"pipelines": [stages, stages]})
    assert len(fig.axes) == 2 and all(ax.get_legend() is not None for ax in fig.axes)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
        "forward (label: micro-batch)", "backward (label: micro-batch)"]


@pytest.mark.distributed
def test_torchrun_run_prints_measured_and_predicted(tmp_path, capsys, profile_ref):
    path = _plan(tmp_path / "p.json", profile=profile_ref)
    assert run_main([path, "--steps", "2", "--run-timeout", "120"]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "predicted" in out and "grad all-reduce  3 per step" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without a CUDA GPU")
def test_gpu_check_refuses_a_host_without_cuda_in_one_line(tmp_path):
    script = Path(__file__).resolve().parents[1] / "experiments" / "gpu_check.sh"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    res = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "gpu_check: error: no CUDA GPU visible to torch (torch.cuda.is_available() is False). "
        "Fix: run on a host with a CUDA GPU and a CUDA build of torch"]
    assert not (tmp_path / "out").exists()


def test_fork_launcher_with_cuda_is_refused_before_any_rank_starts(tmp_path, capsys, profile_ref):
    """A forked rank cannot use CUDA once the launching process has (seen on an H200: every rank aborted)."""
    path = _plan(tmp_path / "p.json", profile=profile_ref)
    assert run_main([path, "--steps", "1", "--launcher", "fork", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hpp run: error: field 'launcher': --launcher fork with --device cuda: a forked rank cannot use "
                   "CUDA once the launching process has. Fix: use --launcher torchrun (the default) on GPUs"]
