"""``hpp estimate PLAN --cluster FILE``: a plan's pipelines bound onto another cluster and priced there
(:func:`hpp.formulation.binding.rebind_plan`), e.g. a Sailor plan on your own cluster instead of the converter's
one-node-per-stage-replica cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpp.cli import main
from hpp.formulation.binding import rebind_plan
from hpp.formulation.cost_model import estimate_plan
from hpp.interop import load_any_plan
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.cluster_format import cluster_to_dict, load_cluster

ROOT = Path(__file__).resolve().parents[1]
SAILOR = ROOT / "experiments" / "plans" / "sailor-opt350-a100-v100.json"


def _cluster_file(tmp_path, capsys, scenario: str) -> Path:
    assert main(["scenarios", "--cluster", scenario]) == 0
    path = tmp_path / f"{scenario}.json"
    path.write_text(capsys.readouterr().out)
    return path


def _estimate(capsys, *args: str) -> dict:
    assert main(["estimate", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_sailor_plan_is_priced_on_the_given_cluster(tmp_path, capsys):
    cfile = _cluster_file(tmp_path, capsys, "opt350-a100x8-v100x8")
    mine = _estimate(capsys, SAILOR, "--format", "sailor", "--model", "OPT-350", "--cluster", cfile)
    theirs = _estimate(capsys, SAILOR, "--format", "sailor", "--model", "OPT-350")
    plan, _, prof = load_any_plan(SAILOR, fmt="sailor", profile=load_bundled_profile("OPT-350"))
    cluster = load_cluster(cfile)
    bound = rebind_plan(plan, cluster, cluster_ref=cluster_to_dict(cluster))
    ids = [d for p in bound.pipelines for st in p.stages for d in st.device_ids]
    assert len(set(ids)) == len(ids) == plan.num_devices
    assert all(cluster.devices[d].device_type == st.device_type
               for p in bound.pipelines for st in p.stages for d in st.device_ids)
    assert [(st.layer_start, st.layer_stop, st.tp_degree) for p in bound.pipelines for st in p.stages] == \
        [(st.layer_start, st.layer_stop, st.tp_degree) for p in plan.pipelines for st in p.stages]
    assert mine["predicted"]["iteration_time_s"] == pytest.approx(estimate_plan(bound, cluster, prof).iteration_time_s,
                                                                  rel=1e-12)
    # the control: the converter's cluster (a node per stage replica, one zone's links) prices the sync otherwise:
    # there both A100 stages share one node (NVLink, 0.012 s), on the converter's cluster they do not (0.50 s)
    assert mine["predicted"]["grad_sync_s"] < 0.05 < 0.3 < theirs["predicted"]["grad_sync_s"]
    assert main(["estimate", str(SAILOR), "--format", "sailor", "--model", "OPT-350", "--cluster", str(cfile)]) == 0
    assert f"2 pipelines on 4 devices of {cfile}'s 16 (bound by --cluster)" in capsys.readouterr().out


def test_an_hpp_plan_rebound_on_its_own_cluster_costs_the_same(tmp_path, capsys):
    cfile = _cluster_file(tmp_path, capsys, "opt350-a100x4-v100x4")
    out = tmp_path / "p.json"
    assert main(["plan", "--scenario", "opt350-a100x4-v100x4", "--no-baselines", "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    same = _estimate(capsys, out)["predicted"]["iteration_time_s"]
    assert _estimate(capsys, out, "--cluster", cfile)["predicted"]["iteration_time_s"] == pytest.approx(same, rel=1e-12)


def test_a_cluster_without_the_plans_devices_is_one_line_exit_2(tmp_path, capsys):
    cfile = tmp_path / "a100.json"
    cfile.write_text(json.dumps({"format": "hpp-cluster", "version": 1, "name": "a", "nodes": [
        {"device_type": "A100-40", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1e11}],
        "inter_node_bandwidth_bytes_per_s": 1e9}))
    assert main(["estimate", str(SAILOR), "--format", "sailor", "--model", "OPT-350", "--cluster", str(cfile)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"hpp estimate: error: {cfile}: field '--cluster': the plan's stages use 2 x V100-16 (the cluster has 0). "
        "Fix: give a cluster with at least the devices the plan uses")
