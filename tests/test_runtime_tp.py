"""Tensor parallelism inside stages, mixed TP degrees across pipelines: training equals one device.

Every launch forks at most 6 gloo ranks of a tiny Hugging Face model (hidden size 64,
sequence 32, float64) for 3 steps and compares every parameter with single-process
training of ``build_stage(model, 0, L)`` on the same global batches with the same
:mod:`hpp.runtime.exec.training` optimizer, schedule and clipping (<= 1e-9).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.devices import DeviceType
from hpp.runtime.exec.data import make_batch_source
from hpp.runtime.exec.reference import max_param_difference
from hpp.runtime.models.stage import build_stage
from hpp.runtime.exec.tensor_parallel import shard_dim
from hpp.runtime.exec.training import (TrainingConfig, make_lr_scheduler, make_optimizer, single_device_step)
from hpp.runtime.models.zoo import load_runtime_model
from hpp.scenarios import make_emulated_cluster
from tests.rank_launch import fork_ranks

pytestmark = pytest.mark.distributed

STEPS = 3
TOL = 1e-9


def _st(lo: int, hi: int, first_dev: int, tp: int = 1, recompute: str = "none") -> Stage:
    return Stage(lo, hi, "cpu", tp, tuple(range(first_dev, first_dev + tp)), recompute)


def llama_mixed_tp() -> Plan:
    """llama-tiny (7 layers): pipeline 0 at TP 2 cut at 3, pipeline 1 at TP 1 cut at 5; 6 ranks, G = 5."""
    return Plan("llama-tiny", 7, 5, (Pipeline((_st(0, 3, 0, 2), _st(3, 7, 2, 2)), 2, 3, "1F1B"),
                                     Pipeline((_st(0, 5, 4), _st(5, 7, 5)), 1, 2, "1F1B")), sequence_length=32)


def opt_tp2_tied() -> Plan:
    """opt-tiny (6 layers, tied embedding): TP 2 everywhere; two stages (two copies) vs one stage (one)."""
    return Plan("opt-tiny", 6, 4, (Pipeline((_st(0, 2, 0, 2), _st(2, 6, 2, 2)), 1, 3, "1F1B"),
                                   Pipeline((_st(0, 6, 4, 2),), 1, 1, "1F1B")), sequence_length=32)


def neo_recompute_clip() -> Plan:
    """gpt-neo-tiny (6 layers, tied): TP 2 two stages (clipping counts pipeline 0) vs TP 1 one stage; all recompute."""
    return Plan("gpt-neo-tiny", 6, 4, (Pipeline((_st(0, 3, 0, 2, "full"), _st(3, 6, 2, 2, "full")), 1, 2, "1F1B"),
                                       Pipeline((_st(0, 6, 4, 1, "full"),), 1, 2, "1F1B")), sequence_length=32)


def _reference(name: str, plan: Plan, training: TrainingConfig, *, seed: int = 0) -> tuple[dict, list[float]]:
    """Single-device training: every parameter by global name (both names of a tied pair), grad norms after clipping."""
    model = load_runtime_model(name)
    module = build_stage(model, 0, model.spec.num_layers, seed=seed, dtype=training.param_dtype)
    named = list(module.layer_parameters())
    opt = make_optimizer([p for _l, _n, p in named], training)
    sched = make_lr_scheduler(opt, training)
    source = make_batch_source(None, model, seed=seed, global_batch_size=plan.global_batch_size)
    norms = []
    for step in range(STEPS):
        x, y = source.batch(step)
        single_device_step(module, opt, sched, x, y, training)
        norms.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for _l, _n, p in named]))))
    out = {n: p.detach().clone() for _l, n, p in named}
    for a, b in model.tied_parameters():
        out[b] = out[a]
    return out, norms


def _run(tmp_path: Path, name: str, plan: Plan, training: TrainingConfig, **kw) -> tuple[float, list[dict], list]:
    res = fork_ranks(plan, name, tmp_path, steps=STEPS, training=training, save_params=True, timeout_s=60,
                     bucket_bytes=kw.pop("bucket_bytes", 16_000), launch_timeout_s=240, **kw)
    assert res.ok, res.failure_message()
    params = [torch.load(tmp_path / f"rank{r}.pt") for r in range(plan.num_devices)]
    ref, _norms = _reference(name, plan, training)
    worst, nan, n = max_param_difference(params, ref)
    assert not nan and set().union(*params) == set(ref), set(ref) - set().union(*params)   # all compared
    return worst, list(res.results), params


F64_ADAMW = TrainingConfig(optimizer="adamw", lr=0.01, dtype="float64", total_steps=STEPS)


def test_llama_mixed_tp_pipelines_match_one_device_and_bytes_match_the_pricing(tmp_path):
    """(a) TP 2 and TP 1 pipelines with different cuts; a rank all-reduces block bytes / t + replicated bytes."""
    plan = llama_mixed_tp()
    worst, results, _ = _run(tmp_path, "llama-tiny", plan, F64_ADAMW)
    assert worst <= TOL, worst
    print(f"max |difference| {worst:.3g}")
    assert sum(r["collectives"][-1]["launched_in_backward"] for r in results) > 0      # overlap kept
    model = load_runtime_model("llama-tiny")
    whole = {n: p for _l, n, p in build_stage(model, 0, 7, seed=0, dtype=torch.float64).layer_parameters()}
    for r in results:
        t, (lo, hi) = r["tp_degree"], r["layers"]
        joined: dict[str, int] = {}
        for label, ranks, nbytes in r["collectives"][-1]["records"]:
            joined[label] = joined.get(label, 0) + nbytes
            assert len(ranks) in (2, 3), ranks         # a piece: one rank per pipeline; replicated: 2 + 1 ranks
        for label, got in joined.items():
            blo, bhi = (int(v) for v in label[len("block ["):-1].split(", "))
            assert lo <= blo and bhi <= hi
            sharded = sum(p.numel() * 8 for n, p in whole.items()
                          if blo <= int(n.split(".")[1]) < bhi and shard_dim(model, n, 2) is not None)
            replicated = sum(p.numel() * 8 for n, p in whole.items()
                             if blo <= int(n.split(".")[1]) < bhi and shard_dim(model, n, 2) is None)
            assert got == sharded // t + replicated, (r["rank"], label, got, sharded, replicated)
        # blocks: [0,3) [3,5) [5,7): every rank of this plan joins the sync of each of its blocks
        assert len(joined) == sum(1 for blo, bhi in ((0, 3), (3, 5), (5, 7)) if lo <= blo and bhi <= hi)
    # the cost model prices block b at max over holders of the profile's per-device bytes (fp32 profile, so x 2)
    est = estimate_plan(plan, make_emulated_cluster("six", (DeviceType("cpu", 10**9, 2),), {"cpu": 6}),
                        load_bundled_profile("llama-tiny"))
    for blk in est.blocks:
        label = f"block [{blk.layer_start}, {blk.layer_stop})"
        issued = max(sum(n for lab, _r, n in r["collectives"][-1]["records"] if lab == label) for r in results)
        assert issued == 2 * blk.num_bytes, (label, issued, blk.num_bytes)
    losses = [l for r in results for l in r["losses"][:1] if l is not None]
    assert len(losses) == 2 and 4.0 < sum(losses) < 7.0              # ~ln(256) at init, one per pipeline


def test_naive_replicated_reduction_over_tp_ranks_fails(tmp_path):
    """Control: summing replicated parameters from every TP rank counts the TP-2 pipeline's norms twice."""
    worst, _results, _ = _run(tmp_path, "llama-tiny", llama_mixed_tp(), F64_ADAMW, naive_tp=True)
    print(f"control max |difference| {worst:.3g}")
    assert worst > 1e-4, worst


def test_opt_tp2_everywhere_with_tied_embeddings_matches_one_device(tmp_path):
    """(b) the tied table: two copies in pipeline 0 (first and last stage), one Parameter in pipeline 1."""
    worst, results, params = _run(tmp_path, "opt-tiny", opt_tp2_tied(), F64_ADAMW)
    assert worst <= TOL, worst
    print(f"max |difference| {worst:.3g}")
    emb, head = "layers.0.embed_tokens.weight", "layers.5.lm_head.weight"
    assert torch.equal(params[0][emb], params[2][head]) and torch.equal(params[4][emb], params[4][head])
    tied = [rec for r in results for rec in r["collectives"][-1]["records"] if rec[0].startswith("tied")]
    assert {len(rec[1]) for rec in tied} == {3}                       # one rank per holder stage (3 stages)


def test_tp4_and_tp2_pipelines_share_pieces_of_a_quarter(tmp_path):
    """T = lcm(4, 2) = 4: each TP-2 rank all-reduces two quarter pieces with two different TP-4 ranks."""
    plan = Plan("opt-tiny", 6, 3, (Pipeline((_st(0, 6, 0, 4),), 1, 2, "1F1B"),
                                   Pipeline((_st(0, 6, 4, 2),), 1, 1, "1F1B")), sequence_length=32)
    worst, results, _ = _run(tmp_path, "opt-tiny", plan, F64_ADAMW, bucket_bytes=10**6)
    assert worst <= TOL, worst
    sets = [sorted({tuple(rec[1]) for rec in r["collectives"][-1]["records"]} - {(0, 1, 2, 3, 4, 5)}) for r in results]
    assert sets == [[(0, 4)], [(1, 4)], [(2, 5)], [(3, 5)], [(0, 4), (1, 4)], [(2, 5), (3, 5)]]


def test_neo_recompute_and_clipping_match_one_device(tmp_path):
    """(c) recomputing stages, mixed TP, global-norm clipping that triggers, warmup + cosine, SGD."""
    training = TrainingConfig(optimizer="sgd", lr=0.5, dtype="float64", clip_grad_norm=0.3, lr_schedule="cosine",
                              warmup_steps=1, total_steps=STEPS)
    plan = neo_recompute_clip()
    _ref, norms = _reference("gpt-neo-tiny", plan, training)
    assert norms == pytest.approx([0.3] * STEPS, rel=1e-5)        # clipped to max_norm: it triggered every step
    unclipped, _ = _reference("gpt-neo-tiny", plan, replace(training, clip_grad_norm=None))
    worst_ref, _nan, _n = max_param_difference([unclipped], _ref)
    assert worst_ref > 1e-3                                        # clipping changes the result
    worst, results, _ = _run(tmp_path, "gpt-neo-tiny", plan, training)
    assert worst <= TOL, worst
    print(f"max |difference| {worst:.3g}")
    assert [r["recompute"] for r in results] == ["full"] * 5
    assert sum(r["collectives"][-1]["launched_in_backward"] for r in results) > 0


def test_bf16_mixed_precision_trains_fp32_masters(tmp_path):
    """bf16 autocast with fp32 master weights: > 50 % of the weights move in 3 steps at lr 1e-3."""
    training = TrainingConfig(optimizer="adamw", lr=1e-3, dtype="bfloat16", total_steps=STEPS)
    plan = llama_mixed_tp()
    res = fork_ranks(plan, "llama-tiny", tmp_path, steps=STEPS, training=training, save_params=True, timeout_s=60,
                     launch_timeout_s=240)
    assert res.ok, res.failure_message()
    model = load_runtime_model("llama-tiny")
    init = {n: p.detach() for _l, n, p in build_stage(model, 0, 7, seed=0, dtype=torch.float32).layer_parameters()}
    changed = total = 0
    for r in range(plan.num_devices):
        for name, value in torch.load(tmp_path / f"rank{r}.pt").items():
            assert value.dtype == torch.float32
            changed += int((value != init[name]).sum())
            total += value.numel()
    assert changed / total > 0.5, changed / total
    print(f"bf16: {changed / total:.3f} of the weights changed")
    lines = [[json.loads(l) for l in (tmp_path / f"rank{r}.steps.jsonl").read_text().splitlines()] for r in (2, 5)]
    assert all([l["step"] for l in ls] == list(range(STEPS)) for ls in lines)
    assert all(4.0 < a["loss"] + b["loss"] < 7.0 for a, b in zip(*lines))      # the two pipelines' parts: ~ln 256


def v66():
    """A GPT whose vocabulary (66) splits at TP 2 but not at TP 4 (``tests.test_runtime_tp:v66``)."""
    from hpp.runtime.models.gpt import GPT, ModelConfig
    return GPT(ModelConfig("v66", num_blocks=1, hidden_size=32, num_heads=4, seq_len=8, vocab_size=66))


def test_a_parameter_sharded_at_one_tp_degree_and_replicated_at_another_is_refused_by_every_rank(tmp_path):
    """Vocabulary 66: the token table is sharded at TP 2 but not at TP 4; every rank stops, none waits."""
    plan = Plan("v66", 3, 2, (Pipeline((_st(0, 3, 0, 4),), 1, 1), Pipeline((_st(0, 3, 4, 2),), 1, 1)))
    res = fork_ranks(plan, "tests.test_runtime_tp:v66", tmp_path, steps=1, timeout_s=60, launch_timeout_s=120)
    assert res.exit_codes == (1,) * 6 and all(e is not None for e in res.errors)
    assert any("layers.0.wte.weight is sharded along dims [0] at TP degrees [2] and replicated at TP [4]" in e
               for e in res.errors), res.errors
