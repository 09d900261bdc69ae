"""The inputs: cluster-file keys, global flags, silent defaults, left-out types,
Metis coverage, bench-solvers' output folder, the documented Python API. Each test reproduces the
original failure (it failed before the fix)."""

import json
from pathlib import Path

import pytest

import hpp
from hpp.cli import main
from hpp.errors import HppInputError
from hpp.profiles.cluster_format import CLUSTER_FORMAT_HELP, cluster_from_dict
from hpp.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parents[1]
A100 = {"device_type": "A100-40", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 2.4e11}
V100 = {"device_type": "V100-16", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1.5e11}


def _cluster(**top):
    d = {"format": "hpp-cluster", "version": 1, "nodes": [dict(A100), dict(V100)],
         "inter_node_bandwidth_bytes_per_s": 2.5e10}
    d.update(top)
    return d


def _plan_file(tmp_path, d, *extra, capsys):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(d))
    code = main(["plan", "--cluster", str(f), "--model", "OPT-350", "--gbs", "64", "--no-baselines", "--workers",
                 "1", *extra])
    return code, capsys.readouterr()


# --------------------------------------------------------------------------- 1. cluster files

def _edit(path, key, new_key):
    """Rename ``key`` at ``path`` (a list of keys/indices) to ``new_key``."""
    def f(d):
        obj = d
        for p in path:
            obj = obj[p]
        obj[new_key] = obj.pop(key)
        return d
    return f


def _node_link(d):
    d["nodes"][0]["intra_node_bandwidth_bytes_per_s"] = {"max_bytes_per_s": 2.4e11, "fit_gb_per_s": [0.8, 15.6, 31.2]}
    return d


def _own_type(d):
    d["device_types"] = {"A100-40": {"memory_bytes": 42_338_615_296, "gpus_per_node": 4}}
    return d


TYPO_CASES = [   # (what, edit, field, the closest valid key named)
    ("node count 'num_device'", _edit(["nodes", 0], "num_devices", "num_device"), "nodes[0].num_device", "num_devices"),
    ("node count 'num_gpus'", _edit(["nodes", 1], "num_devices", "num_gpus"), "nodes[1].num_gpus", "num_devices"),
    ("node type 'device'", _edit(["nodes", 0], "device_type", "devicetype"), "nodes[0].devicetype", "device_type"),
    ("intra link", _edit(["nodes", 0], "intra_node_bandwidth_bytes_per_s", "intra_node_bandwith_bytes_per_s"),
     "nodes[0].intra_node_bandwith_bytes_per_s", "intra_node_bandwidth_bytes_per_s"),
    ("inter link", _edit([], "inter_node_bandwidth_bytes_per_s", "inter_node_bandwidth"),
     "inter_node_bandwidth", "inter_node_bandwidth_bytes_per_s"),
    ("top-level latency", lambda d: {**d, "latency": 1e-5}, "latency", "latency_s"),
    ("top-level device type table", lambda d: {**d, "devices_types": {}}, "devices_types", "device_types"),
    ("device-type memory", lambda d: _edit(["device_types", "A100-40"], "memory_bytes", "memory_byte")(_own_type(d)),
     "device_types.A100-40.memory_byte", "memory_bytes"),
    ("device-type node size", lambda d: _edit(["device_types", "A100-40"], "gpus_per_node", "gpu_per_node")(
        _own_type(d)), "device_types.A100-40.gpu_per_node", "gpus_per_node"),
    ("link object peak", lambda d: _edit(["nodes", 0, "intra_node_bandwidth_bytes_per_s"], "max_bytes_per_s",
                                         "max_bytes")(_node_link(d)),
     "nodes[0].intra_node_bandwidth_bytes_per_s.max_bytes", "max_bytes_per_s"),
    ("link object fit", lambda d: _edit(["nodes", 0, "intra_node_bandwidth_bytes_per_s"], "fit_gb_per_s",
                                        "fit_gbps")(_node_link(d)),
     "nodes[0].intra_node_bandwidth_bytes_per_s.fit_gbps", "fit_gb_per_s"),
]


@pytest.mark.parametrize("what, edit, field, closest", TYPO_CASES, ids=[c[0] for c in TYPO_CASES])
def test_every_unknown_cluster_key_is_refused_naming_the_closest_valid_key(tmp_path, capsys, what, edit, field,
                                                                           closest):
    code, out = _plan_file(tmp_path, edit(_cluster()), capsys=capsys)
    err = out.err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"field '{field}': unknown key" in err[0] and f"did you mean '{closest}'?" in err[0]
    assert str(tmp_path / "c.json") in err[0]


def test_a_misspelled_count_no_longer_plans_the_type_default(tmp_path, capsys):
    """The issue's case: {"num_device": 2} was given gpus_per_node (4) devices and planned silently, exit 0."""
    d = _cluster()
    d["nodes"] = [{"device_type": "A100-40", "num_device": 2, "intra_node_bandwidth_bytes_per_s": 2.4e11}] * 4
    code, out = _plan_file(tmp_path, d, capsys=capsys)
    assert code == 2 and "did you mean 'num_devices'?" in out.err


def test_a_node_without_a_device_count_is_refused(tmp_path, capsys):
    d = _cluster()
    del d["nodes"][1]["num_devices"]
    code, out = _plan_file(tmp_path, d, capsys=capsys)
    assert code == 2
    assert "field 'nodes[1].num_devices': node 1 (V100-16) gives no device count" in out.err
    assert 'add "num_devices": N' in out.err


def test_a_node_larger_than_gpus_per_node_is_planned_as_one_node_and_said(tmp_path, capsys):
    d = _cluster()
    d["nodes"][0]["num_devices"] = 6                       # A100-40's gpus_per_node is 4
    code, out = _plan_file(tmp_path, d, "--json", capsys=capsys)
    assert code == 0
    res = json.loads(out.out)
    note = [n for n in res["notes"] if n.startswith("node 0 has 6 A100-40 devices")]
    assert note and "more than the type's gpus_per_node 4: planned as one node of 6" in note[0]
    assert {n["num_devices"] for n in res["plan"]["cluster"]["nodes"]} == {6, 4}
    # the progress lines say it too
    code, out = _plan_file(tmp_path, d, capsys=capsys)
    assert code == 0 and "[hpp plan] note: node 0 has 6 A100-40 devices" in out.err


def test_an_unknown_gpu_type_names_the_closest_bundled_one(tmp_path, capsys):
    d = _cluster()
    d["nodes"][0]["device_type"] = "A100_40"
    code, out = _plan_file(tmp_path, d, capsys=capsys)
    assert code == 2 and "unknown GPU type 'A100_40'" in out.err and "did you mean 'A100-40'?" in out.err


def test_the_documented_cluster_example_loads():
    text = CLUSTER_FORMAT_HELP
    example = text[text.index("{"):text.index("\n  nodes (required)")]
    c = cluster_from_dict(json.loads(example), source="<help>")
    assert c.count_by_type() == {"A100-40": 4, "V100-16": 4}
    assert c.nodes[1].intra_node.fit_gb_per_s == (0.5, 10.0, 40.0)


def test_saved_and_embedded_clusters_still_load(tmp_path, capsys):
    """Plans embed their cluster (cluster_to_dict); the strict keys must accept every key it writes."""
    from hpp.profiles.cluster_format import cluster_to_dict
    for name, sc in SCENARIOS.items():
        c = sc.cluster()
        assert cluster_from_dict(cluster_to_dict(c)).count_by_type() == c.count_by_type(), name
    assert main(["estimate", str(ROOT / "experiments" / "plans" / "opt350-2pipelines-a100-v100.json")]) == 0


# --------------------------------------------------------------------------- 4. global flags

@pytest.mark.parametrize("argv", [["-v", "instances", "list"], ["-vv", "instances", "list", "--suite", "quick"],
                                  ["--verbose", "scenarios"], ["-v", "plan", "--help"]])
def test_global_verbose_flag_works_before_every_command(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:            # --help
        code = exc.code
    assert code == 0
    assert "unrecognized arguments" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "profile", "bench-solvers", "instances"])
def test_verbose_before_the_dispatched_commands_reaches_their_parser(command, capsys):
    """`hpp -v run ...` said "unrecognized arguments" (the flag went to the runtime's parser)."""
    with pytest.raises(SystemExit) as exc:
        main(["-v", command, "--help"])
    assert exc.value.code == 0
    assert f"usage: hpp {command}" in capsys.readouterr().out


@pytest.mark.distributed
def test_verbose_run_of_a_plan(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--quiet",
                 "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["-v", "run", str(plan), "--steps", "1", "--launcher", "fork", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured"]["iteration_time_s"] > 0


# --------------------------------------------------------------------------- 7. silent defaults

def test_cluster_without_model_or_profile_is_refused(tmp_path, capsys):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(_cluster()))
    assert main(["plan", "--cluster", str(f)]) == 2
    err = capsys.readouterr().err
    assert "field '--model': --cluster needs the model to plan" in err and "OPT-350" in err


def test_defaults_in_use_are_said(capsys):
    assert main(["plan", "--no-baselines", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "[hpp plan] using scenario opt350-a100x8-v100x8 (the default" in err
    assert "[hpp plan] using global batch 1024 samples (the scenario's; --gbs N)" in err


def test_a_small_global_batch_says_how_many_devices_are_idle_and_why(capsys):
    """--gbs 7 on 16 GPUs used 4 of them without a word."""
    assert main(["plan", "--gbs", "7", "--no-baselines", "--workers", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    used = {d for p in res["plan"]["pipelines"] for s in p["stages"] for d in s["device_ids"]}
    assert res["search"]["idle_devices"] == 16 - len(used) > 0
    note = [n for n in res["notes"] if "devices are idle" in n]
    assert note and note[0].startswith(f"{16 - len(used)} of 16 devices are idle")
    assert "the global batch of 7 samples allows at most 7 pipelines" in note[0]


def test_help_shows_the_defaults_and_the_cluster_format(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    for text in ("1024 with --cluster", "(default: 10.0)", "(default: 8)", "(default: cp-sat,",
                 "num_devices (required)", "fit_gb_per_s", "gpus_per_node = the type's usual node size"):
        assert text in " ".join(out.split()), text


# --------------------------------------------------------------------------- 8. one unusable type

def test_a_type_without_a_usable_tp_degree_is_left_out_not_refused(capsys):
    """LLAMA-3-8 on V100-16 is profiled at TP 4 only; --max-tp 2 refused the whole run."""
    assert main(["plan", "--scenario", "llama8-3types-40", "--max-tp", "2", "--no-baselines", "--workers", "1",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert any(n.startswith("V100-16 left out: LLAMA-3-8 on V100-16 is profiled only at TP [4] "
                            "(TP 4: above --max-tp 2)") for n in res["notes"])
    assert {s["device_type"] for p in res["plan"]["pipelines"] for s in p["stages"]} <= {"A100-40", "GH-96"}
    assert any("16 x V100-16" in n and "V100-16 left out (see above)" in n for n in res["notes"])


def test_v100_nodes_of_two_are_left_out_and_only_nothing_left_is_refused(tmp_path, capsys):
    gh = {"device_type": "GH-96", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 4e11}
    v2 = {"device_type": "V100-16", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1.5e11}
    f = tmp_path / "c.json"
    f.write_text(json.dumps(_cluster(nodes=[gh, gh, v2, v2])))
    args = ["plan", "--cluster", str(f), "--model", "LLAMA-3-8", "--gbs", "64", "--no-baselines", "--workers", "1"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "V100-16 left out" in out.err and "more than its nodes' 2 devices" in out.err
    f.write_text(json.dumps(_cluster(nodes=[v2, v2])))
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no GPU type of the cluster has a TP degree of LLAMA-3-8" in err[0]


# --------------------------------------------------------------------------- 10. Metis coverage

def _metis():
    return {"format": "metis-plan", "model": "OPT-350", "gbs": 512, "node_sequence": ["A100-40", "V100-16"],
            "num_nodes": {"A100-40": 4, "V100-16": 4}, "device_groups": [8, 8, 8, 8],
            "strategies": [[2, 4], [2, 4], [2, 4], [2, 4]], "batches": 32, "layer_partition": [0, 5, 12, 19, 26]}


def test_metis_import_names_the_missing_layers(tmp_path, capsys):
    d = _metis()
    d["layer_partition"] = [0, 5, 12, 19, 19]            # covered [0, 19): 19-25 missing
    f = tmp_path / "m.json"
    f.write_text(json.dumps(d))
    assert main(["estimate", str(f), "--format", "metis"]) == 2
    assert "layers 19-25 are missing (no stage holds them)" in capsys.readouterr().err


def test_metis_import_reports_the_layer_coverage_beside_another_defect():
    from hpp.interop.metis import plan_from_metis
    d = _metis()
    d["layer_partition"] = [0, 5, 12, 19]                 # 3 stages' worth: layers 19-25 missing
    d["strategies"][2] = [1, 4]                           # and a bad strategy, found first
    with pytest.raises(HppInputError) as exc:
        plan_from_metis(d, hpp.load_profile("OPT-350"), source="m.json")
    assert exc.value.field == "strategies[2]"
    assert "also layer_partition: layers 19-25 are missing" in str(exc.value)


# --------------------------------------------------------------------------- 5. bench-solvers output

def test_bench_solvers_writes_its_own_folder_and_never_over_existing_files(tmp_path, monkeypatch, capsys):
    from hpp.bench import cli as bench_cli
    results = ROOT / "experiments" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.glob("bench_solvers*")}
    monkeypatch.chdir(tmp_path)
    args = ["bench-solvers", "--instances", "opt350-a100x4-v100x4-s3b2", "--solvers", "heuristic",
            "--time-limit", "1", "--json"]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert {Path(p).parent for p in res["files"].values()} == {Path("bench_solvers_out")}
    assert all((tmp_path / p).is_file() for p in res["files"].values())
    # a second run refuses before solving anything
    monkeypatch.setattr("hpp.bench.solvers.run_bench", lambda *a, **k: pytest.fail("solved before refusing"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "bench_solvers_out/bench_solvers.csv exists" in err and "--force" in err
    assert bench_cli.DEFAULT_OUT_DIR == Path("bench_solvers_out")
    assert {p: p.stat().st_mtime_ns for p in results.glob("bench_solvers*")} == before


# --------------------------------------------------------------------------- 11. docs and API

def test_python_api_is_documented_and_exported():
    assert set(hpp.__all__) >= {"plan", "estimate", "load_cluster", "load_profile", "HppInputError"}
    for name in ("plan", "estimate", "load_cluster", "load_profile"):
        doc = getattr(hpp, name).__doc__
        assert doc and "Parameters" in doc and "Raises" in doc, name
    assert ">>> result = hpp.plan(" in hpp.__doc__


def test_python_api_round_trip(tmp_path):
    res = hpp.plan("opt350-a100x4-v100x4", "OPT-350", global_batch_size=32, workers=1, time_limit_s=2)
    from hpp.plan_data import write_plan_json
    path = tmp_path / "p.json"
    write_plan_json(res.plan, path)
    assert hpp.estimate(path).iteration_time_s == pytest.approx(res.estimate.iteration_time_s, rel=1e-12)
    with pytest.raises(HppInputError, match="neither a bundled model nor a profile file"):
        hpp.load_profile("OPT-9000")
    with pytest.raises(HppInputError, match="did you mean 'num_devices'"):
        hpp.load_cluster({"nodes": [{"device_type": "A100-40", "num_gpus": 4,
                                     "intra_node_bandwidth_bytes_per_s": 1e11}],
                          "inter_node_bandwidth_bytes_per_s": 1e10})


def test_the_contract_ships_in_the_repository_docs():
    doc = ROOT / "docs" / "CONTRACT.md"
    assert doc.is_file() and "`search.source`" in doc.read_text()


# --------------------------------------------------------------------------- requests wired into hpp plan

def test_a_scenario_can_be_planned_with_another_bundled_model(capsys):
    """H1: the tiny HF models plan on the bundled CPU cluster, keeping its global batch."""
    assert main(["plan", "--scenario", "cpu-hetero-4", "--model", "llama-tiny", "--max-tp", "2", "--no-baselines",
                 "--workers", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["model"] == "llama-tiny" and res["global_batch_size"] == SCENARIOS["cpu-hetero-4"].global_batch_size
    assert res["plan"]["profile"] == {"name": "llama-tiny"}


def test_replan_without_a_node_seeded_from_the_previous_plan(tmp_path, capsys):
    """H6: --exclude-nodes / --previous, the seed's survivors and the id map in search.replan."""
    prev = tmp_path / "prev.json"
    assert main(["plan", "--scenario", "opt350-a100x8-v100x8", "--no-baselines", "--workers", "1", "--quiet",
                 "--out", str(prev)]) == 0
    capsys.readouterr()
    assert main(["plan", "--previous", str(prev), "--exclude-nodes", "0", "--no-baselines", "--workers", "1",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["scenario"] == "opt350-a100x8-v100x8"       # the plan's cluster by its name, not the file's "prev"
    rp = res["search"]["replan"]
    assert rp["devices_before"] == 16 and rp["devices_after"] == 12 and rp["excluded_device_ids"] == [0, 1, 2, 3]
    assert rp["device_map"]["4"] == 0 and len(rp["device_map"]) == 12
    assert len(res["plan"]["cluster"]["nodes"]) == 3
    assert res["search"]["source"] in ("cp-sat", "heuristic", "previous")
    assert max(d for p in res["plan"]["pipelines"] for s in p["stages"] for d in s["device_ids"]) < 12


def test_hpp_run_on_a_json_of_another_format_names_the_command_that_reads_it(tmp_path, capsys):
    # hpp run has no --format: the fix names hpp plan --out and hpp estimate --format (the fresh-user trial's report)
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"format": "hpp-cluster", "version": 2}))
    assert main(["run", str(path), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster.json" in err[0] and "field 'format'" in err[0]
    assert "hpp plan --out" in err[0] and "hpp estimate --format sailor|metis" in err[0]
    assert "pass --format" not in err[0]
