"""The GPT-style decoders (``gpt-tiny``, ``gpt-small``) and their protocol adapter.

Layer 0 is the embedding (token + position), layers ``1 .. N`` are transformer
blocks and layer ``N + 1`` is the head (final LayerNorm + output projection).
The loss is applied outside the layers (:func:`hpp.runtime.exec.training.lm_loss`), so a pipeline stage
that holds layers ``[lo, hi)`` is just those layers applied in order
(:class:`hpp.runtime.models.stage.StageModule`; recomputation is documented there).

:class:`GPT` wraps a :class:`ModelConfig` in the runtime model protocol
(:mod:`hpp.runtime.models.api`), so the stage builder, the zoo and the profiler
treat these models like any other; :func:`build_stage_module` is the old entry
point, kept for callers that hold a :class:`ModelConfig`.

Initialisation is deterministic and per layer: layer ``l`` draws its parameters
from :func:`hpp.runtime.models.api.layer_generator` ``(seed, l)``, so a stage builds only
its own layers and still gets exactly the weights that the whole model has. With tied
embeddings the head's output projection is a copy of the embedding's token table
(drawn from layer 0's generator); in one module (a stage that holds both) the
two are one parameter. Keeping separate copies in sync across stages is the
runtime's job (:mod:`hpp.runtime.exec.gradsync`).

Shapes: tokens ``(b, s)`` int64 -> hidden ``(b, s, h)`` -> logits ``(b, s, V)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from hpp.errors import HppInputError
from hpp.runtime.models.api import ModelSpec, check_tp_degree, layer_generator
from hpp.runtime.models.stage import StageModule, build_stage

__all__ = ["ModelConfig", "MODEL_CONFIGS", "get_model_config", "Embedding", "Block", "Head",
           "build_layer", "GPT", "build_stage_module", "tied_param_names"]

_INIT_STD = 0.02
@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Hyper-parameters of a GPT-style decoder.

    Attributes
    ----------
    name : str
    num_blocks : int
        N transformer blocks; the model has ``N + 2`` layers.
    hidden_size, num_heads, seq_len, vocab_size : int
    ffn_mult : int
        MLP width = ``ffn_mult * hidden_size``.
    """

    name: str
    num_blocks: int
    hidden_size: int
    num_heads: int
    seq_len: int
    vocab_size: int
    ffn_mult: int = 4

    @property
    def num_layers(self) -> int:
        """L = N + 2 (embedding, blocks, head)."""
        return self.num_blocks + 2


#: Registry by name. ``gpt-tiny``: a block's forward + backward lasts ~2 ms at b=1 and ~8 ms at b=4 on
#: one CPU thread (long enough for sleep-based speed emulation); ``opt-350`` is the OPT-350 shape for GPUs.
MODEL_CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("gpt-tiny", num_blocks=4, hidden_size=128, num_heads=4, seq_len=128, vocab_size=512),
        ModelConfig("gpt-small", num_blocks=12, hidden_size=256, num_heads=8, seq_len=128, vocab_size=8192),
        ModelConfig("opt-350", num_blocks=24, hidden_size=1024, num_heads=16, seq_len=2048, vocab_size=50272),
    )
}


def get_model_config(name: str) -> ModelConfig:
    """The registered config of ``name`` (case-insensitive; ``OPT-350`` = ``opt-350``).

    Raises
    ------
    HppInputError
        Unknown name (the message lists the known ones).
    """
    key = name.strip().lower()
    if key not in MODEL_CONFIGS:
        raise HppInputError(f"unknown model {name!r}", field="model",
                            fix=f"use one of {sorted(MODEL_CONFIGS)}")
    return MODEL_CONFIGS[key]


def _init_(module: nn.Module, gen: torch.Generator) -> None:
    """Normal(0, 0.02) weights, zero biases, LayerNorm = identity; in named-parameter order."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if ".ln" in f".{name}" or name.startswith("ln"):
                p.fill_(1.0 if leaf == "weight" else 0.0)
            elif leaf == "bias":
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * _INIT_STD)


class Embedding(nn.Module):
    """Layer 0: token + position embedding. ``(b, s)`` int64 -> ``(b, s, h)``."""

    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden_size, dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.wte(tokens) + self.wpe(pos)


class Block(nn.Module):
    """Pre-LayerNorm transformer block with causal self-attention. ``(b, s, h) -> (b, s, h)``."""

    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.ln1 = nn.LayerNorm(h, dtype=dtype)
        self.qkv = nn.Linear(h, 3 * h, dtype=dtype)
        self.proj = nn.Linear(h, h, dtype=dtype)
        self.ln2 = nn.LayerNorm(h, dtype=dtype)
        self.fc = nn.Linear(h, cfg.ffn_mult * h, dtype=dtype)
        self.out = nn.Linear(cfg.ffn_mult * h, h, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.num_heads, h // self.num_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)       # (b, heads, s, h/heads)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    """Layer N+1: final LayerNorm + output projection (no bias). ``(b, s, h) -> (b, s, V)``."""

    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.hidden_size, dtype=dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def build_layer(cfg: ModelConfig, layer: int, *, seed: int, dtype: torch.dtype = torch.float32,
                tie_embeddings: bool = False) -> nn.Module:
    """Layer ``layer`` of the model, initialised from ``(seed, layer)`` alone.

    With ``tie_embeddings`` the head's ``lm_head.weight`` equals layer 0's
    ``wte.weight`` (same draws), but it is a separate tensor here.
    """
    if not 0 <= layer < cfg.num_layers:
        raise IndexError(f"layer {layer} not in [0, {cfg.num_layers})")
    if layer == 0:
        mod: nn.Module = Embedding(cfg, dtype=dtype)
    elif layer == cfg.num_layers - 1:
        mod = Head(cfg, dtype=dtype)
    else:
        mod = Block(cfg, dtype=dtype)
    _init_(mod, layer_generator(seed, layer))
    if tie_embeddings and layer == cfg.num_layers - 1:
        emb = Embedding(cfg, dtype=dtype)
        _init_(emb, layer_generator(seed, 0))
        with torch.no_grad():
            mod.lm_head.weight.copy_(emb.wte.weight)
    return mod


def tied_param_names(cfg: ModelConfig) -> tuple[str, str]:
    """Global names of the two tied copies: (embedding token table, head projection)."""
    return ("layers.0.wte.weight", f"layers.{cfg.num_layers - 1}.lm_head.weight")


class GPT:
    """A :class:`ModelConfig` as a runtime model (:class:`hpp.runtime.models.api.RuntimeModel`).

    Parameters
    ----------
    cfg : ModelConfig
    tie_embeddings : bool
        The head's ``lm_head.weight`` is tied to layer 0's ``wte.weight``.

    TP shards the MLP of every block (``fc`` colwise, ``out`` rowwise) and, when the
    vocabulary divides, the token table and the head; the attention stays replicated
    (its fused ``qkv`` projection would need a per-part split that plain
    ``ColwiseParallel`` does not do).
    """

    def __init__(self, cfg: ModelConfig, *, tie_embeddings: bool = False) -> None:
        self.cfg = cfg
        self.tie_embeddings = tie_embeddings
        self.spec = ModelSpec(name=cfg.name, num_layers=cfg.num_layers, seq_len=cfg.seq_len,
                              vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_heads=cfg.num_heads,
                              num_kv_heads=cfg.num_heads, ffn_size=cfg.ffn_mult * cfg.hidden_size)

    def build_layer(self, index: int, *, seed: int, dtype: torch.dtype = torch.float32) -> nn.Module:
        """Layer ``index`` initialised from ``(seed, index)`` (see :func:`build_layer`)."""
        return build_layer(self.cfg, index, seed=seed, dtype=dtype, tie_embeddings=self.tie_embeddings)

    def tp_plan(self, index: int, tp_degree: int) -> Mapping[str, str]:
        """Module paths of layer ``index`` to shard at TP degree ``tp_degree`` (empty at TP 1)."""
        check_tp_degree(self.spec, tp_degree)
        if tp_degree == 1:
            return {}
        vocab_ok = self.cfg.vocab_size % tp_degree == 0
        if index == 0:
            return {"wte": "embedding"} if vocab_ok else {}
        if index == self.cfg.num_layers - 1:
            return {"lm_head": "output"} if vocab_ok else {}
        return {"fc": "colwise", "out": "rowwise"}

    def tied_parameters(self) -> tuple[tuple[str, str], ...]:
        """``(("layers.0.wte.weight", "layers.<L-1>.lm_head.weight"),)`` when tied, else ``()``."""
        return (tied_param_names(self.cfg),) if self.tie_embeddings else ()


def build_stage_module(cfg: ModelConfig, layer_start: int, layer_stop: int, *, seed: int,
                       dtype: torch.dtype = torch.float32, tie_embeddings: bool = False,
                       device: torch.device | str = "cpu", recompute: str = "none") -> StageModule:
    """A stage holding layers ``[layer_start, layer_stop)`` of ``cfg`` (shorthand for a config).

    Same as ``build_stage(GPT(cfg, tie_embeddings=...), layer_start, layer_stop, ...)``:
    if the stage holds both layer 0 and the head and ``tie_embeddings`` is set, the two
    share one parameter. ``recompute``: ``"none"`` or ``"full"``.

    Raises
    ------
    HppInputError
        Layers outside the model, or a recompute mode the runtime does not execute.
    """
    return build_stage(GPT(cfg, tie_embeddings=tie_embeddings), layer_start, layer_stop, seed=seed,
                       dtype=dtype, device=device, recompute=recompute)
