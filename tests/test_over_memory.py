"""A plan predicted not to fit its devices' memory: ``hpp estimate`` and ``hpp run`` refuse it (exit 2, one line
naming the stage, its devices and the shortfall) unless ``--allow-over-memory``, which the output then states."""

from __future__ import annotations

import json

import pytest

from hpp.cli import main
from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import plan_from_dict, write_plan_json
from hpp.planner import PlannerConfig, plan_hpp
from hpp.profiles.cluster_format import cluster_from_dict
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import get_scenario
from hpp.validate import check_fits_memory, memory_shortfalls

#: the emulated slow type's memory cut to 5,000,000 bytes: its stages need about 12.4 MiB (hand-checked below)
SMALL_BYTES = 5_000_000


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """(fitting plan file, over-full plan file): the cpu-hetero-4 plan, and the same with the slow type's memory cut."""
    sc = get_scenario("cpu-hetero-4")
    res = plan_hpp(sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size, config=PlannerConfig())
    d = tmp_path_factory.mktemp("over")
    ok = d / "ok.json"
    write_plan_json(res.plan, ok)
    doc = json.loads(ok.read_text())
    assert any(st["device_type"] == "cpu-2x" for p in doc["pipelines"] for st in p["stages"])   # the cut bites
    doc["cluster"]["device_types"]["cpu-2x"]["memory_bytes"] = SMALL_BYTES
    over = d / "over.json"
    over.write_text(json.dumps(doc))
    return ok, over


def _estimate(path):
    doc = json.loads(path.read_text())
    plan = plan_from_dict(doc)
    return plan, estimate_plan(plan, cluster_from_dict(doc["cluster"]), load_bundled_profile(doc["profile"]["name"]))


def test_the_shortfall_is_the_largest_need_minus_usable_memory(plans):
    plan, est = _estimate(plans[1])
    over = memory_shortfalls(est)
    stages = [(i, j, s) for i, p in enumerate(est.pipelines) for j, s in enumerate(p.stages)]
    expect = sorted(((i, j, s.memory_bytes - s.capacity_bytes) for i, j, s in stages
                     if s.memory_bytes > s.capacity_bytes), key=lambda t: -t[2])
    assert over == expect and len(over) >= 1
    assert all(plan.pipelines[i].stages[j].device_type == "cpu-2x" for i, j, _ in over)
    assert memory_shortfalls(_estimate(plans[0])[1]) == []                      # control: the plan as planned fits


def test_estimate_refuses_an_over_full_plan_in_one_line_exit_2(plans, capsys):
    _, over = plans
    plan, est = _estimate(over)
    p, s, short = memory_shortfalls(est)[0]
    assert main(["estimate", str(over)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert "\n" not in err and cap.out == ""
    assert f"{over}: field 'pipelines[{p}].stages[{s}]'" in err
    assert f"on cpu-2x device {plan.pipelines[p].stages[s].device_ids[0]}" in err
    assert f"{short / 2**20:.2f} MiB short" in err and "--allow-over-memory" in err


def test_estimate_with_the_flag_prints_it_and_says_so(plans, capsys):
    ok, over = plans
    assert main(["estimate", str(over), "--allow-over-memory"]) == 0
    out = capsys.readouterr().out
    assert "allowed by --allow-over-memory" in out and "MiB short" in out
    assert main(["estimate", str(over), "--allow-over-memory", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["allowed_over_memory"] is True and doc["predicted"]["fits_memory"] is False
    assert main(["estimate", str(ok), "--json"]) == 0                                  # control: fits, no flag
    doc = json.loads(capsys.readouterr().out)
    assert doc["allowed_over_memory"] is False and doc["notes"] == []


def test_check_fits_memory_returns_the_note_only_when_allowed(plans):
    plan, est = _estimate(plans[1])
    from hpp.errors import HppInputError
    with pytest.raises(HppInputError, match="does not fit its devices' memory"):
        check_fits_memory(est, plan, source="x.json")
    note = check_fits_memory(est, plan, allow=True)
    assert note.startswith("the plan is predicted not to fit") and "--allow-over-memory" in note
    fit_plan, fit_est = _estimate(plans[0])
    assert check_fits_memory(fit_est, fit_plan) is None


def test_run_refuses_an_over_full_plan_before_any_rank_starts(plans, capsys, tmp_path):
    pytest.importorskip("torch")
    from hpp.runtime.cli import run_main
    _, over = plans
    assert run_main([str(over), "--steps", "1", "--launcher", "fork", "--dry-run", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "does not fit its devices' memory" in err and "--allow-over-memory" in err
    assert not (tmp_path / "a").exists()
    # with the flag the run goes on (here: its dry run) and its notes say why
    assert run_main([str(over), "--steps", "1", "--launcher", "fork", "--dry-run", str(tmp_path / "b"),
                     "--allow-over-memory", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert any("allowed by --allow-over-memory" in n for n in rep["notes"])
