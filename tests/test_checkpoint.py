"""Checkpoints (hpp.runtime.checkpoint.dcp): written under one layout, loaded exactly under any other.

The training state of a layout is built from single-process training (float64,
AdamW, cosine LR with warmup, tied embeddings): every rank trains the whole tiny model
itself (deterministic, identical on every rank), then hands its stage the trained
values by global name, as a distributed run would hold them. Ranks are forked
(gloo on 127.0.0.1), every launch bounded by a timeout.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from hpp.errors import HppInputError
from hpp.runtime.checkpoint import dcp as ck
from hpp.runtime.checkpoint.export import export_checkpoint
from hpp.runtime.checkpoint import store
from hpp.runtime.launch.processes import free_port
from hpp.runtime.models.api import synthetic_batch
from hpp.runtime.models.gpt import GPT, ModelConfig
from hpp.runtime.models.stage import build_stage
from hpp.runtime.exec.training import TrainingConfig, make_lr_scheduler, make_optimizer, single_device_step

pytestmark = pytest.mark.distributed

CFG = ModelConfig("micro", num_blocks=4, hidden_size=32, num_heads=2, seq_len=16, vocab_size=64)
MODEL = GPT(CFG, tie_embeddings=True)
L = CFG.num_layers                                   # 6
TRAIN = TrainingConfig(optimizer="adamw", lr=1e-2, lr_schedule="cosine", warmup_steps=1, total_steps=8,
                       dtype="float64")
K = 2                                                # steps before the save
LAUNCH_TIMEOUT_S = 90


@functools.lru_cache(maxsize=None)
def reference(steps: int, *, optimizer: str = "adamw"):
    """The whole model trained ``steps`` steps in one process: (module, optimizer, scheduler); read-only.

    Cached: forked ranks inherit what the parent computed.
    """
    cfg = TrainingConfig(**{**TRAIN.__dict__, "optimizer": optimizer})
    module = build_stage(MODEL, 0, L, seed=0, dtype=torch.float64)
    opt = make_optimizer(module.parameters(), cfg)
    sched = make_lr_scheduler(opt, cfg)
    for s in range(steps):
        x, y = synthetic_batch(s, seed=0, global_batch_size=4, seq_len=CFG.seq_len, vocab_size=CFG.vocab_size)
        single_device_step(module, opt, sched, x, y, cfg)
    return module, opt, sched


def fresh(lo: int, hi: int, *, seed: int = 7):
    """An untrained stage of layers [lo, hi) (another seed: nothing equal by accident), its optimizer, scheduler."""
    module = build_stage(MODEL, lo, hi, seed=seed, dtype=torch.float64)
    opt = make_optimizer(module.parameters(), TRAIN)
    return module, opt, make_lr_scheduler(opt, TRAIN)


def by_name(module: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """{global name: {"param": full tensor, <optimizer state>: full tensor}} (DTensors gathered)."""
    def full(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        out[name] = {"param": full(p.detach()), **{k: full(v) for k, v in opt.state.get(p, {}).items()}}
    return out


def stage_from_reference(lo: int, hi: int, ref, *, offset: float = 0.0):
    """Stage [lo, hi) holding the reference's trained parameters, optimizer and scheduler state (+ ``offset``)."""
    rmod, ropt, rsched = ref
    module, opt, sched = fresh(lo, hi)
    rnames = by_name(rmod, ropt)
    with torch.no_grad():
        for name, p in module.named_parameters(remove_duplicate=False):
            p.copy_(rnames[name]["param"] + offset)
    for name, p in module.named_parameters():
        opt.state[p] = {k: v.clone() + (offset if v.dim() else 0) for k, v in rnames[name].items() if k != "param"}
    sched.load_state_dict(rsched.state_dict())
    for g in opt.param_groups:
        g["lr"] = ropt.param_groups[0]["lr"]
    return module, opt, sched


def mismatches(module, opt, ref) -> list[str]:
    """Names whose parameter or optimizer state differs from the reference's in any bit (or is missing)."""
    mine, theirs = by_name(module, opt), by_name(*ref[:2])
    bad = []
    for name, entries in mine.items():
        want = theirs[name]
        if set(entries) != set(want):
            bad.append(f"{name}: keys {sorted(entries)} vs {sorted(want)}")
        bad += [f"{name}.{k}" for k, v in entries.items() if k in want and not torch.equal(v, want[k])]
    return bad


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread here as in the forked ranks: the reference is then the same bit for bit everywhere."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------- forked ranks


def _child(fn: Callable, rank: int, world: int, port: int, out: str, args: tuple) -> None:
    code = 1
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        result = fn(rank, *args)
        dist.barrier()
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        code = 0
    except BaseException:                                              # noqa: BLE001 (reported to the parent)
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
    finally:
        os._exit(code)


def run_ranks(fn: Callable, world: int, out: Path, *args: Any) -> list[Any]:
    """Run ``fn(rank, *args)`` on ``world`` forked gloo ranks; their JSON results, rank order."""
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("fork")
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, str(out), args), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(LAUNCH_TIMEOUT_S)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    errors = [f.read_text() for f in sorted(out.glob("rank*.err"))]
    assert not errors, errors[0]
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def save_layout(rank: int, ckpt: str, ranges: list[tuple[int, int]], offsets: list[float]) -> str:
    module, opt, sched = stage_from_reference(*ranges[rank], reference(K), offset=offsets[rank])
    return str(ck.save_checkpoint(ckpt, step=K, module=module, optimizer=opt, scheduler=sched,
                                  model_name="micro", num_layers=L, extra={"rank_layout": ranges}))


def load_layout(rank: int, ckpt: str, ranges: list[tuple[int, int]]) -> dict[str, Any]:
    module, opt, sched = fresh(*ranges[rank])
    step = ck.load_checkpoint(ckpt, module=module, optimizer=opt, scheduler=sched, model_name="micro", num_layers=L)
    ref = reference(K)
    return {"step": step, "bad": mismatches(module, opt, ref), "lr": opt.param_groups[0]["lr"],
            "ref_lr": ref[1].param_groups[0]["lr"], "epoch": sched.last_epoch, "names": len(by_name(module, opt))}


# ----------------------------------------------------------------------------- tests


def test_resume_on_other_layouts_is_exact(tmp_path: Path) -> None:
    """Save: 2 pipelines x 2 stages, boundaries {3} and {2}. Load: 3 stages {1, 4}, and 1 process holding all.

    Pipeline 1's replicas are offset by +1: the lowest-rank holder (pipeline 0) is the one written, so the
    loaded state still equals the reference (control: the offset copies differ from it).
    """
    ckpt = tmp_path / "ckpt"
    reference(0), reference(K)                                          # computed once, before the forks
    save = [(0, 3), (3, L), (0, 2), (2, L)]
    paths = run_ranks(save_layout, 4, tmp_path / "save", str(ckpt), save, [0.0, 0.0, 1.0, 1.0])
    assert set(paths) == {str(store.step_dir(ckpt, K))}
    assert store.latest_checkpoint(ckpt) == store.step_dir(ckpt, K)
    assert not list(ckpt.glob(".tmp-*"))
    control = stage_from_reference(0, 2, reference(K), offset=1.0)
    assert mismatches(*control[:2], reference(K))                     # the offset replica is not the reference

    results = run_ranks(load_layout, 3, tmp_path / "load", str(ckpt), [(0, 1), (1, 4), (4, L)])
    for r in results:
        assert r["bad"] == [] and r["step"] == K and r["epoch"] == K and r["lr"] == r["ref_lr"]
    assert sum(r["names"] for r in results) == len(by_name(*reference(0)[:2]))

    # one process, everything: load, train 2 more steps == 4 steps straight (bit for bit)
    module, opt, sched = fresh(0, L)
    assert ck.load_checkpoint(ckpt, module=module, optimizer=opt, scheduler=sched, model_name="MICRO",
                              num_layers=L) == K
    assert mismatches(module, opt, reference(K)) == []
    for s in range(K, K + 2):
        x, y = synthetic_batch(s, seed=0, global_batch_size=4, seq_len=CFG.seq_len, vocab_size=CFG.vocab_size)
        single_device_step(module, opt, sched, x, y, TRAIN)
    assert mismatches(module, opt, reference(K + 2)) == []
    assert mismatches(module, opt, reference(K + 1))                  # control: one step short differs


def _tp_stage(ref, tp: int, group) -> tuple:
    """The whole model at TP ``tp`` over ``group``, holding the reference's trained state (sharded locally)."""
    from torch.distributed.tensor import distribute_tensor
    from hpp.runtime.exec.tensor_parallel import parallelize_stage

    module, opt, sched = stage_from_reference(0, L, ref)
    full_state = {n: dict(e) for n, e in by_name(module, opt).items()}
    parallelize_stage(module, MODEL, tp_group=group, tp_degree=tp, device=torch.device("cpu"))
    opt = make_optimizer(module.parameters(), TRAIN)
    sched = make_lr_scheduler(opt, TRAIN)
    sched.load_state_dict(ref[2].state_dict())
    for g in opt.param_groups:
        g["lr"] = ref[1].param_groups[0]["lr"]
    for name, p in module.named_parameters():
        opt.state[p] = {k: (distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)
                            if hasattr(p, "device_mesh") and v.dim() else v.clone())
                        for k, v in full_state[name].items() if k != "param"}
    return module, opt, sched


def save_mixed_tp(rank: int, ckpt: str) -> str:
    """Ranks 0, 1: the whole model at TP 2 (pipeline 0); rank 2: the whole model at TP 1 (pipeline 1)."""
    tp_group = dist.new_group([0, 1])
    ref = reference(K)
    module, opt, sched = _tp_stage(ref, 2, tp_group) if rank < 2 else stage_from_reference(0, L, ref)
    return str(ck.save_checkpoint(ckpt, step=K, module=module, optimizer=opt, scheduler=sched,
                                  model_name="micro", num_layers=L))


def load_tp2(rank: int, ckpt: str) -> dict[str, Any]:
    module, opt, sched = _tp_stage(reference(0), 2, dist.group.WORLD)        # untrained, then loaded
    sharded = sum(hasattr(p, "device_mesh") for p in module.parameters())
    step = ck.load_checkpoint(ckpt, module=module, optimizer=opt, scheduler=sched, model_name="micro", num_layers=L)
    return {"step": step, "bad": mismatches(module, opt, reference(K)), "sharded": sharded}


def test_tp2_and_tp1_checkpoints_load_at_the_other_degree(tmp_path: Path) -> None:
    """TP 2 (+ a TP-1 replica) -> TP 1 in one process, and TP 1 (one process) -> TP 2 on 2 ranks: exact."""
    pytest.importorskip("torch.distributed.tensor.parallel")
    tp2 = tmp_path / "tp2"
    reference(0), reference(K)
    run_ranks(save_mixed_tp, 3, tmp_path / "save", str(tp2))
    module, opt, sched = fresh(0, L)
    assert ck.load_checkpoint(tp2, module=module, optimizer=opt, scheduler=sched) == K
    assert mismatches(module, opt, reference(K)) == []

    tp1 = tmp_path / "tp1"
    rmod, ropt, rsched = reference(K)
    ck.save_checkpoint(tp1, step=K, module=rmod, optimizer=ropt, scheduler=rsched, model_name="micro", num_layers=L)
    for r in run_ranks(load_tp2, 2, tmp_path / "load", str(tp1)):
        assert r["step"] == K and r["bad"] == [] and r["sharded"] > 0


def _save_single(root: Path, step: int, *, model_name: str = "micro", optimizer: str = "adamw") -> Path:
    module, opt, sched = reference(step, optimizer=optimizer)
    return ck.save_checkpoint(root, step=step, module=module, optimizer=opt, scheduler=sched,
                              model_name=model_name, num_layers=L)


def test_incomplete_checkpoints_are_refused_and_skipped(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with pytest.raises(HppInputError, match="no such checkpoint directory"):
        store.resolve_checkpoint(root)
    _save_single(root, 1)
    _save_single(root, 2)
    (store.step_dir(root, 2) / store.COMPLETE_MARKER).unlink()               # a save that died before its marker
    (root / ".tmp-step-3").mkdir()                                      # one that died before its rename
    assert store.latest_checkpoint(root) == store.step_dir(root, 1)
    module, opt, sched = fresh(0, L)
    assert ck.load_checkpoint(root, module=module, optimizer=opt, scheduler=sched) == 1
    with pytest.raises(HppInputError, match="incomplete checkpoint") as exc:
        ck.load_checkpoint(store.step_dir(root, 2), module=module, optimizer=opt, scheduler=sched)
    assert "\n" not in str(exc.value) and str(store.step_dir(root, 2)) in str(exc.value)
    assert "step-1" in str(exc.value)                                   # the fix names the last complete one
    (store.step_dir(root, 1) / store.COMPLETE_MARKER).unlink()
    with pytest.raises(HppInputError, match="no complete checkpoint in this directory: only incomplete ones"):
        ck.load_checkpoint(root, module=module, optimizer=opt, scheduler=sched)


def test_checkpoint_of_another_model_or_optimizer_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _save_single(root, 1)
    module, opt, sched = fresh(0, L)
    with pytest.raises(HppInputError, match=r"checkpoint of model 'micro' \(6 layers\), not of 'gpt-tiny'") as exc:
        ck.load_checkpoint(root, module=module, optimizer=opt, model_name="gpt-tiny", num_layers=6)
    assert "\n" not in str(exc.value) and str(exc.value).endswith(
        "Fix: resume from a checkpoint of gpt-tiny, or resume this one with a plan of micro (hpp plan --model micro ...)")
    with pytest.raises(HppInputError, match="not of 'micro' \\(8 layers\\)"):
        ck.load_checkpoint(root, module=module, optimizer=opt, model_name="micro", num_layers=8)
    wider = GPT(ModelConfig("micro", num_blocks=4, hidden_size=16, num_heads=2, seq_len=16, vocab_size=64))
    small = build_stage(wider, 0, L, seed=0, dtype=torch.float64)
    with pytest.raises(HppInputError, match=r"stores \(64, 32\) for parameter layers.0.wte.weight \(64, 16\)"):
        ck.load_checkpoint(root, module=small, model_name="micro", num_layers=L)
    sgd = make_optimizer(module.parameters(), TrainingConfig(optimizer="sgd", lr=0.1))
    with pytest.raises(HppInputError, match="AdamW optimizer state, this run uses SGD"):
        ck.load_checkpoint(root, module=module, optimizer=sgd)
    assert store.read_checkpoint_meta(root)["step"] == 1                  # nothing above half-loaded the metadata
    wrapped = torch.nn.ModuleDict({"stage": module})                  # names 'stage.layers...': not plan-free
    with pytest.raises(ValueError, match="not global"):
        ck.save_checkpoint(tmp_path / "other", step=1, module=wrapped, optimizer=None, model_name="micro",
                           num_layers=L)


def test_export_torch_and_safetensors_full_float32_by_global_name(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    root = tmp_path / "ckpt"
    _save_single(root, K)
    want = {n: p.detach().float() for n, p in reference(K)[0].named_parameters(remove_duplicate=False)}
    assert "layers.0.wte.weight" in want and f"layers.{L - 1}.lm_head.weight" in want     # both tied names
    export_checkpoint(root, tmp_path / "m.pt")
    export_checkpoint(root, tmp_path / "m.safetensors", format="safetensors")
    for got in (torch.load(tmp_path / "m.pt"), load_file(str(tmp_path / "m.safetensors"))):
        assert set(got) == set(want)
        assert all(got[n].dtype == torch.float32 and torch.equal(got[n], want[n]) for n in want)
    with pytest.raises(HppInputError, match="unknown export format"):
        export_checkpoint(root, tmp_path / "m.bin", format="gguf")
    from hpp.runtime.checkpoint.export import main
    assert main([str(root), str(tmp_path / "cli.pt")]) == 0 and (tmp_path / "cli.pt").is_file()


def test_resave_of_the_same_step_replaces_it_whole(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _save_single(root, 1)
    first = json.loads((store.step_dir(root, 1) / store.META_FILE).read_text())["saved_unix_s"]
    _save_single(root, 1)
    assert json.loads((store.step_dir(root, 1) / store.META_FILE).read_text())["saved_unix_s"] > first
    assert sorted(p.name for p in root.iterdir()) == ["step-1"]
