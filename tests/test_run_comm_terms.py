"""``hpp run`` reports the gradient sync and each stage's p2p wait it measured beside the cost model's.

On the emulated CPU cluster of ``hpp scenarios --cluster cpu-hetero-4`` (gpt-tiny, fork launcher, 3 steps):
a plan of two pipelines syncs every block between them (measured sync > 0), a plan of one pipeline syncs
nothing (measured exactly 0), and the two-pipeline plan run without its block all-reduces (the worker's
control switch) measures 0 too: the figure is the all-reduces' time, not bookkeeping.
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.runtime.cli import _human_run, run_main
from hpp.runtime.config import RunConfig
from hpp.runtime.run import run_plan
from hpp.scenarios import get_scenario

pytestmark = pytest.mark.distributed

FAST = (Stage(0, 3, "cpu", 1, (0,)), Stage(3, 6, "cpu", 1, (1,)))
SLOW = (Stage(0, 2, "cpu-2x", 1, (2,), "full"), Stage(2, 6, "cpu-2x", 1, (3,), "full"))
FLAGS = ["--steps", "3", "--launcher", "fork", "--emulate-speed", "--no-host-calibration", "--quiet",
         "--run-timeout", "180", "--group-timeout", "60"]


def _plan(path, pipelines) -> str:
    cluster = cluster_to_dict(get_scenario("cpu-hetero-4").cluster())
    plan = Plan("gpt-tiny", 6, sum(p.num_samples for p in pipelines), tuple(pipelines), sequence_length=128,
                profile_ref={"name": "gpt-tiny"}, cluster_ref=cluster)
    write_plan_json(plan, path)
    return str(path)


def _run_json(plan: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_main([plan, *FLAGS, "--json"])
    assert code == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("terms")
    two = _plan(tmp / "two.json", [Pipeline(FAST, 2, 8), Pipeline(SLOW, 2, 8)])
    one = _plan(tmp / "one.json", [Pipeline(FAST, 2, 8)])
    control = run_plan(RunConfig.build(two, steps=3, launcher="fork", emulate_speed=True, host_calibration=False,
                                       run_timeout_s=180, group_timeout_s=60,
                                       controls={"skip_block_allreduce": True})).to_dict()
    return {"two": _run_json(two), "one": _run_json(one), "control": control}


def _finite_non_negative(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x >= 0.0


def test_two_pipelines_measure_their_sync_and_waits_beside_the_prediction(reports):
    rep = reports["two"]
    m, pr = rep["measured"], rep["predicted"]
    assert m["grad_sync_s"] > 0 and math.isfinite(m["grad_sync_s"])
    assert len(m["grad_sync_steps_s"]) == 3 and all(_finite_non_negative(x) for x in m["grad_sync_steps_s"])
    assert [(s["pipeline"], s["stage"]) for s in m["stages"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [(s["pipeline"], s["stage"]) for s in pr["stages"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for s in m["stages"]:
        assert _finite_non_negative(s["p2p_wait_s"]) and s["compute_s"] > 0
    for s in pr["stages"]:
        assert all(_finite_non_negative(s[k]) for k in ("compute_s", "p2p_wait_s", "p2p_transfer_wait_s", "p2p_s"))
        assert s["p2p_transfer_wait_s"] <= s["p2p_wait_s"]
    assert pr["grad_sync_s"] > 0 and [s["p2p_s"] > 0 for s in pr["stages"]] == [True, False, True, False]
    text = _human_run(rep)
    line = next(x for x in text.splitlines() if x.startswith("  grad sync"))
    assert f"measured {m['grad_sync_s']:.4f} s per step" in line and f"predicted {pr['grad_sync_s']:.4f} s" in line
    rows = [x.split() for x in text.splitlines() if x.startswith(" " * 18)]
    assert [r[:2] for r in rows] == [["0", "0"], ["0", "1"], ["1", "0"], ["1", "1"]]
    assert [float(r[4]) for r in rows] == [round(s["p2p_wait_s"], 4) for s in m["stages"]]


def test_one_pipeline_syncs_nothing_and_measures_zero(reports):
    m, pr = reports["one"]["measured"], reports["one"]["predicted"]
    assert m["grad_sync_s"] == 0.0 and m["grad_sync_steps_s"] == [0.0, 0.0, 0.0] and pr["grad_sync_s"] == 0.0
    assert len(m["stages"]) == 2 and all(_finite_non_negative(s["p2p_wait_s"]) for s in m["stages"])


def test_the_control_without_block_all_reduces_measures_zero_sync(reports):
    """The same two-pipeline plan with the worker's block all-reduces switched off: nothing is summed, the measured
    sync is 0 while the prediction (which assumes the sync) is not."""
    c = reports["control"]
    assert c["collectives"]["count"] == 0 and reports["two"]["collectives"]["count"] > 0
    assert c["measured"]["grad_sync_s"] == 0.0 and c["predicted"]["grad_sync_s"] > 0
