"""Bundled profiles: contents, round trip, fidelity to the public Sailor files, regeneration."""

import importlib.util
import json
from importlib import resources
from pathlib import Path

import pytest

from hpp.errors import HppInputError
from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.profile_format import load_profile, profile_from_dict, profile_to_dict, save_profile

EXPECTED = {  # model -> (device types, layers, sequence length)
    "OPT-350": (("A100-40", "A100-80", "GH-96", "RTX-2080", "RTX-3090", "Titan-RTX", "V100-16"), 26, 2048),
    "GPT-Neo-2.7": (("A100-40", "A100-80", "GH-96", "V100-16"), 34, 2048),
    "LLAMA-3-8": (("A100-40", "GH-96", "V100-16"), 35, 8192),
}
DATA = resources.files("hpp.profiles").joinpath("data")


def test_bundled_models_are_the_three_converted_ones_and_our_cpu_profiles():
    assert bundled_models() == tuple(sorted([*EXPECTED, "gpt-tiny", "opt-tiny", "gpt-neo-tiny", "llama-tiny"]))
    tiny = load_bundled_profile("gpt-tiny")
    assert "hpp profile" in tiny.source and "cpu" in tiny.device_types


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_bundled_profile_shape_and_provenance(model):
    p = load_bundled_profile(model)
    types, layers, seq = EXPECTED[model]
    assert (p.device_types, p.num_layers, p.sequence_length) == (types, layers, seq)
    assert "eth-easl/sailor commit cf2c8e3" in p.source and "act_mem_bytes" in p.source
    assert p.licence == "MIT, Copyright ETH Zurich"
    assert all(e.num_layers == layers and not e.estimated for e in p.entries.values())


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_bundled_profile_round_trips_through_json(model, tmp_path):
    p = load_bundled_profile(model)
    assert profile_from_dict(json.loads(json.dumps(profile_to_dict(p)))) == p
    save_profile(p, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == p


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_bundled_figures_equal_the_public_files(model, sailor_root):
    sim = json.loads((sailor_root / "simulator-profiles.json").read_text())[model]
    info = json.loads((sailor_root / "llm_info.json").read_text())[model]
    p = load_bundled_profile(model)
    expected_keys = {(g, int(t), int(b)) for g in sim for b in sim[g] for t in sim[g][b] if t in info}
    assert set(p.entries) == expected_keys
    for (g, t, b), e in p.entries.items():
        rows = [sim[g][str(b)][str(t)][str(i)] for i in range(p.num_layers)]
        by = [info[str(t)][str(i)] for i in range(p.num_layers)]
        assert list(e.forward_s) == [r[0] for r in rows]
        assert list(e.backward_s) == [r[1] for r in rows]
        assert list(e.optimizer_s) == [r[2] for r in rows]
        assert list(e.param_bytes) == [x["params_bytes"] for x in by]
        assert list(e.activation_bytes) == [b * x["act_mem_bytes"] for x in by]
        assert list(e.output_bytes) == [b * x["act_output_bytes"] for x in by]


def test_llama_skips_tp8_and_records_it():
    p = load_bundled_profile("LLAMA-3-8")
    assert p.tp_degrees("V100-16") == (4,)
    assert any("tp 8" in s for s in p.meta["skipped_entries"])


def test_gpt_neo_a100_80_zero_optimizer_is_flagged():
    p = load_bundled_profile("GPT-Neo-2.7")
    e = p.layer_profile("A100-80", 1, 1)
    assert sum(e.optimizer_s) == 0 and "not measured" in e.note
    assert len(p.meta["defects"]) == 13


def test_llama_sequence_length_from_llm_info(sailor_root):
    info = json.loads((sailor_root / "llm_info.json").read_text())
    assert info["LLAMA-3-8"]["1"]["1"]["act_output_floats"] == 8192 * 4096
    assert info["OPT-350"]["1"]["1"]["act_output_floats"] == 2048 * 1024
    assert info["GPT-Neo-2.7"]["1"]["1"]["act_output_floats"] == 2048 * 2560


def test_unknown_bundled_model_lists_the_available_ones():
    with pytest.raises(HppInputError) as exc:
        load_bundled_profile("GPT-5")
    assert "GPT-5" in str(exc.value) and "OPT-350" in str(exc.value) and exc.value.field == "model"


def test_notice_carries_the_sailor_licence(sailor_root):
    notice = DATA.joinpath("NOTICE").read_text()
    assert (sailor_root / "LICENSE").read_text() in notice
    assert "cf2c8e3" in notice and "profile-OPT-350.json" in notice and "network.json" in notice


def test_device_table_equals_cluster_basic(sailor_root):
    basic = json.loads((sailor_root / "cluster-basic.json").read_text())
    assert {k: (v["mem_per_gpu"], v["gpus_per_node"]) for k, v in basic.items() if k != "zone"} == {
        d.name: (d.memory_bytes, d.gpus_per_node) for d in BUNDLED_DEVICE_TYPES.values()}


def test_data_is_small_and_compact():
    sizes = {p.name: len(p.read_bytes()) for p in DATA.iterdir()}
    assert sum(sizes.values()) < 2_000_000
    assert "\n " not in DATA.joinpath("profile-OPT-350.json").read_text()


def test_generator_reproduces_the_bundled_data(sailor_root, tmp_path):
    script = Path(__file__).resolve().parents[1] / "experiments" / "convert_public_profiles.py"
    spec = importlib.util.spec_from_file_location("convert_public_profiles", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--sailor", str(sailor_root), "--out", str(tmp_path)]) == 0
    for f in tmp_path.iterdir():
        assert f.read_text() == DATA.joinpath(f.name).read_text(), f.name
