"""`hpp profile` -> `hpp plan` -> `hpp run` on an emulated heterogeneous CPU cluster (fork launcher, gloo)."""

import json

import pytest

from hpp.cli import main

CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "cpu-hetero-4",
           "device_types": {"cpu": {"memory_bytes": 2_000_000_000, "gpus_per_node": 2},
                            "cpu-slow": {"memory_bytes": 2_000_000_000, "gpus_per_node": 2, "slowdown": 2.0}},
           "nodes": [{"device_type": "cpu", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1e9},
                     {"device_type": "cpu-slow", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1e9}],
           "inter_node_bandwidth_bytes_per_s": 1e9, "latency_s": 5e-5}


@pytest.mark.distributed
def test_profile_plan_run_chain(tmp_path, capsys):
    prof, cl, plan = tmp_path / "prof.json", tmp_path / "cluster.json", tmp_path / "plan.json"
    cl.write_text(json.dumps(CLUSTER))
    assert main(["profile", "--model", "gpt-tiny", "--device", "cpu", "--micro-batch-sizes", "1,2",
                 "--out", str(prof), "--emulate", "cpu-slow=2", "--repeats", "3", "--warmup", "1"]) == 0
    capsys.readouterr()
    assert main(["plan", "--cluster", str(cl), "--profile", str(prof), "--gbs", "12", "--time-limit", "5",
                 "--out", str(plan), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["search"]["status"] == "OPTIMAL"
    assert sum(p["num_samples"] for p in planned["plan"]["pipelines"]) == 12
    assert main(["run", str(plan), "--steps", "3", "--launcher", "fork", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["measured"]["iteration_time_s"] > 0
    assert ran["predicted"]["iteration_time_s"] == pytest.approx(planned["predicted"]["iteration_time_s"], rel=1e-9)
    assert ran["collectives"]["count"] >= 1
