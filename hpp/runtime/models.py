"""GPT-style decoders whose layer list lines up with the profile's layer numbering.

Layer 0 is the embedding (token + position), layers ``1 .. N`` are transformer
blocks and layer ``N + 1`` is the head (final LayerNorm + output projection).
The loss is applied outside the layers (:func:`lm_loss`), so a pipeline stage
that holds layers ``[lo, hi)`` is just those layers applied in order
(:class:`StageModule`).

Activation recomputation (a plan stage's ``recompute``): ``"full"`` wraps each of
the stage's layers in ``torch.utils.checkpoint`` (non-reentrant), so a micro-batch
in flight keeps only each layer's input and the layer's activations are rebuilt
during its backward: one extra forward, which is what the cost model charges
(:func:`hpp.formulation.cost_model.stage_compute_s`). ``"selective"`` (Megatron's
recomputation of the attention core only) is refused: these models use the fused
``scaled_dot_product_attention``, which already keeps no ``s x s`` attention matrix,
and the profiler does not measure an attention share, so there is nothing
selective could drop that the planner could price.

Initialisation is deterministic and per layer: layer ``l`` draws its parameters
from its own generator seeded by ``(seed, l)``, so a stage builds only its own
layers and still gets exactly the weights that the whole model has. With tied
embeddings the head's output projection is a copy of the embedding's token table
(drawn from layer 0's generator); in one module (a stage that holds both) the
two are one parameter. Keeping separate copies in sync across stages is the
runtime's job (:mod:`hpp.runtime.gradsync`).

Shapes: tokens ``(b, s)`` int64 -> hidden ``(b, s, h)`` -> logits ``(b, s, V)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpp.errors import HppInputError

__all__ = ["ModelConfig", "MODEL_CONFIGS", "get_model_config", "Embedding", "Block", "Head",
           "build_layer", "StageModule", "build_stage_module", "lm_loss", "tied_param_names", "IGNORE_INDEX",
           "RUNTIME_RECOMPUTE_MODES", "check_recompute"]

#: Target value of padded positions (a partial last micro-batch is padded to full size).
IGNORE_INDEX = -100
_INIT_STD = 0.02
_SEED_STRIDE = 1_000_003
#: Recomputation modes the runtime executes (``"selective"`` is refused, see the module docstring).
RUNTIME_RECOMPUTE_MODES = ("none", "full")


def check_recompute(mode: str, *, field: str = "recompute") -> str:
    """Return ``mode`` if the runtime can execute it.

    Raises
    ------
    HppInputError
        ``"selective"`` (not supported by the runtime) or an unknown mode.
    """
    if mode in RUNTIME_RECOMPUTE_MODES:
        return mode
    if mode == "selective":
        raise HppInputError("selective activation recomputation is not supported by hpp run (its models use fused "
                            "attention, which keeps no attention matrix to drop)", field=field,
                            fix="plan with recompute 'full' or 'none' for this stage")
    raise HppInputError(f"unknown recompute mode {mode!r}", field=field, fix="use 'none' or 'full'")


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


def _layer_generator(seed: int, layer: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * _SEED_STRIDE + layer)


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
    _init_(mod, _layer_generator(seed, layer))
    if tie_embeddings and layer == cfg.num_layers - 1:
        emb = Embedding(cfg, dtype=dtype)
        _init_(emb, _layer_generator(seed, 0))
        with torch.no_grad():
            mod.lm_head.weight.copy_(emb.wte.weight)
    return mod


def tied_param_names(cfg: ModelConfig) -> tuple[str, str]:
    """Global names of the two tied copies: (embedding token table, head projection)."""
    return ("layers.0.wte.weight", f"layers.{cfg.num_layers - 1}.lm_head.weight")


class StageModule(nn.Module):
    """Layers ``[layer_start, layer_stop)`` applied in order.

    Parameter names are global: ``layers.<l>.<...>`` with ``l`` the model's layer
    index, so that stages and the whole model can be compared name by name.
    """

    def __init__(self, layers: dict[int, nn.Module], *, layer_start: int, layer_stop: int,
                 recompute: str = "none") -> None:
        super().__init__()
        self.layer_start, self.layer_stop = layer_start, layer_stop
        self.recompute = check_recompute(recompute)
        self.layers = nn.ModuleDict({str(l): layers[l] for l in range(layer_start, layer_stop)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            if self.recompute == "full" and torch.is_grad_enabled():
                x = checkpoint(layer, x, use_reentrant=False)   # keeps x only; re-runs layer in backward
            else:
                x = layer(x)
        return x

    def layer_parameters(self) -> Iterator[tuple[int, str, nn.Parameter]]:
        """``(layer index, global name, parameter)`` in layer order, each parameter once."""
        seen: set[int] = set()
        for key, layer in self.layers.items():
            for name, p in layer.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield int(key), f"layers.{key}.{name}", p


def build_stage_module(cfg: ModelConfig, layer_start: int, layer_stop: int, *, seed: int,
                       dtype: torch.dtype = torch.float32, tie_embeddings: bool = False,
                       device: torch.device | str = "cpu", recompute: str = "none") -> StageModule:
    """A stage holding layers ``[layer_start, layer_stop)`` of ``cfg``.

    If the stage holds both layer 0 and the head and ``tie_embeddings`` is set,
    the two share one parameter (as in single-device training). ``recompute``:
    ``"none"`` or ``"full"`` (per-layer non-reentrant checkpointing).

    Raises
    ------
    HppInputError
        Layers outside the model, or a recompute mode the runtime does not execute.
    """
    check_recompute(recompute)
    if not 0 <= layer_start < layer_stop <= cfg.num_layers:
        raise HppInputError(f"layers [{layer_start}, {layer_stop}) outside [0, {cfg.num_layers}) of {cfg.name}",
                            field="layers", fix=f"{cfg.name} has {cfg.num_layers} layers")
    layers = {l: build_layer(cfg, l, seed=seed, dtype=dtype, tie_embeddings=tie_embeddings)
              for l in range(layer_start, layer_stop)}
    last = cfg.num_layers - 1
    if tie_embeddings and layer_start == 0 and layer_stop == cfg.num_layers:
        layers[last].lm_head.weight = layers[0].wte.weight
    return StageModule(layers, layer_start=layer_start, layer_stop=layer_stop, recompute=recompute).to(device)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, denominator: int) -> torch.Tensor:
    """Summed next-token cross-entropy divided by ``denominator`` (scalar).

    logits : (b, s, V); targets : (b, s) int64, ``IGNORE_INDEX`` on padded rows.
    With ``denominator = global batch size * seq_len`` the sum over all
    micro-batches of all pipelines equals the full-batch mean loss, so gradients
    add up across pipelines without any rescaling.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float() if logits.dtype == torch.float16
                           else logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum") / denominator
