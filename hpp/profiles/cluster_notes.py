"""What the planner makes of unusual but valid cluster files: one-line notes that ``hpp plan`` prints."""

from __future__ import annotations

from hpp.profiles.cluster import Cluster

__all__ = ["cluster_notes"]


def cluster_notes(cluster: Cluster) -> list[str]:
    """What the planner makes of unusual but valid nodes and links, one line each (empty list if nothing to say).

    A node with more devices than its type's ``gpus_per_node`` is planned as one node of that many devices:
    TP groups as large as the node allows (and the profile measured), its intra-node link between all.
    Version 2: links no pair of nodes can use are said (a type-pair link naming a type no node has; zone links
    when no node has a zone), since a typo in a node's type or zone would otherwise pass silently.

    Examples
    --------
    >>> from hpp.profiles.cluster import Link, Node
    >>> from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
    >>> c = Cluster("c", dict(BUNDLED_DEVICE_TYPES), (Node("A100-40", 6, Link(2e11)),), Link(2e10))
    >>> cluster_notes(c)[0].startswith("node 0 has 6 A100-40 devices, more than the type's gpus_per_node 4")
    True
    """
    big: dict[tuple[str, int], list[int]] = {}
    for i, n in enumerate(cluster.nodes):
        per = cluster.device_types[n.device_type].gpus_per_node
        if n.num_devices > per:
            big.setdefault((n.device_type, n.num_devices), []).append(i)
    out = []
    for (t, k), idx in big.items():
        per = cluster.device_types[t].gpus_per_node
        which = f"node {idx[0]} has" if len(idx) == 1 else \
            f"nodes {', '.join(map(str, idx[:5]))}{', ...' if len(idx) > 5 else ''} ({len(idx)}) have"
        out.append(f"{which} {k} {t} devices, more than the type's gpus_per_node {per}: planned as one node of "
                   f"{k} (TP groups up to {k} devices, the node's intra-node link between all of them); split it "
                   f"into nodes of {per} if each host has {per}")
    net = cluster.network
    if net is not None:
        present = set(cluster.count_by_type())
        unused = sorted(f"{a}-{b}" for a, b in net.inter if a not in present or b not in present)
        if unused:
            out.append(f"links.inter_node: {', '.join(unused)} name a device type no node has: not used")
        if net.zone_links and all(n.zone is None for n in cluster.nodes):
            out.append("links.zones: no node has a zone, so the zone links are not used")
    return out
