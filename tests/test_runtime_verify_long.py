"""``hpp run --verify`` over 1,000 steps: within 1e-9 at every step for the README's plans and for plans with
TP 2, uneven splits, recomputation and mixed TP.

Float64 training of these models drifts from free-running single-device training after a few hundred steps
(as single-device training does from itself when a batch is only summed in another order), so ``--verify``
checks each step from the run's own state (:mod:`hpp.runtime.exec.verify_steps`); these runs check that this holds
for 1,000 steps on every code path, and print the free-running and reversed-order drift beside it.

Slow (minutes per plan on two cores): marked ``slow``, left out of the default run; ``pytest -m slow
tests/test_runtime_verify_long.py`` runs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest

from hpp.cli import main
from hpp.plan_data import Plan, write_plan_json
from hpp.runtime.config import RunConfig
from hpp.runtime.run import run_plan
from tests.test_runtime_tp import llama_mixed_tp, neo_recompute_clip, opt_tp2_tied

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

STEPS = 1000
TOL = 1e-9
CLUSTER6 = {"format": "hpp-cluster", "version": 1, "name": "cpu-6",
            "device_types": {"cpu": {"memory_bytes": 4 * 2**30, "gpus_per_node": 6}},
            "nodes": [{"device_type": "cpu", "num_devices": 6, "intra_node_bandwidth_bytes_per_s": 1e9}],
            "inter_node_bandwidth_bytes_per_s": 1e9}


def _readme_plan(tmp_path, model: str) -> str:
    """``hpp scenarios --cluster cpu-hetero-4 > cluster.json``, then ``hpp plan --cluster cluster.json --model M
    --gbs 8 --max-tp 2 --out plan-M.json``, as the README makes them."""
    cluster = tmp_path / "cluster.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["scenarios", "--cluster", "cpu-hetero-4"]) == 0
    cluster.write_text(buf.getvalue())
    out = tmp_path / f"plan-{model}.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["plan", "--cluster", str(cluster), "--model", model, "--gbs", "8", "--max-tp", "2", "--quiet",
                     "--out", str(out)]) == 0
    return str(out)


def _hand_plan(tmp_path, plan: Plan) -> str:
    path = tmp_path / "plan.json"
    write_plan_json(dataclasses.replace(plan, cluster_ref=CLUSTER6), path)
    return str(path)


def _verify(plan_path: str, **training) -> dict:
    rep = run_plan(RunConfig.build(plan_path, steps=STEPS, verify=True, launcher="fork", host_calibration=False,
                                   run_timeout_s=7200.0, group_timeout_s=300.0, **training))
    v = rep.verify
    print(f"{plan_path}: {STEPS} steps, per-step max |difference| {v['max_abs_difference']:.3g} (step "
          f"{v['worst_step']}), free-running {v['free_running_difference']:.3g}, reversed-order single-device "
          f"drift {v['reordered_difference']}")
    return v


def _assert_every_step_within(v: dict) -> None:
    assert v["steps"] == v["steps_checked"] == STEPS and not v["missing"]
    assert v["max_abs_difference"] <= TOL and v["passed"], v


@pytest.mark.parametrize("model", ["llama-tiny", "opt-tiny", "gpt-neo-tiny"])
def test_readme_plans_verify_every_step_of_1000(tmp_path, model):
    _assert_every_step_within(_verify(_readme_plan(tmp_path, model)))


@pytest.mark.parametrize("plan, training", [
    (llama_mixed_tp, {"lr": 0.01}),                                           # mixed TP 2 / 1, uneven cuts and samples
    (opt_tp2_tied, {"lr": 0.01, "lr_schedule": "cosine", "lr_warmup_steps": 50}),   # TP 2 everywhere, tied copies
    (neo_recompute_clip, {"lr": 0.01, "clip_grad_norm": 0.5}),               # recomputation, TP 2 vs 1, clipping
], ids=["llama-mixed-tp-uneven", "opt-tp2-tied-cosine", "neo-recompute-clip"])
def test_tp_uneven_recompute_plans_verify_every_step_of_1000(tmp_path, plan, training):
    _assert_every_step_within(_verify(_hand_plan(tmp_path, plan()), **training))
