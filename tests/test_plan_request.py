"""One plan request for ``hpp plan`` and :func:`hpp.plan`: the same options give the same plan either way."""

from __future__ import annotations

import json

import pytest

import hpp
from hpp import HppInputError, load_cluster, load_profile
from hpp.cli import main
from hpp.plan_data import plan_to_dict
from hpp.request import build_request


def _plan_json(capsys, argv: list[str]) -> dict:
    assert main(["plan", *argv, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


def _without_predicted(plan: dict) -> dict:
    """The plan without its informational ``predicted`` block (``hpp plan`` fills it, the library leaves it empty)."""
    return {k: v for k, v in plan.items() if k != "predicted"}


def test_cli_and_library_return_the_same_plan_for_the_same_options(capsys):
    cli = _plan_json(capsys, ["--scenario", "cpu-hetero-4", "--no-baselines", "--workers", "1", "--max-stages", "3",
                              "--micro-batch-sizes", "1,2", "--memory-headroom", "0.1", "--seed", "3"])
    res = hpp.plan("cpu-hetero-4", "gpt-tiny", global_batch_size=cli["global_batch_size"], workers=1,
                   max_stages=3, micro_batch_sizes=[1, 2], memory_headroom=0.1, seed=3)
    lib = _without_predicted(plan_to_dict(res.plan))
    assert _without_predicted(cli["plan"]) == lib
    assert cli["search"]["objective_s"] == pytest.approx(res.search.objective_s, rel=1e-12)
    assert cli["search"]["bound_s"] == pytest.approx(res.search.bound_s, rel=1e-12)
    # control: another option changes the plan, so the equality above is not vacuous
    other = hpp.plan("cpu-hetero-4", "gpt-tiny", global_batch_size=cli["global_batch_size"], workers=1,
                     max_stages=1, micro_batch_sizes=[1], memory_headroom=0.1, seed=3)
    assert _without_predicted(plan_to_dict(other.plan)) != lib


def test_library_excludes_devices_as_the_cli_does(capsys):
    cli = _plan_json(capsys, ["--scenario", "cpu-hetero-4", "--no-baselines", "--workers", "1",
                              "--exclude-devices", "3"])
    res = hpp.plan("cpu-hetero-4", "gpt-tiny", global_batch_size=cli["global_batch_size"], workers=1,
                   exclude_devices=[3])
    assert _without_predicted(cli["plan"]) == _without_predicted(plan_to_dict(res.plan))
    assert cli["search"]["replan"]["devices_after"] == 3
    assert max(d for p in res.plan.pipelines for s in p.stages for d in s.device_ids) <= 2


def test_unknown_library_option_is_named():
    with pytest.raises(HppInputError, match="max_stage") as e:
        hpp.plan("cpu-hetero-4", "gpt-tiny", global_batch_size=8, max_stage=3)
    assert "max_stages" in str(e.value)


@pytest.mark.parametrize("kw, field, message", [
    ({"global_batch_size": 0}, "global_batch_size", "global batch size 0. Fix: give a positive integer number of samples"),
    ({"baseline_time_limit_s": 0.0}, "baseline_time_limit_s", "baseline time limit 0.0. Fix: give a positive number"),
    ({"solver": "gurobi"}, "solver", "unknown solver 'gurobi'. Fix: use one of cp-sat, milp, heuristic"),
    ({"exclude_devices": [4]}, "--exclude-devices", "device id 4 is not in the cluster (valid: 0..3)")])
def test_request_checks_its_values(kw, field, message):
    cl, prof = load_cluster("cpu-hetero-4"), load_profile("gpt-tiny")
    args = {"global_batch_size": 8, **kw}
    with pytest.raises(HppInputError) as e:
        build_request(cl, prof, **args)
    assert e.value.field == field and message in str(e.value) and "\n" not in str(e.value)


def test_comma_list_names_the_bad_list():
    import argparse

    from hpp.cliparse import comma_list
    assert comma_list(int)("8,16,") == [8, 16] and comma_list(float)("10,30") == [10.0, 30.0]
    with pytest.raises(argparse.ArgumentTypeError, match="'8,a' is not a comma-separated list of int"):
        comma_list(int)("8,a")


def test_request_is_frozen():
    req = build_request(load_cluster("cpu-hetero-4"), load_profile("gpt-tiny"), 8)
    with pytest.raises(AttributeError):
        req.global_batch_size = 16
    assert req.profile_ref == {"name": "gpt-tiny"} and req.full_cluster is None and req.excluded == frozenset()
