"""Hand-computed cost-model cases (toy profile: fwd [1,2,3] s, bwd = 2 x fwd, params [100,200,300] B,
activations [10,20,30] B, outputs [5,6,7] B, optimizer 0.1 s per layer; links 1000 B/s, no latency)."""

import pytest

from hpp.formulation.cost_model import block_decomposition, estimate_plan, pipeline_time_1f1b_s
from hpp.plan_data import Pipeline, Plan, Stage
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
    # memory: 4 x 600 weights/grads/Adam + 1 in-flight x 60 activations + backward workspace of the
    # largest layer (1.0 x 30, CostModelConfig.backward_workspace_layers), no p2p buffers, no framework
    # memory for the toy type (recomputed by hand for v2: was 2460 without the workspace)
    assert est.peak_memory_bytes == 2490


def test_two_stages_three_micro_batches_and_first_stage_holds_more():
    p = plan([Pipeline((Stage(0, 1, "X", 1, (0,)), Stage(1, 3, "X", 1, (1,))), 1, 3)], 3)
    est = estimate_plan(p, CLUSTER, PROFILE)
    # stage 0: F=1, B=2 -> 3; stage 1: F=5, B=10 -> 15; c = 5 B / 1000 B/s = 0.005 s
    # v2 (recomputed by hand; v1 gave 48.01): p2p waits P = 2 x c on each side of the boundary,
    # D0 = 3.01, D1 = 15.01; T_p = (3.01 + 15.01) + 2 * 0.005 + (3 - 1) * 15.01 = 48.05
    assert est.pipeline_time_s == pytest.approx(48.05)
    s0, s1 = est.pipelines[0].stages
    assert (s0.in_flight_micro_batches, s1.in_flight_micro_batches) == (2, 1)
    assert s0.memory_bytes == 4 * 100 + 2 * 10 + 10 + 2 * 5     # 440 (v1 430; + workspace 10)
    assert s1.memory_bytes == 4 * 500 + 1 * 50 + 30 + 2 * 5     # 2090 (v1 2060; + workspace 30)
    assert s0.bubble_s == pytest.approx(48.05 - 3 * 3.01)
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
    # pipeline b: stages F+B = 9 and 9, c = 6/1000, P = 0.012 each (v2): m = 2: 18.024 + 0.012 + 9.012
    assert est.pipelines[1].time_s == pytest.approx(27.048)
    assert est.iteration_time_s == pytest.approx(48.05 + 0.5 + 0.2)


def test_block_decomposition_doctest_case():
    assert block_decomposition([(0, 2, 3), (0, 1, 3)]) == [(0, 1, (0, 0)), (1, 2, (0, 1)), (2, 3, (1, 1))]


def test_full_recompute_costs_a_forward_and_keeps_inputs_only():
    p = plan([Pipeline((Stage(0, 1, "X", 1, (0,)), Stage(1, 3, "X", 1, (1,), "full")), 1, 3)], 3)
    est = estimate_plan(p, CLUSTER, PROFILE)
    s1 = est.pipelines[0].stages[1]
    assert s1.backward_s == pytest.approx(10 + 5)      # + one forward of layers 1, 2
    # kept: inputs of layers 1 and 2 = out[0] + out[1] = 11; working set: max act = 30 recomputed
    # + 30 backward workspace (v2; v1 had 30 only); buffers 2 * out[0]
    assert s1.memory_bytes == 4 * 500 + 1 * 11 + 30 + 30 + 10


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
    # v2: + 3.0e9 framework memory of an A100-40 and the backward workspace of the largest layer
    assert st0["memory_bytes"] == int(3_000_000_000 + 4 * sum(e.param_bytes[0:13])
                                      + 2 * sum(e.activation_bytes[0:13]) + max(e.activation_bytes[0:13])
                                      + 2 * e.output_bytes[12])
    assert pred["peak_memory_bytes"] == max(s["memory_bytes"] for p in pred["pipelines"] for s in p["stages"])
    assert pred["throughput_samples_per_s"] == pytest.approx(1024 / pred["iteration_time_s"])
    assert [b["layers"] for b in pred["blocks"]] == [[0, 5], [5, 12], [12, 13], [13, 19], [19, 26]]
    assert pred["fits_memory"]


# ------------------------------------------------------------------ memo tables == cost model (v2)

@pytest.mark.parametrize("key", [("GH-96", 4, 8), ("A100-40", 1, 2), ("V100-16", 1, 1)])
def test_memo_tables_price_stages_exactly_like_the_cost_model(key):
    """Every range [u, v), in-flight count and recompute on/off: memo table == stage_time_s / stage_memory_bytes."""
    from hpp.formulation.cost_config import CostModelConfig
    from hpp.formulation.memory_model import stage_memory_bytes
    from hpp.formulation.cost_model import stage_time_s
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.profiles.network import default_inter_node_link
    from hpp.formulation.stage_costs import build_stage_cost_table

    prof = load_bundled_profile("OPT-350")
    e = prof.layer_profile(*key, estimate=False)
    link = default_inter_node_link([key[0]])
    config = CostModelConfig()
    assert config.framework_bytes_of(key[0]) > 0 and config.backward_workspace_layers > 0
    tab = build_stage_cost_table(e, capacity_bytes=10**12, link=link, config=config)
    L = prof.num_layers
    ranges = [(0, L), (0, 1), (0, 5), (5, 12), (12, 13), (19, L), (L - 1, L), (3, 4)]
    checked = 0
    for u, v in ranges:
        for rec, table in (("none", tab.compute_none_s), ("full", tab.compute_full_s)):
            want = stage_time_s(e, u, v, rec, link_in=link, link_out=link, config=config)
            assert table[u, v] == pytest.approx(want, rel=1e-12), (u, v, rec)
        for num_stages, position in ((1, 0), (2, 0), (2, 1), (4, 0), (4, 1), (4, 3)):
            # the table's buffers assume a neighbour before u > 0 and after v < L
            if (u > 0) != (position > 0) or (v < L) != (position < num_stages - 1):
                continue
            for m in (1, 2, 3, 8):
                k = min(m, num_stages - position)           # 1F1B in-flight count
                for rec in ("none", "full"):
                    want = stage_memory_bytes(e, u, v, position=position, num_stages=num_stages,
                                              num_micro_batches=m, recompute=rec, config=config)
                    checked += 1
                    assert abs(tab.memory_bytes(k, rec == "full")[u, v] - want) <= 1.0, (u, v, k, rec)
    assert checked >= 50
    assert tab.framework_bytes == config.framework_bytes_of(key[0])


def test_v1_config_reproduces_the_uncalibrated_model():
    """CostModelConfig.v1(): no framework memory, no workspace, p2p overlapped (the v1 hand values)."""
    from hpp.formulation.cost_config import CostModelConfig
    p = plan([Pipeline((Stage(0, 1, "X", 1, (0,)), Stage(1, 3, "X", 1, (1,))), 1, 3)], 3)
    est = estimate_plan(p, CLUSTER, PROFILE, config=CostModelConfig.v1())
    assert est.pipeline_time_s == pytest.approx(48.01)
    assert [s.memory_bytes for s in est.pipelines[0].stages] == [430, 2060]


def test_p2p_waits_enter_the_bottleneck():
    """k (c_in + c_out) per micro-batch: middle stages wait on both boundaries (k = 2, DeepSpeed)."""
    from hpp.formulation.collectives import stage_p2p_wait_s
    from hpp.profiles.cluster import Link
    e = PROFILE.layer_profile("X", 1, 1)
    link = Link(1000.0, 0.0)
    assert stage_p2p_wait_s(e, 0, 3, link_in=link, link_out=link) == 0.0           # one stage: no transfer
    assert stage_p2p_wait_s(e, 0, 1, link_in=None, link_out=link) == pytest.approx(2 * 5 / 1000)
    assert stage_p2p_wait_s(e, 1, 2, link_in=link, link_out=link) == pytest.approx(2 * (5 + 6) / 1000)
    assert stage_p2p_wait_s(e, 2, 3, link_in=link, link_out=None) == pytest.approx(2 * 6 / 1000)


def test_framework_memory_is_per_gpu_type():
    from hpp.formulation.cost_config import FRAMEWORK_BYTES, CostModelConfig
    c = CostModelConfig()
    assert c.framework_bytes_of("GH-96") == 4_760_000_000
    assert c.framework_bytes_of("V100-16") == 3_000_000_000
    assert c.framework_bytes_of("X") == 0                      # toy / CPU types: none
    assert {t for t, _ in FRAMEWORK_BYTES} == {"GH-96", "A100-40", "A100-80", "V100-16", "Titan-RTX", "RTX-2080",
                                              "RTX-3090"}
    with pytest.raises(ValueError, match="p2p_waits_per_transfer"):
        CostModelConfig(p2p_waits_per_transfer=-1.0)
