"""The type-class bound (the bound's side of the gap): class B's cross-type links by hand, the
bound never above the exhaustive oracle (version-1 and per-pair clusters, both judges), stronger than the copy
bound where plans mix types, and the control: class B's floors applied to every plan are not a bound."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpp.baselines.single_shape import exhaustive_composition
from hpp.formulation.composition.copy_bound import copy_bound
from hpp.formulation.composition.settings import SolverSettings
from hpp.formulation.composition.sync_floor import cluster_links, cross_type_links
from hpp.formulation.composition.type_classes import type_class_bound
from hpp.planner import make_problem, plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.cluster_format import cluster_from_dict
from hpp.scenarios import SCENARIOS

from tests.test_certified import NO_PRUNING, check_instance, random_instance


def _link(gb_per_s: float) -> dict:
    return {"max_bytes_per_s": gb_per_s * 1e9, "latency_s": 0.0}


def _three_type_cluster():
    types = {t: {"memory_bytes": 40 * 10**9, "gpus_per_node": 4} for t in ("A100-40", "V100-16", "GH-96")}
    nodes = [{"device_type": t, "num_devices": 4} for t in ("A100-40", "A100-40", "V100-16", "GH-96")]
    pairs = [{"between": ["A100-40", "A100-40"], "link": _link(25)}, {"between": ["A100-40", "V100-16"], "link": _link(5)},
             {"between": ["A100-40", "GH-96"], "link": _link(12)}, {"between": ["V100-16", "GH-96"], "link": _link(3)},
             {"between": ["V100-16", "V100-16"], "link": _link(10)}, {"between": ["GH-96", "GH-96"], "link": _link(50)}]
    return cluster_from_dict({"version": 2, "name": "three", "device_types": types, "nodes": nodes,
                              "links": {"intra_node": {t: _link(300) for t in types}, "inter_node": pairs}})


def test_cross_type_links_are_the_links_from_the_type_to_the_others():
    cl = _three_type_cluster()
    g, intra, inter = cross_type_links(cl, "A100-40")
    assert g == 4 and intra == []                                   # a ring of two types spans two nodes
    assert sorted(l.max_bytes_per_s / 1e9 for l in inter) == [5.0, 12.0]      # A100-V100 and A100-GH, not A100-A100
    assert sorted(l.max_bytes_per_s / 1e9 for l in cross_type_links(cl, "GH-96")[2]) == [3.0, 12.0]
    # the default floor also has the in-node link and the type's own inter-node link
    _, own_intra, own_inter = cluster_links(cl, "A100-40")
    assert [l.max_bytes_per_s / 1e9 for l in own_intra] == [300.0]
    assert 25.0 in [l.max_bytes_per_s / 1e9 for l in own_inter]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(False, "composition"), (True, "composition"),
                                                   (False, "estimate"), (True, "estimate")]))
def test_type_class_bound_never_above_the_exhaustive_oracle(seed, case):
    per_pair, judge = case
    check_instance(seed, solver="heuristic", judge=judge, max_evaluations=60 if judge == "estimate" else 200,
                   max_gpus_per_type=2, max_types=3, per_pair=per_pair, type_classes=True)


def _bound_problem(seed: int, per_pair: bool):
    cluster, profile, gbs, space = random_instance(seed, max_gpus_per_type=2, max_types=3, per_pair=per_pair)
    problem, _ = make_problem(cluster, profile, gbs, space=space, workers=1)
    full, _ = make_problem(cluster, profile, gbs, space=space, pruning=NO_PRUNING, workers=1)
    problem.estimator = full.estimator = None
    keep = [c for c in range(len(problem.candidates)) if problem.max_copies(c) > 0]
    return problem.bound_problem().restricted(keep), exhaustive_composition(full, max_evaluations=200)[1]


def test_type_classes_close_the_gap_where_plans_mix_types_and_class_b_alone_is_no_bound():
    # per-pair instance 79 (random_instance(79, per_pair=True)): the copy bound 22.25 s, the oracle 26.23 s
    bp, oracle = _bound_problem(79, True)
    plain = copy_bound(bp, max_evals=0).bound_s
    tc = type_class_bound(bp)
    assert plain < 0.9 * oracle and oracle * (1 - 1e-6) <= tc.bound_s <= oracle * (1 + 1e-9)
    assert set(tc.classes) == {"A:T0", "A:T1", "B"} and tc.bound_s == min(tc.classes.values())   # two types
    # the control: class B's cross-type floors on every plan (the classes A_t ignored) exceed the oracle
    only_b = copy_bound(bp, max_evals=0, links_of=cross_type_links).bound_s
    assert only_b > 1.2 * oracle


def test_plan_with_type_classes_reports_the_stronger_bound_of_the_same_plan():
    sc = SCENARIOS["opt350-a100x8-v100x8"]
    prof, cl = load_bundled_profile(sc.model), sc.cluster()
    base = plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(num_workers=1))
    strong = plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(num_workers=1, type_classes=True))
    assert strong.search.objective_s == base.search.objective_s          # the same plan
    assert strong.search.bound_method == "type-classes" and base.search.bound_method == "lp"
    assert base.search.bound_s < strong.search.bound_s <= strong.search.objective_s
    assert strong.search.gap < base.search.gap - 0.003                    # 4.11 % -> 3.60 % (measured)
    assert math.isclose(strong.search.gap, (strong.search.objective_s - strong.search.bound_s) / strong.search.objective_s)


def test_cli_type_classes_flag_reaches_the_solve(capsys):
    import json

    from hpp.cli import main
    # the default scenario (opt350-a100x8-v100x8): hpp plan --type-classes reports the class bound in its JSON
    assert main(["plan", "--no-baselines", "--workers", "1", "--type-classes", "--json", "--quiet"]) == 0
    search = json.loads(capsys.readouterr().out)["search"]
    assert search["bound_method"] == "type-classes" and search["gap"] < 0.038          # 4.24 % without the flag
    # hpp instances solve passes it too (the figures of one library instance, without and with the flag)
    got = {}
    for extra in ([], ["--type-classes"]):
        assert main(["instances", "solve", "opt350-a100x4-v100x4", "--solver", "heuristic", "--json", *extra]) == 0
        out = capsys.readouterr().out
        got[bool(extra)] = json.loads(out[out.index("{"):])
    assert got[True]["bound_s"] >= got[False]["bound_s"] and got[True]["objective_s"] == got[False]["objective_s"]
    # there the classes prove no more than the copy bound (class B is the least): the note says so
    assert got[True]["bound_method"] == "lp" and got[True]["note"] == "type-class bound 39.1303 s, no stronger"
    assert "type-class" not in got[False]["note"]


def test_certify_check_refuses_bad_flags_and_a_run_the_oracle_never_checked(tmp_path, capsys):
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "certify_check", Path(__file__).resolve().parents[1] / "experiments" / "certify_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = str(tmp_path / "c.csv")
    assert mod.main(["--solvers", "foo", "--out", out]) == 2
    assert capsys.readouterr().err.strip() == ("certify_check: --solvers foo: unknown solver 'foo'; give heuristic, "
                                               "cp-sat and/or milp, comma-separated")
    assert mod.main(["--max-gpus", "9", "--out", out]) == 2 and "--max-gpus 9: give 2-8" in capsys.readouterr().err
    assert mod.main(["--work", "-1", "--out", out]) == 2      # was a traceback
    assert capsys.readouterr().err.strip() == "certify_check: --work -1.0: give a positive deterministic work limit"
    # an oracle cap of one multiset checks nothing: exit 1 and say so (not "violations 0" as a pass)
    assert mod.main(["--instances", "2", "--max-evaluations", "1", "--out", out]) == 1
    got = capsys.readouterr()
    assert "checked by the oracle: 0 of 2" in got.out and "the oracle checked no instance" in got.err
    assert mod.main(["--instances", "3", "--max-gpus", "2", "--type-classes", "--out", out]) == 0
    got = capsys.readouterr().out
    assert "checked by the oracle: 3 of 3" in got and "the returned plan was the oracle's optimum (within 0.1%) on " in got
