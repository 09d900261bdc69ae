"""Hand-computed cost-model cases (toy profile: fwd [1,2,3] s, bwd = 2 x fwd, params [100,200,300] B,
activations [10,20,30] B, outputs [5,6,7] B, optimizer 0.1 s per layer; links 1000 B/s, no latency)."""

import pytest

from hpp.formulation.cost_model import block_decomposition, estimate_plan, pipeline_time_1f1b_s
from hpp.plan import Pipeline, Plan, Stage
from tests.synthetic import toy_cluster, toy_profile

PROFILE = toy_profile({"X": 1.0})
CLUSTER = toy_cluster([("X", 4)], memory={"X": 10_000})


def plan(pipes, gbs):
    return Plan("toy", 3, gbs, tuple(pipes))


def test_one_stage():
    p = plan([Pipeline((Stage(0, 3, "X", 1, (0,)),), 1, 4)], 4)
    est = estimate_plan(p, CLUSTER, PROFILE)
    # F = 6, B = 12; T_p = 18 + 3 * 18 = 72; no sync (one pipeline); optimizer 0.3
    assert est.pipeline_time_s == pytest.approx(72.0)
    assert est.grad_sync_s == 0.0
    assert est.optimizer_s == pytest.approx(0.3)
    assert est.iteration_time_s == pytest.approx(72.3)
    assert est.throughput_samples_per_s == pytest.approx(4 / 72.3)
    # memory: 4 x 600 weights/grads/Adam + 1 in-flight x 60 activations, no p2p buffers
    assert est.peak_memory_bytes == 2460


def test_two_stages_three_micro_batches_and_first_stage_holds_more():
    p = plan([Pipeline((Stage(0, 1, "X", 1, (0,)), Stage(1, 3, "X", 1, (1,))), 1, 3)], 3)
    est = estimate_plan(p, CLUSTER, PROFILE)
    # stage 0: F=1, B=2 -> 3; stage 1: F=5, B=10 -> 15; c = 5 B / 1000 B/s = 0.005 s
    # T_p = (3 + 15) + 2 * 0.005 + (3 - 1) * 15 = 48.01
    assert est.pipeline_time_s == pytest.approx(48.01)
    s0, s1 = est.pipelines[0].stages
    assert (s0.in_flight_micro_batches, s1.in_flight_micro_batches) == (2, 1)
    assert s0.memory_bytes == 4 * 100 + 2 * 10 + 2 * 5          # 430
    assert s1.memory_bytes == 4 * 500 + 1 * 50 + 2 * 5          # 2060
    assert s0.bubble_s == pytest.approx(48.01 - 3 * 3)
    assert est.optimizer_s == pytest.approx(0.2)                # slowest stage: layers 1, 2


def test_two_pipelines_with_different_boundaries_blocks():
    pa = Pipeline((Stage(0, 1, "X", 1, (0,)), Stage(1, 3, "X", 1, (1,))), 1, 3)
    pb = Pipeline((Stage(0, 2, "X", 1, (2,)), Stage(2, 3, "X", 1, (3,))), 1, 2)
    est = estimate_plan(plan([pa, pb], 5), CLUSTER, PROFILE)
    blocks = [(b.layer_start, b.layer_stop, b.holders, b.num_bytes) for b in est.blocks]
    assert blocks == [(0, 1, (0, 0), 100), (1, 2, (1, 0), 200), (2, 3, (1, 1), 300)]
    # ring of 2 ranks: 2 (2-1)/2 * bytes / 1000 B/s
    assert [b.allreduce_s for b in est.blocks] == pytest.approx([0.1, 0.2, 0.3])
    # device 1 holds blocks [1,2) and [2,3) -> 0.5 s serialised; the slowest device sets the sync time
    assert est.grad_sync_block_s == pytest.approx(0.5)
    assert est.grad_sync_layer_s == pytest.approx(0.5)
    per_stage = [s.grad_sync_s for pe in est.pipelines for s in pe.stages]
    assert per_stage == pytest.approx([0.1, 0.5, 0.3, 0.3])
    # pipeline b: stages F+B = 9 and 9, c = 6/1000; m = 2: 18 + 0.012 + 9
    assert est.pipelines[1].time_s == pytest.approx(27.012)
    assert est.iteration_time_s == pytest.approx(48.01 + 0.5 + 0.2)


def test_block_decomposition_doctest_case():
    assert block_decomposition([(0, 2, 3), (0, 1, 3)]) == [(0, 1, (0, 0)), (1, 2, (0, 1)), (2, 3, (1, 1))]


def test_full_recompute_costs_a_forward_and_keeps_inputs_only():
    p = plan([Pipeline((Stage(0, 1, "X", 1, (0,)), Stage(1, 3, "X", 1, (1,), "full")), 1, 3)], 3)
    est = estimate_plan(p, CLUSTER, PROFILE)
    s1 = est.pipelines[0].stages[1]
    assert s1.backward_s == pytest.approx(10 + 5)      # + one forward of layers 1, 2
    # kept: inputs of layers 1 and 2 = out[0] + out[1] = 11; working set: max act = 30; buffers 2 * out[0]
    assert s1.memory_bytes == 4 * 500 + 1 * 11 + 30 + 10


def test_pipeline_time_formula():
    assert pipeline_time_1f1b_s([3.0, 2.0], [0.5], 3) == 12.0
    assert pipeline_time_1f1b_s([3.0], [], 0) == 0.0


def test_estimate_cli_on_hand_written_opt350_plan(capsys):
    """2 pipelines (2 x A100-40, 4 x V100-16) for OPT-350 on the default cluster: figures checkable by hand."""
    import json
    from pathlib import Path

    from hpp.cli import main
    from hpp.profiles.bundled import load_bundled_profile

    path = Path(__file__).resolve().parents[1] / "experiments" / "plans" / "opt350-2pipelines-a100-v100.json"
    assert main(["estimate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pred = out["predicted"]
    prof = load_bundled_profile("OPT-350")
    e = prof.layer_profile("A100-40", 1, 2)
    st0 = pred["pipelines"][0]["stages"][0]
    assert st0["forward_s"] == pytest.approx(sum(e.forward_s[0:13]))
    assert st0["backward_s"] == pytest.approx(sum(e.backward_s[0:13]))
    assert st0["memory_bytes"] == int(4 * sum(e.param_bytes[0:13]) + 2 * sum(e.activation_bytes[0:13])
                                      + 2 * e.output_bytes[12])
    assert pred["peak_memory_bytes"] == max(s["memory_bytes"] for p in pred["pipelines"] for s in p["stages"])
    assert pred["throughput_samples_per_s"] == pytest.approx(1024 / pred["iteration_time_s"])
    assert [b["layers"] for b in pred["blocks"]] == [[0, 5], [5, 12], [12, 13], [13, 19], [19, 26]]
    assert pred["fits_memory"]
