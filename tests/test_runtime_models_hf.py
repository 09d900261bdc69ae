"""The runtime's HF models equal the Hugging Face models they are cut from.

Our layers' weights are copied by name (:meth:`HFModel.hf_name`) into the ``*ForCausalLM``
model built from the same config; logits and every parameter's gradient must agree in
float64 to 1e-12. Controls: a GPT-Neo local layer given the global mask, and a model
that misses the causal mask, must differ.

The real configs (opt-350, gpt-neo-2.7, llama-3-8) are checked on a slice (layers 0, 1,
[2,] and the last ones, i.e. an HF model of 1-2 blocks of the real width and vocabulary):
opt-350 always, the two large ones only with ``HPP_REAL_MODEL_TESTS=1`` (several GiB).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from hpp.errors import HppInputError
from hpp.runtime.models.hf import HFModel, hf_model, load_model_file
from hpp.runtime.models.stage import build_stage, StageModule

transformers = pytest.importorskip("transformers")

TINY = ("llama-tiny", "opt-tiny", "gpt-neo-tiny")
_CLASSES = {"opt": "OPTForCausalLM", "gpt_neo": "GPTNeoForCausalLM", "llama": "LlamaForCausalLM"}


def _hf_model_from(model: HFModel, stage: StageModule) -> torch.nn.Module:
    """The HF causal LM of ``model.config`` holding ``stage``'s weights (``stage`` = the whole model)."""
    hf = getattr(transformers, _CLASSES[model.arch])(model.config).to(torch.float64)
    ours = {model.hf_name(name): p for _l, name, p in stage.layer_parameters()}
    theirs = dict(hf.named_parameters())
    assert set(theirs) == set(ours), (set(theirs) ^ set(ours))
    with torch.no_grad():
        for name, p in theirs.items():
            p.copy_(ours[name])
    hf.get_input_embeddings().padding_idx = None     # OPT's pad row is an ordinary row in hpp (hf_models docstring)
    return hf


def _compare(model: HFModel, stage: StageModule, tokens: torch.Tensor, *, grads: bool = True) -> float:
    """max |logits ours - HF| (and asserts the gradients of a fixed loss agree to 1e-12)."""
    hf = _hf_model_from(model, stage)
    ours_out = stage(tokens)
    theirs_out = hf(input_ids=tokens).logits
    diff = float((ours_out - theirs_out).detach().abs().max())
    if grads:
        w = torch.randn(ours_out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        (ours_out * w).sum().backward()
        (theirs_out * w).sum().backward()
        theirs = dict(hf.named_parameters())
        for _l, name, p in stage.layer_parameters():
            q = theirs[model.hf_name(name)]
            assert p.grad is not None and q.grad is not None, name
            assert float((p.grad - q.grad).abs().max()) <= 1e-12, name
    return diff


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_equals_the_hf_model_in_float64(name):
    model = hf_model(name)
    stage = build_stage(model, 0, model.spec.num_layers, seed=3, dtype=torch.float64)
    tokens = torch.randint(0, model.spec.vocab_size, (3, model.spec.seq_len), generator=torch.Generator().manual_seed(1))
    diff = _compare(model, stage, tokens)
    assert diff <= 1e-12
    assert float(stage(tokens).detach().abs().max()) > 1e-3          # not a trivially zero output


def test_tiny_models_have_the_promised_shapes():
    specs = {n: hf_model(n).spec for n in TINY}
    assert {n: s.num_layers for n, s in specs.items()} == {"llama-tiny": 7, "opt-tiny": 6, "gpt-neo-tiny": 6}
    assert all(s.hidden_size == 64 and s.num_heads == 4 and s.seq_len == 32 and s.vocab_size == 256
               for s in specs.values())
    assert specs["llama-tiny"].num_kv_heads == 2
    assert hf_model("opt-tiny").tied_parameters() == (("layers.0.embed_tokens.weight", "layers.5.lm_head.weight"),)
    assert hf_model("gpt-neo-tiny").tied_parameters() == (("layers.0.wte.weight", "layers.5.lm_head.weight"),)
    assert hf_model("llama-tiny").tied_parameters() == ()
    neo = hf_model("gpt-neo-tiny").config
    assert neo.attention_layers == ["global", "local", "global", "local"] and neo.window_size < 32


def test_gpt_neo_local_layer_with_the_global_mask_differs():
    """Control: the sliding-window mask matters (window 8 < 32 tokens)."""
    model = hf_model("gpt-neo-tiny")
    stage = build_stage(model, 0, model.spec.num_layers, seed=3, dtype=torch.float64)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    assert _compare(model, stage, tokens, grads=False) <= 1e-12
    local = stage.layers["2"].attn.attention             # block 1 = layer 2 is local
    assert local.attention_type == "local"
    glob = stage.layers["1"].attn.attention
    local.bias = glob.bias.clone()                       # treat the local layer as global
    assert _compare(model, stage, tokens, grads=False) > 1e-4


@pytest.mark.parametrize("name", TINY)
def test_layers_are_causal(name):
    """Changing the last token leaves every earlier position's logits unchanged (and changes the last)."""
    model = hf_model(name)
    stage = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=torch.float64)
    tokens = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(2))
    other = tokens.clone()
    other[0, -1] = (other[0, -1] + 1) % 256
    with torch.no_grad():
        a, b = stage(tokens), stage(other)
    assert torch.equal(a[:, :-1], b[:, :-1])
    assert float((a[:, -1] - b[:, -1]).abs().max()) > 1e-6


def test_whole_model_equals_its_stages_and_seeds_matter():
    model = hf_model("opt-tiny")
    whole = {n: p for _l, n, p in build_stage(model, 0, 6, seed=3).layer_parameters()}
    parts = {}
    for lo, hi in ((0, 2), (2, 5), (5, 6)):
        parts.update({n: p for _l, n, p in build_stage(model, lo, hi, seed=3).layer_parameters()})
    tied = "layers.5.lm_head.weight"
    assert set(parts) == set(whole) | {tied}              # the whole model holds the tied pair once
    assert all(torch.equal(parts[n], whole[n]) for n in whole)
    assert torch.equal(parts[tied], whole["layers.0.embed_tokens.weight"])
    other = {n: p for _l, n, p in build_stage(model, 0, 6, seed=4).layer_parameters()}
    assert not torch.equal(other["layers.1.fc1.weight"], whole["layers.1.fc1.weight"])


def test_dtypes_apply_to_parameters_not_buffers():
    model = hf_model("llama-tiny")
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        layer = build_stage(model, 1, 2, seed=0, dtype=dtype).layers["1"]
        assert {p.dtype for p in layer.parameters()} == {dtype}
        assert layer.rotary_emb.inv_freq.dtype == torch.float32                 # HF's buffer dtype
        w = layer.self_attn.q_proj.weight.detach().float()
        assert 0.015 < float(w.std()) < 0.025 and float(w.abs().max()) > 0          # normal(0, 0.02)


def test_tp_plan_names_real_modules_and_refuses_bad_degrees():
    for name in TINY:
        model = hf_model(name)
        for index in range(model.spec.num_layers):
            layer = model.build_layer(index, seed=0, dtype=torch.float32)
            plan = model.tp_plan(index, 2)
            for path, style in plan.items():
                assert style in ("colwise", "rowwise", "embedding", "output")
                assert isinstance(layer.get_submodule(path), (torch.nn.Linear, torch.nn.Embedding)), (name, path)
            assert model.tp_plan(index, 1) == {}
        assert model.tp_plan(0, 2) and model.tp_plan(model.spec.num_layers - 1, 2)   # vocab 256 divides
    llama = hf_model("llama-tiny")
    assert llama.tp_plan(1, 2)["self_attn.o_proj"] == "rowwise"
    assert llama.tp_plan(5, 2) == {}                                               # the final norm
    with pytest.raises(HppInputError, match="TP degree 4 does not divide llama-tiny's 2 key/value heads"):
        llama.tp_plan(1, 4)
    with pytest.raises(HppInputError, match="TP degree 3"):
        hf_model("opt-tiny").tp_plan(1, 3)


@pytest.mark.parametrize("name", ("opt-tiny", "gpt-neo-tiny", "llama-tiny"))
def test_prepare_tp_halves_the_heads_the_module_reshapes_by(name):
    model = hf_model(name)
    layer = model.build_layer(1, seed=0, dtype=torch.float64)
    model.prepare_tp(layer, 1, 2)
    if model.arch == "opt":
        assert layer.self_attn.num_heads == 2
    elif model.arch == "gpt_neo":
        assert layer.attn.attention.num_heads == 2
    model.prepare_tp(layer, 0, 2)        # other layers: nothing to do, no error


def _slice(name: str, blocks: int) -> HFModel:
    d = load_model_file(name)
    cfg = dict(d["hf_config"])
    cfg["num_layers" if cfg["model_type"] == "gpt_neo" else "num_hidden_layers"] = blocks
    if cfg["model_type"] == "gpt_neo":
        cfg["attention_types"] = [[["global", "local"], blocks // 2]]
    return HFModel(f"{name}-slice", cfg, seq_len=d["seq_len"], separate_final_norm=d["separate_final_norm"])


def _hf_sharing(model: HFModel, stage: StageModule) -> torch.nn.Module:
    """The HF causal LM built on the meta device and given ``stage``'s tensors themselves (no copy)."""
    with torch.device("meta"):
        hf = getattr(transformers, _CLASSES[model.arch])(model.config)
    state = {model.hf_name(f"layers.{l}.{n}"): p for l, layer in stage.layers.items()
             for n, p in layer.named_parameters(remove_duplicate=False)}
    hf.load_state_dict(state, strict=True, assign=True)
    hf.get_input_embeddings().padding_idx = None
    ours = {f"layers.{l}.{n}": b for l, layer in stage.layers.items() for n, b in layer.named_buffers()}
    for name, buf in list(hf.named_buffers()):           # non-persistent buffers: masks, rotary frequencies
        owner, _, attr = name.rpartition(".")
        if name.endswith("rotary_emb.inv_freq") or name.endswith("rotary_emb.original_inv_freq"):
            src = ours[f"layers.1.rotary_emb.{attr}"]
        else:
            block = int(name.split(".")[2])               # transformer.h.<i>.attn.attention.bias
            src = ours[f"layers.{block + 1}.{name.split('.', 3)[3]}"]
        hf.get_submodule(owner).register_buffer(attr, src, persistent=False)
    return hf


@pytest.mark.parametrize("name,blocks,seq,dtype", [
    ("opt-350", 1, 64, torch.float64),
    pytest.param("gpt-neo-2.7", 2, 300, torch.float64, marks=pytest.mark.skipif(
        os.environ.get("HPP_REAL_MODEL_TESTS") != "1", reason="about 4 GiB, 40 s; set HPP_REAL_MODEL_TESTS=1")),
    pytest.param("llama-3-8", 1, 64, torch.float32, marks=pytest.mark.skipif(
        os.environ.get("HPP_REAL_MODEL_TESTS") != "1", reason="about 10 GiB, 90 s; set HPP_REAL_MODEL_TESTS=1")),
])
def test_real_config_slice_equals_the_hf_model(name, blocks, seq, dtype):
    """The real width, heads, vocabulary and masks on 1-2 blocks (gpt-neo: 300 tokens > window 256).

    llama-3-8 in float32 (its 2 x 525M-parameter vocabulary tables); the HF model shares our
    tensors, so the two computations are the same operations on the same numbers: equal bits.
    """
    full = hf_model(name)
    model = _slice(name, blocks)
    assert model.spec.hidden_size == full.spec.hidden_size and model.spec.vocab_size == full.spec.vocab_size
    stage = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=dtype)
    tokens = torch.randint(0, model.spec.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = stage(tokens)
        theirs = _hf_sharing(model, stage)(input_ids=tokens).logits
    assert ours.dtype == dtype and float((ours - theirs).abs().max()) <= 1e-12
    assert float(ours.abs().max()) > 1e-3


def test_real_configs_match_the_bundled_profiles_layer_counts():
    from hpp.profiles.bundled import load_bundled_profile
    for name, profile in (("opt-350", "OPT-350"), ("gpt-neo-2.7", "GPT-Neo-2.7"), ("llama-3-8", "LLAMA-3-8")):
        assert hf_model(name).spec.num_layers == load_bundled_profile(profile).num_layers
    llama = hf_model("llama-3-8")
    assert (llama.spec.num_heads, llama.spec.num_kv_heads, llama.spec.vocab_size) == (32, 8, 128256)
    assert llama.config.rope_parameters["rope_theta"] == 500000.0
    assert [llama.layer_kind(i) for i in (0, 1, 32, 33, 34)] == ["embedding", "block", "block", "final_norm", "head"]
    opt = hf_model("opt-350")
    assert (opt.config.word_embed_proj_dim, opt.config.do_layer_norm_before) == (512, False)
    neo = hf_model("gpt-neo-2.7")
    assert neo.config.window_size == 256 and neo.config.attention_layers[:2] == ["global", "local"]


# a Hugging Face model's forward prints no transformers FutureWarning: create_causal_mask is called with
# ``cache``, not the deprecated ``past_key_values``
@pytest.mark.parametrize("name", ["opt-tiny", "gpt-neo-tiny", "llama-tiny"])
def test_tiny_hf_model_forward_warns_nothing_future(name):
    model = hf_model(name)
    stage = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=torch.float32)
    tokens = torch.randint(0, model.spec.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = stage(tokens)
    assert out.shape == (2, 8, model.spec.vocab_size) and bool(torch.isfinite(out).all())


def test_the_deprecated_keyword_is_what_warned():
    import inspect

    from hpp.runtime.models import hf_layers
    from transformers.masking_utils import create_causal_mask

    if "cache" not in inspect.signature(create_causal_mask).parameters:
        pytest.skip("a transformers without create_causal_mask(cache=...): past_key_values is not deprecated there")
    assert hf_layers._CACHE_KWARG == "cache"
    cfg = hf_model("gpt-neo-tiny").config                                    # eager: a real mask is built
    x = torch.zeros(1, 4, cfg.hidden_size)
    pos = torch.arange(4).unsqueeze(0)
    with warnings.catch_warnings():                                          # control: the old call warns
        warnings.simplefilter("error", FutureWarning)
        with pytest.raises(FutureWarning, match="past_key_values"):
            create_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None, past_key_values=None,
                               position_ids=pos)
        mask = hf_layers._causal_mask(cfg, x, pos)
    assert mask.shape == (1, 1, 4, 4) and mask[0, 0, 0, 1] < -1e30 and mask[0, 0, 1, 0] == 0
