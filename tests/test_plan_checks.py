"""Plan, Pipeline and Stage check at construction what needs no other input."""

from dataclasses import replace

import pytest

from hpp.errors import HppInputError
from hpp.fileio import check_header
from hpp.plan_data import Pipeline, Plan, Stage, make_pipeline, plan_from_dict, plan_to_dict
from hpp.planner import PlannerConfig
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.cost_config import CostModelConfig


def _stage(lo, hi, ids=(0,), tp=1):
    return Stage(lo, hi, "X", tp, tuple(ids))


def _plan(pipes, gbs, layers=4):
    return Plan("toy", layers, gbs, tuple(pipes))


GOOD = Pipeline((_stage(0, 2, (0,)), _stage(2, 4, (1,))), 1, 4)


def test_valid_plan_builds_and_round_trips():
    plan = _plan([GOOD], 4)
    assert plan_from_dict(plan_to_dict(plan)) == plan


@pytest.mark.parametrize("args, field, pattern", [
    ((1, 1, "X", 1, (0,)), "layers", r"empty stage: layers \[1, 1\)"),
    ((2, 1, "X", 1, (0,)), "layers", r"empty stage"),
    ((-1, 1, "X", 1, (0,)), "layers", r"layers=\[-1, 1\)"),
    ((0, 1, "X", 2, (0,)), "device_ids", r"tp_degree=2 but 1 device ids"),
    ((0, 1, "X", 0, ()), "tp_degree", r"0 is not an integer >= 1"),
    ((0, 1, "X", 1, [0]), "device_ids", r"device_ids=\[0\]"),
    ((0, 1, "X", 1, (0,), "some"), "recompute", r"recompute='some'"),
])
def test_stage_refuses(args, field, pattern):
    with pytest.raises(HppInputError, match=pattern) as info:
        Stage(*args)
    assert info.value.field == field and info.value.fix


@pytest.mark.parametrize("stages, b, n, schedule, field, pattern", [
    ((), 1, 1, "GPipe", "stages", r"no stages"),
    ((_stage(0, 2), _stage(3, 4, (1,))), 1, 4, "1F1B", "stages[1].layers", r"skips layers"),
    ((_stage(0, 2), _stage(1, 4, (1,))), 1, 4, "1F1B", "stages[1].layers", r"repeats layers"),
    ((_stage(0, 4),), 0, 4, "1F1B", "micro_batch_size", r"0 is not an integer >= 1"),
    ((_stage(0, 4),), 1, -1, "1F1B", "num_samples", r"-1 is not an integer >= 0"),
    ((_stage(0, 4),), 1, 4, "zigzag", "schedule", r"schedule='zigzag'"),
    ((_stage(0, 2), _stage(2, 4, (1,))), 4, 4, "1F1B", "schedule", r"1F1B needs at least as many micro-batches"),
])
def test_pipeline_refuses(stages, b, n, schedule, field, pattern):
    with pytest.raises(HppInputError, match=pattern) as info:
        Pipeline(stages, b, n, schedule)
    assert info.value.field == field


@pytest.mark.parametrize("pipes, gbs, layers, field, pattern", [
    ([GOOD], 5, 4, "pipelines[*].num_samples", r"add up to 4, not the global batch size 5"),
    ([GOOD, GOOD], 8, 4, "pipelines[1].stages[0].device_ids", r"device 0 is used twice \(also by pipelines\[0\]"),
    ([GOOD], 4, 5, "pipelines[0].stages", r"stops at layer 4 but the model has 5 layers"),
    ([Pipeline((_stage(1, 4),), 1, 4)], 4, 4, "pipelines[0].stages[0].layers", r"starts at layer 1"),
    ([], 4, 4, "pipelines", r"no pipelines"),
    ([GOOD], 0, 4, "global_batch_size", r"0 is not an integer >= 1"),
    ([GOOD], 4, 0, "num_layers", r"0 is not an integer >= 1"),
])
def test_plan_refuses(pipes, gbs, layers, field, pattern):
    with pytest.raises(HppInputError, match=pattern) as info:
        _plan(pipes, gbs, layers)
    assert info.value.field == field


def test_replace_is_checked_too():
    """A Python-built plan cannot train on a partial batch: dataclasses.replace runs the checks."""
    with pytest.raises(HppInputError, match="add up to"):
        replace(_plan([GOOD], 4), global_batch_size=8)


def test_plan_file_names_source_and_full_field():
    d = plan_to_dict(_plan([GOOD], 4))
    d["pipelines"][0]["stages"][1]["layers"] = [3, 4]
    with pytest.raises(HppInputError, match=r"p\.json: field 'pipelines\[0\]\.stages\[1\]\.layers'.*skips"):
        plan_from_dict(d, source="p.json")
    d = plan_to_dict(_plan([GOOD], 4))
    d["pipelines"][0]["stages"][0]["tp_degree"] = 2
    with pytest.raises(HppInputError, match=r"p\.json: field 'pipelines\[0\]\.stages\[0\]\.device_ids'"):
        plan_from_dict(d, source="p.json")


def test_make_pipeline():
    p = make_pipeline((0, 1, 4), ("A", "B"), (1, 2), ((0,), (1, 2)), (True, "selective"), 2, 7)
    assert [s.recompute for s in p.stages] == ["full", "selective"] and p.num_micro_batches == 4
    assert p.schedule == "1F1B"
    with pytest.raises(HppInputError, match="tp_degree=1 but 2 device ids"):
        make_pipeline((0, 4), ("A",), (1,), ((0, 1),), (False,), 1, 1)


def test_check_header():
    for d, pattern in [([], "an x must be a JSON object"), ({"format": "y"}, "format is 'y', expected 'x'"),
                       ({"format": "x", "version": 9}, "version 9 is not supported")]:
        with pytest.raises(HppInputError, match=pattern):
            check_header(d, fmt="x", version=1, what="an x", source="f", format_fix="a", shape_fix="b")
    check_header({"format": "x", "version": 1}, fmt="x", version=1, what="an x", source="f", format_fix="a",
                 shape_fix="b")


def test_planner_config_of():
    cost = CostModelConfig(memory_headroom=0.1)
    assert PlannerConfig.of(cost).cost == cost and PlannerConfig.of(None) == PlannerConfig()
    cfg = PlannerConfig(space=SearchSpace(max_stages=3))
    assert PlannerConfig.of(cfg, pruning=None).space.max_stages == 3
    assert PlannerConfig.of(cfg, space=SearchSpace(max_stages=5)).space.max_stages == 5


def test_load_plan_is_one_trip(tmp_path, monkeypatch):
    """load_plan reads the file once and validates once (no plan -> resolve -> plan round trips)."""
    import hpp.resolve as resolve
    from hpp.plan_data import write_plan_json
    from hpp.profiles.cluster_format import cluster_to_dict
    from hpp.scenarios import get_scenario

    cluster = get_scenario("opt350-a100x4-v100x4").cluster()
    a100 = next(d.device_id for d in cluster.devices if d.device_type == "A100-40")
    plan = Plan("OPT-350", 26, 2, (Pipeline((Stage(0, 26, "A100-40", 1, (a100,)),), 2, 2),),
                profile_ref={"name": "OPT-350"}, cluster_ref=cluster_to_dict(cluster))
    path = tmp_path / "p.json"
    write_plan_json(plan, path)
    calls = {"read": 0, "validate": 0}

    def counted(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapped
    monkeypatch.setattr(resolve, "read_plan_json", counted("read", resolve.read_plan_json))
    monkeypatch.setattr(resolve, "validate_plan", counted("validate", resolve.validate_plan))
    got, cl, prof = resolve.load_plan(path)
    assert got == plan and cl.num_devices == cluster.num_devices and prof.model == "OPT-350"
    assert calls == {"read": 1, "validate": 1}
    data = plan_to_dict(plan)
    data.pop("profile")
    assert resolve.load_plan(path, data=data, require_profile=False)[2] is None
    assert calls == {"read": 1, "validate": 2}


def test_model_profile_refuses_misfiled_entry_and_bad_layer_count():
    from hpp.profiles.model_profile import ModelProfile
    from tests.synthetic import toy_profile

    e = next(iter(toy_profile({"X": 1.0}).entries.values()))
    with pytest.raises(HppInputError, match=r"the entry filed under \('Y', 1, 1\) is of \('X'") as info:
        ModelProfile("toy", e.num_layers, 1, {("Y", 1, 1): e})
    assert info.value.field == "entries"
    with pytest.raises(HppInputError, match="num_layers=0"):
        ModelProfile("toy", 0, 1, {})
