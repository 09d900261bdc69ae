"""Solver-benchmark instances: a versioned JSON format, the library and seeded generators.

An instance is everything the composition problem is built from: a cluster, a model
profile (a bundled one by name, a file, or embedded), the global batch size and the
search-space options. :meth:`Instance.problem` builds the
:class:`~hpp.formulation.composition.CompositionProblem` with :func:`hpp.planner.make_problem`
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
records the parameters that :func:`synthetic_instance` rebuilds the instance from.

Library (:func:`library`): the bundled real scenarios (:data:`hpp.scenarios.SCENARIOS`, GPU
ones) and seeded synthetic families varying one axis each around a base point: the number of
GPU types (2-6), GPUs (8-4096), layers (8-128), memory skew (layers the smallest GPU can hold)
and speed skew (slowest / fastest GPU). Suites: ``quick`` (small and medium instances, restricted
options; the whole suite is solved by every solver in under 3 minutes on 2 cores) and ``full``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from hpp.errors import HppInputError
from hpp.fileio import read_json
from hpp.formulation.candidates import SearchSpace
from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.cluster import Cluster, Link, Node, cluster_from_dict, cluster_to_dict
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import LayerProfile, ModelProfile, load_profile, profile_from_dict, profile_to_dict
from hpp.scenarios import SCENARIOS

__all__ = ["INSTANCE_FORMAT", "INSTANCE_VERSION", "InstanceOptions", "Instance", "SyntheticSpec", "instance_from_dict",
           "instance_to_dict", "load_instance", "save_instance", "scenario_instance", "synthetic_instance",
           "synthetic_profile", "synthetic_cluster", "library", "get_instance", "SUITES", "FAMILIES"]

INSTANCE_FORMAT = "hpp-instance"
INSTANCE_VERSION = 1
SUITES = ("quick", "full")


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


def _options_from(d: Any, source: str) -> InstanceOptions:
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
    if not isinstance(d, Mapping):
        raise HppInputError("an instance must be a JSON object", source=source, fix="see hpp/instances.py")
    if d.get("format") != INSTANCE_FORMAT:
        raise HppInputError(f"format is {d.get('format')!r}, expected {INSTANCE_FORMAT!r}", source=source,
                            field="format", fix=f"set \"format\": \"{INSTANCE_FORMAT}\"")
    if d.get("version") != INSTANCE_VERSION:
        raise HppInputError(f"version {d.get('version')!r} is not supported", source=source, field="version",
                            fix=f"use version {INSTANCE_VERSION}")
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
                    options=_options_from(d.get("options"), source), family=str(d.get("family", "custom")),
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
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(instance_to_dict(inst, embed_profile=embed_profile), separators=(",", ":")) + "\n")
    tmp.replace(path)


# --------------------------------------------------------------------------- generators


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of a synthetic instance; the same spec always gives the same instance.

    Attributes
    ----------
    num_types : int
        GPU types, 2-6 (``S0`` fastest .. ``S{k-1}`` slowest).
    num_gpus : int
        Total GPUs, 8-4096, split over the types (seeded shares, whole nodes, >= 1 node each).
    num_layers : int
        Model layers, 8-128 (embedding, blocks, head).
    memory_skew : float
        Layers (of the model's blocks, weights and optimizer states, plus a micro-batch of
        activations) the smallest GPU can hold; the largest holds the whole model with room.
    speed_skew : float
        Per-layer time of the slowest type / the fastest, >= 1.
    seed : int
    global_batch_size : int
    gpus_per_node : int
    options : InstanceOptions
    """

    num_types: int = 3
    num_gpus: int = 32
    num_layers: int = 16
    memory_skew: float = 4.0
    speed_skew: float = 3.0
    seed: int = 0
    global_batch_size: int = 256
    gpus_per_node: int = 4
    options: InstanceOptions = InstanceOptions(max_tp=2, micro_batch_sizes=(1, 2), max_stages=4)

    def __post_init__(self) -> None:
        checks = [(2 <= self.num_types <= 6, "num_types", "use 2 to 6 GPU types"),
                  (8 <= self.num_gpus <= 4096, "num_gpus", "use 8 to 4096 GPUs"),
                  (self.num_gpus >= self.num_types * self.gpus_per_node, "num_gpus",
                   "give at least one node per type"),
                  (8 <= self.num_layers <= 128, "num_layers", "use 8 to 128 layers"),
                  (0.5 <= self.memory_skew <= self.num_layers, "memory_skew",
                   "give the layers the smallest GPU holds, between 0.5 and num_layers"),
                  (1.0 <= self.speed_skew <= 100.0, "speed_skew", "give a ratio between 1 and 100"),
                  (self.global_batch_size >= 1, "global_batch_size", "give a positive integer"),
                  (self.gpus_per_node in (1, 2, 4, 8), "gpus_per_node", "use 1, 2, 4 or 8")]
        for ok, name, fix in checks:
            if not ok:
                raise HppInputError(f"{name}={getattr(self, name)!r}", field=name, fix=fix)

    @property
    def name(self) -> str:
        return (f"syn-t{self.num_types}-g{self.num_gpus}-l{self.num_layers}-m{self.memory_skew:g}"
                f"-s{self.speed_skew:g}-r{self.seed}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["options"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.options).items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "<dict>") -> "SyntheticSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HppInputError(f"unknown generator parameter(s) {unknown}", source=source, field="generator",
                                fix=f"use only {sorted(known)}")
        kw = dict(d)
        if "options" in kw:
            kw["options"] = _options_from(kw["options"], source)
        try:
            return cls(**kw)
        except TypeError as exc:
            raise HppInputError(f"bad generator parameters ({exc})", source=source, field="generator",
                                fix="see SyntheticSpec in hpp/instances.py") from None


#: Synthetic model: hidden size 1024 transformer blocks in fp32 (bytes per parameter 4).
_BLOCK_PARAM_BYTES = 12 * 1024 * 1024 * 4
_BLOCK_ACT_BYTES_PER_SAMPLE = 2048 * 1024 * 34          # sequence 2048 x hidden 1024 x 34 bytes (Korthikanti)
_BLOCK_OUT_BYTES_PER_SAMPLE = 2048 * 1024 * 2
_BLOCK_FWD_S_FASTEST = 2.0e-3                          # one block, one sample, TP 1, fastest type
_STATE_FACTOR = 4.0                                    # weights + grads + Adam per parameter byte (cost model)


def synthetic_profile(spec: SyntheticSpec) -> ModelProfile:
    """Per-layer profile of the synthetic model on types ``S0..S{k-1}`` (TP 1, 2, 4; micro-batch 1, 2, 4).

    Layer 0 is an embedding (large parameters, little compute), the last layer the head
    (2.5x a block's compute); blocks vary +-10 % (seeded). The speed of type i is
    ``speed_skew ** (i / (k - 1))`` slower than S0 (jittered), TP t divides compute by
    ``t * 0.85 ** log2 t``, micro-batch b multiplies it by ``b ** 0.9``.
    """
    rng = np.random.default_rng(spec.seed)
    L, k = spec.num_layers, spec.num_types
    base = _BLOCK_FWD_S_FASTEST * rng.uniform(0.9, 1.1, L)
    base[0] *= 0.2
    base[-1] *= 2.5
    params = np.full(L, _BLOCK_PARAM_BYTES, dtype=np.int64)
    params[0] = params[-1] = 50_000 * 1024 * 4                       # vocabulary 50k x hidden 1024
    slow = [1.0] + sorted(spec.speed_skew ** (i / (k - 1)) * rng.uniform(0.95, 1.05) for i in range(1, k))
    entries = {}
    for i, s in enumerate(slow):
        for t in (1, 2, 4):
            for b in (1, 2, 4):
                f = base * s * b ** 0.9 / (t * 0.85 ** math.log2(t))
                e = LayerProfile(f"S{i}", t, b, tuple(f), tuple(2 * f), tuple(params * 1e-10 * s / t),
                                 tuple(int(p) for p in params // t),
                                 tuple(int(_BLOCK_ACT_BYTES_PER_SAMPLE * b / t) for _ in range(L)),
                                 tuple(int(_BLOCK_OUT_BYTES_PER_SAMPLE * b) for _ in range(L)))
                entries[e.key] = e
    return ModelProfile(f"synthetic-{spec.name}", L, 2048, entries, source="hpp.instances.synthetic_profile "
                        f"(seeded generator, {spec.to_dict()})", licence="CC0")


def synthetic_cluster(spec: SyntheticSpec) -> Cluster:
    """GPUs split over ``S0..S{k-1}`` (seeded shares, whole nodes); memory from ``memory_skew``.

    The smallest type (the slowest) holds ``memory_skew`` blocks' states plus one sample's
    activations of as many blocks; capacities grow geometrically to the largest type, which holds
    the whole model's states with room for 2 micro-batches of 4. Links: 100 GB/s in a node,
    10 GB/s between nodes, 10 us latency.
    """
    rng = np.random.default_rng(spec.seed + 10_007)
    k, per = spec.num_types, spec.gpus_per_node
    per_layer = _STATE_FACTOR * _BLOCK_PARAM_BYTES + _BLOCK_ACT_BYTES_PER_SAMPLE
    small = spec.memory_skew * per_layer
    big = max(small * 1.5, spec.num_layers * (_STATE_FACTOR * _BLOCK_PARAM_BYTES + 8 * _BLOCK_ACT_BYTES_PER_SAMPLE))
    mems = [int(big * (small / big) ** (i / (k - 1))) for i in range(k)]
    nodes_total = spec.num_gpus // per
    shares = rng.dirichlet(np.full(k, 2.0))
    nodes = [1 + int(x) for x in np.floor(shares * (nodes_total - k))]
    nodes[0] += nodes_total - sum(nodes)
    intra, inter = Link(1e11, 1e-5), Link(1e10, 1e-5)
    types = {f"S{i}": DeviceType(f"S{i}", mems[i], per) for i in range(k)}
    node_list = [Node(f"S{i}", per, intra) for i in range(k) for _ in range(nodes[i])]
    rest = spec.num_gpus - nodes_total * per
    if rest:
        node_list.append(Node("S0", rest, intra))
    return Cluster(spec.name, types, tuple(node_list), inter)


def synthetic_instance(spec: SyntheticSpec, *, family: str = "synthetic") -> Instance:
    """The instance of ``spec`` (profile embedded)."""
    return Instance(spec.name, synthetic_cluster(spec), spec.global_batch_size, {"embedded": True}, spec.options,
                    family=family, description=f"synthetic, seed {spec.seed}", profile=synthetic_profile(spec),
                    generator=spec.to_dict())


def scenario_instance(name: str, *, options: InstanceOptions = InstanceOptions(), suffix: str = "") -> Instance:
    """The bundled scenario ``name`` as an instance (bundled profile by name)."""
    if name not in SCENARIOS or SCENARIOS[name].device_types:
        gpu = [n for n, s in SCENARIOS.items() if not s.device_types]
        raise HppInputError(f"unknown GPU scenario {name!r}", field="scenario", fix=f"use one of {gpu}")
    sc = SCENARIOS[name]
    return Instance(name + suffix, sc.cluster(), sc.global_batch_size, {"bundled": sc.model}, options,
                    family="scenario", description=sc.description or f"bundled scenario {name}")


# --------------------------------------------------------------------------- library

_QUICK_OPTIONS = InstanceOptions(max_tp=1, micro_batch_sizes=(2,), max_stages=3)
_BASE = SyntheticSpec()
#: One axis varied at a time around :data:`_BASE` (family name -> (field, quick values, full values)).
FAMILIES: Mapping[str, tuple[str, tuple, tuple]] = {
    "types": ("num_types", (2, 4), (2, 3, 4, 5, 6)),
    "gpus": ("num_gpus", (8, 32), (8, 64, 256, 1024, 4096)),
    "layers": ("num_layers", (8, 32), (8, 32, 64, 128)),
    "memory-skew": ("memory_skew", (2.0,), (1.0, 2.0, 8.0)),
    "speed-skew": ("speed_skew", (1.5, 8.0), (1.2, 8.0, 20.0)),
}


def _synthetic_family(suite: str) -> list[Instance]:
    out: dict[str, Instance] = {}
    for fam, (fld, quick, full) in FAMILIES.items():
        for i, v in enumerate(quick if suite == "quick" else full):
            kw = {**{f.name: getattr(_BASE, f.name) for f in fields(SyntheticSpec)}, fld: v, "seed": 1 + i}
            if suite == "quick":     # small: 16 GPUs unless the family varies them, TP 1, b = 2, <= 3 stages
                kw["options"] = _QUICK_OPTIONS
                kw["num_gpus"] = v if fld == "num_gpus" else 16
            else:
                kw["options"] = InstanceOptions(max_tp=4, micro_batch_sizes=(1, 2, 4), max_stages=8)
                if fld == "num_gpus" and v >= 1024:          # large clusters: a batch that keeps every GPU busy
                    kw["global_batch_size"] = 4 * v
            if kw["num_gpus"] < kw["num_types"] * kw["gpus_per_node"]:
                kw["gpus_per_node"] = max(1, kw["num_gpus"] // kw["num_types"] // 2 * 2 or 1)
            spec = SyntheticSpec(**kw)
            out.setdefault(spec.name, synthetic_instance(spec, family=f"synthetic/{fam}"))
    return list(out.values())


def library(suite: str = "quick") -> list[Instance]:
    """The instances of ``suite`` (``quick`` or ``full``), real scenarios first.

    quick: three real-scenario instances (two with restricted options: TP 1 or the least measured,
    micro-batch 2, <= 3 stages), 9 small synthetic instances (8-32 GPUs, one axis varied each) and
    2 medium ones (32-64 GPUs, TP <= 2, micro-batches 1-2, <= 4 stages); full: every GPU scenario
    with default options and 19 synthetic instances (up to 4096 GPUs, 128 layers, 6 types).

    Raises
    ------
    HppInputError
        Unknown suite.
    """
    if suite not in SUITES:
        raise HppInputError(f"unknown suite {suite!r}", field="--suite", fix=f"use one of {list(SUITES)}")
    if suite == "quick":
        real = [scenario_instance("opt350-a100x4-v100x4", options=_QUICK_OPTIONS, suffix="-s3b2"),
                scenario_instance("llama8-3types-40", options=replace(_QUICK_OPTIONS, max_tp=4, micro_batch_sizes=None),
                                  suffix="-s3"),
                scenario_instance("opt350-a100x4-v100x4")]
        medium = [synthetic_instance(replace(_BASE, seed=7), family="synthetic/medium"),
                  synthetic_instance(replace(_BASE, num_types=4, num_gpus=64, seed=8), family="synthetic/medium")]
        return real + _synthetic_family(suite) + medium
    real = [scenario_instance(n) for n, s in SCENARIOS.items() if not s.device_types]
    return real + _synthetic_family(suite)


def get_instance(name: str) -> Instance:
    """An instance of the library by name (quick suite first, then full).

    Raises
    ------
    HppInputError
        No instance of that name (the message lists the quick suite's).
    """
    for suite in SUITES:
        for inst in library(suite):
            if inst.name == name:
                return inst
    raise HppInputError(f"no instance named {name!r} in the library", field="name",
                        fix=f"see `hpp instances list`; e.g. {[i.name for i in library('quick')][:4]}")
