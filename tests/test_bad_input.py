"""Bad input gets a clear error naming the file, the field and the fix (never a deep traceback)."""

import json

import pytest

from hpp.cli import main
from hpp.errors import HppInputError
from hpp.plan_data import Pipeline, Plan, Stage, plan_from_dict
from hpp.resolve import load_plan
from hpp.validate import validate_plan
from tests.synthetic import toy_cluster, toy_profile

PROFILE = toy_profile({"X": 1.0})
CLUSTER = toy_cluster([("X", 4)], memory={"X": 10_000})


def _plan(stages_list, samples, gbs):
    return Plan("toy", 3, gbs, tuple(Pipeline(tuple(st), 1, n) for st, n in zip(stages_list, samples)))


def _plan_dict(stages_list, samples, gbs):
    """A plan JSON object: stages as (lo, hi, type, tp, ids) tuples (invalid ones are refused when built)."""
    return {"format": "hpp-plan", "version": 1, "model": "toy", "num_layers": 3, "global_batch_size": gbs,
            "pipelines": [{"micro_batch_size": 1, "num_samples": n, "schedule": "GPipe",
                           "stages": [{"layers": [lo, hi], "device_type": t, "tp_degree": tp, "device_ids": list(ids)}
                                      for lo, hi, t, tp, ids in st]}
                          for st, n in zip(stages_list, samples)]}


@pytest.mark.parametrize("stages, samples, gbs, pattern", [
    ([[(0, 1, "X", 1, (0,)), (2, 3, "X", 1, (1,))]], [3], 3, r"pipelines\[0\]\.stages\[1\]\.layers.*skips"),
    ([[(0, 2, "X", 1, (0,)), (1, 3, "X", 1, (1,))]], [3], 3, r"repeats"),
    ([[(0, 1, "X", 1, (0,)), (1, 1, "X", 1, (1,)), (1, 3, "X", 1, (2,))]], [3], 3, r"empty stage"),
    ([[(0, 3, "X", 1, (0,))], [(0, 3, "X", 1, (0,))]], [1, 2], 3, r"device 0 is used twice"),
    ([[(0, 3, "X", 1, (0,))]], [2], 3, r"add up to 2, not the global batch size 3"),
    ([[(0, 2, "X", 1, (0,))]], [3], 3, r"stops at layer 2 but the model has 3 layers"),
    ([[(0, 3, "X", 2, (0,))]], [3], 3, r"tp_degree=2 but 1 device ids"),
])
def test_structure_messages(stages, samples, gbs, pattern):
    """What needs no cluster is refused when the plan is built (hpp.plan), naming the file and the field."""
    with pytest.raises(HppInputError, match=pattern) as info:
        plan_from_dict(_plan_dict(stages, samples, gbs), source="plan.json")
    assert "plan.json" in str(info.value) and "Fix:" in str(info.value)


def test_validator_messages():
    """What needs the cluster is refused by validate_plan."""
    with pytest.raises(HppInputError, match=r"device 9 does not exist") as info:
        validate_plan(_plan([[Stage(0, 3, "X", 1, (9,))]], [3], 3), CLUSTER, PROFILE, source="plan.json")
    assert "plan.json" in str(info.value) and "Fix:" in str(info.value)


def test_unknown_gpu_type_in_plan():
    with pytest.raises(HppInputError, match=r"device 0 is a X, not a Y"):
        validate_plan(_plan([[Stage(0, 3, "Y", 1, (0,))]], [3], 3), CLUSTER, PROFILE)


def test_plan_json_structure_errors(tmp_path):
    with pytest.raises(HppInputError, match=r"format is 'sailor'"):
        plan_from_dict({"format": "sailor"}, source="p.json")
    bad = {"format": "hpp-plan", "version": 1, "num_layers": 3, "global_batch_size": 3,
           "pipelines": [{"micro_batch_size": 2, "num_samples": 3, "num_micro_batches": 5,
                          "stages": [{"layers": [0, 3], "device_type": "X", "device_ids": [0]}]}]}
    with pytest.raises(HppInputError, match=r"pipelines\[0\]\.num_micro_batches.*ceil\(3/2\)=2"):
        plan_from_dict(bad, source="p.json")
    f = tmp_path / "broken.json"
    f.write_text("{not json")
    with pytest.raises(HppInputError, match=r"broken.json.*not valid JSON"):
        load_plan(f)
    with pytest.raises(HppInputError, match=r"missing.json.*cannot read"):
        load_plan(tmp_path / "missing.json")


def test_cli_exit_code_2_and_one_line(tmp_path, capsys):
    f = tmp_path / "broken.json"
    f.write_text("[]")
    assert main(["estimate", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.json" in err[0]
    assert main(["plan", "--scenario", "nope"]) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err
    assert main(["plan", "--scenario", ""]) == 2             # used to plan the default scenario silently
    assert "field '--scenario': --scenario ''" in capsys.readouterr().err


def test_cluster_file_errors(tmp_path, capsys):
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"nodes": [{"device_type": "H900", "num_devices": 4,
                                        "intra_node_bandwidth_bytes_per_s": 1e11}],
                             "inter_node_bandwidth_bytes_per_s": 1e9}))
    assert main(["plan", "--cluster", str(c), "--model", "OPT-350"]) == 2
    assert "unknown GPU type 'H900'" in capsys.readouterr().err
    c.write_text(json.dumps({"nodes": [{"device_type": "A100-40", "num_devices": 4,
                                        "intra_node_bandwidth_bytes_per_s": 0}],
                             "inter_node_bandwidth_bytes_per_s": 1e9}))
    assert main(["plan", "--cluster", str(c), "--model", "OPT-350"]) == 2
    err = capsys.readouterr().err
    assert "nodes[0].intra_node_bandwidth_bytes_per_s" in err and "bandwidth" in err


@pytest.mark.parametrize("argv, message", [
    (["plan", "--gbs", "0"], "--gbs 0"),
    (["plan", "--gbs", "-5"], "--gbs -5"),
    (["plan", "--time-limit", "-1"], "--time-limit -1"),
    (["plan", "--max-stages", "0"], "--max-stages 0"),
    (["plan", "--model", "nope"], "field '--model': no bundled profile for model 'nope'"),
    (["plan", "--scenario", "opt350-512", "--cluster", "c.json"], "--scenario cannot be combined with --cluster"),
    (["plan", "--model", "OPT-350", "--profile", "p.json"], "give --profile or --model, not both"),
    (["plan", "--scenario", "opt350-3types-40", "--exclude-devices", "40"],
     "field '--exclude-devices': device id 40 is not in the cluster (valid: 0..39)"),
    (["plan", "--scenario", "opt350-a100x4-v100x4", "--exclude-nodes", "0,1"],
     "leaves none of the cluster's 8"),
    (["plan", "--scenario", "opt350-3types-40", "--exclude-devices", "3,x"], "'3,x' is not a list of ids"),
])
def test_plan_flags_out_of_range(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Fix:" in err[0]


@pytest.mark.parametrize("argv, message", [
    (["plan", "--micro-batch-sizes", "16", "--no-baselines"],
     "profiled for OPT-350 at micro-batch sizes 16 (profiled: A100-40: 1,2,4,8; V100-16: 1,2,4,8)"),
    (["plan", "--micro-batch-sizes", "3,5", "--no-baselines"], "at micro-batch sizes 3,5"),
    (["plan", "--out", "/nonexistent-folder/x/plan.json"], "cannot write /nonexistent-folder/x/plan.json"),
    (["estimate", "plan.json", "--out", "/nonexistent-folder/x/p.json"], "cannot write /nonexistent-folder/x/p.json"),
])
def test_unprofiled_micro_batch_and_unwritable_out_fail_before_the_search(argv, message, capsys, monkeypatch):
    import hpp.planner
    called = []
    monkeypatch.setattr(hpp.planner, "build_candidates_bounded", lambda *a, **k: called.append(1) or ([], [], {}))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Fix:" in err[0], err
    assert called == []          # refused before any candidate was built (no negative "shortfall")


def test_micro_batch_list_that_is_not_numbers_names_the_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--micro-batch-sizes", "1,x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--micro-batch-sizes: '1,x' is not a comma-separated list of integers" in err
    assert "lambda" not in err


def test_types_without_a_requested_micro_batch_size_are_left_out_and_said():
    from hpp.formulation.space_limits import SearchSpace
    from hpp.planner import plan_hpp
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import make_cluster

    cl = make_cluster("gh-a100", {"GH-96": 4, "A100-40": 4})
    said = []
    res = plan_hpp(cl, load_bundled_profile("OPT-350"), 256, space=SearchSpace(micro_batch_sizes=(16,)),
                   progress=said.append)
    assert res.stats["types_left_out"] == ["A100-40"]
    assert said[0] == "left out (no profile at micro-batch sizes 16): A100-40"
    assert {s.device_type for p in res.plan.pipelines for s in p.stages} == {"GH-96"}
    assert all(p.micro_batch_size == 16 for p in res.plan.pipelines)


@pytest.mark.parametrize("argv, words", [
    (["plan", "--gbs", "abc"], "hpp plan: error: argument --gbs: invalid int value: 'abc'. Fix: see hpp plan --help"),
    (["plan", "--solver", "foo"], "hpp plan: error: argument --solver: invalid choice: 'foo'"),
    (["plan", "--no-such-flag"], "hpp plan: error: unknown option --no-such-flag. Fix: see hpp plan --help"),
    ([], "hpp: error: the following arguments are required: command. Fix: see hpp --help"),
    (["run"], "hpp run: error: the following arguments are required: plan, --steps. Fix: see hpp run --help"),
    (["bench-solvers", "--suite"], "hpp bench-solvers: error: argument --suite: expected one argument"),
])
def test_parse_errors_are_one_line_with_the_fix_and_no_usage_block(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Fix: see " in err and "usage:" not in err, err
