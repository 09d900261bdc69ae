"""Sailor and Metis plans -> hpp plans: real files (the calibration runs), CLI, and broken plans with their messages."""

import copy
import json

import pytest

from hpp.cli import main
from hpp.errors import HppInputError
from hpp.formulation.cost_model import estimate_plan
from hpp.interop import detect_plan_format, load_any_plan
from hpp.interop.metis import plan_from_metis
from hpp.interop.sailor import plan_from_sailor
from hpp.profiles.bundled import load_bundled_profile

PROF = load_bundled_profile("OPT-350")


def _sailor(sailor_root, name="N8_plan_config_N8_D2.json"):
    path = sailor_root / "validation-calibration" / name
    return path, json.loads(path.read_text())


def _metis():
    """N8_D2 of the calibration runs as a Metis plan: 4 stages of 2 x TP-4 GH-96 groups, 32 micro-batches of 8."""
    return {"format": "metis-plan", "model": "OPT-350", "gbs": 512, "node_sequence": ["GH-96"],
            "num_nodes": {"GH-96": 8}, "device_groups": [8, 8, 8, 8], "strategies": [[2, 4]] * 4,
            "batches": 32, "layer_partition": [0, 5, 12, 19, 26]}


# ----------------------------------------------------------------------------- real files


def test_real_sailor_file_converts_to_replicated_pipelines(sailor_root):
    path, data = _sailor(sailor_root)
    plan, cluster = plan_from_sailor(data, PROF, source=str(path))
    assert plan.num_pipelines == 2 and plan.global_batch_size == 512
    assert [p.boundaries for p in plan.pipelines] == [(0, 5, 12, 19, 26)] * 2
    assert all(p.micro_batch_size == 8 and p.num_micro_batches == 32 for p in plan.pipelines)
    assert {(s.device_type, s.tp_degree) for p in plan.pipelines for s in p.stages} == {("GH-96", 4)}
    # one GH-96 node of 4 per (replica, stage): N = dp x pp = 8 nodes
    assert len(cluster.nodes) == 8 and {n.num_devices for n in cluster.nodes} == {4}
    assert len({cluster.devices[s.device_ids[0]].node for p in plan.pipelines for s in p.stages}) == 8


@pytest.mark.parametrize("name", ["N16_plan_config_N16_D16.json", "N1_plan_config_N1_D1_M4_G32.json",
                                  "N32_plan_config_N32_D8.json"])
def test_every_layout_of_the_real_files_loads(sailor_root, name):
    path, _ = _sailor(sailor_root, name)
    plan, cluster, prof = load_any_plan(path, profile=PROF)
    assert plan.predicted["imported_from"] == "sailor"
    assert cluster.num_devices == 4 * sum(p.num_stages for p in plan.pipelines)


def test_cli_estimates_a_sailor_file_detected_or_named(sailor_root, capsys, tmp_path):
    path, _ = _sailor(sailor_root)
    assert main(["estimate", str(path), "--model", "OPT-350", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "sailor"
    pred = out["predicted"]
    assert pred["iteration_time_s"] == pytest.approx(2.698, rel=0.08)          # measured: 2.69795 s
    assert pred["peak_memory_bytes"] == pytest.approx(25248661504, rel=0.08)   # measured max_mem
    assert pred["throughput_samples_per_s"] == pytest.approx(512 / pred["iteration_time_s"])
    # named format, and the converted plan written out is a valid hpp plan that estimates the same
    hpp_plan = tmp_path / "converted.json"
    assert main(["estimate", str(path), "--model", "OPT-350", "--format", "sailor", "--json",
                 "--out", str(hpp_plan)]) == 0
    capsys.readouterr()
    assert main(["estimate", str(hpp_plan), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["predicted"]
    assert again["iteration_time_s"] == pytest.approx(pred["iteration_time_s"], rel=1e-12)


def test_metis_plan_of_the_same_run_estimates_like_the_sailor_file(sailor_root, tmp_path, capsys):
    path, data = _sailor(sailor_root)
    s_plan, s_cluster = plan_from_sailor(data, PROF, source=str(path))
    m_plan, m_cluster = plan_from_metis(_metis(), PROF, source="metis.json")
    assert [(p.boundaries, p.micro_batch_size, p.num_samples) for p in m_plan.pipelines] == \
        [(p.boundaries, p.micro_batch_size, p.num_samples) for p in s_plan.pipelines]
    a, b = estimate_plan(s_plan, s_cluster, PROF), estimate_plan(m_plan, m_cluster, PROF)
    assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)
    assert b.peak_memory_bytes == a.peak_memory_bytes
    f = tmp_path / "metis.json"
    f.write_text(json.dumps(_metis()))
    assert main(["estimate", str(f), "--json"]) == 0                          # detected; model from the file
    assert json.loads(capsys.readouterr().out)["format"] == "metis"


def test_metis_heterogeneous_node_sequence():
    d = {"gbs": 64, "node_sequence": ["A100-40", "V100-16"], "num_nodes": {"A100-40": 1, "V100-16": 1},
         "device_groups": [4, 4], "strategies": [[4, 1], [4, 1]], "batches": 4, "layer_partition": [0, 13, 26]}
    plan, cluster = plan_from_metis(d, PROF, source="m.json")
    assert plan.num_pipelines == 4
    assert [s.device_type for s in plan.pipelines[0].stages] == ["A100-40", "V100-16"]
    assert all(p.micro_batch_size == 4 and p.num_samples == 16 for p in plan.pipelines)


def test_detect_format():
    assert detect_plan_format({"format": "hpp-plan"}) == "hpp"
    assert detect_plan_format({"pipeline_list": []}) == "sailor"
    assert detect_plan_format({"layer_partition": [0, 1]}) == "metis"
    with pytest.raises(HppInputError, match="cannot tell the plan's format"):
        detect_plan_format({"x": 1}, source="p.json")


# ----------------------------------------------------------------------------- broken Sailor plans


def _broken_sailor(data, edit):
    d = copy.deepcopy(data)
    edit(d)
    return d


def _stage0(d):
    return d["pipeline_list"][0]


SAILOR_CASES = [
    ("partition misses the head", lambda d: _stage0(d)["layers_per_stage"][3].pop(),
     "pipeline_list[0].layers_per_stage", "the layer partition stops at layer 25 but OPT-350 has 26 layers"),
    ("partition skips a layer", lambda d: _stage0(d)["layers_per_stage"][1].pop(0),
     "pipeline_list[0].layers_per_stage[1]", "stage starts at layer 6 but the previous one stopped at 5"),
    ("empty stage", lambda d: _stage0(d)["layers_per_stage"].__setitem__(1, []),
     "pipeline_list[0].layers_per_stage[1]", "empty stage"),
    ("layer beyond the model", lambda d: _stage0(d)["layers_per_stage"][3].append(26),
     "pipeline_list[0].layers_per_stage[3]", "layer 26 is beyond the model (layers 0..25)"),
    ("GPU type without profile", lambda d: _stage0(d)["tmp_per_stage"][2][1][0][0].__setitem__(0, "H100-80"),
     "pipeline_list[0].tmp_per_stage[2][1][0][0][0]", "GPU type 'H100-80' has no profile for OPT-350"),
    ("batch does not add up", lambda d: d.__setitem__("gbs", 500),
     "gbs", "gbs=500 is not a multiple of mbs x replicas = 8 x 2: the batch does not add up"),
    ("dp differs between stages", lambda d: _stage0(d)["dp"].__setitem__(1, 1),
     "pipeline_list[0].dp", "dp degrees [2, 1, 2, 2] differ between stages"),
    ("replica configs do not match dp", lambda d: _stage0(d)["tmp_per_stage"][0].pop(),
     "pipeline_list[0].tmp_per_stage[0]", "1 replica configs but dp is 2"),
    ("TP larger than the node", lambda d: _stage0(d)["tmp_per_stage"][0][0].__setitem__(1, 8),
     "pipeline_list[0].tmp_per_stage[0][0][1]", "GH-96 is not profiled at TP 8"),
    ("no micro-batch size", lambda d: d.pop("mbs"), "mbs", "missing field 'mbs'"),
]


@pytest.mark.parametrize("what, edit, field, message", SAILOR_CASES, ids=[c[0] for c in SAILOR_CASES])
def test_broken_sailor_plan_names_file_and_field(sailor_root, what, edit, field, message):
    path, data = _sailor(sailor_root)
    with pytest.raises(HppInputError) as exc:
        plan_from_sailor(_broken_sailor(data, edit), PROF, source="broken.json")
    assert exc.value.source == "broken.json" and exc.value.field == field
    assert message in str(exc.value) and "Fix:" in str(exc.value)


def test_cli_refuses_a_broken_sailor_file_with_one_line(sailor_root, tmp_path, capsys):
    _, data = _sailor(sailor_root)
    f = tmp_path / "sailor.json"
    f.write_text(json.dumps(_broken_sailor(data, lambda d: _stage0(d)["layers_per_stage"][3].pop())))
    assert main(["estimate", str(f), "--model", "OPT-350"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{f}: field 'pipeline_list[0].layers_per_stage': the layer partition stops at layer 25" in err


def test_cli_sailor_plan_needs_a_model(sailor_root, capsys):
    path, _ = _sailor(sailor_root)
    assert main(["estimate", str(path)]) == 2
    assert "field '--model': a sailor plan does not name its model" in capsys.readouterr().err


def test_sailor_plan_without_gbs_takes_it_from_the_command_line(sailor_root, tmp_path, capsys):
    _, data = _sailor(sailor_root)
    data.pop("gbs")
    f = tmp_path / "nogbs.json"
    f.write_text(json.dumps(data))
    assert main(["estimate", str(f), "--model", "OPT-350"]) == 2
    assert "field 'gbs': the plan gives no global batch size" in capsys.readouterr().err
    assert main(["estimate", str(f), "--model", "OPT-350", "--gbs", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted"]["iteration_time_s"] > 0


# ----------------------------------------------------------------------------- broken Metis plans


METIS_CASES = [
    ("partition does not cover every layer", lambda d: d.__setitem__("layer_partition", [0, 5, 12, 19, 25]),
     "layer_partition", "the partition [0, 5, 12, 19, 25] covers [0, 25) but OPT-350 has layers [0, 26)"),
    ("layers beyond the model", lambda d: d.__setitem__("layer_partition", [0, 5, 12, 19, 30]),
     "layer_partition", "layers beyond the model"),
    ("empty stage", lambda d: d.__setitem__("layer_partition", [0, 5, 5, 19, 26]),
     "layer_partition", "empty stage 1: layers [5, 5)"),
    ("GPU type without profile", lambda d: (d.__setitem__("node_sequence", ["H100-80"]),
                                            d.__setitem__("num_nodes", {"H100-80": 8})),
     "node_sequence[0]", "GPU type 'H100-80' has no profile for OPT-350"),
    ("batch does not add up", lambda d: d.__setitem__("batches", 30),
     "batches", "gbs=512 is not a multiple of batches x dp = 30 x 2: the batch does not add up"),
    ("dp x tp is not the group size", lambda d: d["strategies"].__setitem__(2, [1, 4]),
     "strategies[2]", "dp x tp = 1 x 4 = 4 but the stage has 8 devices"),
    ("devices do not add up", lambda d: d.__setitem__("device_groups", [8, 8, 8, 4]),
     "device_groups", "device_groups add up to 28 devices but the cluster has 32"),
    ("wrong boundary count", lambda d: d.__setitem__("layer_partition", [0, 12, 26]),
     "layer_partition", "3 boundaries for 4 stages"),
    ("dp differs between stages", lambda d: (d.__setitem__("strategies", [[2, 4], [2, 4], [2, 4], [4, 2]])),
     "strategies", "dp degrees [2, 2, 2, 4] differ between stages"),
]


@pytest.mark.parametrize("what, edit, field, message", METIS_CASES, ids=[c[0] for c in METIS_CASES])
def test_broken_metis_plan_names_file_and_field(what, edit, field, message):
    d = _metis()
    edit(d)
    with pytest.raises(HppInputError) as exc:
        plan_from_metis(d, PROF, source="broken-metis.json")
    assert exc.value.source == "broken-metis.json" and exc.value.field == field
    assert message in str(exc.value)


def test_cli_refuses_a_broken_metis_file(tmp_path, capsys):
    d = _metis()
    d["layer_partition"] = [0, 5, 12, 19, 25]
    f = tmp_path / "metis.json"
    f.write_text(json.dumps(d))
    assert main(["estimate", str(f), "--format", "metis"]) == 2
    err = capsys.readouterr().err
    assert f"{f}: field 'layer_partition': the partition [0, 5, 12, 19, 25] covers [0, 25)" in err


def test_sailor_plan_across_gpu_types_uses_the_per_pair_links():
    """A two-type Sailor plan is priced on the links of the GPU-type pairs it names."""
    from hpp.formulation.collectives import ring_allreduce_s
    from hpp.profiles.network import default_pair_link
    data = {"mbs": 1, "gbs": 8, "pipeline_list": [
        {"num_stages": 2, "layers_per_stage": [list(range(0, 13)), list(range(13, 26))], "dp": [2, 2],
         "tmp_per_stage": [[[[["A100-40", 4, "us-central1-a"]], 4]] * 2, [[[["GH-96", 4, "us-central1-a"]], 4]] * 2]}]}
    plan, cluster = plan_from_sailor(data, PROF, source="het.json")
    assert cluster.per_pair and [n.device_type for n in cluster.nodes] == ["A100-40", "GH-96"] * 2
    est = estimate_plan(plan, cluster, PROF)
    a100_gh, gh_gh, a100_a100 = (default_pair_link("A100-40", "GH-96"), default_pair_link("GH-96", "GH-96"),
                                 default_pair_link("A100-40", "A100-40"))
    e = PROF.layer_profile("A100-40", 4, 1)
    assert est.pipelines[0].stages[0].p2p_s == pytest.approx(a100_gh.transfer_s(e.output_bytes[12]))
    # block [13, 26) is held by the two GH-96 stages only: its ring runs on the GH-96 pair's link; each block's
    # 4 TP shards' rings leave a node at once: 4 flows share the pair's link (GH-96: a NIC per GPU, no loss)
    b0, b1 = est.blocks
    assert b1.allreduce_s == pytest.approx(ring_allreduce_s(b1.num_bytes, 2, gh_gh.shared(4)))
    assert b1.allreduce_s == pytest.approx(ring_allreduce_s(b1.num_bytes, 2, gh_gh), rel=0.02)
    assert b0.allreduce_s == pytest.approx(ring_allreduce_s(b0.num_bytes, 2, a100_a100.shared(4)))
    assert b0.allreduce_s > 1.25 * ring_allreduce_s(b0.num_bytes, 2, a100_a100)         # 2.42 vs 6.04 / 4 GB/s peak
    assert (b0.concurrent_flows, b1.concurrent_flows) == (4, 4)
    # the one-link model priced both on the slowest pair
    old = estimate_plan(plan, cluster.single_link(), PROF)
    assert old.blocks[1].allreduce_s > 5 * b1.allreduce_s


def test_the_shipped_sailor_example_estimates_as_the_readme_says(capsys):
    """README, "Other planners' plans": the example file, its header (4 of the converted cluster's 16 devices:
    one node of 4 per stage replica) and a plan that fits memory; the A100 -> V100 transfer on Sailor's pair fit."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "experiments" / "plans" / "sailor-opt350-a100-v100.json"
    assert main(["estimate", str(path), "--format", "sailor", "--model", "OPT-350"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("(sailor plan): OPT-350, 2 pipelines on 4 devices of the converted "
                                        "cluster's 16 (each stage replica on its own node, as sailor runs it), "
                                        "global batch 1024")
    assert "WARNING" not in out
    assert main(["estimate", str(path), "--format", "sailor", "--model", "OPT-350", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["predicted"]
    assert est["fits_memory"] and [b["allreduce_method"] for b in est["blocks"]] == ["ring", "ring"]
    assert est["device_types"] == ["A100-40", "V100-16"]
