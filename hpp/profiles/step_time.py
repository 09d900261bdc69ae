"""Optional time terms of a profile entry: what the runtime's step costs besides the layers.

Measured by :mod:`hpp.runtime.profile.time_terms` (``hpp profile`` on the runtime itself); the
bundled public GPU profiles (Sailor's Megatron measurements) do not carry them, and the
cost model then prices stages exactly as before. For one device type and micro-batch size:

- ``loss_forward_s``, ``loss_backward_s``: the loss on the last stage's ``(b, s, V)`` logits,
  per micro-batch [s];
- ``micro_batch_overhead_s``: fixed cost of the pipeline schedule per micro-batch and stage
  (one forward and one backward through ``torch.distributed.pipelining``, no neighbours) [s];
  ``micro_batch_overhead_in_op`` is the share of it inside the stage's forward/backward ops
  (the part the CPU speed emulation pads);
- ``p2p_overhead_s``: CPU cost per micro-batch and neighbour stage of posting and completing
  the transfers with it (activation or gradient, both directions) [s];
- ``step_overhead_s``: fixed cost of the schedule per step and stage [s];
- ``p2p_latency_s``, ``p2p_bandwidth_bytes_per_s``: one-way send/recv of the backend between
  two ranks of this device type on one host (gloo on CPU): ``latency + bytes / bandwidth``.

:class:`HostTimeTerms` (a profile's ``meta["host_time"]``) describes the host the profile
was measured on: its cores and ``contention[n-1]``, the CPU time of a compute op while ``n``
processes compute at once / alone (what a CPU run with several ranks per host pays;
:mod:`hpp.runtime.host.time_model`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from hpp.errors import HppInputError, reading_fields
from hpp.fileio import check_keys

__all__ = ["StepTimeTerms", "HostTimeTerms"]


@dataclass(frozen=True, slots=True)
class StepTimeTerms:
    """Time terms of one profile entry (see the module docstring); seconds, bytes/s, a fraction."""

    loss_forward_s: float
    loss_backward_s: float
    micro_batch_overhead_s: float
    micro_batch_overhead_in_op: float
    step_overhead_s: float
    p2p_latency_s: float
    p2p_bandwidth_bytes_per_s: float
    p2p_overhead_s: float = 0.0

    def stage_overhead_s(self, num_neighbours: int) -> float:
        """Fixed cost per micro-batch of a stage with ``num_neighbours`` (0-2) pipeline neighbours [s].

        >>> StepTimeTerms(0, 0, 1e-4, 0, 0, 0, 1e9, p2p_overhead_s=2e-4).stage_overhead_s(2)
        0.0005
        """
        return self.micro_batch_overhead_s + num_neighbours * self.p2p_overhead_s

    def validate(self, *, source: str = "<profile>", where: str = "step_time") -> None:
        """Finite, >= 0, the in-op share in [0, 1], a positive bandwidth.

        Raises
        ------
        HppInputError
            Naming ``where.<field>``.
        """
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise HppInputError(f"{f.name} is {v!r}", source=source, field=f"{where}.{f.name}",
                                    fix="use a finite number >= 0")
        if self.micro_batch_overhead_in_op > 1.0:
            raise HppInputError(f"micro_batch_overhead_in_op is {self.micro_batch_overhead_in_op!r}", source=source,
                                field=f"{where}.micro_batch_overhead_in_op", fix="use a fraction in [0, 1]")
        if not self.p2p_bandwidth_bytes_per_s > 0:
            raise HppInputError("p2p_bandwidth_bytes_per_s is 0", source=source,
                                field=f"{where}.p2p_bandwidth_bytes_per_s", fix="use a bandwidth > 0 [bytes/s]")

    def p2p_s(self, num_bytes: float) -> float:
        """One-way transfer of ``num_bytes`` through the backend [s] (0 bytes: 0).

        >>> StepTimeTerms(0, 0, 0, 0, 0, 1e-4, 1e9).p2p_s(1e6)
        0.0011
        """
        if num_bytes <= 0:
            return 0.0
        return self.p2p_latency_s + num_bytes / self.p2p_bandwidth_bytes_per_s

    def emulated(self, factor: float) -> "StepTimeTerms":
        """The terms of a device emulated ``factor`` x slower by padding the stage's ops.

        :mod:`hpp.runtime.host.emulation` pads ``forward_one_chunk``/``backward_one_chunk``: the
        loss's backward and the in-op share of the per-micro-batch overhead run inside them
        (x ``factor``); the loss's forward, the rest of the schedule, the transfers and their
        posting do not.

        >>> t = StepTimeTerms(1.0, 2.0, 4.0, 0.25, 8.0, 1e-4, 1e9).emulated(3.0)
        >>> t.loss_forward_s, t.loss_backward_s, t.micro_batch_overhead_s, t.micro_batch_overhead_in_op
        (1.0, 6.0, 6.0, 0.5)
        """
        if not factor >= 1.0:
            raise HppInputError(f"emulation factor {factor}", field="slowdown", fix="use a factor >= 1")
        inside = self.micro_batch_overhead_s * self.micro_batch_overhead_in_op
        outside = self.micro_batch_overhead_s - inside
        total = inside * factor + outside
        return StepTimeTerms(self.loss_forward_s, self.loss_backward_s * factor, total,
                             inside * factor / total if total > 0 else 0.0, self.step_overhead_s,
                             self.p2p_latency_s, self.p2p_bandwidth_bytes_per_s, self.p2p_overhead_s)

    def at_micro_batch(self, factor: float) -> "StepTimeTerms":
        """The loss terms x ``factor`` (an estimated micro-batch size: ``b / b0``), the rest unchanged."""
        return StepTimeTerms(self.loss_forward_s * factor, self.loss_backward_s * factor,
                             self.micro_batch_overhead_s, self.micro_batch_overhead_in_op, self.step_overhead_s,
                             self.p2p_latency_s, self.p2p_bandwidth_bytes_per_s, self.p2p_overhead_s)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "<profile>", where: str = "step_time"
                  ) -> "StepTimeTerms":
        """Read the JSON object of an entry's ``step_time``.

        Raises
        ------
        HppInputError
            Not an object, a missing or bad field.
        """
        if not isinstance(d, Mapping):
            raise HppInputError("step_time must be a JSON object", source=source, field=where,
                                fix="see hpp/profiles/step_time.py")
        check_keys(d, tuple(f.name for f in fields(cls)), source=source, where=f"{where}.")
        with reading_fields(source, where, missing_fix="measure the time terms with hpp.runtime.profile.time_terms",
                            bad_fix="use numbers"):
            t = cls(**{f.name: float(d[f.name]) for f in fields(cls) if f.name != "p2p_overhead_s"},
                    p2p_overhead_s=float(d.get("p2p_overhead_s", 0.0)))
        t.validate(source=source, where=where)
        return t


@dataclass(frozen=True, slots=True)
class HostTimeTerms:
    """The host a CPU profile was measured on: cores and CPU-time contention ``kappa(n)``, n = 1 .. cores."""

    cores: int
    contention: tuple[float, ...]
    load_average: float | None = None

    def kappa(self, busy: float) -> float:
        """CPU-time factor while ``busy`` (>= 0, may be fractional) cores compute; linear between points.

        >>> HostTimeTerms(2, (1.0, 1.5)).kappa(1.5)
        1.25
        """
        if not self.contention or busy <= 1.0:
            return 1.0
        pts = (1.0,) + tuple(self.contention[1:])
        x = min(busy, float(len(pts)))
        i = int(math.floor(x)) - 1
        if i >= len(pts) - 1:
            return pts[-1]
        return pts[i] + (x - 1 - i) * (pts[i + 1] - pts[i])

    def to_dict(self) -> dict[str, Any]:
        return {"cores": self.cores, "contention": list(self.contention), "load_average": self.load_average}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "HostTimeTerms":
        """Read ``meta["host_time"]``.

        Raises
        ------
        HppInputError
            Missing cores, or contention factors that are not numbers >= 1.
        """
        try:
            cores = int(d["cores"])
            kappa = tuple(float(x) for x in d.get("contention", ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise HppInputError(f"bad host time terms ({exc})", field="meta.host_time",
                                fix="give cores and contention factors") from None
        if cores < 1 or any(not (math.isfinite(k) and k > 0) for k in kappa):
            raise HppInputError(f"cores {cores}, contention {kappa}", field="meta.host_time",
                                fix="cores >= 1 and positive contention factors")
        la = d.get("load_average")
        return cls(cores, kappa, float(la) if la is not None else None)
