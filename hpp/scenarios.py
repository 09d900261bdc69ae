"""Bundled planning scenarios on the real (Sailor) profiles.

Each scenario names a bundled model profile, a global batch size and a cluster of
whole nodes (4 GPUs per node for A100/V100/GH-96, 8 for the RTX types, the
``gpus_per_node`` of :data:`~hpp.profiles.devices.BUNDLED_DEVICE_TYPES`). Links
come from Sailor's measured network fits (:mod:`hpp.profiles.network`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from hpp.errors import HppInputError
from hpp.profiles.cluster import Cluster, Node
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.network import default_inter_node_link, default_intra_node_link

__all__ = ["Scenario", "SCENARIOS", "DEFAULT_SCENARIO", "get_scenario", "make_cluster"]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A bundled planning problem: model, global batch size, GPUs per device type."""

    name: str
    model: str
    global_batch_size: int
    gpus: tuple[tuple[str, int], ...]
    description: str = ""

    def cluster(self) -> Cluster:
        """The scenario's cluster (whole nodes, measured links)."""
        return make_cluster(self.name, dict(self.gpus))


def make_cluster(name: str, gpus: Mapping[str, int]) -> Cluster:
    """A cluster of ``gpus[type]`` devices per type in nodes of the type's ``gpus_per_node``.

    A count that is not a multiple of the node size leaves one smaller node.

    Raises
    ------
    HppInputError
        An unknown GPU type or a non-positive count.
    """
    nodes = []
    for dtype, count in gpus.items():
        if dtype not in BUNDLED_DEVICE_TYPES:
            raise HppInputError(f"unknown GPU type {dtype!r}", field="gpus",
                                fix=f"use one of {sorted(BUNDLED_DEVICE_TYPES)}")
        if count <= 0:
            raise HppInputError(f"{count} GPUs of {dtype}", field="gpus", fix="give a positive count")
        per = BUNDLED_DEVICE_TYPES[dtype].gpus_per_node
        while count > 0:
            n = min(per, count)
            nodes.append(Node(dtype, n, default_intra_node_link(dtype, n)))
            count -= n
    return Cluster(name, dict(BUNDLED_DEVICE_TYPES), tuple(nodes), default_inter_node_link(gpus))


SCENARIOS: Mapping[str, Scenario] = {s.name: s for s in (
    Scenario("opt350-a100x4-v100x4", "OPT-350", 1024, (("A100-40", 4), ("V100-16", 4))),
    Scenario("opt350-a100x8-v100x8", "OPT-350", 1024, (("A100-40", 8), ("V100-16", 8)), "the default"),
    Scenario("opt350-3types-40", "OPT-350", 1024, (("A100-40", 16), ("V100-16", 16), ("GH-96", 8))),
    Scenario("neo27-a100x16-v100x16", "GPT-Neo-2.7", 1024, (("A100-40", 16), ("V100-16", 16))),
    Scenario("llama8-3types-40", "LLAMA-3-8", 512, (("GH-96", 8), ("A100-40", 16), ("V100-16", 16))),
    Scenario("opt350-512", "OPT-350", 2048, (("A100-40", 128), ("V100-16", 384))),
    Scenario("opt350-1024-4types", "OPT-350", 4096,
             (("A100-40", 256), ("A100-80", 256), ("V100-16", 256), ("GH-96", 256))),
)}

DEFAULT_SCENARIO = "opt350-a100x8-v100x8"


def get_scenario(name: str) -> Scenario:
    """The bundled scenario ``name``; raises HppInputError listing the known names."""
    if name not in SCENARIOS:
        raise HppInputError(f"unknown scenario {name!r}", field="--scenario", fix=f"use one of {list(SCENARIOS)}")
    return SCENARIOS[name]
