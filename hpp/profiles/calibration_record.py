"""What a calibrated profile says about its own figures: which a run corrected, by how much, over how many steps.

``hpp run --calibrate OUT.json`` (:mod:`hpp.runtime.calibrate`) writes a profile whose top-level
``"calibration"`` object is a :class:`ProfileCalibration`::

    {"source": "hpp run plan.json --steps 6", "plan": "plan.json", "steps": 5, "warmup_steps": 1,
     "figures": [{"what": "cpu-2x/tp1/mb2", "status": "calibrated", "method": "scale", "factor": 2.01,
                  "spread": 0.013, "steps": 5, "note": "..."},
                 {"what": "cpu/tp1/mb1", "status": "kept", "method": "", "factor": 1.0, "spread": 0.0,
                  "steps": 0, "note": "the run did not use micro-batch size 1"}, ...]}

One :class:`FigureCalibration` per profile entry (``TYPE/tpT/mbB``) and per link (``link ...``):
``factor`` is new / old (for a link: of its bandwidth), ``spread`` is ``(max - min) / median`` of the
factor fitted step by step over the ``steps`` steps after the warm-up, and a ``kept`` figure keeps the
old value (factor 1, 0 steps) with the reason in ``note``. Unknown keys are errors.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from hpp.errors import HppInputError, reading_fields
from hpp.fileio import check_keys

__all__ = ["FigureCalibration", "ProfileCalibration", "STATUSES", "METHODS"]

#: a figure the run corrected, or one it did not exercise (old value kept)
STATUSES = ("calibrated", "kept")
#: how a calibrated figure was fitted (:mod:`hpp.runtime.calibrate`): per-layer least squares over stages, one
#: factor per entry, or a link's bandwidth from the measured all-reduce time; "" for a kept figure
METHODS = ("least-squares", "scale", "bandwidth", "")


@dataclass(frozen=True, slots=True)
class FigureCalibration:
    """One entry's or link's calibration (module docstring); ``factor`` and ``spread`` are ratios."""

    what: str
    status: str
    method: str
    factor: float
    spread: float
    steps: int
    note: str = ""

    def validate(self, *, source: str, where: str) -> None:
        """Raises HppInputError naming ``where.<field>`` for an unknown status or method, a factor that is not
        finite and > 0, a negative spread or step count, or a kept figure with steps or a factor other than 1."""
        if self.status not in STATUSES:
            raise HppInputError(f"status {self.status!r}", source=source, field=f"{where}.status",
                                fix=f"use one of {list(STATUSES)}")
        if self.method not in METHODS:
            raise HppInputError(f"method {self.method!r}", source=source, field=f"{where}.method",
                                fix=f"use one of {list(METHODS)}")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise HppInputError(f"factor {self.factor!r}", source=source, field=f"{where}.factor",
                                fix="use a finite ratio > 0 (new / old)")
        if not (math.isfinite(self.spread) and self.spread >= 0):
            raise HppInputError(f"spread {self.spread!r}", source=source, field=f"{where}.spread",
                                fix="use a finite ratio >= 0 ((max - min) / median over the steps)")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise HppInputError(f"steps {self.steps!r}", source=source, field=f"{where}.steps",
                                fix="use the number of steps behind the figure (an integer >= 0)")
        if self.status == "kept" and (self.steps != 0 or self.factor != 1.0 or self.method):
            raise HppInputError(f"a kept figure with factor {self.factor}, {self.steps} steps, method "
                                f"{self.method!r}", source=source, field=where,
                                fix='a kept figure has factor 1, 0 steps and method ""')
        if self.status == "calibrated" and (self.steps < 1 or not self.method):
            raise HppInputError(f"a calibrated figure with {self.steps} steps and method {self.method!r}",
                                source=source, field=where, fix="a calibrated figure has steps >= 1 and a method")


@dataclass(frozen=True, slots=True)
class ProfileCalibration:
    """The calibration of a profile (module docstring): the run it came from and one record per figure."""

    source: str
    plan: str
    steps: int
    warmup_steps: int
    figures: tuple[FigureCalibration, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "plan": self.plan, "steps": self.steps, "warmup_steps": self.warmup_steps,
                "figures": [asdict(f) for f in self.figures]}

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "<profile>", where: str = "calibration") -> "ProfileCalibration":
        """Read and validate (unknown keys are errors).

        Raises
        ------
        HppInputError
            Not an object, an unknown or missing key, or a bad value (naming ``where.<field>``).

        Examples
        --------
        >>> c = ProfileCalibration.from_dict({"source": "s", "plan": "p.json", "steps": 3, "warmup_steps": 1,
        ...     "figures": [{"what": "cpu/tp1/mb1", "status": "kept", "method": "", "factor": 1.0, "spread": 0.0,
        ...                  "steps": 0, "note": "not run"}]})
        >>> c.figures[0].status, ProfileCalibration.from_dict(c.to_dict()) == c
        ('kept', True)
        """
        if not isinstance(d, Mapping):
            raise HppInputError("the calibration must be an object", source=source, field=where,
                                fix="write it with hpp run --calibrate")
        check_keys(d, ("source", "plan", "steps", "warmup_steps", "figures"), source=source, where=f"{where}.")
        with reading_fields(source, where, missing_fix="add it (see hpp/profiles/calibration_record.py)",
                            bad_fix="see the format"):
            figs = []
            for i, f in enumerate(d["figures"]):
                w = f"{where}.figures[{i}]"
                if not isinstance(f, Mapping):
                    raise HppInputError("a figure must be an object", source=source, field=w, fix="see the format")
                check_keys(f, ("what", "status", "method", "factor", "spread", "steps", "note"), source=source,
                           where=f"{w}.")
                fig = FigureCalibration(str(f["what"]), str(f["status"]), str(f["method"]), float(f["factor"]),
                                        float(f["spread"]), f["steps"], str(f.get("note", "")))
                fig.validate(source=source, where=w)
                figs.append(fig)
            out = cls(str(d["source"]), str(d["plan"]), d["steps"], d["warmup_steps"], tuple(figs))
        for name in ("steps", "warmup_steps"):
            v = getattr(out, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise HppInputError(f"{name} {v!r}", source=source, field=f"{where}.{name}",
                                    fix="use an integer >= 0")
        return out

    def figure(self, what: str) -> FigureCalibration | None:
        """The record of ``what`` (``TYPE/tpT/mbB`` or ``link ...``), or None."""
        return next((f for f in self.figures if f.what == what), None)
