"""What one training step does, shared by the ranks and the single-device reference.

- Optimizer: AdamW (default; weight decay 0.01, the Adam states the profiles and the
  memory model assume) or SGD (no momentum).
- Learning rate: constant, or linear warmup + cosine decay to ``min_lr_ratio * lr``
  (``torch.optim.lr_scheduler.LambdaLR``, stepped once per optimizer step).
- Precision: ``float32``/``float64`` train in that dtype; ``bfloat16`` is mixed
  precision: fp32 master weights and gradients, the forward under ``torch.autocast``
  (bf16 matmuls), stage outputs sent as bf16 and the loss computed in fp32.
- Loss: summed next-token cross-entropy over targets that are not ``IGNORE_INDEX``,
  divided by the global batch's count of such targets (as torchtitan does), so the
  sum over micro-batches and pipelines is the full-batch mean.
- Clipping by the global gradient norm: every parameter (each block, each tied pair)
  counted once over all ranks, one all-reduce, identical everywhere, and equal to
  ``torch.nn.utils.clip_grad_norm_`` on the single-device model.

:func:`single_device_step` is the reference step (``build_stage(model, 0, L)``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, fields
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hpp.errors import HppInputError
from hpp.runtime.models.api import IGNORE_INDEX

__all__ = ["TrainingConfig", "DTYPES", "make_optimizer", "make_lr_scheduler", "autocast_context", "lm_loss",
           "target_count", "clip_by_global_norm", "single_device_step", "measure_stage_flops"]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
_CLIP_EPS = 1e-6                                   # torch.nn.utils.clip_grad_norm_'s


@dataclass(frozen=True)
class TrainingConfig:
    """The optimizer, schedule, precision and clipping of a run (plain JSON data).

    Attributes
    ----------
    optimizer : ``"adamw"`` or ``"sgd"``
    lr : float
        Peak learning rate.
    weight_decay : float
        Decoupled (AdamW) or L2 (SGD) weight decay.
    lr_schedule : ``"constant"`` or ``"cosine"``
    warmup_steps : int
        Linear warmup steps (cosine schedule).
    min_lr_ratio : float
        Final learning rate / ``lr`` of the cosine decay.
    total_steps : int
        Steps the cosine decays over (>= 1).
    clip_grad_norm : float or None
        Largest global gradient norm; ``None``: no clipping.
    dtype : ``"float32"``, ``"float64"`` or ``"bfloat16"`` (mixed precision)

    Raises
    ------
    HppInputError
        An unknown name or a value out of range.
    """

    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    total_steps: int = 1
    clip_grad_norm: float | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        checks = (("optimizer", self.optimizer in ("adamw", "sgd"), "use adamw or sgd"),
                  ("lr", self.lr > 0, "give a positive learning rate"),
                  ("weight_decay", self.weight_decay >= 0, "give a weight decay >= 0"),
                  ("lr_schedule", self.lr_schedule in ("constant", "cosine"), "use constant or cosine"),
                  ("warmup_steps", self.warmup_steps >= 0, "give warmup steps >= 0"),
                  ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "give a ratio in [0, 1]"),
                  ("total_steps", self.total_steps >= 1, "give total steps >= 1"),
                  ("clip_grad_norm", self.clip_grad_norm is None or self.clip_grad_norm > 0,
                   "give a positive norm or leave it unset"),
                  ("dtype", self.dtype in DTYPES, f"use one of {list(DTYPES)}"))
        for name, ok, fix in checks:
            if not ok:
                raise HppInputError(f"training {name} = {getattr(self, name)!r}", field=name, fix=fix)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainingConfig":
        """From JSON; unknown keys are refused (naming them)."""
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise HppInputError(f"unknown training settings {extra}", field="training", fix=f"use {sorted(known)}")
        return cls(**d)

    @property
    def param_dtype(self) -> torch.dtype:
        """Master weights and gradients: fp32 under bf16 mixed precision."""
        return torch.float32 if self.dtype == "bfloat16" else DTYPES[self.dtype]

    @property
    def activation_dtype(self) -> torch.dtype:
        """What stages send each other (bf16 under mixed precision)."""
        return DTYPES[self.dtype]

    @property
    def logits_dtype(self) -> torch.dtype:
        """The last stage's output, the loss's input (fp32 under mixed precision)."""
        return self.param_dtype


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainingConfig) -> torch.optim.Optimizer:
    """AdamW or SGD over ``params``; DTensor and plain parameters in separate groups.

    torch's multi-tensor (``foreach``) kernels refuse lists mixing DTensors and plain
    tensors; one group of each keeps them usable on GPUs. Same hyper-parameters, so
    the update equals the single-device optimizer's.
    """
    from torch.distributed.tensor import DTensor

    params = list(params)
    dt = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    groups = [{"params": g} for g in (plain, dt) if g]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_factor(step: int, cfg: TrainingConfig) -> float:
    """Learning rate of step ``step`` (0-based) / ``cfg.lr``.

    Warmup: ``(step + 1) / (warmup_steps + 1)``; then cosine from 1 to
    ``min_lr_ratio`` over the remaining ``total_steps - warmup_steps`` steps.

    >>> cfg = TrainingConfig(lr_schedule="cosine", warmup_steps=1, total_steps=3, min_lr_ratio=0.0)
    >>> [round(lr_factor(s, cfg), 3) for s in range(4)]
    [0.5, 1.0, 0.5, 0.0]
    """
    if cfg.lr_schedule == "constant":
        return 1.0
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainingConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` with :func:`lr_factor`; call ``.step()`` after every ``optimizer.step()``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))


def autocast_context(cfg: TrainingConfig, device: torch.device | str):
    """``torch.autocast`` to bf16 under mixed precision, else a null context."""
    if cfg.dtype == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, denominator: int) -> torch.Tensor:
    """Summed cross-entropy over targets != ``IGNORE_INDEX``, divided by ``denominator`` (scalar).

    logits : (b, s, V), any float dtype (computed in fp32 at least); targets : (b, s) int64.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.float()
    return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum") / denominator


def target_count(targets: torch.Tensor) -> int:
    """Targets that carry loss (not ``IGNORE_INDEX``): the loss denominator of a global batch."""
    return int((targets != IGNORE_INDEX).sum())


def clip_by_global_norm(grads: Sequence[tuple[torch.Tensor, bool]], max_norm: float, *,
                        group: dist.ProcessGroup | None = None) -> float:
    """Scale gradients in place so the global norm is at most ``max_norm``; return the norm before.

    Parameters
    ----------
    grads : sequence of (local gradient, counted)
        Every local gradient of this rank; ``counted`` marks the ones whose squares
        enter the norm. Across all ranks the counted tensors must cover every
        parameter of the model exactly once (e.g. pipeline 0's ranks, each sharded
        parameter's local shard, replicated ones from TP rank 0, one copy of a tied pair).
    group : ProcessGroup or None
        All-reduced over it (the world) when torch.distributed is initialised.

    Same coefficient as ``torch.nn.utils.clip_grad_norm_``: ``min(1, max_norm / (norm + 1e-6))``.
    """
    sq = torch.zeros((), dtype=torch.float64, device=grads[0][0].device if grads else "cpu")
    for g, counted in grads:
        if counted:
            sq += g.detach().double().square().sum()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=group)
    norm = float(sq.sqrt())
    coef = min(1.0, max_norm / (norm + _CLIP_EPS))
    for g, _c in grads:
        g.mul_(coef)
    return norm


def single_device_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                       scheduler: torch.optim.lr_scheduler.LRScheduler | None, inputs: torch.Tensor,
                       targets: torch.Tensor, cfg: TrainingConfig) -> float:
    """One reference step of the whole model on the whole global batch; returns the loss.

    ``inputs``/``targets``: ``(G, s)`` int64 on the module's device.
    """
    optimizer.zero_grad(set_to_none=False)
    with autocast_context(cfg, inputs.device):
        logits = module(inputs)
    loss = lm_loss(logits.to(cfg.logits_dtype), targets, denominator=max(1, target_count(targets)))
    loss.backward()
    if cfg.clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.clip_grad_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return float(loss.detach())


def measure_stage_flops(stage: torch.nn.Module, *, is_first: bool, is_last: bool, micro_batch_size: int,
                        seq_len: int, hidden_size: int, dtype: torch.dtype) -> int:
    """Model FLOPs of one micro-batch's forward + backward through ``stage`` (whole, unsharded).

    Counted by ``torch.utils.flop_counter.FlopCounterMode`` under ``FakeTensorMode``
    (shapes only: no memory, no compute), with recomputation off (model FLOPs, not
    hardware FLOPs); the loss of the last stage is included. The parameters' ``.grad``
    are restored afterwards. Call before TP sharding; a
    TP-``t`` rank's share is this / ``t``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    b, s = micro_batch_size, seq_len
    saved = getattr(stage, "recompute", None)
    params = list(stage.parameters())
    grads = [p.grad for p in params]
    device = params[0].device if params else torch.device("cpu")
    if saved is not None:
        stage.recompute = "none"
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), FlopCounterMode(display=False) as counter:
            x = (torch.zeros(b, s, dtype=torch.long, device=device) if is_first
                 else torch.zeros(b, s, hidden_size, dtype=dtype, device=device, requires_grad=True))
            out = stage(x)
            if is_last:
                lm_loss(out, torch.zeros(b, s, dtype=torch.long, device=device), denominator=b * s).backward()
            else:
                out.backward(torch.ones_like(out))
        return int(counter.get_total_flops())
    finally:
        for p, g in zip(params, grads):
            p.grad = g                                   # drop the fake gradients
        if saved is not None:
            stage.recompute = saved
