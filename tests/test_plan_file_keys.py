"""A plan file's keys are checked like a cluster file's (an unknown key is refused, naming the closest known one),
and a plan whose ``model`` is not its profile's model is refused with the known names."""

from __future__ import annotations

import json

import pytest

from hpp.cli import main
from hpp.errors import HppInputError
from hpp.plan_data import plan_from_dict, plan_to_dict
from hpp.planner import PlannerConfig, plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.resolve import load_plan
from hpp.scenarios import get_scenario


@pytest.fixture(scope="module")
def doc():
    """The JSON object of the cpu-hetero-4 plan (gpt-tiny)."""
    sc = get_scenario("cpu-hetero-4")
    res = plan_hpp(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size, config=PlannerConfig())
    return json.loads(json.dumps(plan_to_dict(res.plan)))


def _edit(doc, fn):
    d = json.loads(json.dumps(doc))
    fn(d)
    return d


@pytest.mark.parametrize("edit, field, near", [
    (lambda d: d.update(globl_batch_size=3), "globl_batch_size", "global_batch_size"),
    (lambda d: d["pipelines"][1].update(micro_batch=2), "pipelines[1].micro_batch", "micro_batch_size"),
    (lambda d: d["pipelines"][0]["stages"][0].update(recompte="full"), "pipelines[0].stages[0].recompte",
     "recompute"),
    (lambda d: d.update(profile={"nmae": "gpt-tiny"}), "profile.nmae", "name"),
    (lambda d: d.update(cluster={"pth": "c.json"}), "cluster.pth", "path"),
])
def test_an_unknown_key_is_refused_naming_the_closest(doc, tmp_path, edit, field, near):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_edit(doc, edit)))
    with pytest.raises(HppInputError) as info:
        load_plan(f)
    msg = str(info.value)
    assert f"{f}: field '{field}': unknown key" in msg and f"did you mean {near!r}?" in msg
    f.write_text(json.dumps(doc))
    load_plan(f)                                                           # control: the plan as written


def test_a_profile_given_two_ways_and_a_reference_not_an_object_are_refused(doc, tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_edit(doc, lambda d: d.update(profile={"name": "gpt-tiny", "path": "x.json"}))))
    with pytest.raises(HppInputError, match=r"field 'profile': the profile is given 2 ways"):
        load_plan(f)
    with pytest.raises(HppInputError, match=r"field 'profile': profile is not an object"):
        plan_from_dict(_edit(doc, lambda d: d.update(profile="gpt-tiny")), source="p.json")


def test_a_model_name_typo_fails_estimate_with_the_known_names(doc, tmp_path, capsys):
    f = tmp_path / "typo.json"
    f.write_text(json.dumps(_edit(doc, lambda d: d.update(model="gpt-tiy"))))
    assert main(["estimate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{f}: field 'model': model 'gpt-tiy' is not the model of the plan's profile" in err
    assert "gpt-tiny" in err and "LLAMA-3-8" in err and "OPT-350" in err
    with pytest.raises(HppInputError, match="is not the model of the plan's profile"):
        load_plan(f, require_profile=False)                                # hpp run's loader refuses it too
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(_edit(doc, lambda d: d.update(model="GPT-TINY"))))     # case does not matter
    assert main(["estimate", str(ok)]) == 0
