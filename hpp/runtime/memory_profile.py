"""Per-layer memory terms of a runtime model, measured in the runtime's own conditions (issue 17.2).

For each layer ``l`` of a model, at micro-batch size ``b``, training dtype and TP
degree ``t`` (one device of the TP group), under ``FakeTensorMode`` and MemTracker
(:mod:`hpp.runtime.memory`; no real memory, any model size):

- ``step_activation_bytes[l]``: bytes the layer adds to its stage per micro-batch in
  flight: the tensors its forward saves for backward plus its output (which the next
  layer saves, or the pipelining library holds until backward); its input is not
  counted (the previous layer's output, or the stage's receive buffer);
- ``backward_transient_bytes[l]``: how far memory rises above its level at the start
  of the layer's backward while the layer runs backward (gradients of its
  intermediate tensors and of its input, the parameter gradients before they are
  accumulated). The last layer's figures include the runtime's loss
  (:func:`hpp.runtime.training.lm_loss` on the logits);
- ``loss_activation_bytes`` (one number): what the loss keeps per micro-batch
  (the log-softmax of the logits), part of the last stage's in-flight memory.

The layer runs as it does in a stage (:class:`hpp.runtime.worker.StageForward`):
under autocast for ``bfloat16``, its parameters' gradients allocated, its input a
tensor of the activation dtype that requires grad (tokens for layer 0). Layers of
identical structure (class, parameter and buffer shapes) are measured once.

How the cost model composes them into a stage's peak:
:func:`hpp.formulation.cost_model.stage_memory_breakdown`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from hpp.errors import HppInputError
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.runtime.memory import _StepTracker, build_fake_stage, fake_world
from hpp.runtime.model_api import RuntimeModel

__all__ = ["LayerMemory", "MemoryTerms", "measure_layer_memory", "memory_terms", "add_memory_terms"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LayerMemory:
    """Measured memory figures of one layer, one micro-batch, one device [bytes] (see the module docstring)."""

    param_bytes: int
    output_bytes: int
    step_activation_bytes: int
    backward_transient_bytes: int
    loss_activation_bytes: int = 0


@dataclass(frozen=True, slots=True)
class MemoryTerms:
    """Per-layer terms of a whole model at one (micro-batch size, dtype, TP degree); tuples of shape (L,)."""

    micro_batch_size: int
    dtype: str
    tp_degree: int
    param_bytes: tuple[int, ...]
    output_bytes: tuple[int, ...]
    step_activation_bytes: tuple[int, ...]
    backward_transient_bytes: tuple[int, ...]
    loss_activation_bytes: int


def _signature(module: torch.nn.Module) -> tuple:
    return (type(module).__name__,
            tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()))


def measure_layer_memory(model: RuntimeModel, layer: int, *, micro_batch_size: int, dtype: str = "float32",
                         tp_degree: int = 1, seed: int = 0) -> LayerMemory:
    """Measure one layer's memory terms (see the module docstring).

    Raises
    ------
    HppInputError
        A layer outside the model, a bad micro-batch size or dtype, a TP degree the model
        cannot be split by, or a process group already initialised in this process.
    """
    from hpp.runtime.training import TrainingConfig, autocast_context, lm_loss

    ms = model.spec
    if not 0 <= layer < ms.num_layers:
        raise HppInputError(f"layer {layer} outside [0, {ms.num_layers})", field="layer",
                            fix=f"{ms.name} has {ms.num_layers} layers")
    if micro_batch_size < 1:
        raise HppInputError(f"micro-batch size {micro_batch_size}", field="micro_batch_size", fix="use >= 1")
    tcfg = TrainingConfig(dtype=dtype)
    b, s, h = micro_batch_size, ms.seq_len, ms.hidden_size
    is_last = layer == ms.num_layers - 1
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_world(tp_degree, 0):
        stage = build_fake_stage(model, layer, layer + 1, fake_mode=fake_mode, seed=seed)
        if tp_degree > 1:           # outside the fake mode: the device mesh holds real rank numbers
            from hpp.runtime.tensor_parallel import parallelize_stage
            parallelize_stage(stage, model, tp_group=dist_world(), tp_degree=tp_degree, device=torch.device("cpu"))
        with fake_mode:
            params = [p for _l, _n, p in stage.layer_parameters()]
            for p in params:
                p.grad = torch.zeros_like(p)
            x = (torch.zeros(b, s, dtype=torch.long) if layer == 0
                 else torch.zeros(b, s, h, dtype=tcfg.activation_dtype, requires_grad=True))
            targets = torch.zeros(b, s, dtype=torch.long)
            tracker = _StepTracker()
            tracker.track_external(stage, x, targets)
            with tracker:
                before = tracker.current_bytes()
                with autocast_context(tcfg, "cpu"):
                    y = stage(x)
                y = y.to(tcfg.logits_dtype if is_last else tcfg.activation_dtype)
                after_forward = tracker.current_bytes()
                output_bytes = y.numel() * y.element_size()
                if is_last:
                    loss = lm_loss(y, targets, denominator=b * s)
                    loss_bytes = tracker.current_bytes() - after_forward
                    base = tracker.current_bytes()
                    tracker.window_peak = base
                    loss.backward()
                else:
                    loss_bytes = 0
                    grad = torch.ones_like(y)
                    base = tracker.current_bytes()
                    tracker.window_peak = base
                    y.backward(grad)
                transient = tracker.window_peak - base
    param_bytes = sum(_local_numel(p) * p.element_size() for p in params)
    return LayerMemory(int(param_bytes), int(output_bytes), int(after_forward - before), int(transient),
                       int(loss_bytes))


def dist_world():
    import torch.distributed as dist
    return dist.group.WORLD


def _local_numel(p: torch.Tensor) -> int:
    from hpp.runtime.tensor_parallel import local_tensor
    return local_tensor(p).numel()


def memory_terms(model: RuntimeModel, *, micro_batch_size: int, dtype: str = "float32", tp_degree: int = 1,
                 seed: int = 0) -> MemoryTerms:
    """:func:`measure_layer_memory` for every layer (identical layers measured once)."""
    cache: dict[tuple, LayerMemory] = {}
    rows: list[LayerMemory] = []
    last = model.spec.num_layers - 1
    for l in range(model.spec.num_layers):
        with torch.device("meta"):
            key = (_signature(model.build_layer(l, seed=seed, dtype=torch.float32)), l == 0, l == last)
        if key not in cache:
            cache[key] = measure_layer_memory(model, l, micro_batch_size=micro_batch_size, dtype=dtype,
                                              tp_degree=tp_degree, seed=seed)
        rows.append(cache[key])
    logger.info("memory terms of %s at b=%d, %s, TP %d: %d distinct layers measured", model.spec.name,
                micro_batch_size, dtype, tp_degree, len(cache))
    return MemoryTerms(micro_batch_size, dtype, tp_degree, tuple(r.param_bytes for r in rows),
                       tuple(r.output_bytes for r in rows), tuple(r.step_activation_bytes for r in rows),
                       tuple(r.backward_transient_bytes for r in rows), rows[-1].loss_activation_bytes)


def add_memory_terms(profile: ModelProfile, model: RuntimeModel, *, dtype: str = "float32",
                     seed: int = 0) -> ModelProfile:
    """``profile`` with the memory terms of ``model`` in every entry (per its TP degree and micro-batch size).

    Raises
    ------
    HppInputError
        The model's layer count differs from the profile's.
    """
    if model.spec.num_layers != profile.num_layers:
        raise HppInputError(f"{model.spec.name} has {model.spec.num_layers} layers, the profile of "
                            f"{profile.model} {profile.num_layers}", field="model",
                            fix="measure the memory of the model the profile was measured for")
    measured: dict[tuple[int, int], MemoryTerms] = {}
    entries = {}
    for key, e in profile.entries.items():
        tb = (e.tp_degree, e.micro_batch_size)
        if tb not in measured:
            measured[tb] = memory_terms(model, micro_batch_size=e.micro_batch_size, dtype=dtype,
                                        tp_degree=e.tp_degree, seed=seed)
        entries[key] = with_memory_terms(e, measured[tb])
    meta = dict(profile.meta, memory={"measured_by": "hpp.runtime.memory_profile (FakeTensorMode + MemTracker)",
                                      "dtype": dtype})
    return replace(profile, entries=entries, meta=meta)


def with_memory_terms(e: LayerProfile, t: MemoryTerms) -> LayerProfile:
    """``e`` with the optional memory fields set from ``t``."""
    return replace(e, step_activation_bytes=t.step_activation_bytes,
                   backward_transient_bytes=t.backward_transient_bytes,
                   loss_activation_bytes=t.loss_activation_bytes)


def _unused(_: Sequence[int]) -> None:  # pragma: no cover
    pass
