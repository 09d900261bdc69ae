"""``hpp profiles``: what each bundled profile covers (GPU types, TP degrees, micro-batch sizes, dtype, sequence
length), and that a GPU type it lacks is one the public source has no measurement of."""

from __future__ import annotations

import json

from hpp.cli import main
from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.coverage import DTYPE_NOT_RECORDED, profile_coverage
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.profile_format import save_profile


def test_llama_3_8_coverage_is_its_entries_and_lacks_a100_80():
    prof = load_bundled_profile("LLAMA-3-8")
    c = profile_coverage(prof)
    got = {(t.device_type, tp, b) for t in c.types for tp, mbs in zip(t.tp_degrees, t.micro_batch_sizes)
           for b in mbs}
    assert got == set(prof.entries)
    a100 = next(t for t in c.types if t.device_type == "A100-40")
    assert (a100.tp_degrees, a100.micro_batch_sizes) == ((2, 4), ((1,), (1, 2)))      # the README's sparse pair
    assert c.catalogue_types_missing == ("A100-80", "RTX-2080", "RTX-3090", "Titan-RTX")
    assert (c.sequence_length, c.num_layers, c.dtype) == (8192, 35, DTYPE_NOT_RECORDED)
    assert any("V100-16 mbs 1 tp 8" in s for s in c.skipped)


def test_cpu_profiles_name_their_dtype_and_no_gpu_types():
    c = profile_coverage(load_bundled_profile("llama-tiny"))
    assert c.dtype == "float32" and c.catalogue_types_missing == () and c.sequence_length == 32
    assert [t.device_type for t in c.types] == ["cpu", "cpu-2x"]


def test_hpp_profiles_lists_every_bundled_profile(capsys):
    assert main(["profiles", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["profiles"]
    assert [r["model"] for r in rows] == list(bundled_models())
    llama = next(r for r in rows if r["model"] == "LLAMA-3-8")
    assert set(llama["device_types"]) == {"A100-40", "GH-96", "V100-16"}
    assert llama["device_types"]["V100-16"] == {"tp_degrees": [4], "micro_batch_sizes": {"4": [1]}}
    assert "A100-80" in llama["catalogue_types_missing"]
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "no entries for A100-80, RTX-2080, RTX-3090, Titan-RTX: the source has no measurement of LLAMA-3-8" in out
    assert "e.g. V100-32, is in none of them" in out


def test_hpp_profiles_of_a_file(tmp_path, capsys):
    f = tmp_path / "p.json"
    save_profile(load_bundled_profile("gpt-tiny"), f)
    assert main(["profiles", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpt-tiny: 6 layers, sequence length 128, dtype float32")
    assert main(["profiles", str(tmp_path / "missing.json")]) == 2


def test_types_missing_from_a_bundled_gpu_profile_are_missing_from_the_public_data(sailor_root):
    """What the listing says of a missing GPU type ("the source has no measurement") holds for every bundled GPU
    profile: no file of the artifact's three forms has that model on that type; and every (type, TP, micro-batch)
    of the artifact's simulator profile is covered or listed as left out."""
    sim = json.loads((sailor_root / "simulator-profiles.json").read_text())
    for model in bundled_models():
        c = profile_coverage(load_bundled_profile(model))
        if not c.catalogue_types_missing and not any(t.device_type in BUNDLED_DEVICE_TYPES for t in c.types):
            continue                                                  # a CPU profile
        assert model in sim
        for t in c.catalogue_types_missing:
            assert t not in sim[model]
            assert not (sailor_root / "sailor-format" / model / t).exists()
            assert not (sailor_root / "metis-format" / model / t).exists()
        covered = {(t.device_type, tp, b) for t in c.types for tp, mbs in zip(t.tp_degrees, t.micro_batch_sizes)
                   for b in mbs}
        for gpu, by_mbs in sim[model].items():
            for mbs, by_tp in by_mbs.items():
                for tp in by_tp:
                    key = (gpu, int(tp), int(mbs))
                    assert key in covered or any(f"{gpu} mbs {mbs} tp {tp}:" in s for s in c.skipped), key
