"""Bundled planning scenarios on the real (Sailor) profiles, and emulated CPU clusters.

Each scenario names a bundled model profile, a global batch size and a cluster of
whole nodes (4 GPUs per node for A100/V100/GH-96, 8 for the RTX types, the
``gpus_per_node`` of :data:`~hpp.profiles.devices.BUNDLED_DEVICE_TYPES`). Links
come from Sailor's measured network fits (:mod:`hpp.profiles.network`), per pair of
device types (a version-2 cluster; ``make_cluster(..., per_pair=False)`` builds
the version-1 cluster with one inter-node link, the slowest pair's, as before).

A scenario that carries its own ``device_types`` (emulated CPU "devices": a
slowdown factor and a memory cap each) builds its cluster from those instead,
one node per type, with the loopback link of :data:`CPU_LINK`; its model profile
is a bundled CPU profile measured by ``hpp profile`` (``cpu-hetero-4``: gpt-tiny,
``hpp/profiles/data/profile-gpt-tiny.json``). Run its plans with
``hpp run PLAN.json --emulate-speed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from hpp.errors import HppInputError
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES, DeviceType
from hpp.profiles.network import default_inter_node_link, default_intra_node_link, default_network

__all__ = ["Scenario", "SCENARIOS", "DEFAULT_SCENARIO", "CPU_LINK", "get_scenario", "make_cluster",
           "make_emulated_cluster"]

#: Link between emulated CPU devices (gloo over loopback, one host): 1 GB/s and 50 us per message,
#: the figures the runtime's tests plan with. p2p messages of gpt-tiny are 64 KiB - 1 MiB.
CPU_LINK = Link(1e9, 5e-5)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A bundled planning problem: model, global batch size, devices per device type.

    Attributes
    ----------
    gpus : tuple of (device type, count)
    device_types : tuple of DeviceType
        Emulated device types the scenario defines itself (empty: the bundled GPU types,
        nodes and links of :func:`make_cluster`).
    """

    name: str
    model: str
    global_batch_size: int
    gpus: tuple[tuple[str, int], ...]
    description: str = ""
    device_types: tuple[DeviceType, ...] = ()

    def cluster(self, *, per_pair: bool = True) -> Cluster:
        """The scenario's cluster (whole nodes; measured links, or :data:`CPU_LINK` for emulated types).

        ``per_pair=False``: one inter-node link for every pair of nodes (version 1, the earlier
        model), the slowest pair's.
        """
        if self.device_types:
            return make_emulated_cluster(self.name, self.device_types, dict(self.gpus))
        return make_cluster(self.name, dict(self.gpus), per_pair=per_pair)


def make_cluster(name: str, gpus: Mapping[str, int], *, per_pair: bool = True) -> Cluster:
    """A cluster of ``gpus[type]`` devices per type in nodes of the type's ``gpus_per_node``.

    A count that is not a multiple of the node size leaves one smaller node. Links: Sailor's
    measured fits per pair of device types (:func:`~hpp.profiles.network.default_network`);
    ``per_pair=False``: version 1, the slowest pair's link between every two nodes.

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
    if not per_pair:
        return Cluster(name, dict(BUNDLED_DEVICE_TYPES), tuple(nodes), default_inter_node_link(gpus))
    network, slowest = default_network(nodes)
    return Cluster(name, dict(BUNDLED_DEVICE_TYPES), tuple(nodes), slowest, network)


def make_emulated_cluster(name: str, device_types: tuple[DeviceType, ...], counts: Mapping[str, int], *,
                          link: Link = CPU_LINK) -> Cluster:
    """A cluster of emulated devices: ``counts[type]`` devices per type in nodes of ``gpus_per_node``.

    Every link (inside and across nodes) is ``link``: the devices are processes of one host.

    Raises
    ------
    HppInputError
        A count names a type not in ``device_types``, or is not positive.
    """
    types = {d.name: d for d in device_types}
    nodes = []
    for dtype, count in counts.items():
        if dtype not in types:
            raise HppInputError(f"unknown device type {dtype!r}", field="gpus", fix=f"use one of {sorted(types)}")
        if count <= 0:
            raise HppInputError(f"{count} devices of {dtype}", field="gpus", fix="give a positive count")
        while count > 0:
            n = min(types[dtype].gpus_per_node, count)
            nodes.append(Node(dtype, n, link))
            count -= n
    return Cluster(name, types, tuple(nodes), link)


#: cpu-hetero-4's device types: the profiled CPU (one compute thread per rank) and one 2x slower.
#: Memory caps [bytes] (planning constraints; the runtime does not enforce them on CPU): a fast
#: device holds the whole gpt-tiny model (weights + grads + Adam states 15.6 MB, plus activations:
#: 26 MB at micro-batch 2 as a one-stage pipeline), a slow one at most about half of it (layers
#: [0, 3) at micro-batch 2 need 18.5 MB on a first stage, 12.7 MB with full recomputation).
CPU_HETERO_TYPES = (DeviceType("cpu", 40_000_000, 2), DeviceType("cpu-2x", 16_000_000, 2, slowdown=2.0))

SCENARIOS: Mapping[str, Scenario] = {s.name: s for s in (
    Scenario("opt350-a100x4-v100x4", "OPT-350", 1024, (("A100-40", 4), ("V100-16", 4))),
    Scenario("opt350-a100x8-v100x8", "OPT-350", 1024, (("A100-40", 8), ("V100-16", 8)), "the default"),
    Scenario("opt350-3types-40", "OPT-350", 1024, (("A100-40", 16), ("V100-16", 16), ("GH-96", 8))),
    Scenario("neo27-a100x16-v100x16", "GPT-Neo-2.7", 1024, (("A100-40", 16), ("V100-16", 16))),
    Scenario("llama8-3types-40", "LLAMA-3-8", 512, (("GH-96", 8), ("A100-40", 16), ("V100-16", 16))),
    Scenario("opt350-512", "OPT-350", 2048, (("A100-40", 128), ("V100-16", 384))),
    Scenario("opt350-1024-4types", "OPT-350", 4096,
             (("A100-40", 256), ("A100-80", 256), ("V100-16", 256), ("GH-96", 256))),
    Scenario("opt350-4096-6types", "OPT-350", 16384,
             (("A100-40", 1024), ("V100-16", 1024), ("A100-80", 512), ("GH-96", 512), ("RTX-3090", 512),
              ("Titan-RTX", 512)),
             "4,096 GPUs of 6 types (two types of 1,024); the scale check"),
    Scenario("cpu-hetero-4", "gpt-tiny", 32, (("cpu", 2), ("cpu-2x", 2)),
             "4 emulated CPU devices (2 at 1x, 2 at 2x slower, smaller memory); hpp run --emulate-speed",
             device_types=CPU_HETERO_TYPES),
)}

DEFAULT_SCENARIO = "opt350-a100x8-v100x8"


def get_scenario(name: str, *, field: str = "--scenario") -> Scenario:
    """The bundled scenario ``name``; raises HppInputError listing the known names (``field``: the flag or
    argument that named it)."""
    if name not in SCENARIOS:
        raise HppInputError(f"unknown scenario {name!r}", field=field, fix=f"use one of {list(SCENARIOS)}")
    return SCENARIOS[name]
