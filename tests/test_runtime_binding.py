"""Device binding from the plan (hpp.runtime.launch.binding): hosts, local GPUs, device types, one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch

from hpp.errors import HppInputError
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.runtime.launch.binding import (EMULATE_ENV, TABLE_ENV, NodeDevices, check_host, check_node_devices,
                                 detect_node_devices, device_type_of, host_nodes, host_ranks, load_device_rules,
                                 node_bindings, parse_node_map, rank_bindings, worker_binding)

GIB = 2**30
#: one emulated CPU node of 2 devices (the trial's two-host cluster's node 0)
CPU_CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "cpu1",
               "device_types": {"cpu": {"memory_bytes": 4 * GIB, "gpus_per_node": 2},
                                "cpu-2x": {"memory_bytes": 4 * GIB, "gpus_per_node": 2, "slowdown": 2.0}},
               "nodes": [{"device_type": "cpu", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1e9}],
               "inter_node_bandwidth_bytes_per_s": 1e9}


def cluster() -> Cluster:
    """Node 0: 4 x A100-40 (ids 0-3); node 1: 4 x V100-16 (ids 4-7); node 2: 2 x A100-40 (ids 8-9, unused)."""
    return Cluster("c", dict(BUNDLED_DEVICE_TYPES), (Node("A100-40", 4, Link(2e11)), Node("V100-16", 4, Link(1e11)),
                                                    Node("A100-40", 2, Link(2e11))), Link(1e10))


def plan() -> Plan:
    """Pipeline 0: V100 device 5 then A100 device 1; pipeline 1: one TP-2 stage on A100s 2, 3."""
    p0 = Pipeline((Stage(0, 3, "V100-16", 1, (5,)), Stage(3, 6, "A100-40", 1, (1,))), 1, 4)
    p1 = Pipeline((Stage(0, 6, "A100-40", 2, (2, 3)),), 1, 4)
    return Plan("m", 6, 8, (p0, p1), cluster_ref=cluster_to_dict(cluster()))


def test_ranks_are_bound_to_their_plan_devices() -> None:
    b = rank_bindings(plan())
    assert [(x.rank, x.device_id, x.node, x.local_index, x.device_type) for x in b] == [
        (0, 5, 1, 1, "V100-16"), (1, 1, 0, 1, "A100-40"), (2, 2, 0, 2, "A100-40"), (3, 3, 0, 3, "A100-40")]
    assert [x.rank for x in node_bindings(plan(), 0)] == [1, 2, 3]           # by local GPU index


def test_hosts_play_the_used_nodes_and_cover_every_rank_once() -> None:
    assert host_nodes(plan()) == (0, 1)                                      # node 2 is unused: no host for it
    assert host_nodes(plan(), node_map=parse_node_map("1,0")) == (1, 0)
    started = [worker_binding(plan(), nnodes=2, node_rank=h, local_rank=j).rank
               for h in range(2) for j in range(len(host_ranks(plan(), nnodes=2, node_rank=h)))]
    assert sorted(started) == [0, 1, 2, 3]
    first = worker_binding(plan(), nnodes=2, node_rank=0, local_rank=0, node_map=(1, 0))
    assert (first.rank, first.node, first.local_index) == (0, 1, 1)          # cuda:1 on the V100 host


def test_one_host_plays_the_used_nodes_stacked() -> None:
    """One host (torchrun --standalone, fork launcher): local rank = rank; node 1's GPU 1 is GPU 4 + 1."""
    mine = host_ranks(plan())
    assert [(b.rank, b.node, b.local_index) for b in mine] == [(0, 1, 5), (1, 0, 1), (2, 0, 2), (3, 0, 3)]
    assert worker_binding(plan(), local_rank=2).rank == 2
    mixed = NodeDevices(("A100-40",) * 4 + ("V100-16",) * 4, 8, names=("a",) * 8)
    assert check_host(plan(), mixed) == mine and check_host(plan(), None) == mine
    with pytest.raises(HppInputError, match=r"this host \(plan nodes 0,1\) needs 6 A100-40/V100-16 devices"):
        check_host(plan(), NodeDevices(mixed.types[:5], 5))
    with pytest.raises(HppInputError, match=r"node 1 should have V100-16 devices .* has A100-40 \(device 5\)"):
        check_host(plan(), NodeDevices(("A100-40",) * 8, 8))
    with pytest.raises(HppInputError, match="node 1 should have V100-16"):    # one emulated type, two node types
        check_host(plan(), detect_node_devices(emulate="A100-40"))
    cpu_plan = Plan("m", 4, 4, (Pipeline((Stage(0, 4, "cpu", 1, (0,)),), 1, 4),), cluster_ref=CPU_CLUSTER)
    with pytest.raises(HppInputError, match=r"has cpu-2x \(device 0\)\. Fix: .* re-plan \(an emulating CPU host: "
                                            r"--emulate-node-type cpu\)$"):
        check_host(cpu_plan, detect_node_devices(emulate="cpu-2x"))
    assert check_host(plan(), detect_node_devices(emulate="V100-16"), nnodes=2, node_rank=1) == node_bindings(plan(), 1)


@pytest.mark.parametrize("call, match", [
    (lambda: host_nodes(plan(), node_map=(0, 2)), r"--node-map 0,2 does not list each node the plan uses \(0,1\)"),
    (lambda: parse_node_map("0,a"), r"--node-map '0,a' is not a list of node indices"),
    (lambda: worker_binding(plan(), nnodes=2, node_rank=2, local_rank=0), r"node rank 2, but the plan runs on 2 hosts"),
    (lambda: worker_binding(plan(), nnodes=3, node_rank=0, local_rank=0),
     r"--nnodes 3, but the plan runs on 2 nodes \(0,1\)"),
    (lambda: worker_binding(plan(), nnodes=2, node_rank=0, local_rank=3),
     r"local rank 3, but this host runs 3 ranks of the plan"),
    (lambda: check_node_devices(plan(), 0, found_type="V100-16", found_count=4),
     r"node 0 should have A100-40 devices \(the plan's cluster\) but this host has V100-16 \(device 1\)\. Fix: start this host with the node rank "
     r"\(or --node-map\) of a node of its type, or re-plan$"),
    (lambda: check_node_devices(plan(), 0, found_type=("A100-40", "A100-40", None, "A100-40"), found_count=4),
     r"node 0 should have A100-40 devices .* but this host has an unknown GPU type .* add a rule to \$"),
    (lambda: check_node_devices(plan(), 0, found_type="A100-40", found_count=3),
     r"node 0 needs 4 A100-40 devices \(local GPU indices up to 3\) but this host has 3"),
    (lambda: check_node_devices(plan(), 3, found_type="A100-40", found_count=4),
     r"node 3 is not in the plan's cluster \(valid: 0\.\.2\)"),
    (lambda: detect_node_devices(emulate="A100-40:x"), r"--emulate-node-type 'A100-40:x'"),
])
def test_bad_hosts_are_one_line_errors(call, match) -> None:
    with pytest.raises(HppInputError, match=match) as exc:
        call()
    assert "\n" not in str(exc.value) and exc.value.fix


def test_matching_hosts_pass_and_emulation_plays_a_node() -> None:
    assert [b.rank for b in check_node_devices(plan(), 1, found_type="V100-16", found_count=2)] == [0]
    assert len(check_node_devices(plan(), 0, found_type=["A100-40"] * 4, found_count=8)) == 3
    v100 = detect_node_devices(emulate="V100-16")
    assert v100.emulated and v100.count is None
    check_node_devices(plan(), 1, **v100.check_args())
    with pytest.raises(HppInputError, match="should have A100-40 devices"):     # control: the wrong node
        check_node_devices(plan(), 0, **v100.check_args())
    four = detect_node_devices(emulate="A100-40:3")
    with pytest.raises(HppInputError, match="needs 4 A100-40 devices"):
        check_node_devices(plan(), 0, **four.check_args())


def test_emulation_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(EMULATE_ENV, "A100-40:4")
    got = detect_node_devices()
    assert got.types == ("A100-40",) * 4 and got.count == 4
    monkeypatch.delenv(EMULATE_ENV)
    if not torch.cuda.is_available():
        assert detect_node_devices() is None                                  # a CPU host: nothing to check


@pytest.mark.parametrize("name, gib, want", [
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40"), ("NVIDIA A100 80GB PCIe", 79.2, "A100-80"),
    ("Tesla V100-SXM2-16GB", 15.8, "V100-16"), ("Tesla V100-SXM2-32GB", 31.7, None),
    ("NVIDIA GH200 480GB", 94.5, "GH-96"), ("NVIDIA H200", 139.8, "H200"), ("NVIDIA H100 80GB HBM3", 79.1, "H100"),
    ("NVIDIA GeForce RTX 3090", 23.7, "RTX-3090"), ("NVIDIA GeForce RTX 2080 Ti", 10.8, "RTX-2080"),
    ("NVIDIA TITAN RTX", 23.6, "Titan-RTX"), ("NVIDIA L40S", 44.4, None),
])
def test_device_names_map_to_bundled_types(name: str, gib: float, want: str | None) -> None:
    assert device_type_of(name, int(gib * GIB)) == want


def test_user_rules_come_first(tmp_path, monkeypatch) -> None:
    table = tmp_path / "types.json"
    table.write_text(json.dumps([{"name_contains": "L40S", "type": "L40S"},
                                 {"name_contains": "A100", "min_memory_gib": 30, "max_memory_gib": 50,
                                  "type": "A100-40-pcie"}]))
    monkeypatch.setenv(TABLE_ENV, str(table))
    rules = load_device_rules()
    assert device_type_of("NVIDIA L40S", 44 * GIB, rules) == "L40S"
    assert device_type_of("NVIDIA A100-PCIE-40GB", 39 * GIB, rules) == "A100-40-pcie"
    assert device_type_of("NVIDIA A100-SXM4-80GB", 79 * GIB, rules) == "A100-80"   # the bundled rule after them
    table.write_text(json.dumps([{"name": "L40S", "type": "L40S"}]))
    with pytest.raises(HppInputError, match=r"rule 0 is .*name_contains and type") as exc:
        load_device_rules()
    assert str(table) in str(exc.value)
