"""Pure parts of the runtime: models, layout, batch split, timeline replay (no processes)."""

from __future__ import annotations

import pytest
import torch

from hpp.errors import HppInputError
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.runtime.exec.layout import block_holders, blocks, group_layout, rank_roles, split_micro_batches
from hpp.runtime.exec.training import lm_loss
from hpp.runtime.host.time_model import schedule_order
from hpp.runtime.models.api import IGNORE_INDEX, synthetic_batch
from hpp.runtime.models.gpt import ModelConfig, build_stage_module, get_model_config, tied_param_names
from hpp.runtime.timeline import simulate_pipeline

CFG = ModelConfig("micro", num_blocks=4, hidden_size=16, num_heads=2, seq_len=8, vocab_size=32)


def _st(lo: int, hi: int, dev: int, tp: int = 1) -> Stage:
    return Stage(lo, hi, "cpu", tp, tuple(range(dev, dev + tp)))


def _plan() -> Plan:
    return Plan("micro", 6, 13, (Pipeline((_st(0, 2, 0), _st(2, 4, 1), _st(4, 6, 2)), 2, 7),
                                 Pipeline((_st(0, 3, 3), _st(3, 6, 4)), 1, 1, "GPipe"),
                                 Pipeline((_st(0, 6, 5),), 3, 5)))


def test_registry_and_layer_count():
    assert get_model_config("OPT-350").num_layers == 26
    assert get_model_config("gpt-tiny").num_layers == 6
    with pytest.raises(HppInputError, match="unknown model 'nope'.*gpt-tiny"):
        get_model_config("nope")


def test_stages_reassemble_the_whole_model_deterministically():
    whole = {n: p for _l, n, p in build_stage_module(CFG, 0, 6, seed=3).layer_parameters()}
    parts = {}
    for lo, hi in ((0, 2), (2, 5), (5, 6)):
        parts.update({n: p for _l, n, p in build_stage_module(CFG, lo, hi, seed=3).layer_parameters()})
    assert whole.keys() == parts.keys()
    assert all(torch.equal(whole[k], parts[k]) for k in whole)
    other = {n: p for _l, n, p in build_stage_module(CFG, 0, 6, seed=4).layer_parameters()}
    assert not torch.equal(other["layers.1.qkv.weight"], whole["layers.1.qkv.weight"])


def test_tied_copies_start_equal_and_share_in_one_module():
    emb, head = tied_param_names(CFG)
    first = dict((n, p) for _l, n, p in build_stage_module(CFG, 0, 2, seed=1, tie_embeddings=True).layer_parameters())
    last = dict((n, p) for _l, n, p in build_stage_module(CFG, 4, 6, seed=1, tie_embeddings=True).layer_parameters())
    assert torch.equal(first[emb], last[head])
    whole = build_stage_module(CFG, 0, 6, seed=1, tie_embeddings=True)
    names = [n for _l, n, _p in whole.layer_parameters()]
    assert emb in names and head not in names          # one parameter, listed once
    assert whole.layers["5"].lm_head.weight is whole.layers["0"].wte.weight


def test_stage_forward_shapes_and_loss():
    x, y = synthetic_batch(0, seed=0, global_batch_size=3, seq_len=CFG.seq_len, vocab_size=CFG.vocab_size)
    assert x.shape == y.shape == (3, CFG.seq_len) and torch.equal(x[:, 1:], y[:, :-1])
    logits = build_stage_module(CFG, 0, 6, seed=0)(x)
    assert logits.shape == (3, CFG.seq_len, CFG.vocab_size)
    mean = torch.nn.functional.cross_entropy(logits.reshape(-1, CFG.vocab_size), y.reshape(-1))
    assert torch.allclose(lm_loss(logits, y, denominator=3 * CFG.seq_len), mean)


def test_blocks_holders_and_groups():
    plan = _plan()
    assert blocks(plan) == ((0, 2), (2, 3), (3, 4), (4, 6))
    assert block_holders(plan) == ((0, 3, 5), (1, 3, 5), (1, 4, 5), (2, 4, 5))
    layout = group_layout(plan, tie_embeddings=True)
    assert layout.pipeline_ranks == ((0, 1, 2), (3, 4), (5,))
    assert layout.tied_ranks == (0, 2, 3, 4, 5)
    order = layout.creation_order()
    assert order[:3] == ((0, 1, 2), (3, 4), (5,)) and len(set(order)) == len(order)
    roles = rank_roles(plan)
    assert [(r.pipeline, r.stage_index, r.sample_offset, r.num_micro_batches) for r in roles] == [
        (0, 0, 0, 4), (0, 1, 0, 4), (0, 2, 0, 4), (1, 0, 7, 1), (1, 1, 7, 1), (2, 0, 8, 2)]


def test_tp_degrees_that_differ_within_a_pipeline_are_refused():
    plan = Plan("micro", 6, 4, (Pipeline((_st(0, 3, 0, tp=2), _st(3, 6, 2)), 2, 4),))
    with pytest.raises(HppInputError, match=r"pipeline 0 mixes TP degrees \[1, 2\]") as info:
        rank_roles(plan)
    assert info.value.fix == "re-plan; hpp plan emits one TP degree per pipeline"
    assert info.value.field == "pipelines[0].stages[*].tp_degree"


def test_samples_that_miss_the_global_batch_are_refused_before_any_rank_runs():
    # a plan built in Python (not read from JSON): 5 of 13 samples would train on a partial batch; such a
    # Plan cannot be built (hpp.plan_data.Plan checks at construction), so no rank ever gets one
    with pytest.raises(HppInputError) as exc:
        Plan("micro", 6, 13, (Pipeline((_st(0, 6, 0),), 3, 5),))
    assert "add up to 5, not the global batch size 13" in str(exc.value)
    assert exc.value.field == "pipelines[*].num_samples" and exc.value.fix


def test_partial_last_micro_batch_is_padded_with_ignored_targets():
    x = torch.arange(14).reshape(7, 2)
    xp, yp = split_micro_batches(x, x + 100, micro_batch_size=3, ignore_index=IGNORE_INDEX)
    assert xp.shape == (9, 2) and torch.equal(xp[:7], x) and (yp[7:] == IGNORE_INDEX).all()
    chunks = torch.tensor_split(xp, 3)                     # how the schedule chunks it
    assert [c.shape[0] for c in chunks] == [3, 3, 3] and torch.equal(chunks[2][0], x[6])


def test_schedule_replay_matches_the_1f1b_formula():
    assert schedule_order(1, 2, 3, "1F1B") == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    def end(f, b, m):
        ops = simulate_pipeline(f, b, m, "1F1B")
        assert all(len(stage) == 2 * m for stage in ops)
        return max(op[3] for stage in ops for op in stage)

    def formula(f, b, m):
        return sum(f) + sum(b) + (m - 1) * max(x + y for x, y in zip(f, b))

    assert end([1.0] * 3, [2.0] * 3, 5) == pytest.approx(formula([1.0] * 3, [2.0] * 3, 5))   # balanced: exact
    f, b = [1.0, 2.0, 1.5], [2.0, 4.0, 3.0]
    assert formula(f, b, 1) == pytest.approx(end(f, b, 1))
    assert max(x + y for x, y in zip(f, b)) * 5 <= end(f, b, 5) <= formula(f, b, 5)          # bounds
    gp = simulate_pipeline(f, b, 2, "GPipe")
    assert [k for k, _i, _s, _e in gp[0]] == ["F", "F", "B", "B"]


def _fwd_bwd(mod, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Output, gradients by name and the bytes of non-parameter tensors saved for backward."""
    params = {p.untyped_storage().data_ptr() for p in mod.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = mod(x)
    out.square().sum().backward()
    return out.detach(), {n: p.grad.clone() for _l, n, p in mod.layer_parameters()}, sum(saved.values())


def test_full_recompute_reruns_each_layer_and_keeps_only_inputs():
    """recompute='full': same output and gradients (float64, exact), every layer forward twice, less kept."""
    x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len))
    plain = build_stage_module(CFG, 0, 5, seed=1, dtype=torch.float64)
    ckpt = build_stage_module(CFG, 0, 5, seed=1, dtype=torch.float64, recompute="full")
    calls: dict[str, int] = {}
    for key, layer in ckpt.layers.items():      # count calls of forward itself (the recompute skips module hooks)
        def counted(*args, _key=key, _fwd=layer.forward):
            calls[_key] = calls.get(_key, 0) + 1
            return _fwd(*args)
        layer.forward = counted
    out0, g0, kept0 = _fwd_bwd(plain, x)
    out1, g1, kept1 = _fwd_bwd(ckpt, x)
    assert torch.equal(out0, out1)
    assert g0.keys() == g1.keys() and all(torch.allclose(g0[k], g1[k], rtol=0, atol=1e-12) for k in g0)
    assert calls == {str(l): 2 for l in range(5)}
    assert kept1 < kept0 / 3, (kept1, kept0)


def test_selective_recompute_is_refused_with_the_stage_named():
    with pytest.raises(HppInputError, match="selective activation recomputation is not supported"):
        build_stage_module(CFG, 0, 2, seed=0, recompute="selective")
    plan = Plan("micro", 6, 4, (Pipeline((_st(0, 3, 0), Stage(3, 6, "cpu", 1, (1,), "selective")), 2, 4),))
    with pytest.raises(HppInputError) as info:
        rank_roles(plan)
    assert info.value.field == "pipelines[0].stages[1].recompute"
    with pytest.raises(HppInputError, match="unknown recompute mode"):
        build_stage_module(CFG, 0, 2, seed=0, recompute="partial")
