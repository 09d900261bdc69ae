"""Cluster format version 2 (links per pair of node groups): parsing, defaults, bad input."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hpp.cli import main
from hpp.errors import HppInputError
from hpp.profiles.cluster import Link
from hpp.profiles.cluster_format import cluster_from_dict, cluster_to_dict
from hpp.profiles.network import default_inter_node_link, default_intra_node_link, default_pair_link
from hpp.scenarios import get_scenario

TYPES = {t: {"memory_bytes": 10**12, "gpus_per_node": 2} for t in ("X", "Y")}

ROOT = Path(__file__).resolve().parents[1]


def _v2(nodes, links=None, **top):
    return {"version": 2, "device_types": TYPES, "nodes": nodes, **({"links": links} if links else {}), **top}


def test_bundled_types_default_to_sailor_fits_per_pair():
    c = cluster_from_dict({"version": 2, "nodes": [{"device_type": "A100-40", "num_devices": 4},
                                                   {"device_type": "GH-96", "num_devices": 4},
                                                   {"device_type": "GH-96", "num_devices": 4},
                                                   {"device_type": "V100-16", "num_devices": 2}]})
    assert c.per_pair
    assert c.node_link(0, 1) == default_pair_link("A100-40", "GH-96")                 # 2.42 GB/s
    assert c.node_link(1, 2) == default_pair_link("GH-96", "GH-96")                   # 22.9 GB/s
    assert c.node_link(0, 3) == default_pair_link("A100-40", "V100-16")               # 1.72 GB/s
    assert c.node_link(3, 3) == default_intra_node_link("V100-16", 2)
    assert round(c.node_link(1, 2).max_bytes_per_s / 1e9, 1) == 22.9
    # the one-link view (inter_node) is the slowest pair, as the version-1 default was
    assert c.inter_node == default_inter_node_link(["A100-40", "GH-96", "V100-16"])


def test_explicit_links_win_and_round_trip():
    d = {"version": 2, "zones": ["a", "b"],
         "nodes": [{"device_type": "A100-40", "num_devices": 4, "zone": "a"},
                   {"device_type": "A100-40", "num_devices": 4, "zone": "a",
                    "intra_node_bandwidth_bytes_per_s": 3e11},
                   {"device_type": "V100-16", "num_devices": 4, "zone": "b"}],
         "links": {"intra_node": {"A100-40": 2e11},
                   "inter_node": [{"between": ["A100-40", "A100-40"], "link": {"max_bytes_per_s": 1e10,
                                                                              "latency_s": 2e-6}}],
                   "zones": [{"between": ["b", "a"], "link": 5e8}]}}
    c = cluster_from_dict(d)
    assert c.nodes[0].intra_node == Link(2e11) and c.nodes[1].intra_node == Link(3e11)
    assert c.node_link(0, 1) == Link(1e10, 2e-6)
    assert c.node_link(0, 2) == Link(5e8) == c.type_link("V100-16", "A100-40", "b", "a")     # zones differ
    assert c.inter_node == Link(5e8)
    back = cluster_from_dict(json.loads(json.dumps(cluster_to_dict(c))))
    assert back == c and cluster_to_dict(back)["version"] == 2
    assert c.link_bound(["A100-40", "V100-16"]).max_bytes_per_s == 3e11
    assert c.link_bound(["A100-40", "V100-16"]).latency_s == 2e-6


def test_version_1_still_reads_and_writes_version_1():
    d = {"nodes": [{"device_type": "X", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 100},
                   {"device_type": "Y", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 50}],
         "inter_node_bandwidth_bytes_per_s": 10, "device_types": TYPES}
    c = cluster_from_dict(d)
    assert not c.per_pair and c.node_link(0, 1) == c.inter_node == Link(10.0)
    assert cluster_to_dict(c)["version"] == 1 and "links" not in cluster_to_dict(c)
    assert c.link_bound(["X", "Y"]) == Link(100.0)


@pytest.mark.parametrize("d, message, field", [
    (_v2([{"device_type": "X", "num_devices": 2}, {"device_type": "Y", "num_devices": 2}],
         {"intra_node": {"X": 1, "Y": 1}}),
     "no inter-node link between X and Y: the cluster holds both", "links.inter_node"),
    (_v2([{"device_type": "X", "num_devices": 2}, {"device_type": "X", "num_devices": 2}], {"intra_node": {"X": 1}}),
     "no inter-node link between X and X", "links.inter_node"),
    ({"version": 2, "nodes": [{"device_type": "A100-40", "num_devices": 4},
                              {"device_type": "RTX-2080", "num_devices": 8}]},
     "no inter-node link between A100-40 and RTX-2080", "links.inter_node"),        # Sailor measured no such pair
    (_v2([{"device_type": "X", "num_devices": 2, "zone": "c"}], {"intra_node": {"X": 1}}, zones=["a"]),
     "unknown zone 'c'", "nodes[0].zone"),
    (_v2([{"device_type": "X", "num_devices": 2, "zone": "a"}],
         {"intra_node": {"X": 1}, "zones": [{"between": ["a", "q"], "link": 1}]}, zones=["a"]),
     "unknown zone 'q'", "links.zones[0].between"),
    (_v2([{"device_type": "X", "num_devices": 2, "zone": "a"}, {"device_type": "X", "num_devices": 2, "zone": "b"}],
         {"intra_node": {"X": 1}}, zones=["a", "b"]),
     "no link between zones a and b", "links.zones"),
    (_v2([{"device_type": "X", "num_devices": 2}, {"device_type": "Y", "num_devices": 2}],
         {"intra_node": {"X": 1, "Y": 1}, "inter_node": [{"between": ["X", "Y"], "link": -5e9}]}),
     "bandwidth must be a positive number of bytes/s, got -5000000000.0", "links.inter_node[0].link"),
    (_v2([{"device_type": "X", "num_devices": 2}], {"intra_node": {"X": -1}}),
     "bandwidth must be a positive", "links.intra_node.X"),
    # the key at fault, a typo named as such, version 2's keys without "version": 2
    (_v2([{"device_type": "X", "num_devices": 2}, {"device_type": "Y", "num_devices": 2}],
         {"intra_node": {"X": 1, "Y": 1}, "inter_node": [{"between": ["X", "Y"], "link": {"max_bytes_per_s": -1}}]}),
     "bandwidth must be a positive", "links.inter_node[0].link.max_bytes_per_s"),
    (_v2([{"device_type": "X", "num_devices": 2}, {"device_type": "Y", "num_devices": 2}],
         {"intra_node": {"X": 1, "Y": 1}, "inter_node": [{"betwen": ["X", "Y"], "link": 1}]}),
     "unknown key 'betwen'. Fix: did you mean 'between'?", "links.inter_node[0].betwen"),
    ({"nodes": [{"device_type": "X", "num_devices": 2}], "device_types": TYPES, "links": {"intra_node": {"X": 1}}},
     "'links' belong to version 2 but the file has no version (1 by default). Fix: add \"version\": 2", "version"),
    ({"version": 1, "nodes": [{"device_type": "X", "num_devices": 2}], "device_types": TYPES, "zones": ["a"],
      "links": {}}, "'links' and 'zones' belong to version 2 but the file says version 1", "version"),
    (_v2([{"device_type": "X", "num_devices": 2}], {"intra_node": {"X": 1}, "inter": []}),
     "unknown key 'inter'", "links.inter"),
    (_v2([{"device_type": "X", "num_devices": 2}], {"intra_node": {"X": 1}}, inter_node_bandwidth_bytes_per_s=1),
     "unknown key 'inter_node_bandwidth_bytes_per_s'", "inter_node_bandwidth_bytes_per_s"),
    (_v2([{"device_type": "X", "num_devices": 2}]),
     "no intra-node link for device type 'X'", "links.intra_node.X"),
    (_v2([{"device_type": "X", "num_devices": 2}], {"intra_node": {"X": 1},
                                                    "inter_node": [{"between": ["X", "X"], "link": 1},
                                                                   {"between": ["X", "X"], "link": 2}]}),
     "the pair ['X', 'X'] is given twice", "links.inter_node[1]"),
])
def test_bad_version_2_input_is_one_line(d, message, field):
    with pytest.raises(HppInputError) as exc:
        cluster_from_dict(d, source="c.json")
    assert message in str(exc.value) and exc.value.field == field, str(exc.value)
    assert "\n" not in str(exc.value) and exc.value.source == "c.json"


def test_cli_exits_2_on_a_missing_pair(tmp_path, capsys):
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"version": 2, "nodes": [{"device_type": "A100-40", "num_devices": 4},
                                                     {"device_type": "RTX-2080", "num_devices": 8}]}))
    assert main(["plan", "--cluster", str(c), "--model", "OPT-350", "--time-limit", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no inter-node link between A100-40 and RTX-2080" in err and len(err.splitlines()) == 1


def test_bundled_scenarios_are_per_pair_and_keep_a_one_link_form():
    sc = get_scenario("opt350-1024-4types")
    new, old = sc.cluster(), sc.cluster(per_pair=False)
    assert new.per_pair and not old.per_pair and new.inter_node == old.inter_node
    gh = [i for i, n in enumerate(new.nodes) if n.device_type == "GH-96"][:2]
    assert new.node_link(*gh).max_bytes_per_s > 10 * old.node_link(*gh).max_bytes_per_s


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["A100-40", "A100-80", "V100-16", "GH-96"]), min_size=1, max_size=5),
       st.lists(st.floats(1e3, 1e10), min_size=2, max_size=2))
def test_link_bound_is_never_slower_than_any_link(types, sizes):
    c = cluster_from_dict({"version": 2, "nodes": [{"device_type": t, "num_devices": 4} for t in types]})
    bound = c.link_bound(set(types))
    for i in range(len(c.nodes)):
        for j in range(len(c.nodes)):
            for x in sizes:
                assert bound.transfer_s(x) <= c.node_link(i, j).transfer_s(x)


def test_links_no_node_can_use_are_noted(tmp_path, capsys):
    """A type-pair link naming a type no node has, and zone links without zoned nodes, are said (a typo in a
    node's type or zone would otherwise pass); the header names the cluster by its "name", not the file."""
    from hpp.profiles.cluster_notes import cluster_notes
    c = cluster_from_dict(_v2([{"device_type": "X", "num_devices": 2}, {"device_type": "X", "num_devices": 2}],
                              {"intra_node": {"X": 1}, "inter_node": [{"between": ["X", "X"], "link": 1},
                                                                      {"between": ["X", "Y"], "link": 1}],
                               "zones": [{"between": ["a", "b"], "link": 1}]}, zones=["a", "b"]))
    assert cluster_notes(c) == ["links.inter_node: X-Y name a device type no node has: not used",
                                "links.zones: no node has a zone, so the zone links are not used",
                                "inter-node links X-X give no figures for several flows at once (aggregate, "
                                "nic_bytes_per_s): flows leaving a node are priced as if they did not share its "
                                "network (`hpp profile-network` measures it)"]
    assert cluster_notes(get_scenario("opt350-a100x8-v100x8").cluster()) == []
    path = tmp_path / "file-stem.json"
    path.write_text(json.dumps({"version": 2, "name": "my-two-types", "nodes": [
        {"device_type": "A100-40", "num_devices": 4}, {"device_type": "V100-16", "num_devices": 4}]}))
    assert main(["plan", "--cluster", str(path), "--model", "OPT-350", "--no-baselines", "--workers", "1",
                 "--quiet", "--default-links"]) == 0
    assert "HPP plan for OPT-350 on my-two-types: 8 devices" in capsys.readouterr().out


def test_links_left_out_of_a_cluster_file_need_default_links_and_are_noted(tmp_path, capsys):
    """A cluster file without the links its nodes use would plan on one public cloud's measurements: refused in one
    line naming them, unless --default-links, which the progress lines then state."""
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"version": 2, "nodes": [{"device_type": "A100-40", "num_devices": 4},
                                                        {"device_type": "V100-16", "num_devices": 4}],
                                "links": {"intra_node": {"V100-16": 1.5e11}}}))
    args = ["plan", "--cluster", str(path), "--model", "OPT-350", "--gbs", "64", "--no-baselines", "--workers", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{path}" in err and "field 'links'" in err
    assert "no link given for inter_node A100-40-V100-16, intra_node A100-40" in err and "--default-links" in err
    assert main(["estimate", str(ROOT / "experiments" / "plans" / "opt350-2pipelines-a100-v100.json"),
                 "--cluster", str(path)]) == 2
    assert "--default-links" in capsys.readouterr().err
    assert main([*args, "--default-links"]) == 0
    err = capsys.readouterr().err
    assert ("note: links not in the file: inter_node A100-40-V100-16, intra_node A100-40 are Sailor's measured fits "
            "of one public cloud (us-central1-a; --default-links accepted them)") in err
    # a file that gives every link it uses needs no flag; its plain-number links share nothing, which is said
    path.write_text(json.dumps({"version": 2, "nodes": [{"device_type": "A100-40", "num_devices": 4},
                                                        {"device_type": "V100-16", "num_devices": 4}],
                                "links": {"intra_node": {"A100-40": 2e11, "V100-16": 1.5e11},
                                          "inter_node": [{"between": ["A100-40", "V100-16"], "link": 2e9}]}}))
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "links not in the file" not in err
    assert "note: inter-node links A100-40-V100-16 give no figures for several flows at once" in err
