"""Default links from Sailor's network fits: fidelity to the files and the documented rules."""

import json
from importlib import resources

import pytest

from hpp.errors import HppInputError
from hpp.profiles.network import default_inter_node_link, default_intra_node_link
from hpp.profiles.network import network_table_from_sailor

ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def fits(sailor_root):
    net = sailor_root / "network"
    return (json.loads((net / "intra_node_bandwidths.json").read_text()),
            json.loads((net / "multizone_bandwidths_het.json").read_text())[ZONE])


def _as_fit(link):
    return [list(link.fit_gb_per_s), link.max_bytes_per_s]


@pytest.mark.parametrize("gpu,n,measured", [("A100-40", 4, "4"), ("A100-40", 2, "2"), ("RTX-2080", 8, "8"),
                                            ("A100-40", 8, "4"), ("GH-96", 3, "2"), ("V100-16", 1, "2")])
def test_intra_node_link_is_the_measured_fit(fits, gpu, n, measured):
    assert _as_fit(default_intra_node_link(gpu, n)) == fits[0][gpu][measured]


@pytest.mark.parametrize("gpu", ["A100-40", "V100-16", "GH-96", "Titan-RTX", "RTX-2080", "RTX-3090"])
def test_inter_node_link_of_one_type_is_its_own_fit(fits, gpu):
    assert _as_fit(default_inter_node_link([gpu])) == fits[1][gpu]["1"][ZONE][gpu]["1"]
    assert _as_fit(default_inter_node_link([gpu], num_devices=4)) == fits[1][gpu]["4"][ZONE][gpu]["4"]


def test_inter_node_pair_takes_the_slower_measured_link(fits):
    mixed = default_inter_node_link(["A100-40", "V100-16", "A100-40"])
    assert _as_fit(mixed) == fits[1]["A100-40"]["1"][ZONE]["V100-16"]["1"]
    rtx = default_inter_node_link(["Titan-RTX", "RTX-3090"])
    assert rtx.max_bytes_per_s < 0.2e9 < default_inter_node_link(["Titan-RTX"]).max_bytes_per_s
    assert rtx.max_bytes_per_s == min(fits[1]["Titan-RTX"]["1"][ZONE]["RTX-3090"]["1"][1],
                                      fits[1]["RTX-3090"]["1"][ZONE]["Titan-RTX"]["1"][1])


def test_a100_80_uses_a100_40_inter_node_fit():
    assert default_inter_node_link(["A100-80"]) == default_inter_node_link(["A100-40"])
    assert default_inter_node_link(["A100-80", "GH-96"]).max_bytes_per_s == pytest.approx(2.42e9, rel=1e-3)


def test_link_bandwidth_follows_the_fit():
    link = default_intra_node_link("A100-40", 4)
    a, b, c = link.fit_gb_per_s
    assert link.bandwidth_bytes_per_s(8e6) == pytest.approx((a * 9 + b * 3 + c) * 1e9)
    assert link.bandwidth_bytes_per_s(1e12) == link.max_bytes_per_s


@pytest.mark.parametrize("call,match", [
    (lambda: default_intra_node_link("H100-XX", 4), "H100-XX"),
    (lambda: default_intra_node_link("A100-40", 0), "num_devices"),
    (lambda: default_inter_node_link([]), "no device types"),
    (lambda: default_inter_node_link(["A100-40", "TPU"]), "'TPU'"),
    (lambda: default_inter_node_link(["A100-40"], num_devices=-2), "num_devices"),
])
def test_bad_network_requests_are_refused(call, match):
    with pytest.raises(HppInputError, match=match):
        call()


def test_bundled_network_table_equals_the_source(sailor_root):
    net = sailor_root / "network"
    table = network_table_from_sailor(net / "intra_node_bandwidths.json", net / "multizone_bandwidths_het.json")
    bundled = json.loads(resources.files("hpp.profiles").joinpath("data").joinpath("network.json").read_text())
    assert {k: bundled[k] for k in table} == table
    assert "cf2c8e3" in bundled["source"] and bundled["licence"] == "MIT, Copyright ETH Zurich"


@pytest.mark.parametrize("bw", [0, -5.0])
def test_zero_or_negative_measured_bandwidth_names_the_field(tmp_path, sailor_root, bw):
    bad = tmp_path / "intra.json"
    bad.write_text(json.dumps({"A100-40": {"2": [[0.1, 1.0, 2.0], bw]}}))
    with pytest.raises(HppInputError, match="peak bandwidth") as exc:
        network_table_from_sailor(bad, sailor_root / "network" / "multizone_bandwidths_het.json")
    assert exc.value.source == str(bad) and exc.value.field == "A100-40.2"
