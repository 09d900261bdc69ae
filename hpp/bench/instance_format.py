"""The solver-benchmark instance: what the composition problem is built from, and its versioned JSON format.

An instance is everything the composition problem is built from: a cluster, a model
profile (a bundled one by name, a file, or embedded), the global batch size and the
search-space options. :meth:`Instance.problem` builds the
:class:`~hpp.formulation.composition.problem.CompositionProblem` with :func:`hpp.planner.make_problem`
(stage-balance DP + the exact pruning rules), so every solver sees the same candidates.

JSON form (version 1)::

    {"format": "hpp-instance", "version": 1, "name": "syn-t3-g32-l16-m4-s3-r1",
     "family": "synthetic", "description": "...",
     "cluster": {... hpp-cluster object, see hpp/profiles/cluster.py ...},
     "profile": {"bundled": "OPT-350"} | {"file": "profile.json"} | {"embedded": {... hpp-profile ...}},
     "global_batch_size": 256,
     "options": {"max_tp": 2, "micro_batch_sizes": [1, 2], "max_stages": 4,
                 "max_types_per_pipeline": 2, "allow_recompute": true, "mixed_tp_pipelines": false},
     "generator": {"num_types": 3, "num_gpus": 32, ..., "seed": 1}}

A ``file`` profile is relative to the instance file. ``generator`` (synthetic instances only)
records the parameters that :func:`hpp.bench.instances.synthetic_instance` rebuilds the instance from.

The library of instances and the seeded generators are in :mod:`hpp.bench.instances`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.fileio import check_header, read_json, write_atomic
from hpp.formulation.space_limits import SearchSpace
from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.cluster import Cluster
from hpp.profiles.cluster_format import cluster_from_dict, cluster_to_dict
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.profile_format import load_profile, profile_from_dict, profile_to_dict

__all__ = ["INSTANCE_FORMAT", "INSTANCE_VERSION", "InstanceOptions", "Instance", "instance_from_dict",
           "instance_to_dict", "options_from_dict", "load_instance", "save_instance"]

INSTANCE_FORMAT = "hpp-instance"
INSTANCE_VERSION = 1


@dataclass(frozen=True)
class InstanceOptions:
    """Search-space options of an instance (the fields of :class:`SearchSpace` that instances set)."""

    max_tp: int | None = None
    micro_batch_sizes: tuple[int, ...] | None = None
    max_stages: int = 8
    max_types_per_pipeline: int = 2
    allow_recompute: bool = True
    mixed_tp_pipelines: bool = False

    def search_space(self) -> SearchSpace:
        return SearchSpace(micro_batch_sizes=self.micro_batch_sizes, max_tp=self.max_tp, max_stages=self.max_stages,
                           max_types_per_pipeline=self.max_types_per_pipeline, allow_recompute=self.allow_recompute,
                           mixed_tp_pipelines=self.mixed_tp_pipelines)


@dataclass(frozen=True)
class Instance:
    """One benchmark instance (see the module docstring for its JSON form).

    Attributes
    ----------
    profile_ref : dict
        ``{"bundled": NAME}``, ``{"file": PATH}`` or ``{"embedded": True}`` (then ``profile`` is set).
    profile : ModelProfile or None
        The profile when embedded (or once resolved).
    generator : dict
        Parameters of :func:`synthetic_instance` (empty for other instances).
    """

    name: str
    cluster: Cluster
    global_batch_size: int
    profile_ref: Mapping[str, Any]
    options: InstanceOptions = InstanceOptions()
    family: str = "custom"
    description: str = ""
    profile: ModelProfile | None = None
    generator: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_devices

    @property
    def num_types(self) -> int:
        return len(self.cluster.count_by_type())

    def load_profile(self) -> ModelProfile:
        """The instance's model profile (bundled, file or embedded).

        Raises
        ------
        HppInputError
            The profile is missing (no such bundled model or file).
        """
        if self.profile is not None:
            return self.profile
        if "bundled" in self.profile_ref:
            return load_bundled_profile(str(self.profile_ref["bundled"]))
        path = Path(str(self.profile_ref.get("file", "")))
        if not path.is_file():
            raise HppInputError(f"instance {self.name!r} names a missing profile file {str(path)!r}",
                                field="profile.file", fix="give an existing hpp-profile JSON file (relative to the "
                                                          "instance file) or embed the profile")
        return load_profile(path)

    def problem(self):
        """The composition problem of this instance: ``(CompositionProblem, stats)`` from make_problem.

        Raises
        ------
        HppInputError, InfeasibleError
        """
        # local: hpp.planner loads OR-Tools and SciPy (+0.6 s start-up for `hpp instances list`)
        from hpp.planner import make_problem

        profile = self.load_profile()
        _check_types(self.cluster, profile, source=self.name)
        return make_problem(self.cluster, profile, self.global_batch_size, space=self.options.search_space())

    def summary(self) -> dict[str, Any]:
        """One row for ``hpp instances list``."""
        model = self.profile.model if self.profile is not None else self.profile_ref.get(
            "bundled", Path(str(self.profile_ref.get("file", "?"))).stem)
        layers = self.profile.num_layers if self.profile is not None else None
        return {"name": self.name, "family": self.family, "model": model, "num_layers": layers,
                "num_gpus": self.num_gpus, "num_types": self.num_types, "global_batch_size": self.global_batch_size,
                "max_stages": self.options.max_stages, "max_tp": self.options.max_tp,
                "micro_batch_sizes": list(self.options.micro_batch_sizes or []) or None}


def _check_types(cluster: Cluster, profile: ModelProfile, *, source: str) -> None:
    for i, n in enumerate(cluster.nodes):
        if n.device_type not in profile.device_types:
            raise HppInputError(f"GPU type {n.device_type!r} has no profile for {profile.model}", source=source,
                                field=f"cluster.nodes[{i}].device_type",
                                fix=f"use types in {list(profile.device_types)} or a profile that covers it")


# --------------------------------------------------------------------------- JSON


def instance_to_dict(inst: Instance, *, embed_profile: bool | None = None) -> dict[str, Any]:
    """JSON object of ``inst``; ``embed_profile`` (default: only if it has no bundled name) embeds the profile."""
    embed = ("bundled" not in inst.profile_ref) if embed_profile is None else embed_profile
    opts = asdict(inst.options)
    opts["micro_batch_sizes"] = list(inst.options.micro_batch_sizes) if inst.options.micro_batch_sizes else None
    out: dict[str, Any] = {"format": INSTANCE_FORMAT, "version": INSTANCE_VERSION, "name": inst.name,
                           "family": inst.family, "description": inst.description,
                           "cluster": cluster_to_dict(inst.cluster),
                           "profile": {"embedded": profile_to_dict(inst.load_profile())} if embed
                           else dict(inst.profile_ref),
                           "global_batch_size": inst.global_batch_size, "options": opts}
    if inst.generator:
        out["generator"] = dict(inst.generator)
    return out


def options_from_dict(d: Any, source: str) -> InstanceOptions:
    if d is None:
        return InstanceOptions()
    if not isinstance(d, Mapping):
        raise HppInputError("options must be a JSON object", source=source, field="options",
                            fix="e.g. {\"max_stages\": 4, \"max_tp\": 2}")
    known = {f.name for f in fields(InstanceOptions)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise HppInputError(f"unknown option(s) {unknown}", source=source, field=f"options.{unknown[0]}",
                            fix=f"use only {sorted(known)}")

    def pos_int(name: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HppInputError(f"{name}={value!r}", source=source, field=f"options.{name}",
                                fix="give a positive integer")
        return value

    mbs = d.get("micro_batch_sizes")
    if mbs is not None:
        if not isinstance(mbs, list) or not mbs:
            raise HppInputError(f"micro_batch_sizes={mbs!r}", source=source, field="options.micro_batch_sizes",
                                fix="give a non-empty list of positive integers, or null for all measured sizes")
        mbs = tuple(pos_int("micro_batch_sizes", b) for b in mbs)
    max_tp = d.get("max_tp")
    return InstanceOptions(max_tp=None if max_tp is None else pos_int("max_tp", max_tp), micro_batch_sizes=mbs,
                           max_stages=pos_int("max_stages", d.get("max_stages", 8)),
                           max_types_per_pipeline=pos_int("max_types_per_pipeline", d.get("max_types_per_pipeline", 2)),
                           allow_recompute=bool(d.get("allow_recompute", True)),
                           mixed_tp_pipelines=bool(d.get("mixed_tp_pipelines", False)))


def instance_from_dict(d: Any, *, source: str = "<dict>", base_dir: Path | None = None) -> Instance:
    """Validate and build an :class:`Instance` from its JSON object.

    Raises
    ------
    HppInputError
        Wrong format or version, missing or bad fields, a missing profile (bundled name or file),
        a GPU type of the cluster without profile. The message names ``source`` and the field.
    """
    check_header(d, fmt=INSTANCE_FORMAT, version=INSTANCE_VERSION, what="an instance", source=source,
                 format_fix=f'set "format": "{INSTANCE_FORMAT}"', shape_fix="see hpp/bench/instance_format.py")
    for name in ("name", "cluster", "profile", "global_batch_size"):
        if name not in d:
            raise HppInputError(f"missing field {name!r}", source=source, field=name, fix="add it")
    gbs = d["global_batch_size"]
    if not isinstance(gbs, int) or isinstance(gbs, bool) or gbs < 1:
        raise HppInputError(f"global_batch_size={gbs!r}", source=source, field="global_batch_size",
                            fix="give a positive integer number of samples")
    try:
        cluster = cluster_from_dict(d["cluster"], source=source)
    except HppInputError as exc:
        raise HppInputError(exc.message, source=source, field=f"cluster.{exc.field}" if exc.field else "cluster",
                            fix=exc.fix) from None
    ref = d["profile"]
    if not isinstance(ref, Mapping) or len(set(ref) & {"bundled", "file", "embedded"}) != 1:
        raise HppInputError(f"profile={_short(ref)}", source=source, field="profile",
                            fix="give exactly one of {\"bundled\": NAME}, {\"file\": PATH}, {\"embedded\": {...}}")
    profile = None
    if "bundled" in ref:
        if ref["bundled"] not in bundled_models():
            raise HppInputError(f"instance names a missing profile: no bundled profile for model {ref['bundled']!r}",
                                source=source, field="profile.bundled", fix=f"use one of {list(bundled_models())}")
        profile_ref: dict[str, Any] = {"bundled": ref["bundled"]}
    elif "file" in ref:
        path = Path(str(ref["file"]))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise HppInputError(f"instance names a missing profile: file {str(path)!r} does not exist",
                                source=source, field="profile.file",
                                fix="give an existing hpp-profile JSON file (relative to the instance) or embed it")
        profile_ref = {"file": str(path)}
    else:
        try:
            profile = profile_from_dict(ref["embedded"], source=source)
        except HppInputError as exc:
            raise HppInputError(exc.message, source=source, field=f"profile.embedded.{exc.field}" if exc.field
                                else "profile.embedded", fix=exc.fix) from None
        profile_ref = {"embedded": True}
    inst = Instance(name=str(d["name"]), cluster=cluster, global_batch_size=gbs, profile_ref=profile_ref,
                    options=options_from_dict(d.get("options"), source), family=str(d.get("family", "custom")),
                    description=str(d.get("description", "")), profile=profile,
                    generator=dict(d.get("generator") or {}))
    if profile is not None or "bundled" in profile_ref:
        _check_types(cluster, inst.load_profile(), source=source)
    return inst


def _short(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) < 80 else text[:77] + "..."


def load_instance(path: str | Path) -> Instance:
    """Read an instance JSON file (see the module docstring).

    Raises
    ------
    HppInputError
        Missing file, invalid JSON, or a field that fails validation (named with the file).
    """
    p = Path(path)
    data = read_json(p, what="instance file")
    return instance_from_dict(data, source=str(p), base_dir=p.parent)


def save_instance(inst: Instance, path: str | Path, *, embed_profile: bool | None = None) -> None:
    """Write ``inst`` as JSON (via a temporary file: never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(instance_to_dict(inst, embed_profile=embed_profile), separators=(",", ":")) + "\n")

