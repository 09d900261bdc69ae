"""Pure parts of TP and training (no processes): TP layout, finest-common-shard pieces, schedule, clipping."""

from __future__ import annotations

import math

import pytest
import torch

from hpp.errors import HppInputError
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.runtime.exec.sync_units import _param_entries, sync_units
from hpp.runtime.exec.layout import ShardGroups, group_layout, rank_roles
from hpp.runtime.models.stage import build_stage
from hpp.runtime.exec.training import (TrainingConfig, clip_by_global_norm, lr_factor, make_lr_scheduler, make_optimizer,
                                  measure_stage_flops)
from hpp.runtime.config import RunConfig, RunFacts
from hpp.runtime.exec.worker import training_config
from hpp.runtime.models.zoo import load_runtime_model


def _st(lo: int, hi: int, first: int, tp: int = 1) -> Stage:
    return Stage(lo, hi, "cpu", tp, tuple(range(first, first + tp)))


def mixed_plan() -> Plan:
    """llama-tiny: TP 2 cut at 3 (ranks 0-3), TP 1 cut at 5 (ranks 4, 5)."""
    return Plan("llama-tiny", 7, 5, (Pipeline((_st(0, 3, 0, 2), _st(3, 7, 2, 2)), 2, 3),
                                     Pipeline((_st(0, 5, 4), _st(5, 7, 5)), 1, 2)), sequence_length=32)


def test_ranks_are_numbered_stage_by_stage_with_tp_rank_inside():
    roles = rank_roles(mixed_plan())
    assert [(r.pipeline, r.stage_index, r.tp_degree, r.tp_rank, r.stage_ranks) for r in roles] == [
        (0, 0, 2, 0, (0, 1)), (0, 0, 2, 1, (0, 1)), (0, 1, 2, 0, (2, 3)), (0, 1, 2, 1, (2, 3)),
        (1, 0, 1, 0, (4,)), (1, 1, 1, 0, (5,))]
    assert [r.device_id for r in roles] == [0, 1, 2, 3, 4, 5]


def test_lanes_tp_groups_and_pieces():
    layout = group_layout(mixed_plan())
    assert layout.lane_ranks == (((0, 2), (1, 3)), ((4, 5),))
    assert layout.stage_ranks == ((0, 1), (2, 3), (4,), (5,))
    assert [b.layers for b in layout.blocks] == [(0, 1, 2), (3, 4), (5, 6)]
    b0 = layout.blocks[0]
    assert b0.holders == ((0, 1), (4,)) and b0.num_pieces == 2
    assert [b0.piece_ranks(j) for j in range(2)] == [(0, 4), (1, 4)] and b0.all_ranks == (0, 1, 4)
    order = layout.creation_order()
    assert order[:3] == ((0, 2), (1, 3), (4, 5)) and len(set(order)) == len(order)
    assert all(len(r) > 1 for r in order[3:])
    assert {(0, 4), (1, 4), (0, 1, 4), (2, 4), (3, 4), (2, 3, 4), (2, 5), (3, 5), (2, 3, 5)} <= set(order)


def test_finest_common_shard_of_tp_2_and_3():
    """T = lcm(2, 3) = 6: piece j on TP rank j*2//6 of one holder and j*3//6 of the other."""
    g = ShardGroups((1,), ((0, 1), (2, 3, 4)))
    assert g.num_pieces == 6
    assert [g.piece_ranks(j) for j in range(6)] == [(0, 2), (0, 2), (0, 3), (1, 3), (1, 4), (1, 4)]
    assert g.rank_sets() == ((0, 2), (0, 3), (1, 3), (1, 4), (0, 1, 2, 3, 4))
    assert ShardGroups((1,), ((0, 1),)).rank_sets() == ()                # one holder: nothing to sync


def test_tp1_rank_cuts_every_sharded_parameter_into_the_pieces_of_its_tp2_peers():
    """Rank 4 (TP 1) holds whole parameters: each sharded one goes out as 2 pieces, each element once."""
    plan = mixed_plan()
    model = load_runtime_model("llama-tiny")
    roles = rank_roles(plan)
    stage = build_stage(model, 0, 5, seed=0, dtype=torch.float64)
    units = sync_units(group_layout(plan), roles[4], roles, stage, model)
    assert [u.label for u in units] == ["block [0, 3)", "block [3, 5)"]
    for u in units:
        sets = u.groups.rank_sets()
        covered: dict[str, int] = {}
        for _layer, e, s in u.entries:
            name = next(n for _l, n, p in stage.layer_parameters() if p is e.param)
            covered[name] = covered.get(name, 0) + e.numel
            assert e.contribute
            if e.dim is None:                                   # replicated (norms): all ranks of both holders
                assert len(sets[s]) == 3
            else:
                assert len(sets[s]) == 2 and e.length == e.param.shape[e.dim] // 2
        whole = {n: p.numel() for l, n, p in stage.layer_parameters() if l in u.groups.layers}
        assert covered == whole


class _StubModel:
    """Shards ``lin`` colwise at any TP degree, divisible or not."""

    def tp_plan(self, index, tp_degree):
        return {"lin": "colwise"} if tp_degree > 1 else {}


def test_uneven_pieces_and_mixed_sharding_are_refused_with_the_sizes_named():
    p = torch.nn.Parameter(torch.zeros(10, 3))
    groups = ShardGroups((0,), ((0, 1), (2, 3, 4, 5), (6,)))
    with pytest.raises(HppInputError, match="size 10 splits unevenly at TP degrees \\[1, 2, 4\\]"):
        _param_entries("layers.0.lin.weight", p, groups=groups, holder_names=["layers.0.lin.weight"] * 3,
                       model=_StubModel(), module=None, tp_rank=0, my_holder=2, naive_tp=False)
    even = _param_entries("layers.0.lin.weight", torch.nn.Parameter(torch.zeros(8, 3)), groups=groups,
                          holder_names=["layers.0.lin.weight"] * 3, model=_StubModel(), module=None, tp_rank=0,
                          my_holder=2, naive_tp=False)
    assert [(e.start, e.length, ranks) for e, ranks in even] == [(0, 2, (0, 2, 6)), (2, 2, (0, 3, 6)),
                                                                 (4, 2, (1, 4, 6)), (6, 2, (1, 5, 6))]

    class Half(_StubModel):
        def tp_plan(self, index, tp_degree):
            return {"lin": "colwise"} if tp_degree == 2 else {}

    with pytest.raises(HppInputError, match="replicated at TP \\[4\\]"):
        _param_entries("layers.0.lin.weight", p, groups=groups, holder_names=["layers.0.lin.weight"] * 3,
                       model=Half(), module=None, tp_rank=0, my_holder=2, naive_tp=False)


def test_warmup_cosine_schedule_through_lambda_lr():
    cfg = TrainingConfig(lr=1.0, lr_schedule="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
    sched = make_lr_scheduler(opt, cfg)
    lrs = []
    for _ in range(7):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    cos = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert lrs == pytest.approx([1 / 3, 2 / 3, *cos])
    assert lr_factor(5, TrainingConfig()) == 1.0


def test_bad_training_settings_name_the_field():
    with pytest.raises(HppInputError) as info:
        TrainingConfig(optimizer="lamb")
    assert info.value.field == "optimizer"
    with pytest.raises(HppInputError, match="unknown training settings \\['momentum'\\]"):
        TrainingConfig.from_dict({"momentum": 0.9})
    with pytest.raises(HppInputError):
        TrainingConfig(clip_grad_norm=0.0)


def test_a_rank_trains_with_the_resolved_training_over_the_runs_steps():
    """The facts' training (resolved once by hpp run) as given; its schedule spans the run's steps unless it says."""
    config = RunConfig.build("p.json", steps=4)
    facts = RunFacts(plan={}, model="gpt-tiny", training={"optimizer": "adamw", "lr": 0.01, "dtype": "float64"})
    assert training_config(config, facts) == TrainingConfig(optimizer="adamw", lr=0.01, total_steps=4,
                                                            dtype="float64")
    facts = RunFacts(plan={}, model="gpt-tiny", training={"optimizer": "sgd", "total_steps": 9})
    assert training_config(config, facts).total_steps == 9


def test_bfloat16_keeps_fp32_master_weights():
    bf = TrainingConfig(dtype="bfloat16")
    assert (bf.param_dtype, bf.activation_dtype, bf.logits_dtype) == (torch.float32, torch.bfloat16, torch.float32)


def test_clipping_counts_each_parameter_once_and_equals_torch():
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(5, 4, dtype=torch.float64)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    ref = [p.grad.clone() for p in params]
    refp = [torch.nn.Parameter(torch.zeros(5, 4, dtype=torch.float64)) for _ in range(3)]
    for p, g in zip(refp, ref):
        p.grad = g
    total = float(torch.nn.utils.clip_grad_norm_(refp, 1.0))
    # the same three parameters, split as two ranks would hold them: shards of param 0, a duplicate of param 2
    g0 = params[0].grad
    terms = [(g0[:2], True), (g0[2:], True), (params[1].grad, True), (params[2].grad, True),
             (params[2].grad.clone(), False)]
    norm = clip_by_global_norm(terms, 1.0)
    assert norm == pytest.approx(total, rel=1e-14) and norm > 1.0
    assert all(torch.allclose(p.grad, q.grad, rtol=0, atol=1e-15) for p, q in zip(params, refp))


def test_flops_of_stages_add_up_to_the_whole_model_and_leave_grads_alone():
    model = load_runtime_model("llama-tiny")
    kw = dict(micro_batch_size=2, seq_len=32, hidden_size=64, dtype=torch.float64)
    whole = build_stage(model, 0, 7, seed=0, dtype=torch.float64, recompute="full")
    total = measure_stage_flops(whole, is_first=True, is_last=True, **kw)
    parts = [measure_stage_flops(build_stage(model, lo, hi, seed=0, dtype=torch.float64), is_first=lo == 0,
                                 is_last=hi == 7, **kw) for lo, hi in ((0, 3), (3, 7))]
    assert total == sum(parts) > 0
    assert whole.recompute == "full" and all(p.grad is None for p in whole.parameters())
