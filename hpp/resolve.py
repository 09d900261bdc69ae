"""Load a plan file in one trip: read, build (checked), resolve its cluster and profile, validate.

A plan written by ``hpp plan --out`` embeds its cluster and names (or embeds) its
profile, so that ``hpp estimate PLAN.json`` and ``hpp run PLAN.json`` need nothing
else. Paths inside a plan are relative to the plan file. :func:`load_plan` is the one
loader of every command that reads a plan (``hpp run``, ``hpp estimate``, ``--previous``):
the JSON is read once, the :class:`~hpp.plan_data.Plan` checks itself when built (layers,
TP degrees, devices used once, samples), and :func:`~hpp.validate.validate_plan` checks
it once against the cluster and profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.fileio import check_keys
from hpp.plan_data import Plan, plan_from_dict, read_plan_json
from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.cluster import Cluster
from hpp.profiles.cluster_format import cluster_from_dict, load_cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.profile_format import load_profile, profile_from_dict, profile_to_dict
from hpp.validate import validate_plan

__all__ = ["resolve_profile", "resolve_cluster", "resolve_plan", "load_plan", "profile_ref_for", "check_model_name"]


def resolve_profile(ref: Mapping[str, Any], *, base: Path, source: str) -> ModelProfile:
    """The profile a plan's ``profile`` object names: ``{"name"}``, ``{"path"}`` or ``{"embedded"}``.

    Raises
    ------
    HppInputError
        An unknown key, more than one of them, an unknown bundled name, a missing file, or an invalid profile.
    """
    check_keys(ref, ("name", "path", "embedded"), source=source, where="profile.")
    if len(ref) > 1:
        raise HppInputError(f"the profile is given {len(ref)} ways ({', '.join(ref)})", source=source,
                            field="profile", fix="give one of name, path or embedded")
    if "embedded" in ref:
        return profile_from_dict(ref["embedded"], source=f"{source}: profile.embedded")
    if "path" in ref:
        return load_profile(base / str(ref["path"]))
    if "name" in ref:
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
        check_keys(ref, ("path",), source=source, where="cluster.")
        return load_cluster(base / str(ref["path"]))
    if "nodes" in ref:
        return cluster_from_dict(ref, source=f"{source}: cluster")
    check_keys(ref, ("path",), source=source, where="cluster.")         # a typo of path is named
    raise HppInputError("the plan names no cluster", source=source, field="cluster",
                        fix='embed the cluster object or give {"path": FILE}')


def profile_ref_for(profile: ModelProfile) -> dict[str, Any]:
    """How a plan should refer to ``profile``: by name when bundled, else embedded."""
    if profile.model in bundled_models() and load_bundled_profile(profile.model) is profile:
        return {"name": profile.model}
    return {"embedded": profile_to_dict(profile)}


def check_model_name(plan: Plan, profile: ModelProfile, *, source: str) -> None:
    """Refuse a plan whose ``model`` is not the model of the profile it names (a typo would otherwise pass, priced
    with that profile, and fail only when ``hpp run`` loads the model). Names are compared without case (the
    runtime's ``llama-3-8`` is the profile's ``LLAMA-3-8``); a plan that names no model is not checked.

    Raises
    ------
    HppInputError
        Naming both names and the bundled models.
    """
    if not plan.model or plan.model.strip().casefold() == profile.model.strip().casefold():
        return
    raise HppInputError(f"model {plan.model!r} is not the model of the plan's profile ({profile.model!r}); the known "
                        f"models are {', '.join(sorted({profile.model, *bundled_models()}))}", source=source,
                        field="model", fix=f"set model to {profile.model!r}, or name the profile of {plan.model!r}")


def resolve_plan(plan: Plan, *, base: Path, source: str, cluster: Cluster | None = None,
                 profile: ModelProfile | None = None, require_profile: bool = True
                 ) -> tuple[Plan, Cluster, ModelProfile | None]:
    """``plan`` with its cluster and profile (those given, else the ones it names), validated once.

    ``require_profile=False``: a plan that names no profile is allowed (the profile is then None).

    Raises
    ------
    HppInputError
        A reference that cannot be resolved, or an invariant :func:`~hpp.validate.validate_plan` refuses.
    """
    if cluster is None:
        cluster = resolve_cluster(plan.cluster_ref, base=base, source=source)
    if profile is None and (require_profile or plan.profile_ref):
        profile = resolve_profile(plan.profile_ref, base=base, source=source)
        check_model_name(plan, profile, source=source)
    validate_plan(plan, cluster, profile, source=source)
    return plan, cluster, profile


def load_plan(path: str | Path, *, profile: ModelProfile | None = None, cluster: Cluster | None = None,
              require_profile: bool = True, data: Mapping[str, Any] | None = None
              ) -> tuple[Plan, Cluster, ModelProfile | None]:
    """Read a plan file and return it checked, with its cluster and profile (unless given): one trip.

    Parameters
    ----------
    path : the plan file (references inside it are relative to its folder).
    profile, cluster : optional; given, they replace the ones the plan names.
    require_profile : False allows a plan that names no profile (``hpp run``: no prediction then).
    data : the file's JSON object when the caller already read it (e.g. to detect its format).

    Returns
    -------
    (plan, cluster, profile)

    Raises
    ------
    HppInputError
        Any problem with the file, its references or its invariants (naming the file and field).
    """
    path = Path(path)
    plan = plan_from_dict(read_plan_json(path) if data is None else data, source=str(path))
    return resolve_plan(plan, base=path.parent, source=str(path), cluster=cluster, profile=profile,
                        require_profile=require_profile)
