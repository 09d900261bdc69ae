"""Resolve the files a plan names: its cluster and its profile.

A plan written by ``hpp plan --out`` embeds its cluster and names (or embeds) its
profile, so that ``hpp estimate PLAN.json`` and ``hpp run PLAN.json`` need nothing
else. Paths inside a plan are relative to the plan file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.plan import Plan, plan_from_dict, read_plan_json
from hpp.profiles.cluster import Cluster, cluster_from_dict, load_cluster
from hpp.profiles.model_profile import ModelProfile, load_profile, profile_from_dict
from hpp.validate import validate_plan

__all__ = ["resolve_profile", "resolve_cluster", "load_plan_inputs", "profile_ref_for"]


def resolve_profile(ref: Mapping[str, Any], *, base: Path, source: str) -> ModelProfile:
    """The profile a plan's ``profile`` object names: ``{"name"}``, ``{"path"}`` or ``{"embedded"}``.

    Raises
    ------
    HppInputError
        Unknown bundled name, missing file, or an invalid profile.
    """
    if "embedded" in ref:
        return profile_from_dict(ref["embedded"], source=f"{source}: profile.embedded")
    if "path" in ref:
        return load_profile(base / str(ref["path"]))
    if "name" in ref:
        from hpp.profiles.bundled import load_bundled_profile
        try:
            return load_bundled_profile(str(ref["name"]))
        except HppInputError as exc:
            raise HppInputError(exc.message, source=source, field="profile.name", fix=exc.fix) from None
    raise HppInputError("the plan names no profile", source=source, field="profile",
                        fix='add "profile": {"name": MODEL} (bundled), {"path": FILE} or {"embedded": {...}}')


def resolve_cluster(ref: Mapping[str, Any], *, base: Path, source: str) -> Cluster:
    """The cluster a plan's ``cluster`` object embeds (an hpp-cluster object) or names (``{"path"}``).

    Raises
    ------
    HppInputError
    """
    if "path" in ref and "nodes" not in ref:
        return load_cluster(base / str(ref["path"]))
    if "nodes" in ref:
        return cluster_from_dict(ref, source=f"{source}: cluster")
    raise HppInputError("the plan names no cluster", source=source, field="cluster",
                        fix='embed the cluster object or give {"path": FILE}')


def profile_ref_for(profile: ModelProfile) -> dict[str, Any]:
    """How a plan should refer to ``profile``: by name when bundled, else embedded."""
    from hpp.profiles.bundled import bundled_models, load_bundled_profile
    if profile.model in bundled_models() and load_bundled_profile(profile.model) is profile:
        return {"name": profile.model}
    from hpp.profiles.model_profile import profile_to_dict
    return {"embedded": profile_to_dict(profile)}


def load_plan_inputs(path: str | Path, *, profile: ModelProfile | None = None,
                     cluster: Cluster | None = None) -> tuple[Plan, Cluster, ModelProfile]:
    """Read a plan file, resolve its cluster and profile (unless given), and validate it.

    Returns
    -------
    (plan, cluster, profile)

    Raises
    ------
    HppInputError
        Any problem with the file, its references or its invariants (naming the file and field).
    """
    path = Path(path)
    data = read_plan_json(path)
    plan = plan_from_dict(data, source=str(path))
    if cluster is None:
        cluster = resolve_cluster(plan.cluster_ref, base=path.parent, source=str(path))
    if profile is None:
        profile = resolve_profile(plan.profile_ref, base=path.parent, source=str(path))
    validate_plan(plan, cluster, profile, source=str(path))
    return plan, cluster, profile
