"""``hpp profile``: measure a runtime model's per-layer profile in the native format.

Any runtime model is profiled through its protocol (:mod:`hpp.runtime.models.api`):
a bundled name or ``MODULE:FUNCTION`` (:func:`hpp.runtime.models.zoo.load_runtime_model`),
a :class:`~hpp.runtime.models.gpt.ModelConfig`, or a model object. Each layer is
built once (``build_layer``) and measured at every micro-batch size ``b`` (one layer
at a time, on random inputs of the right shape):

- ``forward_s``, ``backward_s``: median over ``repeats`` timed runs after
  ``warmup`` untimed ones (CUDA: synchronised); the relative spread
  ``(max - min) / median`` per layer goes into ``meta["spread"]``;
- ``param_bytes``: the layer's parameter bytes;
- ``activation_bytes``: bytes the layer keeps for backward, measured with
  saved-tensor hooks (distinct storages, parameters excluded);
- ``output_bytes``: bytes of the layer's output (what a stage boundary sends);
- ``optimizer_s``: median time of an AdamW step over the layer's parameters.

CPU profiles run with ``num_threads`` compute threads (1 = what each rank of
``hpp run`` uses). With one thread the times are the calling thread's CPU time
(``time.thread_time``), not wall time: on a dedicated core the two agree, and on a
shared host (other processes, other ranks) CPU time is still the dedicated-core
figure, while wall time grows with the host's load. It is also what the runtime's
speed emulation multiplies (:mod:`hpp.runtime.host.emulation`). ``meta["clock"]`` says
which clock was used and ``meta["load_average"]`` the host's 1-minute load before
and after. For emulated device types (slowdown ``k``)
:func:`scale_profile` adds entries whose forward and backward times are ``k`` x
the measured ones (what sleep-padding produces); the optimizer step is not
padded by the runtime and is copied unchanged. Each scaled entry says so in its note.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from hpp.errors import HppInputError
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.profiles.profile_format import save_profile
from hpp.runtime.host.time_model import emulated_entry
from hpp.runtime.models.api import RuntimeModel, check_protocol
from hpp.runtime.models.gpt import GPT, ModelConfig
from hpp.runtime.models.zoo import canonical_model_name, load_runtime_model, portable_model_spec

__all__ = ["profile_model", "scale_profile", "dilate_profile", "write_profile", "measure_layer", "resolve_model"]

logger = logging.getLogger(__name__)


def _timer(device: torch.device, *, cpu_time: bool = False) -> Callable[[], float]:
    if device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.thread_time if cpu_time else time.perf_counter


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _saved_bytes(fn: Callable[[], torch.Tensor], params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Run ``fn`` under saved-tensor hooks; return its output and the distinct non-parameter bytes saved.

    The output's graph is for counting only: its backward raises. The pack hook keeps no
    tensor, because a graph that saves its own output (tanh, GELU, softmax) and holds it
    through the hook forms a reference cycle through C++ that Python's collector cannot see:
    every measured layer's activations stayed alive (on a GPU, until the profile ran out of memory).
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> int:
        st = t.untyped_storage()
        if st.data_ptr() not in param_ptrs:
            storages[st.data_ptr()] = st.nbytes()
        return st.nbytes()

    def unpack(_: int) -> torch.Tensor:
        raise RuntimeError("the graph of a saved-bytes measurement keeps no tensors: it has no backward")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = fn()
    return out, sum(storages.values())


def measure_layer(layer: torch.nn.Module, make_input: Callable[[], torch.Tensor], *, device: torch.device,
                  warmup: int, repeats: int, cpu_time: bool = False,
                  mixed_precision: bool = False) -> dict[str, float | list[float]]:
    """Forward/backward/optimizer seconds (all repeats) and bytes of one layer.

    ``cpu_time``: on CPU, time with the calling thread's CPU clock (one compute thread only).
    ``mixed_precision``: the forward runs under ``torch.autocast(bfloat16)`` with fp32
    weights, as ``hpp run --dtype bfloat16`` runs it.

    Returns
    -------
    dict
        ``forward_s``, ``backward_s``, ``optimizer_s``: lists of ``repeats`` seconds;
        ``param_bytes``, ``activation_bytes``, ``output_bytes``: bytes.
    """
    params = list(layer.parameters())
    now = _timer(device, cpu_time=cpu_time)
    opt = torch.optim.AdamW(params, lr=1e-4)
    fwd, bwd, step = [], [], []
    x = make_input()
    for i in range(warmup + repeats):
        t0 = now()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed_precision):
            y = layer(x)
        t1 = now()
        grad = torch.ones_like(y)
        t2 = now()
        y.backward(grad)
        t3 = now()
        opt.step()
        t4 = now()
        opt.zero_grad(set_to_none=False)
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t3 - t2)
            step.append(t4 - t3)
    y, act = _saved_bytes(lambda: layer(x), params)
    return {"forward_s": fwd, "backward_s": bwd, "optimizer_s": step,
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "activation_bytes": act, "output_bytes": y.numel() * y.element_size()}


def _spread(values: Sequence[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else 0.0


def resolve_model(model: str | ModelConfig | RuntimeModel) -> tuple[RuntimeModel, str]:
    """``(runtime model, the name to record)``: a zoo name or ``MODULE:FUNCTION``, a GPT config or a model.

    The recorded name is what :func:`hpp.runtime.models.zoo.load_runtime_model` loads the model
    from again (the canonical zoo name, or the ``MODULE:FUNCTION`` string, a file path made absolute:
    :func:`hpp.runtime.models.zoo.portable_model_spec`), or the model's ``spec.name`` for an object.

    Raises
    ------
    HppInputError
        Unknown name, import failure, or an object that does not follow the protocol.
    """
    if isinstance(model, ModelConfig):
        return GPT(model), model.name
    if isinstance(model, str):
        loaded = load_runtime_model(model)
        return loaded, canonical_model_name(model) or portable_model_spec(model)
    obj = check_protocol(model, source=type(model).__name__)
    return obj, obj.spec.name


def profile_model(model: str | ModelConfig | RuntimeModel, *, device: str = "cpu",
                  micro_batch_sizes: Sequence[int] = (1, 2, 4), tp_degree: int = 1, device_type: str | None = None,
                  warmup: int = 3, repeats: int = 10, num_threads: int = 1, seed: int = 0,
                  dtype: torch.dtype = torch.float32, mixed_precision: bool = False,
                  memory_terms: bool = True) -> ModelProfile:
    """Measure ``model``'s per-layer profile on ``device`` for each micro-batch size.

    Parameters
    ----------
    model : str, ModelConfig or RuntimeModel
        A runtime model name (``hpp.runtime.models.zoo.runtime_model_names()``, case-insensitive),
        ``MODULE:FUNCTION``, a GPT config, or an object following the protocol.
    device : ``"cpu"`` or ``"cuda"``
    micro_batch_sizes : sequence of int, each >= 1
    device_type : str, optional
        Name of the entries' device type (default: ``device``).
    mixed_precision : bool
        Time the layers as ``hpp run --dtype bfloat16`` runs them (autocast, fp32 weights).
    memory_terms : bool
        Also measure the memory of the runtime's real stage step per layer
        (:func:`hpp.runtime.profile.memory_terms.add_memory_terms`: FakeTensorMode + MemTracker, no
        real memory used), which the cost model then prices instead of its calibrated formula.

    Returns
    -------
    ModelProfile
        Named ``model.spec.name``; ``meta["runtime_model"]`` says how to load the model
        again (zoo name or ``MODULE:FUNCTION``), ``meta["hyper_parameters"]`` holds the
        sizes (heads, key/value heads, MLP width) the planner checks TP degrees against.

    Raises
    ------
    HppInputError
        Unknown model, TP > 1, bad sizes, no CUDA device, or a micro-batch size
        that runs out of memory (naming the sizes that fit).
    """
    rmodel, runtime_name = resolve_model(model)
    spec = rmodel.spec
    sizes = _check_profile_args(tp_degree=tp_degree, device=device, micro_batch_sizes=micro_batch_sizes)
    memory_dtype = "bfloat16" if mixed_precision else "float32"
    terms = {}
    if memory_terms:
        # before the timing: the memory terms are measured in forked children, and a process that has
        # run autograd on a GPU cannot fork one (torch refuses: autograd's device threads). Imported
        # here, not on top: torch's MemTracker and DTensor, 4-6 s (-X importtime), which hpp run does not need.
        from hpp.runtime.profile.memory_terms import add_memory_terms, memory_terms as measure_terms
        terms = {(1, b): measure_terms(rmodel, micro_batch_size=b, dtype=memory_dtype, tp_degree=1, seed=seed)
                 for b in sizes}
    dev = torch.device(device)
    type_name = device_type or device
    cpu_clock = device == "cpu" and num_threads == 1
    load_before = _load_average()
    old_threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(num_threads)
    try:
        rows = _measure_rows(rmodel, sizes, dev, seed=seed, dtype=dtype, warmup=warmup, repeats=repeats,
                             cpu_clock=cpu_clock, mixed_precision=mixed_precision)
    finally:
        torch.set_num_threads(old_threads)
    entries, spread = _entries(rows, type_name=type_name, model_name=spec.name,
                               note=f"measured by hpp profile: median of {repeats} after {warmup} warm-up"
                                    + (", CPU time of the compute thread" if cpu_clock else ""))
    meta = {"machine": platform.node(), "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": device if device == "cpu" else torch.cuda.get_device_name(dev), "num_threads": num_threads,
            "clock": "thread_time (CPU time of the compute thread)" if cpu_clock else "perf_counter (wall)",
            "load_average": {"before": load_before, "after": _load_average(), "cores": os.cpu_count()},
            "dtype": "bfloat16 autocast, fp32 weights" if mixed_precision else str(dtype).removeprefix("torch."),
            "warmup": warmup, "repeats": repeats,
            "spread": spread, "spread_definition": "(max - min) / median over repeats, per layer",
            "runtime_model": runtime_name, "hyper_parameters": _hyper_parameters(spec)}
    profile = ModelProfile(model=spec.name, num_layers=spec.num_layers, sequence_length=spec.seq_len,
                           entries=entries, source="measured by hpp profile (hpp.runtime.profile.profiler)",
                           licence="MIT", meta=meta)
    if memory_terms:
        profile = add_memory_terms(profile, rmodel, dtype=memory_dtype, seed=seed, measured=terms)
    return profile


def _entries(rows: dict[int, list[dict]], *, type_name: str, model_name: str, note: str
             ) -> tuple[dict[tuple[str, int, int], LayerProfile], dict[str, dict[str, list[float]]]]:
    """Per micro-batch size, the profile entry (medians over the repeats) and the times' spread per layer."""
    entries: dict[tuple[str, int, int], LayerProfile] = {}
    spread: dict[str, dict[str, list[float]]] = {}
    for b, layer_rows in rows.items():
        med = {k: tuple(statistics.median(r[k]) for r in layer_rows)
               for k in ("forward_s", "backward_s", "optimizer_s")}
        entries[(type_name, 1, b)] = LayerProfile(
            device_type=type_name, tp_degree=1, micro_batch_size=b, forward_s=med["forward_s"],
            backward_s=med["backward_s"], optimizer_s=med["optimizer_s"],
            param_bytes=tuple(int(r["param_bytes"]) for r in layer_rows),
            activation_bytes=tuple(int(r["activation_bytes"]) for r in layer_rows),
            output_bytes=tuple(int(r["output_bytes"]) for r in layer_rows), note=note)
        spread[f"{type_name}/tp1/mb{b}"] = {k: [round(_spread(r[k]), 4) for r in layer_rows]
                                             for k in ("forward_s", "backward_s")}
        logger.info("profiled %s at micro-batch %d: %.2f ms forward+backward", model_name, b,
                    1e3 * sum(med["forward_s"]) + 1e3 * sum(med["backward_s"]))
    return entries, spread


def _hyper_parameters(spec: Any) -> dict[str, int]:
    """The sizes the planner checks TP degrees against (``meta["hyper_parameters"]``)."""
    return {"num_blocks": spec.num_blocks, "hidden_size": spec.hidden_size, "num_heads": spec.num_heads,
            "num_kv_heads": spec.num_kv_heads, "ffn_size": spec.ffn_size, "seq_len": spec.seq_len,
            "vocab_size": spec.vocab_size}


def _check_profile_args(*, tp_degree: int, device: str, micro_batch_sizes: Sequence[int]) -> list[int]:
    """The sorted micro-batch sizes; :class:`HppInputError` for what :func:`profile_model` cannot measure."""
    if tp_degree != 1:
        raise HppInputError(f"--tp {tp_degree}: the profiler measures TP degree 1 only", field="tp",
                            fix="use --tp 1")
    if device not in ("cpu", "cuda"):
        raise HppInputError(f"--device {device!r}", field="device", fix="use cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise HppInputError("--device cuda but no CUDA device is visible", field="device", fix="use --device cpu")
    sizes = sorted(set(micro_batch_sizes))
    if not sizes or sizes[0] < 1:
        raise HppInputError(f"micro-batch sizes {list(micro_batch_sizes)}", field="micro_batch_sizes",
                            fix="give positive integers, e.g. 1,2,4")
    return sizes


def _measure_rows(rmodel: RuntimeModel, sizes: list[int], dev: torch.device, *, seed: int, dtype: torch.dtype,
                  warmup: int, repeats: int, cpu_clock: bool, mixed_precision: bool) -> dict[int, list[dict]]:
    """Per micro-batch size, one :func:`measure_layer` record per layer (each layer built once, on ``dev``)."""
    spec = rmodel.spec
    gen = torch.Generator().manual_seed(seed)
    rows: dict[int, list[dict]] = {b: [] for b in sizes}
    for l in range(spec.num_layers):
        layer = rmodel.build_layer(l, seed=seed, dtype=dtype).to(dev)
        for b in sizes:
            def make_input(l: int = l, b: int = b) -> torch.Tensor:
                if l == 0:
                    return torch.randint(0, spec.vocab_size, (b, spec.seq_len), generator=gen).to(dev)
                return torch.randn(b, spec.seq_len, spec.hidden_size, generator=gen, dtype=dtype).to(
                    dev).requires_grad_(True)
            try:
                rows[b].append(measure_layer(layer, make_input, device=dev, warmup=warmup, repeats=repeats,
                                             cpu_time=cpu_clock, mixed_precision=mixed_precision))
            except torch.OutOfMemoryError:
                fits = [x for x in sizes if x < b]
                raise HppInputError(f"micro-batch size {b} runs out of memory on {dev.type} (layer {l})",
                                    field="micro_batch_sizes",
                                    fix=f"the largest size that fits is {fits[-1]}" if fits
                                    else "the largest size that fits is none") from None
            for p in layer.parameters():
                p.grad = None
        del layer
    return rows


def scale_profile(profile: ModelProfile, slowdowns: Mapping[str, float], *, base_device_type: str) -> ModelProfile:
    """Add entries for emulated device types: ``base_device_type``'s entries with compute x slowdown.

    Parameters
    ----------
    slowdowns : {device type name: k >= 1}

    Raises
    ------
    HppInputError
        The base device type has no entries, or a slowdown < 1.
    """
    base = [e for e in profile.entries.values() if e.device_type == base_device_type]
    if not base:
        raise HppInputError(f"the profile has no entries for {base_device_type!r}", field="device_type",
                            fix=f"use one of {list(profile.device_types)}")
    entries = dict(profile.entries)
    for name, k in slowdowns.items():
        if not k >= 1.0:
            raise HppInputError(f"slowdown {k} for {name!r}", field="slowdown", fix="use a factor >= 1")
        for e in base:
            scaled = emulated_entry(e, name, k)
            entries[scaled.key] = scaled
    meta = dict(profile.meta, emulated={name: {"base": base_device_type, "slowdown": k}
                                        for name, k in slowdowns.items()})
    return replace(profile, entries=entries, meta=meta)


def dilate_profile(profile: ModelProfile, time_scale: float) -> ModelProfile:
    """Every entry's forward and backward seconds x ``time_scale`` (the emulation's time dilation).

    The optimizer step is not padded by the runtime and stays as measured.
    ``time_scale == 1`` returns ``profile`` itself.
    """
    if time_scale == 1.0:
        return profile
    if not time_scale > 1.0:
        raise HppInputError(f"time scale {time_scale}", field="time_scale", fix="use a factor >= 1")
    entries = {k: replace(e, forward_s=tuple(v * time_scale for v in e.forward_s),
                          step_time=e.step_time.emulated(time_scale) if e.step_time is not None else None,
                          backward_s=tuple(v * time_scale for v in e.backward_s)) for k, e in profile.entries.items()}
    return replace(profile, entries=entries, meta=dict(profile.meta, time_scale=time_scale))


def write_profile(profile: ModelProfile, path: str | Path) -> None:
    """Save ``profile`` (native format; temporary file + rename, never partial)."""
    save_profile(profile, path)
