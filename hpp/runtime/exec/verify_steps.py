"""``hpp run --verify`` step by step: each step of the run against one single-device step from the run's state.

Why per step. Float64 training of the tiny models is chaotic over a few hundred steps:
two single-device trainings that differ only in the order one batch is summed (its
samples reversed) agree to ~1e-15 for a while, then drift apart by many orders of
magnitude within tens of steps (llama-tiny, the README's plan, AdamW lr 1e-3: 4.6e-15
after 170 steps, 1.2e-8 after 190, 4.6e-3 after 200). A distributed step sums the
same gradient in another order (per pipeline, then all-reduced), so comparing only the
final parameters with free-running single-device training measures that chaos, not the
runtime. What holds exactly, up to rounding, is each step: from the same parameters
and optimizer state, one step of the run and one single-device step
(:func:`hpp.runtime.exec.training.single_device_step`) on the same global batch agree.

How. Before the first step and after every step, every rank sends its full parameters
(TP shards joined) and optimizer state, by global name, to rank 0 (one gather over a
gloo group). Rank 0 keeps a single-device model (``build_stage(model, 0, L)``) and its
optimizer; for step ``k`` it loads the run's state before the step (each name from the
lowest rank that holds it), sets the learning rate of step ``k`` from its own schedule
(:func:`hpp.runtime.exec.training.lr_factor`), takes one single-device step on step ``k``'s
global batch and compares the result with every rank's parameters after the step (every
copy: replicas, both names of a tied pair). The step's largest difference is broadcast,
so every rank records it (each host of a multi-host run reports it). Before the first
step of a fresh run the ranks' initial parameters are compared with the single-device
initialisation too.

A real difference (a skipped gradient sum, a wrong shard, a stale replica)
shows in the step where it happens, whatever came before; rounding does not accumulate
across steps, so the tolerance (:data:`hpp.runtime.exec.reference.VERIFY_TOLERANCE`) does not
depend on the run's length.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hpp.runtime.models.api import RuntimeModel
from hpp.runtime.exec.reference import max_param_difference
from hpp.runtime.models.stage import StageModule, build_stage
from hpp.runtime.exec.training import TrainingConfig, lr_factor, make_optimizer, single_device_step
from hpp.runtime.exec.step import full_params
from hpp.runtime.exec.weights import load_weights_folder

__all__ = ["rank_state", "StepVerifier"]


def _full(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole (a DTensor's shards joined: collective over its mesh), detached, on the CPU."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def rank_state(module: StageModule, optimizer: torch.optim.Optimizer, model: RuntimeModel) -> dict[str, Any]:
    """This rank's full parameters and optimizer state by global name (collective within each TP group).

    Returns
    -------
    dict
        ``params``: :func:`hpp.runtime.exec.step.full_params` (both names of a pair tied within the
        stage); ``optim``: ``{name: {state key: tensor}}`` under the name
        :meth:`~hpp.runtime.models.stage.StageModule.layer_parameters` gives (AdamW ``step``, ``exp_avg``,
        ``exp_avg_sq``; empty for SGD without momentum). Every tensor whole and on the CPU.
    """
    optim = {name: {k: _full(v) if isinstance(v, torch.Tensor) else v for k, v in optimizer.state.get(p, {}).items()}
             for _l, name, p in module.layer_parameters()}
    return {"params": full_params(module, model), "optim": optim}


class StepVerifier:
    """One rank's part of the per-step check; rank 0 holds the single-device model.

    Parameters
    ----------
    model : RuntimeModel
    training : TrainingConfig
        The run's; the single-device step uses it (float64 under ``--verify``).
    seed : int
        The run's initialisation seed (the initial-parameter check).
    rank : int
    timeout_s : float
        Of the gloo group of every rank that the state travels in, made here when the default group is
        not gloo (NCCL), so the construction is collective too.
    device : torch.device or str
        Rank 0's device: the single-device model computes there, so a GPU run is checked against the
        GPU's own arithmetic (HF's Llama RMSNorm and GPT-Neo attention compute in float32 even in a
        float64 run, and CPU and GPU round those differently: on an H200, llama-tiny's first AdamW
        step differed from a CPU reference by 3.6e-6).
    weights : str, optional
        The run's ``--weights`` folder: the single-device model loads it whole (rank 0), so the initial
        check compares every rank's slices with the folder's tensors.

    Every rank must construct it at the same point, call :meth:`start` once and :meth:`check` after
    every optimizer step (all three are collective).
    """

    def __init__(self, model: RuntimeModel, training: TrainingConfig, *, seed: int, rank: int,
                 timeout_s: float = 300.0, device: torch.device | str = "cpu", weights: str | None = None) -> None:
        self.model, self.training, self.seed, self.rank = model, training, seed, rank
        self.device = torch.device(device)
        self.group: dist.ProcessGroup | None = None                # the CPU tensors travel over gloo
        if dist.get_backend() != "gloo":
            self.group = dist.new_group(list(range(dist.get_world_size())), backend="gloo",
                                        timeout=timedelta(seconds=timeout_s))
        self._before: list[dict[str, Any]] | None = None          # rank 0: every rank's state before the step
        self._module: StageModule | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        if rank == 0:
            self._module = build_stage(model, 0, model.spec.num_layers, seed=seed, dtype=training.param_dtype,
                                       device=self.device)
            if weights is not None:
                load_weights_folder(self._module, model, weights)
            self._optimizer = make_optimizer([p for _l, _n, p in self._module.layer_parameters()], training)

    def _gather(self, module: StageModule, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]] | None:
        state = rank_state(module, optimizer, self.model)
        size = dist.get_world_size(self.group)
        out: list[Any] | None = [None] * size if self.rank == 0 else None
        dist.gather_object(state, out, dst=0, group=self.group)
        return out

    def _broadcast(self, value: float | None) -> float:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return float(box[0])

    def _reference_params(self) -> dict[str, torch.Tensor]:
        """The single-device model's parameters by global name (both names of a tied pair)."""
        assert self._module is not None
        out = {name: p.detach().cpu() for _l, name, p in self._module.layer_parameters()}
        for first, second in self.model.tied_parameters():
            if first in out:
                out.setdefault(second, out[first])
        return out

    def start(self, module: StageModule, optimizer: torch.optim.Optimizer, *, fresh: bool) -> float | None:
        """Record the run's state before its first step; ``fresh`` (not resumed): compare it with the
        single-device initialisation and return that max |difference| (None when resumed)."""
        self._before = self._gather(module, optimizer)
        if not fresh:
            return None
        diff = None
        if self.rank == 0:
            assert self._before is not None
            diff, _nan, _n = max_param_difference([s["params"] for s in self._before], self._reference_params())
        return self._broadcast(diff)

    def _load_before(self) -> None:
        """The single-device model and optimizer take the run's state before the step (lowest holder)."""
        assert self._module is not None and self._optimizer is not None and self._before is not None
        with torch.no_grad():
            for _l, name, p in self._module.layer_parameters():
                holder = next(s for s in self._before if name in s["params"])
                p.copy_(holder["params"][name])
                st = holder["optim"].get(name, {})
                if st:      # moments on the parameter's device; AdamW keeps its step count on the CPU
                    self._optimizer.state[p] = {
                        k: (v.clone() if k == "step" else v.to(p.device, copy=True)) if isinstance(v, torch.Tensor)
                        else v for k, v in st.items()}
                else:
                    self._optimizer.state.pop(p, None)

    def check(self, step: int, inputs: torch.Tensor, targets: torch.Tensor, module: StageModule,
              optimizer: torch.optim.Optimizer) -> float:
        """After the run's optimizer step ``step`` (0-based, global): its max |difference| from one
        single-device step on the same global batch ``(G, s)`` from the run's state before it.

        NaN anywhere counts as an infinite difference.
        """
        after = self._gather(module, optimizer)
        diff = None
        if self.rank == 0:
            assert self._optimizer is not None and after is not None
            self._load_before()
            for group in self._optimizer.param_groups:
                group["lr"] = self.training.lr * lr_factor(step, self.training)
            single_device_step(self._module, self._optimizer, None, inputs.to(self.device), targets.to(self.device),
                               self.training)
            diff, _nan, _n = max_param_difference([s["params"] for s in after], self._reference_params())
        self._before = after
        return self._broadcast(diff)

