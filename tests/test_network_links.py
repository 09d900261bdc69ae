"""From the ranks' records to the cluster file (no processes): the links measured on a cluster with zones and
one-device nodes, simulated from known links, come back in the file at the measured figures.

Cluster: node 0 ``A:2`` and node 1 ``A:1`` in zone ``z1``, node 2 ``B:2`` in zone ``z2``. Measured: A's intra-node
link (node 0), A - A (nodes 0, 1: one flow, node 1 has one device), the zones' link (nodes 0, 2: 1 and 2 flows);
B's nodes have two devices, so B's intra-node link too. A and B meet only across zones: the file gives their
pair the zones' link.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from hpp.profiles.cluster import AggregateFit, Link
from hpp.profiles.cluster_format import cluster_from_dict
from hpp.profiles.network_fit import LATENCY_PROBE_BYTES
from hpp.runtime.network.hosts import HostInfo
from hpp.runtime.network.links import cluster_file, fit_links
from hpp.runtime.network.measure import LinkTask, link_tasks

SIZES = [int(1e6 * 2 ** i) for i in range(6)]
TRUE = {"intra_node A": Link(8e9, 5e-6, (0.0, 0.5, 4.0)), "intra_node B": Link(6e9, 6e-6, (0.0, 0.25, 3.0)),
        "inter_node A - A": Link(2e9, 20e-6, (0.0, 0.1, 1.0)),
        "zones z1 - z2": Link(1e9, 50e-6, (0.0, 0.05, 0.5), aggregate=(AggregateFit(2, 1.5e9, (0.0, 0.075, 0.75)),))}
HOSTS = (HostInfo(0, "h0", "A", 2, "z1", 10**9), HostInfo(1, "h1", "A", 1, "z1", 10**9),
         HostInfo(2, "h2", "B", 2, "z2", 2 * 10**9))


def records_of(i: int, task: LinkTask, link: Link) -> list[dict]:
    """What the ranks would record on ``link``: round trips = one-way time + one latency (the acknowledgement);
    probes at latency + bytes / peak; 2-rank all-reduces at the ring's time."""
    out = [{"task": i, "op": "probe", "flows": 1, "flow": 0, "bytes": x,
            "seconds": [2 * link.latency_s + x / link.max_bytes_per_s] * 3} for x in LATENCY_PROBE_BYTES]
    for k in task.flows:
        shared = link.shared(k)
        out += [{"task": i, "op": "p2p", "flows": k, "flow": j, "bytes": x,
                 "seconds": [shared.transfer_s(x) + link.latency_s] * 3} for x in SIZES for j in range(k)]
        out += [{"task": i, "op": "allreduce", "flows": k, "flow": j, "bytes": x, "rank": r,
                 "seconds": [2 * x / 2 / shared.bandwidth_bytes_per_s(x / 2) + 2 * link.latency_s] * 3}
                for x in SIZES for j in range(k) for r in (0, 1)]
    return out


def test_the_tasks_of_a_zoned_cluster():
    tasks = link_tasks([(h.device_type, h.num_devices, h.zone) for h in HOSTS])
    assert [(t.name, t.node_a, t.node_b, t.flows) for t in tasks] == [
        ("intra_node A", 0, 0, (1,)), ("intra_node B", 2, 2, (1,)), ("inter_node A - A", 0, 1, (1,)),
        ("zones z1 - z2", 0, 2, (1, 2))]


def test_the_file_holds_the_measured_links_and_loads_back():
    tasks = link_tasks([(h.device_type, h.num_devices, h.zone) for h in HOSTS])
    records = [r for i, t in enumerate(tasks) for r in records_of(i, t, TRUE[t.name])]
    fitted = fit_links(tasks, records, devices=[h.num_devices for h in HOSTS])
    for task, f, lat, allreduce in fitted:
        true = TRUE[task.name]
        assert f.largest_error < 1e-9 and f.link.latency_s == pytest.approx(true.latency_s, rel=1e-6)
        assert f.link.fit_gb_per_s == pytest.approx(true.fit_gb_per_s, abs=1e-9)
        assert [a.flows for a in f.link.aggregate] == [a.flows for a in true.aggregate]
        if task.kind != "intra_node":               # pairs of ranks: the records are the ring's time
            assert all(a["measured_s"] == pytest.approx(a["predicted_s"], rel=1e-6) for a in allreduce)
    d, notes = cluster_file(HOSTS, fitted, name="zoned", description="test")
    c = cluster_from_dict(json.loads(json.dumps(d)), source="zoned.json")
    assert d["version"] == 2 and d["zones"] == ["z1", "z2"] and sorted(d["links"]["intra_node"]) == ["A", "B"]
    assert c.node_link(0, 1).max_bytes_per_s == pytest.approx(1.5e9)   # the fastest measured: 1.5 GB/s at 32 MB
    assert c.node_link(0, 1).fit_gb_per_s == pytest.approx(TRUE["inter_node A - A"].fit_gb_per_s, abs=1e-9)
    zone = c.node_link(1, 2)                              # A (z1) - B (z2): the zones' link
    assert zone.fit_gb_per_s == pytest.approx(TRUE["zones z1 - z2"].fit_gb_per_s, abs=1e-9)
    assert zone.aggregate[0].fit_gb_per_s == pytest.approx((0.0, 0.075, 0.75), abs=1e-9)
    assert c.nodes[1].intra_node == c.nodes[0].intra_node          # per type
    assert c.device_types["B"].memory_bytes == 2 * 10**9 and c.device_types["A"].gpus_per_node == 2
    assert any("A and B nodes meet only across zones" in n for n in notes)
    assert d["links"]["inter_node"] == [{"between": ["A", "A"], "link": d["links"]["inter_node"][0]["link"]},
                                        {"between": ["A", "B"], "link": d["links"]["zones"][0]["link"]}]


def test_a_type_of_one_device_nodes_gets_its_inter_node_link_and_a_note():
    hosts = (HostInfo(0, "h0", "A", 1, None, 10**9), HostInfo(1, "h1", "A", 1, None, 10**9))
    tasks = link_tasks([(h.device_type, h.num_devices, h.zone) for h in hosts])
    assert [t.name for t in tasks] == ["inter_node A - A"]
    fitted = fit_links(tasks, records_of(0, tasks[0], TRUE["inter_node A - A"]), devices=[1, 1])
    d, notes = cluster_file(hosts, fitted, name="ones", description="test")
    assert d["links"]["intra_node"]["A"] == d["links"]["inter_node"][0]["link"]
    assert any("every A node has one device" in n for n in notes)
    assert asdict(hosts[0])["zone"] is None


def test_a_missing_flow_is_refused_naming_the_link():
    task = LinkTask("inter_node", ("A", "A"), 0, 1, (1, 2))
    records = [r for r in records_of(0, task, TRUE["zones z1 - z2"]) if not (r["flows"] == 2 and r["flow"] == 1)]
    with pytest.raises(ValueError, match=r"the 2-flow times of 1000000 bytes miss flows \[1\]"):
        fit_links([task], records, devices=[2, 2])
