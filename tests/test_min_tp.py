"""``hpp plan --min-tp`` (no way to ask the CLI for a TP plan, ``--max-tp`` is only a cap and the
fastest cpu-hetero-4 plans are TP 1): the search, the baselines and the returned plan's check keep TP >= min_tp."""

from __future__ import annotations

import json

import pytest

from hpp.baselines.single_shape import run_baselines
from hpp.cli import main
from hpp.errors import HppInputError
from hpp.formulation.space_limits import SearchSpace, stage_kinds
from hpp.formulation.space_limits import space_violations
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import get_scenario


def _plan_json(capsys, *flags: str) -> dict:
    assert main(["plan", "--scenario", "cpu-hetero-4", "--model", "llama-tiny", "--json", "--quiet", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def _tps(d: dict) -> set[int]:
    return {s["tp_degree"] for p in d["plan"]["pipelines"] for s in p["stages"]}


def test_min_tp_2_gives_a_tp2_plan_and_the_default_a_tp1_one(capsys):
    assert _tps(_plan_json(capsys, "--no-baselines")) == {1}                 # the control: TP 1 is fastest here
    d = _plan_json(capsys, "--min-tp", "2", "--max-tp", "2")
    assert _tps(d) == {2}
    for b in d["baselines"].values():                                        # the baselines searched TP 2 too
        assert "TP=2" in b["description"] or "(tp2)" in b["description"], b


def test_stage_kinds_and_the_space_check_keep_tp_at_least_min_tp():
    s = get_scenario("cpu-hetero-4")
    cluster, prof = s.cluster(), load_bundled_profile("llama-tiny")
    assert {k.tp_degree for ks in stage_kinds(cluster, prof, SearchSpace()).values() for k in ks} == {1, 2}
    assert {k.tp_degree for ks in stage_kinds(cluster, prof, SearchSpace(min_tp=2)).values() for k in ks} == {2}
    with pytest.raises(HppInputError) as e:
        stage_kinds(cluster, prof, SearchSpace(min_tp=3))
    assert e.value.field == "--min-tp" and "lower --min-tp, raise --max-tp or use larger nodes" in str(e.value)
    base = run_baselines(cluster, prof, 32, space=SearchSpace())
    tp1 = next(b.plan for b in base.values() if b.plan is not None)
    assert space_violations(tp1, SearchSpace(), cluster=cluster, profile=prof) == []
    bad = space_violations(tp1, SearchSpace(min_tp=2, max_tp=2), cluster=cluster, profile=prof)
    assert bad and all(v.endswith("is not a kind of the space (TP 2..2)") for v in bad), bad


@pytest.mark.parametrize("flags, words", [
    (["--min-tp", "0"], "field '--min-tp': --min-tp 0. Fix: give an integer >= 1"),
    (["--min-tp", "4", "--max-tp", "2"], "field '--min-tp': --min-tp 4 with --max-tp 2. Fix: give 1 <= --min-tp <= "
                                         "--max-tp"),
])
def test_bad_min_tp_is_one_line_exit_2(capsys, flags, words):
    assert main(["plan", "--scenario", "cpu-hetero-4", "--model", "llama-tiny", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hpp plan: error: ") and words in err and len(err.splitlines()) == 1, err
