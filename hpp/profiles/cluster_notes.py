"""What the planner makes of unusual but valid cluster files: one-line notes that ``hpp plan`` prints."""

from __future__ import annotations

import math

from hpp.profiles.cluster import Cluster

__all__ = ["cluster_notes"]


def _unshared_pairs(cluster: Cluster) -> list[str]:
    """The pairs of device types (zones aside) whose inter-node links carry no sharing figures, one node per
    (type, zone) class checked (the links depend on the classes only)."""
    reps: dict[tuple, int] = {}
    for i, n in enumerate(cluster.nodes):
        reps.setdefault((n.device_type, n.zone), i)
    cls = sorted(reps.items(), key=lambda kv: kv[1])
    out = set()
    for a, (ka, i) in enumerate(cls):
        for kb, j in cls[a:]:
            jj = j if i != j else next((k for k, n in enumerate(cluster.nodes) if k != i and
                                        (n.device_type, n.zone) == ka), None)
            if jj is None:
                continue
            if (not cluster.node_link(i, jj).aggregate and cluster.nodes[i].nic_bytes_per_s == math.inf
                    and cluster.nodes[jj].nic_bytes_per_s == math.inf):
                out.add(f"{ka[0]}-{kb[0]}")
    return sorted(out)


def cluster_notes(cluster: Cluster) -> list[str]:
    """What the planner makes of unusual but valid nodes and links, one line each (empty list if nothing to say).

    A node with more devices than its type's ``gpus_per_node`` is planned as one node of that many devices:
    TP groups as large as the node allows (and the profile measured), its intra-node link between all.
    Version 2: links no pair of nodes can use are said (a type-pair link naming a type no node has; zone links
    when no node has a zone), since a typo in a node's type or zone would otherwise pass silently; so are the
    links the file left out (Sailor's measured fits filled in) and inter-node links that carry no figures for
    several flows at once (those flows are then priced as if they shared nothing).

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
        if net.defaulted:
            out.append(f"links not in the file: {', '.join(net.defaulted)} are Sailor's measured fits of one public "
                       "cloud (us-central1-a; --default-links accepted them)")
        present = set(cluster.count_by_type())
        unused = sorted(f"{a}-{b}" for a, b in net.inter if a not in present or b not in present)
        if unused:
            out.append(f"links.inter_node: {', '.join(unused)} name a device type no node has: not used")
        if net.zone_links and all(n.zone is None for n in cluster.nodes):
            out.append("links.zones: no node has a zone, so the zone links are not used")
    unshared = _unshared_pairs(cluster)
    if unshared:
        out.append(f"inter-node links {', '.join(unshared)} give no figures for several flows at once (aggregate, "
                   "nic_bytes_per_s): flows leaving a node are priced as if they did not share its network "
                   "(`hpp profile-network` measures it)")
    return out
