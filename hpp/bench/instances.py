"""Solver-benchmark instances: the library and the seeded generators.

The instance and its JSON format are in :mod:`hpp.bench.instance_format`.

Library (:func:`library`): the bundled real scenarios (:data:`hpp.scenarios.SCENARIOS`, GPU
ones) and seeded synthetic families varying one axis each around a base point: the number of
GPU types (2-6), GPUs (8-4096), layers (8-128), memory skew (layers the smallest GPU can hold)
and speed skew (slowest / fastest GPU). Suites: ``quick`` (small and medium instances, restricted
options; the whole suite is solved by every solver in under 3 minutes on 2 cores) and ``full``.

This module re-exports the format's names (:class:`Instance`, :func:`load_instance`, ...), so
``hpp.bench.instances`` is the one import for the benchmark's instances.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

import numpy as np

from hpp.bench.instance_format import (Instance, InstanceOptions,
                                       options_from_dict)
from hpp.errors import HppInputError
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.scenarios import SCENARIOS

__all__ = ["SyntheticSpec", "scenario_instance", "synthetic_instance", "synthetic_profile", "synthetic_cluster",
           "library", "get_instance", "SUITES", "FAMILIES"]

SUITES = ("quick", "full")


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
            kw["options"] = options_from_dict(kw["options"], source)
        try:
            return cls(**kw)
        except TypeError as exc:
            raise HppInputError(f"bad generator parameters ({exc})", source=source, field="generator",
                                fix="see SyntheticSpec in hpp/bench/instances.py") from None


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
    return ModelProfile(f"synthetic-{spec.name}", L, 2048, entries, source="hpp.bench.instances.synthetic_profile "
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
