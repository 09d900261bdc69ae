"""Small synthetic profiles and clusters for hand-computed and property tests."""

from __future__ import annotations

from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import LayerProfile, ModelProfile


def toy_profile(types: dict[str, float], *, fwd=(1.0, 2.0, 3.0), act=(10, 20, 30), params=(100, 200, 300),
                out=(5, 6, 7), opt=(0.1, 0.1, 0.1), sizes=(1,)) -> ModelProfile:
    """A profile whose per-layer times scale with the type's slowdown; backward = 2 x forward."""
    entries = {}
    for t, slow in types.items():
        for b in sizes:
            e = LayerProfile(t, 1, b, tuple(f * slow * b for f in fwd), tuple(2 * f * slow * b for f in fwd),
                             tuple(opt), tuple(params), tuple(a * b for a in act), tuple(o * b for o in out))
            entries[e.key] = e
    return ModelProfile("toy", len(fwd), 1, entries, "synthetic", "CC0")


def toy_cluster(nodes: list[tuple[str, int]], *, memory: dict[str, int], bw: float = 1e3, latency: float = 0.0,
                inter_bw: float | None = None) -> Cluster:
    types = {t: DeviceType(t, m, 8) for t, m in memory.items()}
    link = Link(bw, latency)
    return Cluster("toy", types, tuple(Node(t, n, link) for t, n in nodes),
                   Link(inter_bw if inter_bw is not None else bw, latency))
