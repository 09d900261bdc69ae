"""Hugging Face folders in (``hpp run --weights``) and out (``export --format hf``).

The folders are made in each test's temporary folder by ``transformers`` (``save_pretrained``) from the shipped
tiny configs, every parameter perturbed so that no two tensors are alike (biases and norms included). The
loss and logits are compared with ``transformers``' own forward in float64.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json
from hpp.runtime.checkpoint import dcp as ck
from hpp.runtime.checkpoint.export import export_checkpoint, main as export_main
from hpp.runtime.cli import run_main
from hpp.runtime.exec.data import make_batch_source
from hpp.runtime.exec.training import TrainingConfig, make_optimizer, single_device_step
from hpp.runtime.exec.weights import load_weights_folder
from hpp.runtime.models import hf_layers
from hpp.runtime.models.hf import HFModel, hf_model, load_model_file
from hpp.runtime.models.hf_folder import open_weights_folder
from hpp.runtime.models.stage import build_stage

CLUSTER4 = {"format": "hpp-cluster", "version": 1, "name": "cpu-4",
            "device_types": {"cpu": {"memory_bytes": 4 * 2**30, "gpus_per_node": 4}},
            "nodes": [{"device_type": "cpu", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1e9}],
            "inter_node_bandwidth_bytes_per_s": 1e9}
TOL = 1e-10


def save_hf(name_or_model: str | HFModel, folder: Path, *, seed: int = 7, **save_kw) -> torch.nn.Module:
    """A ``*ForCausalLM`` of the model's config, every parameter perturbed, saved with ``save_pretrained``."""
    m = hf_model(name_or_model) if isinstance(name_or_model, str) else name_or_model
    torch.manual_seed(seed)
    hf = hf_layers.causal_lm_class(m.arch)(m.config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(folder, **save_kw)
    return hf.eval()


def opt_plan(path: Path, model: str = "opt-tiny", num_layers: int = 6) -> str:
    """Two pipelines on 4 ranks: one stage at TP 2 (both tied ends in it), and two TP-1 stages (the tied table
    on the first and the last stage); global batch 4."""
    p0 = Pipeline((Stage(0, num_layers, "cpu", 2, (0, 1)),), 1, 2)
    p1 = Pipeline((Stage(0, 3, "cpu", 1, (2,)), Stage(3, num_layers, "cpu", 1, (3,))), 1, 2)
    write_plan_json(Plan(model, num_layers, 4, (p0, p1), sequence_length=32, cluster_ref=CLUSTER4), path)
    return str(path)


def stage_logits(model: HFModel, state: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """hpp's single-device model with ``state`` (global names) in float64: logits ``(b, s, V)``."""
    module = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=torch.float64)
    missing, unexpected = module.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if k in dict(module.named_parameters())], (missing, unexpected)
    with torch.no_grad():
        return module(tokens)


def run_with_weights(tmp_path: Path, capsys, name: str, num_layers: int, *extra: str
                     ) -> tuple[torch.nn.Module, float, float, str]:
    """``hpp run --weights --verify`` of a saved folder under :func:`opt_plan`: the transformers model, the run's
    first-step loss, transformers' loss on that step's batch (float64) and the run's stdout."""
    hf = save_hf(name, tmp_path / "in")
    plan = opt_plan(tmp_path / "plan.json", model=name, num_layers=num_layers)
    metrics = tmp_path / "m.jsonl"
    assert run_main([plan, "--weights", str(tmp_path / "in"), "--verify", "--launcher", "fork", "--metrics-jsonl",
                     str(metrics), "--quiet", "--group-timeout", "60", "--run-timeout", "240", "--no-host-calibration",
                     *extra]) == 0
    x, y = make_batch_source(None, hf_model(name), seed=0, global_batch_size=4).batch(0)
    with torch.no_grad():
        logits = hf.double()(x).logits
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    return hf, json.loads(metrics.read_text().splitlines()[0])["loss"], want, capsys.readouterr().out


@pytest.mark.distributed
def test_weights_run_first_loss_is_transformers_and_its_export_reloads(tmp_path, capsys):
    """opt-tiny, two pipelines with TP 2: step 1's loss is transformers' forward on that batch (float64, 1e-10),
    --verify passes; after 2 steps, the exported folder loads with from_pretrained (no missing or unexpected
    key) and its logits are hpp's (1e-10), the pad token's row included."""
    hf, got, want, out_text = run_with_weights(tmp_path, capsys, "opt-tiny", 6, "--steps", "2",
                                               "--save", str(tmp_path / "ck"))
    assert f"note: --weights {tmp_path / 'in'}: its float32 tensors are cast to the run's float64" in out_text
    assert "verify: max |difference|" in out_text and "): ok" in out_text
    model = hf_model("opt-tiny")
    x, _y = make_batch_source(None, model, seed=0, global_batch_size=4).batch(0)
    print(f"first-step loss {got!r} vs transformers {want!r}: |difference| {abs(got - want):.3g}")
    assert abs(got - want) <= TOL

    out = tmp_path / "out"
    assert export_main([str(tmp_path / "ck"), str(out), "--format", "hf", "--dtype", "float64",
                        "--max-shard-size", "500KB"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2 and "lm_head.weight" not in index["weight_map"]
    cls = hf_layers.causal_lm_class("opt")
    back, info = cls.from_pretrained(out, output_loading_info=True, dtype=torch.float64)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    state = export_checkpoint(tmp_path / "ck", tmp_path / "m.pt", format="torch", dtype=torch.float64) and \
        torch.load(tmp_path / "m.pt")
    tokens = x.clone()
    tokens[0, :4] = 1                                  # OPT's pad token: hpp trains its row, HF must not zero it
    with torch.no_grad():
        theirs = back.eval()(tokens).logits
    mine = stage_logits(model, state, tokens)
    print(f"exported logits |difference| {(theirs - mine).abs().max().item():.3g}")
    assert (theirs - mine).abs().max().item() <= TOL
    emb = state["layers.0.embed_tokens.weight"]
    moved = (emb - hf.model.decoder.embed_tokens.weight.double()).abs()
    assert moved[1].max() > 1e-6 and torch.equal(back.model.decoder.embed_tokens.weight[1], emb[1])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name, num_layers", [("gpt-neo-tiny", 6), ("llama-tiny", 7)])
def test_other_architectures_first_loss_is_transformers(tmp_path, capsys, name, num_layers):
    """GPT-Neo (local attention, tied) and Llama (GQA: 2 key/value heads split at TP 2) under the same plan."""
    _hf, got, want, out_text = run_with_weights(tmp_path, capsys, name, num_layers, "--steps", "1")
    assert "): ok" in out_text
    print(f"{name}: first-step loss |difference| from transformers {abs(got - want):.3g}")
    assert abs(got - want) <= TOL


@pytest.mark.parametrize("name", ["opt-tiny", "gpt-neo-tiny", "llama-tiny"])
def test_export_after_steps_reloads_with_transformers(tmp_path, name):
    """A stage loaded from a folder, 2 AdamW steps, a checkpoint, --format hf: from_pretrained gives hpp's logits."""
    save_hf(name, tmp_path / "in")
    model = hf_model(name)
    n = model.spec.num_layers
    module = build_stage(model, 0, n, seed=0, dtype=torch.float64)
    load_weights_folder(module, model, tmp_path / "in")
    training = TrainingConfig(optimizer="adamw", lr=1e-2, dtype="float64", total_steps=2)
    opt = make_optimizer([p for _l, _n, p in module.layer_parameters()], training)
    source = make_batch_source(None, model, seed=0, global_batch_size=2)
    for step in range(2):
        single_device_step(module, opt, None, *source.batch(step), training)
    ck.save_checkpoint(tmp_path / "ck", step=2, module=module, optimizer=None, model_name=name, num_layers=n)
    shapes = export_checkpoint(tmp_path / "ck", tmp_path / "out", format="hf", dtype=torch.float64)
    back, info = hf_layers.causal_lm_class(model.arch).from_pretrained(tmp_path / "out", output_loading_info=True,
                                                                       dtype=torch.float64)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert set(shapes) == set(dict(back.named_parameters()))
    x, _y = source.batch(5)
    with torch.no_grad():
        diff = (back.eval()(x).logits - module(x)).abs().max().item()
    print(f"{name}: exported logits |difference| {diff:.3g}")
    assert diff <= TOL


def test_sharded_folder_loads_the_same_as_one_file(tmp_path):
    """llama-tiny (untied) saved whole and as an index + 2 shards: the same parameters, equal to transformers'."""
    hf = save_hf("llama-tiny", tmp_path / "one")
    nbytes = sum(p.numel() * 4 for p in hf.parameters())
    save_hf("llama-tiny", tmp_path / "two", max_shard_size=nbytes // 2 + 10_000)
    index = json.loads((tmp_path / "two" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2 and not (tmp_path / "two" / "model.safetensors").exists()
    model = hf_model("llama-tiny")
    got = {}
    for sub in ("one", "two"):
        module = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=torch.float32)
        stats = load_weights_folder(module, model, tmp_path / sub)
        got[sub] = {n: p.detach().clone() for _l, n, p in module.layer_parameters()}
        assert stats["tensors"] == len(got[sub]) == len(list(hf.parameters()))
    theirs = dict(hf.named_parameters())
    for name, value in got["one"].items():
        assert torch.equal(value, got["two"][name]) and torch.equal(value, theirs[model.hf_name(name)]), name


def test_bfloat16_folder_is_cast_to_the_runs_float64(tmp_path):
    """A bf16 folder into a float64 stage: every value exactly the bf16 value (a cast up loses nothing)."""
    hf = save_hf("gpt-neo-tiny", tmp_path / "bf", seed=3)
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf")
    folder = open_weights_folder(tmp_path / "bf")
    assert set(folder.dtypes.values()) == {"BF16"}
    model = hf_model("gpt-neo-tiny")
    module = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=torch.float64)
    load_weights_folder(module, model, tmp_path / "bf")
    theirs = dict(hf.named_parameters())
    for _l, name, p in module.layer_parameters():
        assert p.dtype == torch.float64 and torch.equal(p.detach(), theirs[model.hf_name(name)].double()), name


def opt_wide() -> HFModel:
    """``tests.test_runtime_weights:opt_wide``: an OPT of 12 blocks of width 512 (38 M parameters, 155 MB in
    float32), most of them in the blocks, so that a quarter of the model is far from all of it."""
    cfg = {**load_model_file("opt-tiny")["hf_config"], "hidden_size": 512, "word_embed_proj_dim": 512,
           "ffn_dim": 2048, "num_attention_heads": 8, "num_hidden_layers": 12, "vocab_size": 2048,
           "max_position_embeddings": 16}
    return HFModel("opt-wide", cfg, seq_len=16)


@pytest.mark.distributed
def test_a_ranks_memory_while_loading_grows_by_one_tensor_not_the_model(tmp_path):
    """Two stages at TP 2 (4 ranks, a quarter of the model each): while loading, no rank's resident memory grows
    by more than the stated margin (one tensor: load_margin_bytes), a fraction of the model; control: reading
    the whole file with safetensors' load_file grows it by the whole model."""
    from safetensors.torch import load_file
    from hpp.runtime.exec.weights import release_free_memory, rss_bytes
    from hpp.runtime.launch.launchers import launch_forked
    from tests.rank_launch import rank_job, sgd

    model = opt_wide()
    save_hf(model, tmp_path / "in")
    whole = (tmp_path / "in" / "model.safetensors").stat().st_size
    n = model.spec.num_layers
    plan = Plan("opt-wide", n, 2, (Pipeline((Stage(0, n // 2, "cpu", 2, (0, 1)), Stage(n // 2, n, "cpu", 2, (2, 3))),
                                            1, 2),), sequence_length=16)
    config, facts = rank_job(plan, "tests.test_runtime_weights:opt_wide", steps=1, training=sgd(), timeout_s=60)
    facts = replace(facts, weights=str(tmp_path / "in"))
    res = launch_forked(config, facts, world_size=4, out_dir=tmp_path / "ranks", timeout_s=240)
    assert res.ok, res.failure_message()
    for r in res.results:
        w = r["weights"]
        print(f"rank {r['rank']}: shard {w['bytes'] / 2**20:.1f} MiB of {whole / 2**20:.1f} MiB; resident memory "
              f"grew by {w['peak_rss_growth_bytes'] / 2**20:.1f} MiB while loading (margin "
              f"{w['margin_bytes'] / 2**20:.1f} MiB)")
        assert w["bytes"] < whole / 3 and w["read_bytes"] == w["bytes"]
        assert w["peak_rss_growth_bytes"] <= w["margin_bytes"] < whole / 3
    release_free_memory()
    before = rss_bytes()
    everything = load_file(str(tmp_path / "in" / "model.safetensors"))
    assert all(math.isfinite(float(t.sum())) for t in everything.values())      # every value read
    grown = rss_bytes() - before
    print(f"control: load_file grew resident memory by {grown / 2**20:.1f} MiB")
    assert grown >= 0.9 * whole and len(everything) > 0


# -- bad input: one line, exit 2, before any process -----------------------------------------------------------------


def _refused(capsys, argv: list[str]) -> str:
    capsys.readouterr()                               # save_pretrained's progress bar
    assert run_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_bad_folders_are_one_line_before_any_process(tmp_path, capsys, no_launch):
    plan = opt_plan(tmp_path / "plan.json")
    run = [plan, "--steps", "1", "--launcher", "fork", "--no-host-calibration", "--weights"]
    save_hf("gpt-neo-tiny", tmp_path / "neo")
    assert _refused(capsys, [*run, str(tmp_path / "neo")]) == (
        f"hpp run: error: {tmp_path / 'neo' / 'config.json'}: field 'model_type': model_type 'gpt_neo', but the run's "
        "model opt-tiny is 'opt'. Fix: give a folder of the model opt-tiny, or run a plan of the folder's model "
        "(its shipped config: hpp/runtime/models/configs/opt-tiny.json)")
    wide = HFModel("opt-wide", {**load_model_file("opt-tiny")["hf_config"], "ffn_dim": 256}, seq_len=32)
    save_hf(wide, tmp_path / "wide")
    assert "field 'ffn_dim': ffn_dim 256, but the run's model opt-tiny has 128. Fix:" in \
        _refused(capsys, [*run, str(tmp_path / "wide")])

    run[0] = opt_plan(tmp_path / "llama.json", model="llama-tiny", num_layers=7)
    save_hf("llama-tiny", tmp_path / "two", max_shard_size=400_000)
    index = json.loads((tmp_path / "two" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 2
    (tmp_path / "two" / shards[1]).rename(tmp_path / "aside")
    assert _refused(capsys, [*run, str(tmp_path / "two")]) == (
        f"hpp run: error: {tmp_path / 'two' / shards[1]}: field '--weights': safetensors file missing. "
        "Fix: copy the whole model folder (every file the index names)")
    data = (tmp_path / "aside").read_bytes()
    (tmp_path / "two" / shards[1]).write_bytes(data[: len(data) - 1000])              # truncated
    line = _refused(capsys, [*run, str(tmp_path / "two")])
    assert line.startswith(f"hpp run: error: {tmp_path / 'two' / shards[1]}: field '--weights': not a complete "
                           "safetensors file (") and line.endswith("Fix: copy or download the file again (it is "
                                                                   "truncated or damaged)"), line
    (tmp_path / "two" / shards[1]).write_bytes(data)
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = shards[0]
    (tmp_path / "two" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _refused(capsys, [*run, str(tmp_path / "two")]) == (
        f"hpp run: error: {tmp_path / 'two' / 'model.safetensors.index.json'}: field 'weight_map': names tensor "
        f"'model.layers.9.mlp.up_proj.weight' in shard {shards[0]}, which has no such tensor. "
        "Fix: use the index written with the shards (save_pretrained writes both)")
    del index["weight_map"]["model.layers.9.mlp.up_proj.weight"]
    (tmp_path / "two" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert run_main([*run, str(tmp_path / "two"), "--dry-run", str(tmp_path / "dry")]) == 0      # control: accepted
    capsys.readouterr()


def test_weights_with_resume_or_a_model_without_hf_names_is_refused(tmp_path, capsys, no_launch):
    save_hf("opt-tiny", tmp_path / "in")
    plan = opt_plan(tmp_path / "plan.json")
    assert _refused(capsys, [plan, "--steps", "1", "--weights", str(tmp_path / "in"), "--resume",
                             str(tmp_path / "ck")]) == (
        "hpp run: error: field '--weights': --weights with --resume: a resumed run continues from its checkpoint's "
        "weights. Fix: drop --weights (or --resume to start a new run from the folder)")
    gpt = opt_plan(tmp_path / "gpt.json", model="gpt-tiny")
    assert _refused(capsys, [gpt, "--steps", "1", "--weights", str(tmp_path / "in")]) == (
        "hpp run: error: field '--weights': --weights loads Hugging Face folders into the shipped OPT, GPT-Neo and "
        "Llama models, not 'gpt-tiny'. Fix: run a plan of opt-*, gpt-neo-* or llama-* (or drop --weights)")
    assert _refused(capsys, [plan, "--steps", "1", "--weights", str(tmp_path / "nope")]) == (
        f"hpp run: error: {tmp_path / 'nope'}: field '--weights': no such folder. "
        "Fix: give a folder written by save_pretrained (config.json and safetensors weights)")


def test_export_hf_of_a_model_without_hf_names_is_refused(tmp_path, capsys):
    from hpp.runtime.models.gpt import GPT, ModelConfig
    micro = GPT(ModelConfig("micro", num_blocks=1, hidden_size=8, num_heads=2, seq_len=4, vocab_size=16))
    module = build_stage(micro, 0, 3, seed=0)
    ck.save_checkpoint(tmp_path / "ck", step=1, module=module, optimizer=None, model_name="micro", num_layers=3)
    assert export_main([str(tmp_path / "ck"), str(tmp_path / "out"), "--format", "hf"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("python -m hpp.runtime.checkpoint.export: error: field '--format': the checkpoint's model "
                           "'micro' is not a shipped OPT, GPT-Neo or Llama model, so it has no Hugging Face names. "
                           "Fix: export it with --format safetensors (its state dict by hpp's global names)")
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_export_hf_refuses_an_existing_folder_and_a_bad_shard_size(tmp_path, capsys):
    model = hf_model("llama-tiny")
    module = build_stage(model, 0, model.spec.num_layers, seed=0)
    ck.save_checkpoint(tmp_path / "ck", step=1, module=module, optimizer=None, model_name="llama-tiny",
                       num_layers=model.spec.num_layers)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    assert export_main([str(tmp_path / "ck"), str(out), "--format", "hf"]) == 2
    assert capsys.readouterr().err.strip() == (f"python -m hpp.runtime.checkpoint.export: error: field 'OUT': {out} "
                                               "exists. Fix: give a new folder, or --force to replace that folder")
    assert [p.name for p in out.iterdir()] == ["keep"]
    assert export_main([str(tmp_path / "ck"), str(out), "--format", "hf", "--max-shard-size", "lots"]) == 2
    assert capsys.readouterr().err.strip() == ("python -m hpp.runtime.checkpoint.export: error: field "
                                               "'--max-shard-size': --max-shard-size 'lots'. Fix: give bytes or a "
                                               "size such as 500MB or 5GB")
    assert export_main([str(tmp_path / "ck"), str(out), "--format", "hf", "--force"]) == 0      # control
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "out"]                     # no temporary left
