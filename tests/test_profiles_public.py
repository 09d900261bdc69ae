"""Loaders of the public Sailor and Metis formats: fidelity to the files, rules, and bad input."""

import json
import re

import pytest

from hpp.errors import HppInputError
from hpp.profiles.cluster import Link
from hpp.profiles.devices import DeviceType, device_type_from_dict
from hpp.profiles.model_profile import LayerProfile, ModelProfile, estimate_micro_batch
from hpp.profiles.public_metis import METIS_FORWARD_FRACTION, METIS_MEMORY_PARAM_FACTOR, load_metis_profiles
from hpp.profiles.public import load_sailor_profiles

MIB = 2 ** 20
OPT_TYPES = ("A100-40", "A100-80", "GH-96", "RTX-2080", "RTX-3090", "Titan-RTX", "V100-16")


def _metis_name(f):
    return tuple(int(x) for x in re.match(r"mbs(\d+)_tmp(\d+)\.json", f.name).groups())


# --- Sailor format -----------------------------------------------------------------------------------

@pytest.mark.parametrize("model,types", [("OPT-350", OPT_TYPES), ("GPT-Neo-2.7", ("A100-40", "A100-80", "V100-16")),
                                         ("LLAMA-3-8", ("A100-40", "GH-96"))])
def test_sailor_format_figures_equal_the_files(model, types, sailor_root):
    info = json.loads((sailor_root / "llm_info.json").read_text())[model]
    dirs = [sailor_root / "sailor-format" / model / t for t in types]
    p = load_sailor_profiles(model, dirs, sailor_root / "llm_info.json")
    assert p.device_types == tuple(sorted(types))
    n = 0
    for t in types:
        times = json.loads((sailor_root / "sailor-format" / model / t / "profile.json").read_text())
        for b, per_tp in times.items():
            for tp, layers in per_tp.items():
                e = p.entries[(t, int(tp), int(b))]
                rows = [layers[str(i)] for i in range(p.num_layers)]
                assert [list(x) for x in zip(e.forward_s, e.backward_s, e.optimizer_s)] == rows
                by = [info[tp][str(i)] for i in range(p.num_layers)]
                assert list(e.param_bytes) == [x["params_bytes"] for x in by]
                assert list(e.activation_bytes) == [int(b) * x["act_mem_bytes"] for x in by]
                assert list(e.output_bytes) == [int(b) * x["act_output_bytes"] for x in by]
                n += 1
    assert n == len(p.entries)


def test_sailor_model_directory_is_accepted(sailor_root):
    p = load_sailor_profiles("OPT-350", sailor_root / "sailor-format" / "OPT-350", sailor_root / "llm_info.json")
    assert p.device_types == OPT_TYPES and p.num_layers == 26


def test_sailor_gpt_neo_gh96_copy_of_opt_is_refused(sailor_root):
    with pytest.raises(HppInputError) as exc:
        load_sailor_profiles("GPT-Neo-2.7", sailor_root / "sailor-format" / "GPT-Neo-2.7",
                             sailor_root / "llm_info.json")
    msg = str(exc.value)
    assert "GH-96/profile.json" in msg and "26 layers" in msg and "34" in msg
    assert exc.value.source.endswith("GPT-Neo-2.7/GH-96/profile.json")


def test_sailor_tp_missing_in_llm_info_is_skipped_or_refused(sailor_root, caplog):
    sim, info = sailor_root / "simulator-profiles.json", sailor_root / "llm_info.json"
    p = load_sailor_profiles("LLAMA-3-8", sim, info, device_types=["V100-16"])
    assert list(p.entries) == [("V100-16", 4, 1)] and "llm_info has no TP 8" in caplog.text
    with pytest.raises(HppInputError, match=r"llm_info has no TP 8.*Fix:.*strict=False") as exc:
        load_sailor_profiles("LLAMA-3-8", sim, info, device_types=["V100-16"], strict=True)
    assert exc.value.field == "1.8"


# --- Metis format ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["OPT-350", "GPT-Neo-2.7"])
def test_metis_figures_follow_the_rules(model, sailor_root):
    root = sailor_root / "metis-format" / model
    p = load_metis_profiles(model, root)
    files = sorted(root.glob("*/mbs*_tmp*.json"))
    assert len(files) == len(p.entries)
    for f in files:
        b, t = _metis_name(f)
        d = json.loads(f.read_text())
        e = p.entries[(f.parent.name, t, b)]
        params = d["model"]["parameters"]["parameters_per_layer_bytes"]
        assert e.estimated and "assumed 1:2" in e.note
        assert list(e.param_bytes) == params
        assert list(e.output_bytes) == d["model"]["parameters"]["activation_parameters_bytes"]
        assert list(e.activation_bytes) == [round(m * MIB - 5 * q) for m, q in
                                            zip(d["execution_memory"]["layer_memory_total_mb"], params)]
        for fw, bw, c in zip(e.forward_s, e.backward_s, d["execution_time"]["layer_compute_total_ms"]):
            assert fw + bw == pytest.approx(c / 1000, rel=1e-12) and bw == pytest.approx(2 * fw, rel=1e-12)
        assert sum(e.optimizer_s) == pytest.approx(d["execution_time"]["optimizer_time_ms"] / 1000, rel=1e-12)
        assert e.optimizer_s[0] / e.optimizer_s[1] == pytest.approx(params[0] / params[1], rel=1e-9)


def test_metis_memory_is_five_times_params_plus_llm_info_activations(sailor_root):
    """layer_memory_total = 5 x param_bytes + b x act_mem_bytes, exactly, except one known layer."""
    assert METIS_MEMORY_PARAM_FACTOR == 5 and METIS_FORWARD_FRACTION == pytest.approx(1 / 3)
    info = json.loads((sailor_root / "llm_info.json").read_text())
    exceptions, checked = set(), 0
    for model in ("OPT-350", "GPT-Neo-2.7"):
        for f in sorted((sailor_root / "metis-format" / model).glob("*/mbs*_tmp*.json")):
            b, t = _metis_name(f)
            d = json.loads(f.read_text())
            for i, (m, q) in enumerate(zip(d["execution_memory"]["layer_memory_total_mb"],
                                           d["model"]["parameters"]["parameters_per_layer_bytes"])):
                checked += 1
                if m * MIB != METIS_MEMORY_PARAM_FACTOR * q + b * info[model][str(t)][str(i)]["act_mem_bytes"]:
                    exceptions.add((model, f.parent.name, t, i))
    assert checked > 4000
    # Known defect: OPT-350 on A100-80 at TP 4, layer 1 is b x 0.5 MiB below the rule (llm_info differs there).
    assert exceptions == {("OPT-350", "A100-80", 4, 1)}


def test_metis_and_sailor_formats_agree_on_fwd_plus_bwd(sailor_root):
    sailor = load_sailor_profiles("OPT-350", [sailor_root / "sailor-format/OPT-350/A100-40"],
                                  sailor_root / "llm_info.json")
    metis = load_metis_profiles("OPT-350", [sailor_root / "metis-format/OPT-350/A100-40"])
    common = set(sailor.entries) & set(metis.entries)
    assert len(common) >= 9
    for k in common:
        s, m = sailor.entries[k], metis.entries[k]
        assert [f + g for f, g in zip(s.forward_s, s.backward_s)] == pytest.approx(
            [f + g for f, g in zip(m.forward_s, m.backward_s)], abs=2e-6)
        assert s.activation_bytes == m.activation_bytes and s.output_bytes == m.output_bytes


def test_metis_llama_inconsistent_layer_lists_are_refused(sailor_root):
    with pytest.raises(HppInputError) as exc:
        load_metis_profiles("LLAMA-3-8", sailor_root / "metis-format" / "LLAMA-3-8")
    assert "35 values but model.num_layers is 34" in str(exc.value)
    assert exc.value.source.endswith(".json") and "LLAMA-3-8" in exc.value.source
    assert exc.value.field == "model.parameters.parameters_per_layer_bytes"


# --- bad input (synthetic files) ---------------------------------------------------------------------

def _llm_info(tmp_path, layers=2, tps=(1,)):
    row = {"params_bytes": 100, "act_output_bytes": 10, "act_mem_bytes": 20}
    path = tmp_path / "llm_info.json"
    path.write_text(json.dumps({"M": {str(t): {str(i): row for i in range(layers)} for t in tps}}))
    return path


def _gpu(tmp_path, name, layers=2, text=None):
    d = tmp_path / name
    d.mkdir()
    body = {"1": {"1": {str(i): [0.1, 0.2, 0.01] for i in range(layers)}}}
    (d / "profile.json").write_text(text if text is not None else json.dumps(body))
    return d


def test_missing_file_is_named(tmp_path):
    with pytest.raises(HppInputError, match="cannot read llm_info file") as exc:
        load_sailor_profiles("M", [_gpu(tmp_path, "A100-40")], tmp_path / "nope.json")
    assert exc.value.source == str(tmp_path / "nope.json")


def test_malformed_json_is_named(tmp_path):
    d = _gpu(tmp_path, "A100-40", text='{"1": {"1": ')
    with pytest.raises(HppInputError, match="not valid JSON") as exc:
        load_sailor_profiles("M", [d], _llm_info(tmp_path))
    assert exc.value.source == str(d / "profile.json")


def test_unknown_gpu_type_is_named(tmp_path):
    d = _gpu(tmp_path, "H100-XX")
    with pytest.raises(HppInputError, match=r"unknown GPU type 'H100-XX'.*known_device_types") as exc:
        load_sailor_profiles("M", [d], _llm_info(tmp_path))
    assert exc.value.field == "device_type" and "H100-XX" in exc.value.source
    p = load_sailor_profiles("M", [d], _llm_info(tmp_path), known_device_types=["H100-XX"])
    assert p.device_types == ("H100-XX",)


def test_layer_count_differing_between_device_types_is_refused(tmp_path):
    dirs = [_gpu(tmp_path, "A100-40", 2), _gpu(tmp_path, "V100-16", 2), _gpu(tmp_path, "GH-96", 3)]
    with pytest.raises(HppInputError, match=r"differs between device types: GH-96 has 3 layers") as exc:
        load_sailor_profiles("M", dirs, _llm_info(tmp_path))
    assert exc.value.source == str(dirs[2] / "profile.json")


def test_layer_count_differing_from_llm_info_is_refused(tmp_path):
    with pytest.raises(HppInputError, match="times have 3 layers but llm_info gives"):
        load_sailor_profiles("M", [_gpu(tmp_path, "A100-40", 3)], _llm_info(tmp_path, layers=2))


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "x"])
def test_negative_or_bad_time_names_the_field(tmp_path, bad):
    body = {"1": {"1": {"0": [0.1, 0.2, 0.0], "1": [bad, 0.2, 0.0]}}}
    d = _gpu(tmp_path, "A100-40", text=json.dumps(body))
    with pytest.raises(HppInputError, match="fwd_s is") as exc:
        load_sailor_profiles("M", [d], _llm_info(tmp_path))
    assert exc.value.field == "1.1.1"


@pytest.mark.parametrize("text,field", [
    ('{"1": {"1": {"0": [0.1, 0.2, 0.0], "0": [0.1, 0.2, 0.0]}}}', "0"),
    ('{"1": {"1": {"0": [0.1, 0.2, 0.0]}}, "01": {"1": {"0": [0.1, 0.2, 0.0]}}}', "01"),
])
def test_duplicate_entries_are_refused(tmp_path, text, field):
    d = _gpu(tmp_path, "A100-40", text=text)
    with pytest.raises(HppInputError, match="duplicate") as exc:
        load_sailor_profiles("M", [d], _llm_info(tmp_path, layers=1))
    assert exc.value.field == field and exc.value.source == str(d / "profile.json")


def test_same_device_type_twice_is_refused(tmp_path):
    d = _gpu(tmp_path, "A100-40")
    with pytest.raises(HppInputError, match="given twice"):
        load_sailor_profiles("M", [d, d], _llm_info(tmp_path))


def test_negative_bytes_in_llm_info_name_the_field(tmp_path):
    path = tmp_path / "llm_info.json"
    path.write_text(json.dumps({"M": {"1": {"0": {"params_bytes": -1, "act_output_bytes": 1, "act_mem_bytes": 1}}}}))
    with pytest.raises(HppInputError, match="params_bytes is -1") as exc:
        load_sailor_profiles("M", [_gpu(tmp_path, "A100-40", 1)], path)
    assert exc.value.field == "M.1.0.params_bytes"


def test_metis_missing_field_and_negative_activation(tmp_path):
    d = tmp_path / "A100-40"
    d.mkdir()
    good = {"model": {"model_name": "M", "num_layers": 1, "parameters": {
        "parameters_per_layer_bytes": [MIB], "activation_parameters_bytes": [8]}},
        "execution_time": {"optimizer_time_ms": 3.0, "layer_compute_total_ms": [3.0]},
        "execution_memory": {"layer_memory_total_mb": [6.0]}}
    (d / "mbs1_tmp1.json").write_text(json.dumps(good))
    e = load_metis_profiles("M", [d]).entries[("A100-40", 1, 1)]
    assert (e.activation_bytes, e.optimizer_s) == ((MIB,), (0.003,))
    assert e.forward_s == pytest.approx((0.001,)) and e.backward_s == pytest.approx((0.002,))
    good["execution_memory"]["layer_memory_total_mb"] = [4.0]
    (d / "mbs1_tmp1.json").write_text(json.dumps(good))
    with pytest.raises(HppInputError, match="activation bytes would be") as exc:
        load_metis_profiles("M", [d])
    assert exc.value.field == "execution_memory.layer_memory_total_mb[0]"
    del good["execution_time"]["optimizer_time_ms"]
    (d / "mbs1_tmp1.json").write_text(json.dumps(good))
    with pytest.raises(HppInputError, match="missing field") as exc:
        load_metis_profiles("M", [d])
    assert exc.value.field == "execution_time.optimizer_time_ms" and exc.value.source.endswith("mbs1_tmp1.json")


@pytest.mark.parametrize("memory_bytes", [0, -1])
def test_zero_or_negative_capacity_is_refused(memory_bytes):
    with pytest.raises(HppInputError, match="memory_bytes"):
        DeviceType("X", memory_bytes, 4)
    with pytest.raises(HppInputError) as exc:
        device_type_from_dict("X", {"memory_bytes": memory_bytes, "gpus_per_node": 4}, source="c.json")
    assert exc.value.source == "c.json" and exc.value.field == "device_types.X.memory_bytes"


@pytest.mark.parametrize("bw", [0.0, -1e9])
def test_zero_or_negative_bandwidth_is_refused(bw):
    with pytest.raises(HppInputError, match="bandwidth"):
        Link(bw)


# --- estimate_micro_batch ----------------------------------------------------------------------------

def _entry(b, fwd, act):
    return LayerProfile("X", 1, b, forward_s=fwd, backward_s=tuple(2 * f for f in fwd), optimizer_s=(0.5, 0.5),
                        param_bytes=(100, 200), activation_bytes=act, output_bytes=(10 * b, 10 * b))


def test_estimate_micro_batch_hand_computed():
    p = ModelProfile("toy", 2, 16, {("X", 1, 1): _entry(1, (1.0, 2.0), (100, 300)),
                                    ("X", 1, 2): _entry(2, (1.5, 3.0), (150, 500))})
    e = estimate_micro_batch(p, "X", 1, 4)
    # nearest measured b0 = 2, slope from (1, 2): y(4) = y(2) + 2 * (y(2) - y(1))
    assert e.forward_s == (2.5, 5.0) and e.backward_s == (5.0, 10.0)
    assert e.activation_bytes == (250, 900) and e.output_bytes == (40, 40)
    assert e.param_bytes == (100, 200) and e.optimizer_s == (0.5, 0.5)
    assert e.estimated and e.micro_batch_size == 4 and "estimated" in e.note
    assert p.layer_profile("X", 1, 4) == e
    with pytest.raises(HppInputError, match="no measurement at micro-batch 4"):
        p.layer_profile("X", 1, 4, estimate=False)


def test_estimate_micro_batch_single_size_is_proportional():
    p = ModelProfile("toy", 2, 16, {("X", 1, 2): _entry(2, (1.0, 2.0), (100, 300))})
    e = estimate_micro_batch(p, "X", 1, 3)
    assert e.forward_s == (1.5, 3.0) and e.activation_bytes == (150, 450) and e.estimated
