"""The layer modules of :mod:`hpp.runtime.models.hf`: HF submodules with ONE tensor in and out.

This is the only module of hpp that imports ``transformers``; :mod:`hpp.runtime.models.hf`
imports it lazily, so that ``hpp plan`` never pays for it.

Shapes: the embedding maps tokens ``(b, s)`` int64 to ``(b, s, h)``; blocks and the final
norm ``(b, s, h) -> (b, s, h)``; the head ``(b, s, h) -> (b, s, V)``.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers import (GPTNeoConfig, GPTNeoForCausalLM, LlamaConfig, LlamaForCausalLM, OPTConfig,
                          OPTForCausalLM)
from transformers.initialization import no_init_weights
from transformers.masking_utils import create_causal_mask
from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoBlock
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.opt.modeling_opt import OPTDecoderLayer, OPTLearnedPositionalEmbedding

__all__ = ["make_config", "embedding", "block", "final_norm", "head", "causal_lm_class", "parameter_shapes",
           "ATTN_IMPLEMENTATION"]

_CONFIG_CLASSES = {"opt": OPTConfig, "gpt_neo": GPTNeoConfig, "llama": LlamaConfig}
_CAUSAL_LM_CLASSES = {"opt": OPTForCausalLM, "gpt_neo": GPTNeoForCausalLM, "llama": LlamaForCausalLM}
#: Attention kernel per architecture: ``sdpa`` with no mask is causal (what the HF models pass
#: OPT and Llama layers on CPU); GPT-Neo has only eager (and flash) attention, with its own mask buffer.
ATTN_IMPLEMENTATION = {"opt": "sdpa", "gpt_neo": "eager", "llama": "sdpa"}
#: ``create_causal_mask``'s cache argument: ``cache`` (newer transformers 5.x; passing the old
#: ``past_key_values`` there warns FutureWarning once per process), ``past_key_values`` before.
_CACHE_KWARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def make_config(arch: str, hf_config: dict):
    """The architecture's config object from a hub ``config.json`` dict, attention kernel set."""
    cfg = _CONFIG_CLASSES[arch].from_dict(hf_config)
    cfg._attn_implementation = ATTN_IMPLEMENTATION[arch]
    return cfg


def _causal_mask(config, x: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The mask the HF model passes its decoder layers for input ``x`` (no padding, no cache).

    ``None`` under sdpa (= causal); under eager a ``(b, 1, s, s)`` additive mask of ``x``'s
    dtype (GPT-Neo adds it to its float32 scores, so a float64 run takes its softmax in float64,
    exactly as the HF model does).
    """
    return create_causal_mask(config=config, inputs_embeds=x, attention_mask=None, position_ids=position_ids,
                              **{_CACHE_KWARG: None})


def _positions(x: torch.Tensor) -> torch.Tensor:
    """``(1, s)`` int64 positions 0 .. s-1 of a ``(b, s)`` or ``(b, s, h)`` input."""
    return torch.arange(x.shape[1], device=x.device).unsqueeze(0)


class OPTEmbedding(nn.Module):
    """Token table (width ``word_embed_proj_dim``), ``project_in`` to the hidden size, learned positions."""

    def __init__(self, c: OPTConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.word_embed_proj_dim)      # first draw: tied with lm_head
        self.embed_positions = OPTLearnedPositionalEmbedding(c.max_position_embeddings, c.hidden_size)
        self.project_in = (nn.Linear(c.word_embed_proj_dim, c.hidden_size, bias=False)
                           if c.word_embed_proj_dim != c.hidden_size else None)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        if self.project_in is not None:
            x = self.project_in(x)
        return x + self.embed_positions(None, 0, position_ids=_positions(tokens))


class OPTBlock(OPTDecoderLayer):
    """``OPTDecoderLayer`` with the HF model's causal mask (sdpa: none, i.e. ``is_causal``)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        mask = _causal_mask(self.self_attn.config, hidden_states, None)
        return super().forward(hidden_states, attention_mask=mask)


class OPTHead(nn.Module):
    """Final LayerNorm (pre-LN configs only), ``project_out``, ``lm_head`` (no bias)."""

    def __init__(self, c: OPTConfig) -> None:
        super().__init__()
        self.final_layer_norm = (nn.LayerNorm(c.hidden_size, elementwise_affine=c.layer_norm_elementwise_affine)
                                 if c.do_layer_norm_before and not c._remove_final_layer_norm else None)
        self.project_out = (nn.Linear(c.hidden_size, c.word_embed_proj_dim, bias=False)
                            if c.word_embed_proj_dim != c.hidden_size else None)
        self.lm_head = nn.Linear(c.word_embed_proj_dim, c.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return self.lm_head(x)


class GPTNeoEmbedding(nn.Module):
    """Token table ``wte`` and learned positions ``wpe``."""

    def __init__(self, c: GPTNeoConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.hidden_size)                      # first draw: tied with lm_head
        self.wpe = nn.Embedding(c.max_position_embeddings, c.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.wte(tokens) + self.wpe(_positions(tokens))


class GPTNeoLayer(GPTNeoBlock):
    """``GPTNeoBlock``: its attention masks with its own causal or sliding-window (local) buffer,
    plus the HF model's additive causal mask."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        mask = _causal_mask(self.attn.attention.config, hidden_states, _positions(hidden_states))
        return super().forward(hidden_states, attention_mask=mask)[0]


class GPTNeoHead(nn.Module):
    """Final LayerNorm ``ln_f`` and ``lm_head`` (no bias)."""

    def __init__(self, c: GPTNeoConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class LlamaEmbedding(nn.Module):
    """Token table ``embed_tokens`` (rotary positions are applied in the blocks)."""

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens)


class LlamaBlock(LlamaDecoderLayer):
    """``LlamaDecoderLayer`` with its own (non-persistent) rotary embedding and the HF model's causal mask."""

    def __init__(self, c: LlamaConfig, layer_idx: int) -> None:
        super().__init__(c, layer_idx)
        self.rotary_emb = LlamaRotaryEmbedding(config=c)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        pos = _positions(hidden_states)
        cos_sin = self.rotary_emb(hidden_states, position_ids=pos)
        mask = _causal_mask(self.self_attn.config, hidden_states, pos)
        return super().forward(hidden_states, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)


class LlamaFinalNorm(nn.Module):
    """The final RMSNorm ``norm`` as a layer of its own."""

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class LlamaHead(nn.Module):
    """``lm_head``, after the final RMSNorm unless that is a layer of its own."""

    def __init__(self, c: LlamaConfig, *, with_norm: bool) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps) if with_norm else None
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x) if self.norm is not None else x)


def embedding(arch: str, c) -> nn.Module:
    """Layer 0 of ``arch``, parameters uninitialised (the caller initialises every one)."""
    with no_init_weights():
        return {"opt": OPTEmbedding, "gpt_neo": GPTNeoEmbedding, "llama": LlamaEmbedding}[arch](c)


def block(arch: str, c, block_index: int) -> nn.Module:
    """Block ``block_index`` (from 0) of ``arch``, parameters uninitialised."""
    with no_init_weights():
        if arch == "opt":
            return OPTBlock(c, layer_idx=block_index)
        if arch == "gpt_neo":
            return GPTNeoLayer(c, layer_id=block_index)
        return LlamaBlock(c, block_index)


def final_norm(arch: str, c) -> nn.Module:
    """The separate final-norm layer (Llama)."""
    assert arch == "llama", arch
    with no_init_weights():
        return LlamaFinalNorm(c)


def head(arch: str, c, *, with_norm: bool = True) -> nn.Module:
    """The last layer of ``arch``, parameters uninitialised."""
    with no_init_weights():
        if arch == "opt":
            return OPTHead(c)
        if arch == "gpt_neo":
            return GPTNeoHead(c)
        return LlamaHead(c, with_norm=with_norm)


def causal_lm_class(arch: str) -> type:
    """The ``*ForCausalLM`` class of ``arch`` (whose state-dict names a Hugging Face folder uses)."""
    return _CAUSAL_LM_CLASSES[arch]


def parameter_shapes(c) -> dict[str, tuple[int, ...]]:
    """``{state-dict name: shape}`` of every parameter of the ``*ForCausalLM`` model of config ``c`` (a tied head
    included: the model is built on the meta device, untied and unallocated)."""
    with torch.device("meta"), no_init_weights():
        m = _CAUSAL_LM_CLASSES[c.model_type](c)
    return {name: tuple(p.shape) for name, p in m.named_parameters()}
