"""Time side of the runtime step's time terms, their gating in the cost model, the host model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpp.errors import HppInputError
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan, stage_compute_s, stage_fixed_s
from hpp.formulation.collectives import p2p_transfer_s, stage_p2p_wait_s
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.profiles.profile_format import profile_from_dict, profile_to_dict
from hpp.profiles.step_time import HostTimeTerms, StepTimeTerms
from hpp.runtime.host.time_model import scale_cpu_work, simulate_host_run

TERMS = StepTimeTerms(loss_forward_s=0.25, loss_backward_s=0.5, micro_batch_overhead_s=0.2,
                      micro_batch_overhead_in_op=0.5, step_overhead_s=0.03, p2p_latency_s=0.01,
                      p2p_bandwidth_bytes_per_s=1000.0, p2p_overhead_s=0.1)
LINK = Link(1e6, 1e-3)                   # 1 MB/s, 1 ms: 100 bytes take 1.1 ms; the backend's 0.01 + 0.1 s is slower


def entry(device_type: str = "cpu", *, mb: int = 1, step_time: StepTimeTerms | None = None) -> LayerProfile:
    return LayerProfile(device_type, 1, mb, (1.0, 1.0, 1.0, 1.0), (2.0, 2.0, 2.0, 2.0), (0.1, 0.1, 0.1, 0.1),
                        (10, 10, 10, 10), (100, 100, 100, 100), (100, 100, 100, 100), step_time=step_time)


def cluster(n: int) -> Cluster:
    return Cluster("toy", {"cpu": DeviceType("cpu", 10**9, n)}, (Node("cpu", n, LINK),), LINK)


def profile(e: LayerProfile, **meta) -> ModelProfile:
    return ModelProfile("toy", 4, 8, {e.key: e}, meta=meta)


def plan(pipes: list[list[tuple[int, int, int]]], m: int) -> Plan:
    """Pipelines of stages (lo, hi, device), micro-batch 1, ``m`` micro-batches each."""
    ps = tuple(Pipeline(tuple(Stage(lo, hi, "cpu", 1, (d,)) for lo, hi, d in st), 1, m) for st in pipes)
    return Plan("toy", 4, m * len(ps), ps, 8)


# ------------------------------------------------------------------ the terms as profile data


def test_step_time_round_trips_through_the_profile_format_and_is_validated():
    prof = profile(entry(step_time=TERMS))
    back = profile_from_dict(profile_to_dict(prof))
    assert back.entries[("cpu", 1, 1)].step_time == TERMS and back.entries[("cpu", 1, 1)].has_step_time
    d = profile_to_dict(prof)
    d["entries"][0]["step_time"]["loss_forward_s"] = -1.0
    with pytest.raises(HppInputError, match="loss_forward_s"):
        profile_from_dict(d)
    del d["entries"][0]["step_time"]["loss_forward_s"]
    with pytest.raises(HppInputError, match="missing field 'loss_forward_s'"):
        profile_from_dict(d)
    assert "step_time" not in profile_to_dict(profile(entry()))["entries"][0]     # old profiles stay as they were


def test_emulated_terms_scale_only_what_the_padding_covers_and_compose():
    k = TERMS.emulated(2.0)
    assert (k.loss_forward_s, k.loss_backward_s) == (0.25, 1.0)
    assert k.micro_batch_overhead_s == pytest.approx(0.1 * 2 + 0.1)            # in-op half x 2, the rest x 1
    assert k.p2p_overhead_s == TERMS.p2p_overhead_s and k.p2p_latency_s == TERMS.p2p_latency_s
    twice = TERMS.emulated(2.0).emulated(3.0)
    once = TERMS.emulated(6.0)
    assert twice.micro_batch_overhead_s == pytest.approx(once.micro_batch_overhead_s)
    assert twice.micro_batch_overhead_in_op == pytest.approx(once.micro_batch_overhead_in_op)


def test_an_estimated_micro_batch_scales_the_loss_terms():
    prof = profile(entry(step_time=TERMS))
    e4 = prof.layer_profile("cpu", 1, 4)
    assert e4.estimated and e4.step_time.loss_backward_s == pytest.approx(4 * TERMS.loss_backward_s)
    assert e4.step_time.micro_batch_overhead_s == TERMS.micro_batch_overhead_s


# ------------------------------------------------------------------ the cost model


def test_profiles_without_the_terms_are_priced_as_before():
    e = entry()
    assert stage_compute_s(e, 2, 4, "none") == (2.0, 4.0) and stage_fixed_s(e, 2, 4) == 0.0
    assert stage_p2p_wait_s(e, 1, 3, link_in=LINK, link_out=LINK) == pytest.approx(2.0 * 2 * LINK.transfer_s(100))
    p = plan([[(0, 2, 0), (2, 4, 1)]], 3)
    est = estimate_plan(p, cluster(2), profile(e))
    c = LINK.transfer_s(100)
    d = 2 * 1.0 + 2 * 2.0 + 2.0 * c                          # each stage: F + B + k c (k = 2, one neighbour)
    assert est.pipeline_time_s == pytest.approx(2 * d + 2 * c + 2 * d)


def test_the_terms_add_loss_overhead_backend_transfers_and_step_overhead():
    e = entry(step_time=TERMS)
    c = TERMS.p2p_s(100)                                     # 0.01 + 100 / 1000 = 0.11 s > the link's 1.1 ms
    assert p2p_transfer_s(e, LINK, 100) == pytest.approx(c)
    assert stage_fixed_s(e, 0, 2) == pytest.approx(0.2 + 0.1)                     # first stage: one neighbour
    assert stage_fixed_s(e, 2, 4) == pytest.approx(0.25 + 0.5 + 0.2 + 0.1)        # last: + loss
    assert stage_compute_s(e, 2, 4, "full") == pytest.approx((2 + 0.15 + 0.25, 4 + 2 + 0.15 + 0.5))
    assert stage_p2p_wait_s(e, 1, 3, link_in=LINK, link_out=LINK) == pytest.approx(1.0 * 2 * c)   # k = 1
    p = plan([[(0, 2, 0), (2, 4, 1)]], 3)
    est = estimate_plan(p, cluster(2), profile(e))
    d0 = 2 + 4 + 0.3 + c
    d1 = 2 + 4 + 1.05 + c
    assert est.pipeline_time_s == pytest.approx(d0 + d1 + 2 * c + 2 * d1 + 0.03)
    assert est.pipelines[0].stages[1].forward_s == pytest.approx(2 + 0.15 + 0.25)
    base = estimate_plan(p, cluster(2), profile(entry()), config=CostModelConfig(p2p_waits_per_transfer=1.0))
    assert est.pipeline_time_s > base.pipeline_time_s + 1.0      # control: without the terms far less


# ------------------------------------------------------------------ the host model


def test_one_stage_pipelines_on_enough_cores_match_the_cost_model_exactly():
    p = plan([[(0, 4, 0)], [(0, 4, 1)]], 3)
    prof = profile(entry(step_time=replace(TERMS, micro_batch_overhead_in_op=0.0)))
    est = estimate_plan(p, cluster(2), prof)
    h = simulate_host_run(p, cluster(2), prof, cores=2, emulate_speed=False)
    assert h.iteration_time_s == pytest.approx(est.iteration_time_s)
    assert h.iteration_time_s == pytest.approx(0.03 + 3 * (4 + 8 + 0.75 + 0.2) + est.grad_sync_s + 0.4)


def test_two_stage_1f1b_replays_the_schedule():
    p = plan([[(0, 2, 0), (2, 4, 1)]], 2)        # F = 2, B = 4 per stage; hand-made 1F1B timeline: 3 x 6
    h = simulate_host_run(p, cluster(2), profile(replace(entry(), output_bytes=(0, 0, 0, 0))), cores=2,
                          emulate_speed=False)
    assert h.schedule_end_s[0] == pytest.approx(18.0) and h.iteration_time_s == pytest.approx(18.0 + 0.2)


def test_ranks_share_the_cores_and_pay_the_contention():
    p = plan([[(0, 4, 0)], [(0, 4, 1)]], 2)
    prof = profile(entry())
    alone = simulate_host_run(p, cluster(2), prof, cores=2, emulate_speed=False)
    sync = alone.grad_sync_s                                                    # 2 ms ring over the toy link
    shared = simulate_host_run(p, cluster(2), prof, cores=1, emulate_speed=False)
    contended = simulate_host_run(p, cluster(2), prof, cores=2, emulate_speed=False, host=HostTimeTerms(2, (1.0, 1.5)))
    assert alone.iteration_time_s == pytest.approx(2 * 12 + sync + 0.4)
    assert shared.iteration_time_s == pytest.approx(2 * (2 * 12) + sync + 2 * 0.4)   # two ranks on one core
    assert contended.iteration_time_s == pytest.approx(1.5 * (2 * 12) + sync + 1.5 * 0.4)
    assert contended.cpu_s[0] == pytest.approx(1.5 * 2 * 12)                     # CPU time grows too
    busy = simulate_host_run(p, cluster(2), prof, cores=2, emulate_speed=False, background=2.0)
    assert busy.iteration_time_s == pytest.approx(2 * (2 * 12) + sync + 2 * 0.4)   # two other busy processes


def test_emulation_pads_to_slowdown_times_scale_and_absorbs_sharing():
    p = plan([[(0, 4, 0)], [(0, 4, 1)], [(0, 4, 2)], [(0, 4, 3)]], 1)
    prof = profile(entry())
    ded = simulate_host_run(p, cluster(4), prof, cores=4, emulate_speed=True, time_scale=1.0)
    sync = ded.grad_sync_s
    half = simulate_host_run(p, cluster(4), prof, cores=2, emulate_speed=True, time_scale=2.0)
    assert ded.iteration_time_s == pytest.approx(12 + sync + 0.4)
    # 4 ranks on 2 cores at time scale 2: every op lasts 2 x its CPU time; only the unpadded optimizer shares
    assert half.iteration_time_s == pytest.approx(2 * 12 + sync + 2 * 0.4)
    control = simulate_host_run(p, cluster(4), prof, cores=2, emulate_speed=False)
    assert control.iteration_time_s == pytest.approx(2 * 12 + sync + 2 * 0.4)  # unpadded: shared the same way
    slow = simulate_host_run(p, cluster(4), prof, cores=2, emulate_speed=True, time_scale=2.0,
                             host=HostTimeTerms(2, (1.0, 1.25)))
    assert slow.iteration_time_s == pytest.approx(1.25 * 2 * 12 + sync + 1.25 * 2 * 0.4)   # padding x contention
    assert scale_cpu_work(prof, 2.0).entries[("cpu", 1, 1)].forward_s[0] == 2.0


def test_host_terms_interpolate_and_refuse_bad_data():
    h = HostTimeTerms(4, (1.0, 1.2, 1.4, 2.0))
    assert h.kappa(0.5) == 1.0 and h.kappa(2) == 1.2 and h.kappa(3.5) == pytest.approx(1.7) and h.kappa(9) == 2.0
    with pytest.raises(HppInputError):
        HostTimeTerms.from_dict({"cores": 0, "contention": [1.0]})
