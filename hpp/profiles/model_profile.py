"""Model profiles: per device type, TP degree and micro-batch size, per-layer costs.

A :class:`ModelProfile` maps ``(device_type, tp_degree, micro_batch_size)`` to a
:class:`LayerProfile` that gives, for every layer ``l`` in ``0 .. L-1`` (layer 0
is the embedding, layer L-1 the head), the figures of ONE device of a TP group of
that type running one micro-batch:

- ``forward_s[l]``, ``backward_s[l]``: compute seconds (TP communication inside);
- ``optimizer_s[l]``: optimizer-step seconds for the layer's parameter shard;
- ``param_bytes[l]``: parameter bytes held by one device (the layer's shard at TP t);
- ``activation_bytes[l]``: activation bytes kept for backward, per micro-batch;
- ``output_bytes[l]``: bytes of the layer's output (what a stage sends to the next);
- ``attention_activation_bytes[l]`` (optional): the share of ``activation_bytes``
  that selective recomputation (Megatron) drops; ``None`` = not measured.

Optional memory terms of the runtime's own training step (measured by
:mod:`hpp.runtime.profile.memory_terms` with FakeTensor + MemTracker; ``None`` = not measured,
and the cost model then uses its calibrated formula on ``activation_bytes``):

- ``step_activation_bytes[l]``: bytes layer ``l`` adds to its stage per micro-batch in
  flight inside a stage (what its forward saves for backward plus its output, less its
  input where it keeps none of it: the previous layer's output is then freed);
- ``stage_entry_bytes[l]``, ``stage_exit_release_bytes[l]`` (optional, ``None`` = 0): what
  layer ``l`` adds when it is the first layer of a non-first stage (its input, the receive
  buffer, is held anyway), and what the stage's cast of its output to the send dtype frees
  when it ends a sending stage (bf16 mixed precision: an fp32 output); ``first_stage_exit_release_bytes``
  the latter along a first stage;
- ``forward_transient_bytes[l]`` (optional, ``None`` = 0; ``first_stage_*`` along a first stage): how
  far memory rises above layer ``l``'s kept level while its forward runs inside a stage;
- ``backward_transient_bytes[l]``: how far memory rises above its level at the start of
  layer ``l``'s backward while it runs (the last layer's includes the loss's backward);
- ``loss_activation_bytes`` (one number): what the loss keeps per micro-batch in flight;
- ``first_stage_step_activation_bytes[l]``, ``first_stage_backward_transient_bytes[l]``: the
  same for layers of a first stage where they differ (bf16 mixed precision: the embedding's
  fp32 output makes the first stage's residual stream fp32, stages send bf16);
- ``tied_param_bytes`` (one number): parameter bytes of the last layer that are one tensor
  with the first layer's (tied embeddings) when a stage holds both (a one-stage pipeline).

Precondition for the planner: every entry of one profile has the same layer count.

The native JSON form (``format: "hpp-profile"``) is read and written by :mod:`hpp.profiles.profile_format`.

Missing combinations: :meth:`ModelProfile.layer_profile` refuses a (device type,
TP) pair that has no measurement at all. For a missing micro-batch size of a
measured pair it can estimate (``estimate=True``) by the rule documented in
:func:`estimate_micro_batch`; the result has ``estimated=True`` and every plan and
report that uses it says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from hpp.errors import HppInputError
from hpp.profiles.calibration_record import ProfileCalibration
from hpp.profiles.step_time import StepTimeTerms

__all__ = ["LayerProfile", "ModelProfile", "estimate_micro_batch", "PROFILE_FORMAT", "PROFILE_VERSION"]

PROFILE_FORMAT = "hpp-profile"
PROFILE_VERSION = 1
_PER_LAYER_FIELDS = ("forward_s", "backward_s", "optimizer_s", "param_bytes", "activation_bytes", "output_bytes")
#: Optional one-number fields (``None`` = not measured).
_OPTIONAL_SCALAR_FIELDS = ("loss_activation_bytes", "tied_param_bytes")
#: Optional per-layer fields (``None`` = not measured).
_OPTIONAL_PER_LAYER_FIELDS = ("attention_activation_bytes", "step_activation_bytes", "backward_transient_bytes",
                              "first_stage_step_activation_bytes", "first_stage_backward_transient_bytes",
                              "stage_entry_bytes", "stage_exit_release_bytes", "first_stage_exit_release_bytes",
                              "forward_transient_bytes", "first_stage_forward_transient_bytes")
#: The optional per-layer fields that belong to the runtime step's memory terms (dropped together).
_STEP_MEMORY_FIELDS = _OPTIONAL_PER_LAYER_FIELDS[1:]

Key = tuple[str, int, int]  # (device_type, tp_degree, micro_batch_size)


@dataclass(frozen=True, slots=True)
class LayerProfile:
    """Per-layer figures of one device of a TP group, for one micro-batch (see module docstring).

    All per-layer tuples have shape ``(num_layers,)``; seconds and bytes.
    """

    device_type: str
    tp_degree: int
    micro_batch_size: int
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    optimizer_s: tuple[float, ...]
    param_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    output_bytes: tuple[int, ...]
    attention_activation_bytes: tuple[int, ...] | None = None
    estimated: bool = False
    note: str = ""
    step_activation_bytes: tuple[int, ...] | None = None
    backward_transient_bytes: tuple[int, ...] | None = None
    loss_activation_bytes: int | None = None
    first_stage_step_activation_bytes: tuple[int, ...] | None = None
    first_stage_backward_transient_bytes: tuple[int, ...] | None = None
    tied_param_bytes: int | None = None
    step_time: StepTimeTerms | None = None    # time terms of the runtime's step (hpp/profiles/step_time.py)
    stage_entry_bytes: tuple[int, ...] | None = None
    stage_exit_release_bytes: tuple[int, ...] | None = None
    first_stage_exit_release_bytes: tuple[int, ...] | None = None
    forward_transient_bytes: tuple[int, ...] | None = None
    first_stage_forward_transient_bytes: tuple[int, ...] | None = None

    @property
    def num_layers(self) -> int:
        return len(self.forward_s)

    @property
    def key(self) -> Key:
        return (self.device_type, self.tp_degree, self.micro_batch_size)

    @property
    def has_step_memory(self) -> bool:
        """The runtime step's memory terms were measured (all three optional fields are set)."""
        return (self.step_activation_bytes is not None and self.backward_transient_bytes is not None
                and self.loss_activation_bytes is not None)

    @property
    def has_step_time(self) -> bool:
        """The runtime step's time terms were measured (:mod:`hpp.profiles.step_time`)."""
        return self.step_time is not None

    def validate(self, *, source: str, where: str) -> None:
        """Check lengths, signs and finiteness.

        Raises
        ------
        HppInputError
            Naming ``source`` and the field ``where.<name>``.
        """
        n = len(self.forward_s)
        if n == 0:
            raise HppInputError("entry has no layers", source=source, field=f"{where}.forward_s",
                                fix="give one value per layer")
        fields = list(_PER_LAYER_FIELDS) + [f for f in _OPTIONAL_PER_LAYER_FIELDS if getattr(self, f) is not None]
        for name in fields:
            vals = getattr(self, name)
            if len(vals) != n:
                raise HppInputError(f"{len(vals)} values but forward_s has {n} layers", source=source,
                                    field=f"{where}.{name}", fix="give exactly one value per layer")
            for i, v in enumerate(vals):
                if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                    raise HppInputError(f"layer {i} has {v!r}", source=source, field=f"{where}.{name}[{i}]",
                                        fix="use finite values >= 0 (seconds or bytes)")
        for name in _OPTIONAL_SCALAR_FIELDS:
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and v >= 0):
                raise HppInputError(f"{name} is {v!r}", source=source, field=f"{where}.{name}",
                                    fix="use an integer >= 0 (bytes)")
        if self.step_time is not None:
            self.step_time.validate(source=source, where=f"{where}.step_time")
        if self.tp_degree < 1 or self.micro_batch_size < 1:
            raise HppInputError(f"tp_degree={self.tp_degree}, micro_batch_size={self.micro_batch_size}",
                                source=source, field=where, fix="both must be integers >= 1")


@dataclass(frozen=True)
class ModelProfile:
    """A model's per-layer profile on several device types, TP degrees and micro-batch sizes.

    Attributes
    ----------
    model : str
        Model name, e.g. ``"OPT-350"``.
    num_layers : int
        L; every entry has L layers.
    sequence_length : int
        Tokens per sample (for tokens/s).
    entries : Mapping[(device_type, tp_degree, micro_batch_size), LayerProfile]
    source, licence : str
        Where the figures come from and under which licence.
    meta : Mapping
        Free-form provenance (machine, torch version, date, hyper-parameters).
    calibration : ProfileCalibration or None
        Written by ``hpp run --calibrate``: which figures a run corrected, with their spread and step count
        (:mod:`hpp.profiles.calibration_record`); None for a profile no run calibrated.
    """

    model: str
    num_layers: int
    sequence_length: int
    entries: Mapping[Key, LayerProfile]
    source: str = ""
    licence: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    calibration: ProfileCalibration | None = None

    def __post_init__(self) -> None:
        """Check what needs no other input: a positive layer count, every entry of that many layers and
        filed under its own ``(device_type, tp_degree, micro_batch_size)``. Raises HppInputError."""
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise HppInputError(f"num_layers={self.num_layers!r}", field="num_layers", fix="give a positive integer")
        for key, e in self.entries.items():
            if tuple(key) != e.key:
                raise HppInputError(f"the entry filed under {tuple(key)} is of {e.key}", field="entries",
                                    fix="file each entry under its (device_type, tp_degree, micro_batch_size)")
            if e.num_layers != self.num_layers:
                raise HppInputError(
                    f"{e.device_type} (tp {e.tp_degree}, micro-batch {e.micro_batch_size}) has {e.num_layers} "
                    f"layers but the model has {self.num_layers}", field="entries",
                    fix="every device type of one model must profile the same layers")

    @property
    def device_types(self) -> tuple[str, ...]:
        """Device types with at least one entry, sorted."""
        return tuple(sorted({k[0] for k in self.entries}))

    def tp_degrees(self, device_type: str) -> tuple[int, ...]:
        """Measured TP degrees of ``device_type``, ascending."""
        return tuple(sorted({k[1] for k in self.entries if k[0] == device_type}))

    def micro_batch_sizes(self, device_type: str, tp_degree: int) -> tuple[int, ...]:
        """Measured micro-batch sizes of ``(device_type, tp_degree)``, ascending."""
        return tuple(sorted(k[2] for k in self.entries if k[0] == device_type and k[1] == tp_degree))

    def has(self, device_type: str, tp_degree: int, micro_batch_size: int) -> bool:
        return (device_type, tp_degree, micro_batch_size) in self.entries

    def layer_profile(self, device_type: str, tp_degree: int, micro_batch_size: int, *,
                      estimate: bool = True) -> LayerProfile:
        """The entry for ``(device_type, tp_degree, micro_batch_size)``.

        Parameters
        ----------
        estimate : bool
            If the micro-batch size is not measured but others are for this
            ``(device_type, tp_degree)``, return an estimate (``estimated=True``)
            by :func:`estimate_micro_batch`; if False, refuse.

        Raises
        ------
        HppInputError
            The device type is not in the profile, the TP degree is not measured for
            it, or the micro-batch size is missing and ``estimate`` is False.
        """
        key = (device_type, tp_degree, micro_batch_size)
        if key in self.entries:
            return self.entries[key]
        if device_type not in self.device_types:
            raise HppInputError(f"device type {device_type!r} is not in the profile of {self.model}",
                                field="device_type",
                                fix=f"use one of {list(self.device_types)} or profile {device_type}")
        tps = self.tp_degrees(device_type)
        if tp_degree not in tps:
            raise HppInputError(f"{self.model} on {device_type} has no measurement at TP {tp_degree}",
                                field="tp_degree", fix=f"use a TP degree in {list(tps)}")
        measured = self.micro_batch_sizes(device_type, tp_degree)
        if not estimate:
            raise HppInputError(
                f"{self.model} on {device_type} at TP {tp_degree} has no measurement at micro-batch "
                f"{micro_batch_size}", field="micro_batch_size",
                fix=f"use one of {list(measured)} or allow estimates")
        return estimate_micro_batch(self, device_type, tp_degree, micro_batch_size)


def estimate_micro_batch(profile: ModelProfile, device_type: str, tp_degree: int,
                         micro_batch_size: int) -> LayerProfile:
    """Estimate an unmeasured micro-batch size from the measured ones of the same (type, TP).

    Rule (documented, marked ``estimated=True``): per layer, compute seconds and
    activation/output bytes are fitted as ``y(b) = y(b0) + (b - b0) * slope`` where
    ``b0`` is the nearest measured size and ``slope`` the per-sample increment
    between the two nearest measured sizes (with one measured size: proportional,
    ``slope = y(b0) / b0``); values never drop below 0. Parameter bytes and the
    optimizer step do not depend on the micro-batch size and are copied.

    Raises
    ------
    HppInputError
        No measured micro-batch size for ``(device_type, tp_degree)``.
    """
    sizes = profile.micro_batch_sizes(device_type, tp_degree)
    if not sizes:
        raise HppInputError(f"no measurement of {profile.model} on {device_type} at TP {tp_degree}",
                            field="entries", fix="profile this combination")
    near = sorted(sizes, key=lambda s: (abs(s - micro_batch_size), s))
    b0 = near[0]
    e0 = profile.entries[(device_type, tp_degree, b0)]
    e1 = profile.entries[(device_type, tp_degree, near[1])] if len(near) > 1 else None

    def fit(name: str) -> tuple[float, ...]:
        y0 = getattr(e0, name)
        if e1 is None:
            return tuple(max(0.0, v * micro_batch_size / b0) for v in y0)
        y1 = getattr(e1, name)
        db = e1.micro_batch_size - b0
        return tuple(max(0.0, v0 + (micro_batch_size - b0) * (v1 - v0) / db) for v0, v1 in zip(y0, y1))

    def ints(t: Iterable[float]) -> tuple[int, ...]:
        return tuple(int(round(v)) for v in t)

    optional = {}
    for name in _OPTIONAL_PER_LAYER_FIELDS:
        both = getattr(e0, name) is not None and (e1 is None or getattr(e1, name) is not None)
        optional[name] = ints(fit(name)) if both else None
    loss = None
    if e0.loss_activation_bytes is not None and (e1 is None or e1.loss_activation_bytes is not None):
        y0 = e0.loss_activation_bytes
        slope = (y0 / b0 if e1 is None
                 else (e1.loss_activation_bytes - y0) / (e1.micro_batch_size - b0))  # type: ignore[operator]
        loss = int(round(max(0.0, y0 + (micro_batch_size - b0) * slope)))
    if optional["step_activation_bytes"] is None or optional["backward_transient_bytes"] is None or loss is None:
        optional.update(dict.fromkeys(_STEP_MEMORY_FIELDS))
        loss = None
    return replace(e0, micro_batch_size=micro_batch_size, forward_s=fit("forward_s"),
                   backward_s=fit("backward_s"), activation_bytes=ints(fit("activation_bytes")),
                   output_bytes=ints(fit("output_bytes")), **optional, loss_activation_bytes=loss, estimated=True,
                   step_time=e0.step_time.at_micro_batch(micro_batch_size / b0) if e0.step_time else None,
                   note=f"estimated from measured micro-batch sizes {sorted({b0, near[1] if e1 else b0})}")
