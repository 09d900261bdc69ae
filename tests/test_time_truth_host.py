"""The host model's real-op terms: kappa past the cores and the CPU an op pays after a wait."""

from __future__ import annotations

import pytest

from hpp.errors import HppInputError
from hpp.profiles.step_time import HostTimeTerms
from hpp.runtime.host.time_model import simulate_host_run
from hpp.runtime.host.ops import MeasuredHost, OpProbe, op_probe_of
from tests.test_time_truth import cluster, entry, plan, profile


def probe(kappa=(1.0, 1.0, 1.0, 1.0), wake=0.0) -> OpProbe:
    return OpProbe("toy", 1.0, tuple(kappa), (wake,) * len(kappa), 2)


def test_the_probe_is_monotone_clamped_and_interpolates():
    p = OpProbe.from_measured("toy", [2.0, 2.0, 2.0, 1.0], [2.0, 1.8, 3.0, 1.45], [2.5, 2.1, 2.4, 2.5], cores=2)
    # ratios 1, 0.9, 1.5, 1.45: never cheaper with more processes, so the dips are pooled (isotonic fit)
    assert p.kappa == pytest.approx((1.0, 1.0, 1.475, 1.475))
    assert p.wake_s == pytest.approx((0.3, 0.3, 0.4, 1.5))   # 0.5, 0.1, 0.4, 1.5: each n against its own reference
    assert p.hot_s == 2.0
    # cycling processes also contend (n / 2 at a time on 2 cores): that part is kappa's, the rest is the wake
    q = OpProbe.from_measured("toy", [1.0] * 4, [1.0, 1.2, 1.3, 1.4], [1.0, 1.0, 1.5, 1.7], cores=2)
    assert q.wake_s == pytest.approx((0.0, 0.0, 0.4, 0.5))      # 1.5 - kappa(1.5) = 1.1, 1.7 - kappa(2) = 1.2
    assert p.kappa_at(0.3) == 1.0 and p.kappa_at(2.5) == pytest.approx(1.2375) and p.kappa_at(40) == 1.475
    assert p.wake_at(0) == 0.0 and p.wake_at(4) == 1.5 and p.wake_at(9) == 1.5
    with pytest.raises(HppInputError):
        OpProbe("toy", 1.0, (0.8, 1.0), (0.0, 0.0), 2)
    with pytest.raises(HppInputError):
        OpProbe.from_dict({"op": "toy", "hot_s": 1.0, "kappa": [1.0]})


def test_the_probe_travels_in_the_profile_meta():
    host = MeasuredHost(2, (1.0, 1.1), 0.5, ops=probe(wake=0.25))
    d = host.to_dict()
    assert d["contention"] == [1.0, 1.1] and op_probe_of({"host_time": d}) == probe(wake=0.25)
    assert op_probe_of({"host_time": HostTimeTerms(2, (1.0,)).to_dict()}) is None and op_probe_of({}) is None


def test_back_to_back_ops_pay_the_wake_once_per_step():
    p = plan([[(0, 4, 0)], [(0, 4, 1)]], 2)                  # one stage: F 4, B 8, twice; optimizer 0.4
    base = simulate_host_run(p, cluster(2), profile(entry()), cores=2, emulate_speed=False)
    sync = base.grad_sync_s
    woke = simulate_host_run(p, cluster(2), profile(entry()), cores=2, emulate_speed=False, ops=probe(wake=0.5))
    assert base.iteration_time_s == pytest.approx(24 + sync + 0.4)
    assert woke.iteration_time_s == pytest.approx(24 + 0.5 + sync + 0.4)   # only the step's first op waited
    assert woke.cpu_s[0] == pytest.approx(24.5)


def test_oversubscribed_ranks_pay_the_measured_kappa_past_the_cores():
    p = plan([[(0, 4, 0)], [(0, 4, 1)]], 2)
    ops = probe(kappa=(1.0, 1.5, 1.5, 1.5))
    h = simulate_host_run(p, cluster(2), profile(entry()), cores=1, emulate_speed=False, ops=ops)
    sync = h.grad_sync_s
    # two ranks on one core: half a core each, and 1.5 x the CPU per op -> 3 x the work
    assert h.iteration_time_s == pytest.approx(3 * 24 + sync + 3 * 0.4)
    assert h.cpu_s[0] == pytest.approx(1.5 * 24)
    control = simulate_host_run(p, cluster(2), profile(entry()), cores=1, emulate_speed=False,
                                host=HostTimeTerms(1, (1.0, 1.5)))   # the old matmul kappa stops at the cores
    assert control.iteration_time_s == pytest.approx(2 * 24 + sync + 2 * 0.4)


def test_emulated_ops_after_a_sleep_pay_the_wake_and_its_padding():
    p = plan([[(0, 4, 0)], [(0, 4, 1)]], 1)                  # 2 ranks, 2 cores, padded x 2: F then B sleep
    h = simulate_host_run(p, cluster(2), profile(entry()), cores=2, emulate_speed=True, time_scale=2.0,
                          ops=probe(wake=0.5))
    sync = h.grad_sync_s
    assert h.iteration_time_s == pytest.approx(2 * (4 + 0.5) + 2 * (8 + 0.5) + sync + 0.4)
    assert h.cpu_s[0] == pytest.approx(13.0)


def test_the_profile_meta_supplies_the_probe_unless_host_terms_are_given():
    meta = {"host_time": MeasuredHost(2, (1.0, 1.0), ops=probe(wake=0.5)).to_dict()}
    p = plan([[(0, 4, 0)], [(0, 4, 1)]], 2)
    from_meta = simulate_host_run(p, cluster(2), profile(entry(), **meta), cores=2, emulate_speed=False)
    explicit = simulate_host_run(p, cluster(2), profile(entry(), **meta), cores=2, emulate_speed=False,
                                 host=HostTimeTerms(2, (1.0, 1.0)))
    assert from_meta.iteration_time_s == pytest.approx(explicit.iteration_time_s + 0.5)


def test_scaling_the_cpu_work_scales_the_probe_seconds_not_its_ratios():
    from hpp.runtime.host.time_model import scale_cpu_work
    prof = profile(entry(), host_time=MeasuredHost(2, (1.0, 1.0), ops=probe(kappa=(1.0, 1.5), wake=0.5)).to_dict())
    ops = op_probe_of(scale_cpu_work(prof, 2.0).meta)
    assert ops.wake_s == (1.0, 1.0) and ops.kappa == (1.0, 1.5) and ops.hot_s == 2.0
    assert op_probe_of(prof.meta).wake_s == (0.5, 0.5)                      # the input is left alone


def test_a_rank_asleep_in_a_receive_wakes_later_while_others_compute():
    from dataclasses import replace
    p = plan([[(0, 2, 0), (2, 4, 1)]], 2)                    # F = 2, B = 4 per stage; no transfer time
    prof = profile(replace(entry(), output_bytes=(0, 0, 0, 0)))
    ops = OpProbe("toy", 1.0, (1.0, 1.0), (0.0, 0.0), 2, (0.5, 0.5))
    h = simulate_host_run(p, cluster(2), prof, cores=2, emulate_speed=False, ops=ops)
    # stage 1 wakes for F0 at 2 + 0.5; stage 0 sleeps in both of its backward receives: 18 + 2 x 0.5
    assert h.schedule_end_s == pytest.approx((19.0, 14.5)) and h.iteration_time_s == pytest.approx(19.2)
    control = simulate_host_run(p, cluster(2), prof, cores=2, emulate_speed=False, ops=replace(ops, recv_wake_s=()))
    assert control.schedule_end_s == pytest.approx((18.0, 14.0))
    assert ops.recv_wake_at(7) == 0.5 and OpProbe.from_dict(ops.to_dict()) == ops
