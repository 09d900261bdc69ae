"""Memory truth: the runtime's stage step measured with FakeTensor + MemTracker vs the memory model.

Everything runs on fake tensors (no real memory) with a fake process group, on the tiny
variants of the HF architectures.
"""

from __future__ import annotations

import dataclasses

import pytest

from hpp.errors import HppInputError
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.memory_model import stage_memory_breakdown, stage_memory_bytes
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.profiles.profile_format import profile_from_dict, profile_to_dict
from hpp.runtime.profile.stage_memory import StepSpec, measure_stage_step
from hpp.runtime.profile.memory_terms import LayerMemory, memory_terms, with_memory_terms
from hpp.runtime.models.zoo import load_runtime_model

NO_FRAMEWORK = CostModelConfig(framework_bytes=())


def _entry(terms, **overrides) -> LayerProfile:
    n = len(terms.param_bytes)
    z = (0.0,) * n
    e = with_memory_terms(LayerProfile("X", terms.tp_degree, terms.micro_batch_size, z, z, z, terms.param_bytes,
                                       terms.step_activation_bytes, terms.output_bytes), terms)
    return dataclasses.replace(e, **overrides)


def _err(pred: int, meas: int) -> float:
    return abs(pred - meas) / meas


@pytest.fixture(scope="module")
def llama_tiny():
    model = load_runtime_model("llama-tiny")
    return model, memory_terms(model, micro_batch_size=2)


def test_tiny_stage_step_predicted_from_per_layer_terms_within_5_percent(llama_tiny):
    """2-stage llama-tiny, 3 micro-batches, AdamW: each stage's peak from per-layer terms + cost model vs MemTracker."""
    model, terms = llama_tiny
    e = _entry(terms)
    L = model.spec.num_layers
    for position, (lo, hi) in enumerate(((0, 4), (4, L))):
        meas = measure_stage_step(model, StepSpec(lo, hi, position, 2, 2, 3, optimizer="adamw"))
        pred = stage_memory_breakdown(e, lo, hi, position=position, num_stages=2, num_micro_batches=3,
                                      config=NO_FRAMEWORK)
        assert _err(pred["peak"], meas.peak_bytes) < 0.05, (position, pred, meas.peak_bytes)
        # the measured step holds what the breakdown says it does: weights, gradients, 2 AdamW states
        assert meas.breakdown["parameters"] == pred["parameters"]
        assert meas.breakdown["optimizer_states"] == pytest.approx(2 * pred["parameters"], rel=1e-3)
        if position == 1:
            # control: blind to what the old per-layer profile never saw (the loss's saved log-softmax,
            # backward temporaries), the last stage is under-predicted by more than 5 %
            blind = stage_memory_breakdown(_entry(terms, loss_activation_bytes=0, backward_transient_bytes=(0,) * L),
                                           lo, hi, position=1, num_stages=2, num_micro_batches=3,
                                           config=NO_FRAMEWORK)
            assert _err(blind["peak"], meas.peak_bytes) > 0.05


def test_sgd_has_no_optimizer_states_and_the_model_knows(llama_tiny):
    model, terms = llama_tiny
    L = model.spec.num_layers
    meas = measure_stage_step(model, StepSpec(0, L, 0, 1, 2, 1, optimizer="sgd"))
    pred = stage_memory_breakdown(_entry(terms), 0, L, position=0, num_stages=1, num_micro_batches=1,
                                  config=dataclasses.replace(NO_FRAMEWORK, optimizer="sgd"))
    assert meas.breakdown["optimizer_states"] == 0 and pred["optimizer_states"] == 0
    assert _err(pred["peak"], meas.peak_bytes) < 0.05
    adamw = stage_memory_breakdown(_entry(terms), 0, L, position=0, num_stages=1, num_micro_batches=1,
                                   config=NO_FRAMEWORK)
    assert adamw["optimizer_states"] == 2 * adamw["parameters"]


def test_one_stage_peak_does_not_grow_with_micro_batches():
    """The runtime keeps no outputs the loss consumed: 1 stage, 1 vs 4 micro-batches, same peak."""
    model = load_runtime_model("opt-tiny")
    L, V, s = model.spec.num_layers, model.spec.vocab_size, model.spec.seq_len
    logits = 2 * s * V * 4                                      # one micro-batch's fp32 (b, s, V)
    now = [measure_stage_step(model, StepSpec(0, L, 0, 1, 2, m, optimizer="sgd")).peak_bytes for m in (1, 4)]
    # what may grow: the step's token ids and targets (b m s int64 each) and one loss scalar per micro-batch
    tokens = 2 * 3 * (2 * s * 8)
    assert 0 <= now[1] - now[0] <= tokens + 3 * 4
    # control: the runtime as it was (return_outputs=True, a real output placeholder) keeps every logits chunk
    old = [measure_stage_step(model, StepSpec(0, L, 0, 1, 2, m, optimizer="sgd"), legacy_waste=True).peak_bytes
           for m in (1, 4)]
    assert old[1] - old[0] >= 3 * logits
    assert old[0] > now[0]


def test_tp2_stage_step_predicted_within_5_percent():
    model = load_runtime_model("opt-tiny")
    terms = memory_terms(model, micro_batch_size=2, tp_degree=2)
    L = model.spec.num_layers
    meas = measure_stage_step(model, StepSpec(3, L, 1, 2, 2, 2, tp_degree=2))
    pred = stage_memory_breakdown(_entry(terms), 3, L, position=1, num_stages=2, num_micro_batches=2,
                                  config=NO_FRAMEWORK)
    assert _err(pred["peak"], meas.peak_bytes) < 0.05
    assert pred["parameters"] < sum(memory_terms(model, micro_batch_size=2).param_bytes[3:L])   # sharded


def test_bf16_tp2_first_stage_predicted_within_5_percent():
    """bf16 autocast, TP 2, first of 4 stages of opt-tiny (the case that was 7.3 % over, 15 % at opt-350).

    Under autocast the embedding's fp32 output makes the first stage's residual stream fp32, and
    each post-LN block keeps only bf16 casts of its input: the previous block's fp32 output is
    freed inside the stage, and the stage's last output is cast to bf16 to be sent. Only the
    stage's two layers are measured (as ``memory_terms`` measures a first stage's chain).
    """
    import torch

    from hpp.runtime.profile.memory_terms import measure_layer_memory

    model = load_runtime_model("opt-tiny")
    L, n = model.spec.num_layers, 2 * model.spec.seq_len * model.spec.hidden_size   # n: elements of one (b, s, h)
    kw = dict(micro_batch_size=2, dtype="bfloat16", tp_degree=2)
    emb = measure_layer_memory(model, 0, **kw)
    block = measure_layer_memory(model, 1, input_dtype=emb.output_dtype, **kw)     # fp32 in, as in the stage
    assert emb.output_dtype == block.output_dtype == torch.float32
    assert block.stage_exit_release_bytes == 4 * n - 2 * n                         # fp32 output out, bf16 cast in

    def entry(a: LayerMemory, b: LayerMemory) -> LayerProfile:
        pad = (0,) * (L - 2)
        z = (0.0,) * L
        return LayerProfile("X", 2, 2, z, z, z, (a.param_bytes, b.param_bytes) + pad, (0,) * L,
                            (a.output_bytes, b.output_bytes) + pad,
                            step_activation_bytes=(a.step_activation_bytes, b.step_activation_bytes) + pad,
                            backward_transient_bytes=(a.backward_transient_bytes, b.backward_transient_bytes) + pad,
                            loss_activation_bytes=0,
                            stage_exit_release_bytes=(a.stage_exit_release_bytes, b.stage_exit_release_bytes) + pad,
                            forward_transient_bytes=(a.forward_transient_bytes, b.forward_transient_bytes) + pad)

    meas = measure_stage_step(model, StepSpec(0, 2, 0, 4, 2, 4, dtype="bfloat16", tp_degree=2))
    pred = stage_memory_breakdown(entry(emb, block), 0, 2, position=0, num_stages=4, num_micro_batches=4,
                                  config=NO_FRAMEWORK)
    assert _err(pred["peak"], meas.peak_bytes) < 0.02, (pred, meas.peak_bytes)
    # control: the block's fp32 output counted as kept (what a measurement with a held input says) and
    # no cast at the stage's end: more than 5 % over, as before the fix
    held = dataclasses.replace(block, step_activation_bytes=block.step_activation_bytes + 4 * n,
                               stage_exit_release_bytes=0)
    blind = stage_memory_breakdown(entry(emb, held), 0, 2, position=0, num_stages=4, num_micro_batches=4,
                                   config=NO_FRAMEWORK)
    assert _err(blind["peak"], meas.peak_bytes) > 0.05


def test_measure_refuses_bad_specs():
    model = load_runtime_model("opt-tiny")
    with pytest.raises(HppInputError, match="micro-batches"):
        measure_stage_step(model, StepSpec(0, 3, 0, 2, 1, 1))          # 1F1B needs m >= stages
    with pytest.raises(HppInputError, match="holds layers"):
        measure_stage_step(model, StepSpec(1, 3, 0, 2, 1, 2))          # a first stage starts at layer 0
    with pytest.raises(HppInputError, match="optimizer"):
        StepSpec(0, 6, optimizer="adam").validate(6)


# ------------------------------------------------------------------ profile fields and cost model (no torch step)

def _toy(**memory) -> LayerProfile:
    return LayerProfile("X", 1, 2, (1.0,) * 3, (2.0,) * 3, (0.1,) * 3, (100,) * 3, (10, 20, 30), (5, 6, 7), **memory)


def test_profile_round_trip_keeps_the_memory_terms_and_old_entries_unchanged():
    new = _toy(step_activation_bytes=(5, 20, 30), backward_transient_bytes=(4, 8, 40), loss_activation_bytes=9,
               tied_param_bytes=3)
    old = _toy()
    for e in (new, old):
        p = ModelProfile("toy", 3, 8, {e.key: e})
        d = profile_to_dict(p)
        assert profile_from_dict(d).entries[e.key] == e
    assert "step_activation_bytes" not in profile_to_dict(ModelProfile("toy", 3, 8, {old.key: old}))["entries"][0]
    assert new.has_step_memory and not old.has_step_memory


def test_profile_refuses_memory_terms_of_the_wrong_length():
    d = profile_to_dict(ModelProfile("toy", 3, 8, {(("X", 1, 2)): _toy()}))
    d["entries"][0]["backward_transient_bytes"] = [1, 2]
    with pytest.raises(HppInputError, match="backward_transient_bytes"):
        profile_from_dict(d)


def test_without_the_terms_the_calibrated_formula_is_unchanged():
    e = _toy()
    got = stage_memory_bytes(e, 0, 3, position=0, num_stages=2, num_micro_batches=4, config=NO_FRAMEWORK)
    assert got == 4 * 300 + 2 * 60 + 30 + 2 * 7                # state factor 4, k = 2, workspace, p2p buffers
    parts = stage_memory_breakdown(e, 0, 3, position=0, num_stages=2, num_micro_batches=4, config=NO_FRAMEWORK)
    assert parts["peak"] == got and "weights_and_states" in parts


def test_step_memory_formula_by_hand():
    """k = 2 in flight of a first stage of 2 with m = 4: states, buffers per micro-batch, transient."""
    e = _toy(step_activation_bytes=(5, 20, 30), backward_transient_bytes=(4, 8, 40), loss_activation_bytes=9)
    cfg = dataclasses.replace(NO_FRAMEWORK, optimizer_transient_params=0.1)
    d = stage_memory_breakdown(e, 0, 2, position=0, num_stages=2, num_micro_batches=4, config=cfg)
    # AdamW: P (2 + 2) = 800; buffers: 4 gradient receive buffers of output[1] = 24; k K = 2 x 25;
    # transient: layer 1's 8 (layer 0's 4 comes after 20 freed)
    assert d["peak"] == 800 + 24 + 50 + 8
    assert d["pipeline_buffers"] == 24 and d["embedding"] == 10 and d["phase"] == 0
    last = stage_memory_breakdown(e, 2, 3, position=1, num_stages=2, num_micro_batches=4, config=cfg)
    # P 100 x 4; 4 activation receive buffers of output[1] + 1 held input gradient; K = 30 + 9; T 40
    assert last["peak"] == 400 + 4 * 6 + 6 + 39 + 40
    sgd = dataclasses.replace(cfg, optimizer="sgd")
    assert stage_memory_bytes(e, 2, 3, position=1, num_stages=2, num_micro_batches=4, config=sgd) == \
        last["peak"] - 200
    # the optimizer step's temporaries (1 x P, foreach) outgrow the backward of the first stage
    opt = stage_memory_breakdown(e, 0, 2, position=0, num_stages=2, num_micro_batches=4, config=NO_FRAMEWORK)
    assert opt["phase"] == 1 and opt["peak"] == 800 + 24 + 200


def test_memory_headroom_and_config_checks():
    assert CostModelConfig().usable_memory_bytes(1000) == 1000
    assert CostModelConfig(memory_headroom=0.05, reserve_bytes=10).usable_memory_bytes(1000) == 940
    for bad in (dict(memory_headroom=1.0), dict(memory_headroom=-0.1), dict(optimizer="adam"),
                dict(optimizer_transient_params=-1.0)):
        with pytest.raises(HppInputError):
            CostModelConfig(**bad)


def test_estimated_micro_batch_interpolates_the_memory_terms():
    from hpp.profiles.model_profile import estimate_micro_batch

    a = _toy(step_activation_bytes=(5, 20, 30), backward_transient_bytes=(4, 8, 40), loss_activation_bytes=9)
    b = dataclasses.replace(a, micro_batch_size=4, step_activation_bytes=(9, 40, 60),
                            backward_transient_bytes=(8, 16, 80), loss_activation_bytes=18)
    p = ModelProfile("toy", 3, 8, {a.key: a, b.key: b})
    e = estimate_micro_batch(p, "X", 1, 3)
    assert e.step_activation_bytes == (7, 30, 45) and e.loss_activation_bytes == 14 and e.estimated


@pytest.mark.parametrize("first_stage", [False, True])
def test_step_memory_tables_price_every_range_like_the_cost_model(llama_tiny, first_stage):
    """The planner's dense tables (hpp.formulation.step_memory) == stage_memory_breakdown for every range."""
    from hpp.formulation.cost_config import OPTIMIZER_STATES
    from hpp.formulation.step_memory import step_memory_peak, step_memory_tables

    _model, terms = llama_tiny
    e = _entry(terms, tied_param_bytes=100)
    L, out = e.num_layers, terms.output_bytes
    assert any(terms.forward_transient_bytes)
    # the stage entry / exit terms as bf16 has them (llama-tiny's fp32 blocks keep their input: 0)
    e = dataclasses.replace(e, stage_entry_bytes=tuple(o if 0 < l < L - 1 else 0 for l, o in enumerate(out)),
                            stage_exit_release_bytes=tuple(o // 2 * (l % 2) for l, o in enumerate(out)))
    if first_stage:                                          # as under bf16: the first stage's own terms
        e = dataclasses.replace(e, first_stage_step_activation_bytes=tuple(2 * a for a in terms.step_activation_bytes),
                                first_stage_backward_transient_bytes=tuple(3 * t for t in
                                                                           terms.backward_transient_bytes),
                                first_stage_exit_release_bytes=out,
                                first_stage_forward_transient_bytes=tuple(5 * f for f in
                                                                          terms.forward_transient_bytes))
    L = e.num_layers
    for optimizer in ("adamw", "sgd"):
        cfg = dataclasses.replace(NO_FRAMEWORK, optimizer=optimizer)
        tab = step_memory_tables(e, optimizer_states=OPTIMIZER_STATES[optimizer],
                                 optimizer_transient_params=cfg.optimizer_transient_params)
        for S in (1, 2, 3):
            for m in (S, S + 2):
                for rec in ("none", "full"):
                    for position in range(S):
                        k = min(m, S - position)
                        peak = step_memory_peak(tab, in_flight=k, num_micro_batches=m, recompute=rec == "full")
                        for u in range(L):
                            for v in range(u + 1, L + 1):
                                if (u > 0) != (position > 0) or (v < L) != (position < S - 1):
                                    continue
                                want = stage_memory_breakdown(e, u, v, position=position, num_stages=S,
                                                              num_micro_batches=m, recompute=rec, config=cfg)
                                assert peak[u, v] == want["peak"], (optimizer, S, m, rec, position, u, v)


def test_a_measurement_leaves_no_fake_world_state_in_this_process():
    """Fake meshes must not reach later real process groups (the lead's bf16 TP test failed after a TP-2 measure)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _world
    from torch.distributed.tensor import DTensor

    cache = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache
    before = (cache.cache_info().currsize, _world.group_count)
    model = load_runtime_model("opt-tiny")
    measure_stage_step(model, StepSpec(3, 6, 1, 2, 1, 2, tp_degree=2))
    assert not dist.is_initialized()
    assert (cache.cache_info().currsize, _world.group_count) == before
