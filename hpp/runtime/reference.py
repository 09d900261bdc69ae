"""Single-device reference training, to check that an HPP run updates the model identically.

The reference trains the whole model on the whole global batch of every step
(:func:`hpp.runtime.layout.synthetic_batch`) with the full-batch mean loss, the
same initialisation, optimizer and learning rate as the runtime's ranks.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from hpp.errors import HppInputError
from hpp.runtime.layout import synthetic_batch
from hpp.runtime.models import ModelConfig, build_stage_module, lm_loss, tied_param_names

__all__ = ["make_optimizer", "train_reference", "max_param_difference"]


def make_optimizer(name: str, params: Sequence[torch.nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """SGD (no momentum) or AdamW (weight decay 0.01): the runtime's two optimizers.

    Raises
    ------
    HppInputError
        Unknown name.
    """
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    raise HppInputError(f"unknown optimizer {name!r}", field="optimizer", fix="use sgd or adamw")


def train_reference(cfg: ModelConfig, *, global_batch_size: int, steps: int, seed: int = 0,
                    dtype: torch.dtype = torch.float64, tie_embeddings: bool = False, optimizer: str = "sgd",
                    lr: float = 0.1) -> dict[str, torch.Tensor]:
    """Train on one device; return every parameter by global name (both tied names if tied)."""
    model = build_stage_module(cfg, 0, cfg.num_layers, seed=seed, dtype=dtype, tie_embeddings=tie_embeddings)
    opt = make_optimizer(optimizer, list(model.parameters()), lr=lr)
    for step in range(steps):
        x, y = synthetic_batch(step, seed=seed, global_batch_size=global_batch_size, seq_len=cfg.seq_len,
                               vocab_size=cfg.vocab_size)
        opt.zero_grad()
        lm_loss(model(x), y, denominator=global_batch_size * cfg.seq_len).backward()
        opt.step()
    out = {name: p.detach().clone() for _l, name, p in model.layer_parameters()}
    if tie_embeddings:
        emb, head = tied_param_names(cfg)
        out[head] = out[emb]
    return out


def max_param_difference(rank_params: Sequence[Mapping[str, torch.Tensor]],
                         reference: Mapping[str, torch.Tensor]) -> tuple[float, bool, int]:
    """``(max abs difference, any NaN, parameters compared)`` over every rank's parameters.

    A NaN compares as a 0.0 difference in ``abs().max()`` arithmetic of some
    reductions, so NaN is reported separately and also forces the difference to inf.
    """
    worst, nan, n = 0.0, False, 0
    for params in rank_params:
        for name, value in params.items():
            ref = reference[name]
            if torch.isnan(value).any() or torch.isnan(ref).any():
                nan = True
                worst = math.inf
                continue
            worst = max(worst, (value.to(ref.dtype) - ref).abs().max().item())
            n += 1
    return worst, nan, n
