"""The instance format, the library and the seeded generators (hpp/bench/instances.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hpp.errors import HppInputError
from hpp.bench.instances import FAMILIES, SyntheticSpec, get_instance, library, scenario_instance, synthetic_instance
from hpp.bench.instance_format import (InstanceOptions, instance_from_dict, instance_to_dict, load_instance, save_instance)
from hpp.profiles.profile_format import save_profile


def _small() -> SyntheticSpec:
    return SyntheticSpec(num_types=2, num_gpus=8, num_layers=8, seed=3,
                         options=InstanceOptions(max_tp=1, micro_batch_sizes=(2,), max_stages=2))


def test_synthetic_roundtrip_through_a_file_gives_the_same_problem(tmp_path):
    inst = synthetic_instance(_small())
    path = tmp_path / "i.json"
    save_instance(inst, path)
    back = load_instance(path)
    assert back.name == inst.name and back.global_batch_size == inst.global_batch_size
    assert back.options == inst.options and back.generator == inst.generator
    assert instance_to_dict(back) == instance_to_dict(inst)
    p1, _ = inst.problem()
    p2, _ = back.problem()
    assert [c.label() for c in p1.candidates] == [c.label() for c in p2.candidates]


def test_generator_is_deterministic_and_seeded():
    a = instance_to_dict(synthetic_instance(_small()))
    b = instance_to_dict(synthetic_instance(_small()))
    c = instance_to_dict(synthetic_instance(replace(_small(), seed=4)))
    assert a == b
    assert a["profile"] != c["profile"]
    assert SyntheticSpec.from_dict(a["generator"]) == _small()


def test_bundled_and_file_profile_references(tmp_path):
    inst = scenario_instance("opt350-a100x4-v100x4")
    d = instance_to_dict(inst)
    assert d["profile"] == {"bundled": "OPT-350"} and d["format"] == "hpp-instance" and d["version"] == 1
    # a file reference is relative to the instance file
    save_profile(synthetic_instance(_small()).load_profile(), tmp_path / "prof.json")
    d2 = instance_to_dict(synthetic_instance(_small()))
    d2["profile"] = {"file": "prof.json"}
    (tmp_path / "inst.json").write_text(json.dumps(d2))
    back = load_instance(tmp_path / "inst.json")
    assert back.load_profile().num_layers == 8


def test_library_suites_cover_the_stated_ranges():
    quick = library("quick")
    names = [i.name for i in quick]
    assert len(names) == len(set(names))
    assert any(i.family == "scenario" for i in quick) and any(i.family.startswith("synthetic") for i in quick)
    assert max(i.num_gpus for i in quick) <= 64
    full_axes = {fam: vals for fam, (_, _, vals) in FAMILIES.items()}
    assert min(full_axes["types"]) == 2 and max(full_axes["types"]) == 6
    assert min(full_axes["gpus"]) == 8 and max(full_axes["gpus"]) == 4096
    assert min(full_axes["layers"]) == 8 and max(full_axes["layers"]) == 128
    assert get_instance(names[0]).name == names[0]


def test_quick_library_builds_small_problems():
    for inst in library("quick"):
        problem, _ = inst.problem()
        assert 1 <= len(problem.candidates) <= 1000, inst.name


def _valid() -> dict:
    return instance_to_dict(synthetic_instance(_small()))


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="nope"), "format is 'nope', expected 'hpp-instance'"),
    (lambda d: d.update(version=7), "version 7 is not supported"),
    (lambda d: d.pop("cluster"), "missing field 'cluster'"),
    (lambda d: d.update(global_batch_size=0), "field 'global_batch_size': global_batch_size=0"),
    (lambda d: d["options"].update(max_stage=3), "unknown option(s) ['max_stage']"),
    (lambda d: d["options"].update(max_stages=0), "field 'options.max_stages': max_stages=0"),
    (lambda d: d["options"].update(micro_batch_sizes=[]), "field 'options.micro_batch_sizes'"),
    (lambda d: d.update(profile={"bundled": "GPT-9"}),
     "instance names a missing profile: no bundled profile for model 'GPT-9'"),
    (lambda d: d.update(profile={"file": "nowhere.json"}), "instance names a missing profile: file"),
    (lambda d: d.update(profile={"bundled": "OPT-350", "file": "x"}), "give exactly one of"),
    (lambda d: d.update(profile={"bundled": "OPT-350"}), "GPU type 'S0' has no profile for OPT-350"),
    (lambda d: d["cluster"]["nodes"][0].update(num_devices=-1), "field 'cluster.nodes[0].num_devices'"),
])
def test_bad_instances_get_clear_messages(mutate, message):
    d = _valid()
    mutate(d)
    with pytest.raises(HppInputError) as exc:
        instance_from_dict(d, source="bad.json")
    assert message in str(exc.value)
    assert "bad.json" in str(exc.value)


def test_bad_files_and_names(tmp_path):
    with pytest.raises(HppInputError, match="cannot read instance file"):
        load_instance(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(HppInputError, match="not valid JSON"):
        load_instance(tmp_path / "x.json")
    with pytest.raises(HppInputError, match="unknown suite 'huge'"):
        library("huge")
    with pytest.raises(HppInputError, match="no instance named 'nope' in the library"):
        get_instance("nope")
    with pytest.raises(HppInputError, match="num_types=7"):
        SyntheticSpec(num_types=7)
    with pytest.raises(HppInputError, match="num_layers=200"):
        SyntheticSpec(num_layers=200)
