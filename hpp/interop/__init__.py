"""Import plans written by other planners (Sailor, Metis) as hpp plans with their cluster.

Both importers are pure: a parsed JSON object and a profile in, a validated
``(Plan, Cluster)`` out. Every defect of the foreign plan is an
:class:`~hpp.errors.HppInputError` naming the file (``source``), the field and the fix:
a layer partition that does not cover every layer, an empty stage, layers beyond
the model, a GPU type without a profile, a batch that does not add up.

sailor  Sailor's plans and run files (:func:`plan_from_sailor`, :func:`sailor_measurement`)
metis   Metis' plan description (:func:`plan_from_metis`)
common  the field checks, the foreign plan's cluster and the final validated plan they share

This module reads any plan file (:func:`load_any_plan`: hpp, Sailor or Metis, detected from its keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.interop.metis import plan_from_metis
from hpp.interop.sailor import plan_from_sailor
from hpp.plan_data import Plan, read_plan_json
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.resolve import load_plan

__all__ = ["FOREIGN_FORMATS", "detect_plan_format", "load_any_plan"]

FOREIGN_FORMATS = ("sailor", "metis")


def detect_plan_format(data: Any, *, source: str = "<plan>") -> str:
    """``"hpp"``, ``"sailor"`` or ``"metis"`` from the keys of a plan's JSON object.

    >>> detect_plan_format({"pipeline_list": []})
    'sailor'
    """
    if isinstance(data, Mapping):
        if data.get("format") == "hpp-plan":
            return "hpp"
        if "pipeline_list" in data:
            return "sailor"
        if data.get("format") == "metis-plan" or "layer_partition" in data:
            return "metis"
        if "format" in data:
            return "hpp"   # plan_from_dict names the bad format
    raise HppInputError("cannot tell the plan's format (no 'format', 'pipeline_list' or 'layer_partition')",
                        source=source, field="format", fix="pass --format hpp|sailor|metis")


def load_any_plan(path: str | Path, *, fmt: str | None = None, profile: ModelProfile | None = None,
                  gbs: int | None = None) -> tuple[Plan, Cluster, ModelProfile]:
    """Read an hpp, Sailor or Metis plan file (``fmt`` or detected), resolve and validate it.

    Parameters
    ----------
    fmt : {"hpp", "sailor", "metis"}, optional
        Detected from the keys when None.
    profile : ModelProfile, optional
        Required for Sailor plans (they name no model) and for Metis plans without ``model``.
    gbs : int, optional
        Global batch size for foreign plans that carry none.

    Raises
    ------
    HppInputError
        Naming the file and the field.
    """
    path = Path(path)
    src = str(path)
    data = read_plan_json(path)
    fmt = fmt or detect_plan_format(data, source=src)
    if fmt == "hpp":
        return load_plan(path, profile=profile, data=data)  # type: ignore[return-value]  (a profile is required)
    if fmt not in FOREIGN_FORMATS:
        raise HppInputError(f"unknown plan format {fmt!r}", source=src, field="--format",
                            fix="use hpp, sailor or metis")
    if profile is None:
        name = data.get("model") if isinstance(data, Mapping) else None
        if not name:
            raise HppInputError(f"a {fmt} plan does not name its model", source=src, field="--model",
                                fix="pass --model NAME (e.g. OPT-350)")
        try:
            profile = load_bundled_profile(str(name))
        except HppInputError as exc:
            raise HppInputError(exc.message, source=src, field="model", fix=exc.fix) from None
    convert = plan_from_sailor if fmt == "sailor" else plan_from_metis
    plan, cluster = convert(data, profile, source=src, gbs=gbs)
    return plan, cluster, profile
