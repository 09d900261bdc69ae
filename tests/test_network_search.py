"""The search prices stage-to-stage transfers per pair of adjacent stage kinds.

The batched stage balance equals the per-shape DP on a version-2 cluster, and both equal an
exhaustive enumeration of the partitions priced with the cost model's own functions on the links
:func:`~hpp.formulation.collectives.p2p_link_options` names.
"""

import itertools
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from hpp.formulation.space_limits import SearchSpace, common_micro_batch_sizes, stage_kinds
from hpp.formulation.candidates import enumerate_shapes
from hpp.formulation.collectives import p2p_link_options
from hpp.formulation.cost_model import stage_time_s
from hpp.formulation.stage_balance import StageBalancer, StageKind
from hpp.formulation.stage_balance_batch import PartitionBatch, balance_pairs
from hpp.profiles.cluster_format import cluster_from_dict
from hpp.profiles.model_profile import ModelProfile
from hpp.formulation.stage_costs import StageCostCache
from hpp.pruning.rules import PruningOptions
from tests.synthetic import toy_profile

TYPES = {t: {"memory_bytes": 10**12, "gpus_per_node": 4} for t in ("X", "Y")}


def _with_tp2(p: ModelProfile) -> ModelProfile:
    """The profile plus TP-2 entries (half the time and bytes per device)."""
    entries = dict(p.entries)
    for e in p.entries.values():
        e2 = replace(e, tp_degree=2, forward_s=tuple(x / 2 for x in e.forward_s),
                     backward_s=tuple(x / 2 for x in e.backward_s))
        entries[e2.key] = e2
    return ModelProfile(p.model, p.num_layers, p.sequence_length, entries, p.source, p.licence)


PROFILE = _with_tp2(toy_profile({"X": 1.0, "Y": 1.7}, fwd=(1.0, 2.0, 3.0, 1.5, 2.5, 1.0), act=(10,) * 6,
                                params=(100,) * 6, out=(400, 900, 300, 800, 500, 600), opt=(0.1,) * 6))


def cluster():
    nodes = [{"device_type": "X", "num_devices": 2}] * 3 + [{"device_type": "Y", "num_devices": 4}] * 2
    links = {"intra_node": {"X": 1000, "Y": 800},
             "inter_node": [{"between": ["X", "Y"], "link": 100}, {"between": ["X", "X"], "link": 300},
                            {"between": ["Y", "Y"], "link": 200}]}
    return cluster_from_dict({"version": 2, "device_types": TYPES, "nodes": nodes, "links": links, "latency_s": 0})


def _balancer(cl, *, packed=True):
    cache = StageCostCache(PROFILE, {t: 10**12 for t in TYPES}, cl.inter_node, pair_links=partial(p2p_link_options, cl))
    return StageBalancer(cache, packed_p2p=packed)


def _links(cl, shape, i, packed):
    """The options of stage i's transfer out (oracle: recomputed from the rule, not from the balancer)."""
    a, b = shape[i], shape[i + 1]
    run = None
    if packed and a == b:
        run = next((r for r in range(1, len(shape) - i) if i + r + 1 >= len(shape) or shape[i + r + 1] != a),
                   len(shape) - i - 1)
    return p2p_link_options(cl, a, b, run=run)


def _best_oracle(cl, shape, packed):
    """Least bottleneck (max stage time D_s) over all partitions, each stage priced by stage_time_s."""
    L, S = PROFILE.num_layers, len(shape)
    e = {k: PROFILE.layer_profile(k.device_type, k.tp_degree, 1) for k in set(shape)}
    best = np.inf
    for cuts in itertools.combinations(range(1, L), S - 1):
        b = (0, *cuts, L)
        times = []
        for i, k in enumerate(shape):
            opts_in = _links(cl, shape, i - 1, packed) if i > 0 else None
            opts_out = _links(cl, shape, i, packed) if i < S - 1 else None
            # the fastest option per transfer: price each combination, keep the least (waits add up)
            t = min(stage_time_s(e[k], b[i], b[i + 1], "none", link_in=li, link_out=lo)
                    for li in (opts_in or [None]) for lo in (opts_out or [None]))
            times.append(t)
        best = min(best, max(times))
    return best


X1, Y1, X2 = StageKind("X", 1), StageKind("Y", 1), StageKind("X", 2)


@pytest.mark.parametrize("shape", [(X1, X1, X1), (X1, X1, Y1), (X1, Y1, Y1, Y1), (X2, X2), (X1, X1, X1, X1)])
@pytest.mark.parametrize("packed", [True, False])
def test_dp_equals_exhaustive_partitions_on_per_pair_links(shape, packed):
    cl = cluster()
    part = _balancer(cl, packed=packed).balance(shape, 1)
    assert part.bottleneck_s == pytest.approx(_best_oracle(cl, shape, packed), rel=1e-12)


def test_packed_rule_prices_the_node_crossings_a_packed_binding_has():
    cl = cluster()         # X nodes of 2: two TP-1 X stages per node
    # a run of 3 X stages packed from its end: stages (0 | 1, 2): 0 -> 1 crosses nodes, 1 -> 2 does not
    assert p2p_link_options(cl, X1, X1, run=2)[0].max_bytes_per_s == 300
    assert p2p_link_options(cl, X1, X1, run=1)[0].max_bytes_per_s == 1000
    # TP 2 fills an X node: every pair of X TP-2 stages crosses
    assert [l.max_bytes_per_s for l in p2p_link_options(cl, X2, X2, run=1)] == [300]
    # the lower-bound rule offers both
    assert [l.max_bytes_per_s for l in p2p_link_options(cl, X1, X1)] == [1000, 300]


def test_batched_balance_equals_the_per_shape_dp_on_a_per_pair_cluster():
    cl = cluster()
    space = SearchSpace(max_stages=4, max_tp=2)
    shapes = list(enumerate_shapes(cl, stage_kinds(cl, PROFILE, space), space, PruningOptions(), PROFILE.num_layers))
    pairs = [(i, b) for i, s in enumerate(shapes) for b in common_micro_batch_sizes(PROFILE, s, space)]
    batch, _ = balance_pairs(_balancer(cl), shapes, pairs)
    bal, rows = _balancer(cl), []
    for i, b in pairs:
        part, few = bal.balance_both(shapes[i], b)
        if part is not None:
            rows += [(i, b, 0, part)] + ([(i, b, 1, few)] if few is not None else [])
    want = PartitionBatch.from_partitions(rows, PROFILE.num_layers)
    assert len(batch) == len(want) > 10
    got, exp = batch.partitions(), want.partitions()
    assert [p.boundaries for p in got] == [p.boundaries for p in exp]
    assert [p.bottleneck_s for p in got] == [p.bottleneck_s for p in exp]
    assert [p.fill_s for p in got] == [p.fill_s for p in exp]


def _zoned(cross_link: float | None, zone_link: float = 5e8) -> dict:
    """2 A100-40 nodes and 1 V100-16 node in zone a, 1 GH-96 node in zone b: GH meets the others across zones
    only, so its type-pair links (``cross_link``; None: not given) are links no pair of nodes uses."""
    pairs = [{"between": ["A100-40", "A100-40"], "link": 1.25e10}, {"between": ["A100-40", "V100-16"], "link": 1.7e9}]
    if cross_link is not None:
        pairs += [{"between": [t, "GH-96"], "link": cross_link} for t in ("A100-40", "V100-16")]
    return {"format": "hpp-cluster", "version": 2, "name": "zoned", "zones": ["a", "b"],
            "nodes": [{"device_type": "A100-40", "num_devices": 4, "zone": "a"},
                      {"device_type": "A100-40", "num_devices": 4, "zone": "a"},
                      {"device_type": "V100-16", "num_devices": 4, "zone": "a"},
                      {"device_type": "GH-96", "num_devices": 4, "zone": "b"}],
            "links": {"inter_node": pairs, "zones": [{"between": ["a", "b"], "link": zone_link}]}}


def test_links_no_pair_of_nodes_uses_do_not_change_the_plan(tmp_path, capsys):
    """The search priced a ring edge between types on the type pair's link even where every
    such pair of nodes crosses zones (the cost model: the zone link); an unused link 1e7 made OPT-350 37 % slower."""
    import json
    from hpp.cli import main
    got = []
    for cross in (1e7, 1e12, None):         # slow, fast, absent (it was refused after the candidates were built)
        path = tmp_path / f"c-{cross}.json"
        path.write_text(json.dumps(_zoned(cross)))
        assert main(["plan", "--cluster", str(path), "--model", "OPT-350", "--gbs", "256", "--no-baselines", "--default-links",
                     "--workers", "1", "--quiet", "--json"]) == 0
        res = json.loads(capsys.readouterr().out)
        got.append((json.dumps(res["plan"]["pipelines"]), res["search"]["objective_s"], res["search"]["bound_s"]))
    assert got[0] == got[1] == got[2]
    # control: the zone link itself is used, so changing it changes the figures
    path = tmp_path / "slow-zone.json"
    path.write_text(json.dumps(_zoned(1e7, zone_link=1e7)))
    assert main(["plan", "--cluster", str(path), "--model", "OPT-350", "--gbs", "256", "--no-baselines", "--default-links",
                 "--workers", "1", "--quiet", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["search"]["objective_s"], res["search"]["bound_s"]) != got[0][1:]


def test_network_scenarios_refuses_an_unknown_scenario_in_one_line(capsys, monkeypatch):
    import importlib.util
    import sys
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "network_scenarios", Path(__file__).resolve().parents[1] / "experiments" / "network_scenarios.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)      # its dataclass needs its module registered
    spec.loader.exec_module(mod)
    for argv, says in ((["--scenarios", "foo"], "--scenarios: unknown 'foo' (hpp scenarios lists them)"),
                       (["--scenarios", "opt350-a100x4-v100x4", "--repeats", "0"], "--repeats: give 1 or more")):
        with pytest.raises(SystemExit) as exc:
            mod.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and says in err[0], err
