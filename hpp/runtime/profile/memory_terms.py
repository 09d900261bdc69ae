"""Per-layer memory terms of a runtime model, measured in the runtime's own conditions.

For each layer ``l`` of a model, at micro-batch size ``b``, training dtype and TP
degree ``t`` (one device of the TP group), under ``FakeTensorMode`` and MemTracker
(:mod:`hpp.runtime.profile.fake_env`; no real memory, any model size; each measurement in a
forked child, so the calling process keeps no fake-world state):

- ``step_activation_bytes[l]``: bytes the layer adds to its stage per micro-batch in
  flight when it runs INSIDE a stage: the tensors its forward saves for backward plus
  its output, less its input when it keeps none of it (its input is then the previous
  layer's output, a non-leaf tensor freed once the layer has run: under autocast a
  layer that casts its fp32 input to bf16 keeps only the casts, one per consuming
  linear layer, since autocast caches casts of leaf tensors only);
- ``stage_entry_bytes[l]``: what the layer adds on top when it is the FIRST layer of a
  (non-first) stage: its input is then the stage's receive buffer, which the pipelining
  library holds anyway (the input bytes it would have freed inside a stage);
- ``stage_exit_release_bytes[l]``: bytes freed per micro-batch when the layer ENDS a
  stage that sends: the stage casts its output to the send dtype (``StageForward``), and
  an output of another dtype (fp32 under autocast) is freed for the smaller cast;
- ``forward_transient_bytes[l]``: how far memory rises above the layer's kept level while
  its forward runs inside a stage (intermediates, autocast's bf16 weight copies; a stage's
  forward peak can exceed its backward one: Llama's MLP under bf16);
- ``backward_transient_bytes[l]``: how far memory rises above its level at the start
  of the layer's backward while the layer runs backward (gradients of its
  intermediate tensors and of its input, the parameter gradients before they are
  accumulated). The last layer's figures include the runtime's loss
  (:func:`hpp.runtime.exec.training.lm_loss` on the logits);
- ``loss_activation_bytes`` (one number): what the loss keeps per micro-batch
  (the log-softmax of the logits), part of the last stage's in-flight memory.

Why the three (bf16, found with MemTracker on the stage step): measured with a held
leaf input alone, a post-LayerNorm OPT block of a first stage (fp32 residual stream)
counted its fp32 output as kept, but inside the stage the next block keeps only bf16
casts of it; at TP 2 (where the DTensor input of the column-parallel q/k/v makes every
cast a separate copy at any input) that was one fp32 ``(b, s, h)`` per block and
micro-batch in flight: +15 % on opt-350's first stages. Llama blocks keep none of their
bf16 input either (their RMSNorm reads a cast of it).

The layer runs as it does in a stage (:class:`hpp.runtime.exec.step.StageForward`):
under autocast for ``bfloat16``, its parameters' gradients allocated, its input a
tensor of the activation dtype that requires grad (tokens for layer 0). Layers of
identical structure (class, parameter and buffer shapes) are measured once. Also:
``tied_param_bytes``, what a stage holding both ends of a tied pair holds once.
Not counted: module buffers (GPT-Neo's causal masks, 4 MiB per block at 2048 tokens).

How the cost model composes them into a stage's peak:
:func:`hpp.formulation.cost_model.stage_memory_breakdown`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from hpp.errors import HppInputError
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.runtime.profile.fake_env import StepTracker, build_fake_stage, fake_world, isolated, warm_up_sharding
from hpp.runtime.models.api import RuntimeModel
from hpp.runtime.models.stage import split_global_name
from hpp.runtime.exec.tensor_parallel import local_tensor, parallelize_stage, shard_dim
from hpp.runtime.exec.training import TrainingConfig, autocast_context, lm_loss

__all__ = ["LayerMemory", "MemoryTerms", "measure_layer_memory", "memory_terms", "add_memory_terms",
           "with_memory_terms"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LayerMemory:
    """Measured memory figures of one layer, one micro-batch, one device [bytes] (see the module docstring)."""

    param_bytes: int
    output_bytes: int
    step_activation_bytes: int
    backward_transient_bytes: int
    loss_activation_bytes: int = 0
    output_dtype: torch.dtype = torch.float32      # of the layer's output inside a stage (before any cast)
    stage_entry_bytes: int = 0
    stage_exit_release_bytes: int = 0
    forward_transient_bytes: int = 0


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
    first_stage_step_activation_bytes: tuple[int, ...] | None = None
    first_stage_backward_transient_bytes: tuple[int, ...] | None = None
    tied_param_bytes: int = 0
    stage_entry_bytes: tuple[int, ...] | None = None
    stage_exit_release_bytes: tuple[int, ...] | None = None
    first_stage_exit_release_bytes: tuple[int, ...] | None = None
    forward_transient_bytes: tuple[int, ...] | None = None
    first_stage_forward_transient_bytes: tuple[int, ...] | None = None


def _signature(module: torch.nn.Module) -> tuple:
    return (type(module).__name__,
            tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()))


def measure_layer_memory(model: RuntimeModel, layer: int, *, micro_batch_size: int, dtype: str = "float32",
                         tp_degree: int = 1, seed: int = 0, input_dtype: torch.dtype | None = None,
                         isolate: bool = True) -> LayerMemory:
    """Measure one layer's memory terms (see the module docstring).

    ``input_dtype``: the dtype of the layer's input (default: what stages send, the
    activation dtype); the first stage's layers get what the embedding makes.
    ``isolate``: measure in a forked child (:func:`hpp.runtime.profile.stage_memory.isolated`), leaving
    no fake-world state in this process.

    Raises
    ------
    HppInputError
        A layer outside the model, a bad micro-batch size or dtype, a TP degree the model
        cannot be split by, or a process group already initialised in this process.
    """
    if isolate:
        return isolated(measure_layer_memory, model, layer, micro_batch_size=micro_batch_size, dtype=dtype,
                        tp_degree=tp_degree, seed=seed, input_dtype=input_dtype, isolate=False)

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
            parallelize_stage(stage, model, tp_group=_world(), tp_degree=tp_degree, device=torch.device("cpu"))
        with fake_mode:
            params = [p for _l, _n, p in stage.layer_parameters()]
            for p in params:
                p.grad = torch.zeros_like(p)
            if tp_degree > 1:
                warm_up_sharding(stage, model, micro_batch_size=b, is_first=layer == 0, is_last=is_last, dtype=dtype,
                                 input_dtype=input_dtype)
            x = (torch.zeros(b, s, dtype=torch.long) if layer == 0
                 else torch.zeros(b, s, h, dtype=input_dtype or tcfg.activation_dtype, requires_grad=True))
            targets = torch.zeros(b, s, dtype=torch.long)
            tracker = StepTracker()
            tracker.track_external(stage, x, targets)
            with tracker:
                before = tracker.current_bytes()
                with autocast_context(tcfg, "cpu"):
                    y = stage(x)
                if is_last:                              # the stage's output cast (StageForward)
                    y = y.to(tcfg.logits_dtype)
                after_forward = tracker.current_bytes()
                out_dtype = tcfg.logits_dtype if is_last else tcfg.activation_dtype
                output_bytes = y.numel() * out_dtype.itemsize    # what a stage ending here sends
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
                out_dtype_inside = y.dtype
                inner, release, forward_rise = _inside_stage_pass(stage, tracker, x, tcfg, is_last=is_last)
    param_bytes = sum(_local_numel(p) * p.element_size() for p in params)
    first = int(after_forward - before)
    if first < inner or release < 0:
        logger.warning("layer %d of %s: stage entry %d B, exit release %d B (expected >= 0; counted as 0)",
                       layer, ms.name, first - inner, release)
    return LayerMemory(int(param_bytes), int(output_bytes), int(inner), int(transient), int(loss_bytes),
                       out_dtype_inside, max(0, first - int(inner)), max(0, int(release)),
                       max(0, int(forward_rise - inner)))


def _inside_stage_pass(stage: torch.nn.Module, tracker: StepTracker, x: torch.Tensor, tcfg, *,
                       is_last: bool) -> tuple[int, int, int]:
    """The layer's forward once more, as it runs inside a stage: ``(kept, exit release, rise)`` [bytes].

    Its input is a non-leaf tensor (the previous layer's output) whose last reference
    is dropped after the forward, so it is freed unless the layer saved it; ``kept`` is
    what stays (saved tensors + output - a freed input). Then the output's cast to the
    send dtype (as :class:`hpp.runtime.exec.step.StageForward` does at a stage's end), the
    uncast output dropped: ``release`` is how much that frees (negative: it adds). ``rise``: the
    highest level during the forward above the level before it (its input still alive).
    """
    xi = x if not x.is_floating_point() else x * 1          # tokens stay tokens; else a non-leaf copy
    before = tracker.current_bytes()
    tracker.window_peak = before
    with autocast_context(tcfg, "cpu"):
        y = stage(xi)
    if is_last:
        y = y.to(tcfg.logits_dtype)
    rise = tracker.window_peak - before
    del xi
    kept = tracker.current_bytes() - before
    if is_last:
        return kept, 0, rise
    sent = y.to(tcfg.activation_dtype)
    del y
    release = before + kept - tracker.current_bytes()
    del sent
    return kept, release, rise


def _world():
    return dist.group.WORLD


def _local_numel(p: torch.Tensor) -> int:
    return local_tensor(p).numel()


def memory_terms(model: RuntimeModel, *, micro_batch_size: int, dtype: str = "float32", tp_degree: int = 1,
                 seed: int = 0) -> MemoryTerms:
    """:func:`measure_layer_memory` for every layer (identical layers measured once).

    Under ``bfloat16`` the first stage's layers may see another input dtype than the
    others (the embedding's output is fp32 under autocast, while stages send bf16):
    they are measured along the model's own chain too, into ``first_stage_*`` (None
    when equal to the others).
    """
    act_dtype = TrainingConfig(dtype=dtype).activation_dtype
    cache: dict[tuple, LayerMemory] = {}
    last = model.spec.num_layers - 1

    def measure(l: int, input_dtype: torch.dtype) -> LayerMemory:
        with torch.device("meta"):
            sig = _signature(model.build_layer(l, seed=seed, dtype=torch.float32))
        key = (sig, l == 0, l == last, input_dtype)
        if key not in cache:
            cache[key] = measure_layer_memory(model, l, micro_batch_size=micro_batch_size, dtype=dtype,
                                              tp_degree=tp_degree, seed=seed, input_dtype=input_dtype)
        return cache[key]

    rows = [measure(l, act_dtype) for l in range(model.spec.num_layers)]
    chain = [rows[0]]
    for l in range(1, model.spec.num_layers):
        chain.append(measure(l, chain[-1].output_dtype))
    logger.info("memory terms of %s at b=%d, %s, TP %d: %d layer measurements", model.spec.name,
                micro_batch_size, dtype, tp_degree, len(cache))
    def used(m: LayerMemory) -> tuple:                     # what a first stage reads of its layers' terms
        return m.step_activation_bytes, m.backward_transient_bytes, m.stage_exit_release_bytes, m.forward_transient_bytes

    same = all(used(c) == used(r) for c, r in zip(chain, rows))
    return MemoryTerms(micro_batch_size, dtype, tp_degree, tuple(r.param_bytes for r in rows),
                       tuple(r.output_bytes for r in rows), tuple(r.step_activation_bytes for r in rows),
                       tuple(r.backward_transient_bytes for r in rows), rows[-1].loss_activation_bytes,
                       None if same else tuple(c.step_activation_bytes for c in chain),
                       None if same else tuple(c.backward_transient_bytes for c in chain),
                       _tied_bytes(model, tp_degree=tp_degree, seed=seed),
                       tuple(r.stage_entry_bytes for r in rows), tuple(r.stage_exit_release_bytes for r in rows),
                       None if same else tuple(c.stage_exit_release_bytes for c in chain),
                       tuple(r.forward_transient_bytes for r in rows),
                       None if same else tuple(c.forward_transient_bytes for c in chain))


def _tied_bytes(model: RuntimeModel, *, tp_degree: int, seed: int) -> int:
    """Bytes of one device's copy of the second name of every tied pair (fp32 masters)."""
    total = 0
    for _a, b in model.tied_parameters():
        layer, path = split_global_name(b)
        with torch.device("meta"):
            p = model.build_layer(layer, seed=seed, dtype=torch.float32).get_parameter(path)
        total += p.numel() * p.element_size() // (tp_degree if shard_dim(model, b, tp_degree) is not None else 1)
    return total


def add_memory_terms(profile: ModelProfile, model: RuntimeModel, *, dtype: str = "float32",
                     seed: int = 0, measured: dict[tuple[int, int], MemoryTerms] | None = None) -> ModelProfile:
    """``profile`` with the memory terms of ``model`` in every entry (per its TP degree and micro-batch size).

    The terms do not depend on the device type (shapes and the runtime's code decide
    them), so entries of one (TP degree, micro-batch size) share one measurement.
    ``measured``: terms already measured, by ``(TP degree, micro-batch size)``; the
    missing ones are measured here.

    Raises
    ------
    HppInputError
        The model's layer count differs from the profile's.
    """
    if model.spec.num_layers != profile.num_layers:
        raise HppInputError(f"{model.spec.name} has {model.spec.num_layers} layers, the profile of "
                            f"{profile.model} {profile.num_layers}", field="model",
                            fix="measure the memory of the model the profile was measured for")
    measured = dict(measured or {})
    entries = {}
    for key, e in profile.entries.items():
        tb = (e.tp_degree, e.micro_batch_size)
        if tb not in measured:
            measured[tb] = memory_terms(model, micro_batch_size=e.micro_batch_size, dtype=dtype,
                                        tp_degree=e.tp_degree, seed=seed)
        entries[key] = with_memory_terms(e, measured[tb])
    meta = dict(profile.meta, memory={"measured_by": "hpp.runtime.profile.memory_terms (FakeTensorMode + MemTracker)",
                                      "dtype": dtype, "torch": torch.__version__})
    return replace(profile, entries=entries, meta=meta)


def with_memory_terms(e: LayerProfile, t: MemoryTerms) -> LayerProfile:
    """``e`` with the optional memory fields set from ``t``."""
    return replace(e, step_activation_bytes=t.step_activation_bytes,
                   backward_transient_bytes=t.backward_transient_bytes,
                   loss_activation_bytes=t.loss_activation_bytes,
                   first_stage_step_activation_bytes=t.first_stage_step_activation_bytes,
                   first_stage_backward_transient_bytes=t.first_stage_backward_transient_bytes,
                   tied_param_bytes=t.tied_param_bytes, stage_entry_bytes=t.stage_entry_bytes,
                   stage_exit_release_bytes=t.stage_exit_release_bytes,
                   first_stage_exit_release_bytes=t.first_stage_exit_release_bytes,
                   forward_transient_bytes=t.forward_transient_bytes,
                   first_stage_forward_transient_bytes=t.first_stage_forward_transient_bytes)
