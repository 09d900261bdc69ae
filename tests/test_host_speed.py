"""Time truth: ``hpp run`` on CPU predicts at this host's speed (hpp.runtime.profile.host_speed).

The probe is monkeypatched except in one test, which runs it for real on the bundled gpt-tiny profile
with few repeats and asserts no time.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

import hpp.runtime.profile.host_speed as host_speed
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.runtime.host.time_model import scale_cpu_work, simulate_host_run
from hpp.runtime.profile.host_speed import HostSpeed, calibrate_host_speed
from hpp.runtime.run_report import predict_run

LINK = Link(1e6, 1e-3)
#: What profile_model writes for a one-thread CPU profile (the probe's eligibility test reads these keys).
CPU_META = {"device": "cpu", "clock": "thread_time (CPU time of the compute thread)", "num_threads": 1,
            "warmup": 2, "repeats": 4, "dtype": "float32", "runtime_model": "gpt-tiny"}


def entry(device_type: str = "cpu", mb: int = 1) -> LayerProfile:
    return LayerProfile(device_type, 1, mb, (1.0, 1.0, 1.0, 1.0), (2.0, 2.0, 2.0, 2.0), (0.1, 0.1, 0.1, 0.1),
                        (10, 10, 10, 10), (100, 100, 100, 100), (100, 100, 100, 100))


def profile(*entries: LayerProfile, **meta) -> ModelProfile:
    return ModelProfile("toy", 4, 8, {e.key: e for e in entries or (entry(),)}, meta=meta)


def cluster(n: int, slowdown: float = 1.0) -> Cluster:
    return Cluster("toy", {"cpu": DeviceType("cpu", 10**9, n, slowdown=slowdown)}, (Node("cpu", n, LINK),), LINK)


def two_stage_plan(m: int = 3) -> Plan:
    """Two pipelines of two stages on four ranks: more ranks than a 2-core host has cores."""
    pipes = tuple(Pipeline((Stage(0, 2, "cpu", 1, (2 * p,)), Stage(2, 4, "cpu", 1, (2 * p + 1,))), 1, m)
                  for p in range(2))
    return Plan("toy", 4, 2 * m, pipes, 8)


@pytest.fixture
def probe_2x(monkeypatch):
    """The probe measures twice the profile's reference (layer 2: forward 1 s + backward 2 s = 3 s)."""
    calls = []

    def fake(rmodel, layer, **kw):
        calls.append((layer, kw))
        return [6.0, 6.0, 6.0]
    monkeypatch.setattr(host_speed, "probe_reference_s", fake)
    return calls


def _no_probe(*_a, **_k):
    raise AssertionError("the probe must not run")


@pytest.mark.parametrize("emulate, time_scale, slowdown", [(False, 1.0, 1.0), (True, 2.0, 2.0)])
def test_the_factor_scales_the_profiles_cpu_work_once(probe_2x, emulate, time_scale, slowdown):
    prof, cl, pl = profile(**CPU_META), cluster(4, slowdown), two_stage_plan()
    hs = calibrate_host_speed(prof, device="cpu", model=object(), budget_s=1e3)     # toy seconds: no cut
    assert hs.factor == 2.0 and hs.profile_s == 3.0 and hs.here_s == 6.0 and hs.reason is None
    layer, kw = probe_2x[0]
    assert layer == 2 and (kw["warmup"], kw["repeats"]) == (2, 4) and kw["cpu_time"] and kw["param_bytes"] == 10
    pred = predict_run(pl, cl, prof, time_scale=time_scale, device="cpu", emulate_speed=emulate, host_speed=hs)
    cores = os.cpu_count() or 1
    want = simulate_host_run(pl, cl, scale_cpu_work(prof, 2.0), cores=cores, emulate_speed=emulate,
                             time_scale=time_scale)
    as_is = simulate_host_run(pl, cl, prof, cores=cores, emulate_speed=emulate, time_scale=time_scale)
    assert pred["iteration_time_s"] == want.iteration_time_s
    assert pred["throughput_samples_per_s"] == pl.global_batch_size / want.iteration_time_s
    assert pred["host_model"]["cpu_s"] == list(want.cpu_s)
    assert pred["host_model"]["profile_as_is_iteration_time_s"] == as_is.iteration_time_s
    assert pred["host_speed"]["factor"] == 2.0 and "layer 2 (cpu, tp 1, mb 1)" in pred["host_speed"]["reference"]
    # control: a prediction that ignored the factor (or applied it twice) would be this far off
    assert pred["iteration_time_s"] > 1.5 * as_is.iteration_time_s
    twice = simulate_host_run(pl, cl, scale_cpu_work(prof, 4.0), cores=cores, emulate_speed=emulate,
                              time_scale=time_scale)
    assert pred["iteration_time_s"] < 0.75 * twice.iteration_time_s
    # the plan's own estimate and the closed form stay on the profile as is
    plain = predict_run(pl, cl, prof, time_scale=time_scale, device="cpu", emulate_speed=emulate)
    for key in ("plan_iteration_time_s", "cost_model_iteration_time_s", "pipeline_time_s"):
        assert pred[key] == plain[key]


def test_off_switch_and_no_factor_give_the_profile_as_is(monkeypatch):
    monkeypatch.setattr(host_speed, "probe_reference_s", _no_probe)
    prof, cl, pl = profile(**CPU_META), cluster(4), two_stage_plan()
    off = HostSpeed.skipped("host calibration off (--no-host-calibration)")
    pred = predict_run(pl, cl, prof, device="cpu", host_speed=off)
    want = simulate_host_run(pl, cl, prof, cores=os.cpu_count() or 1, emulate_speed=False)
    assert pred["iteration_time_s"] == want.iteration_time_s == predict_run(pl, cl, prof)["iteration_time_s"]
    assert pred["host_speed"]["factor"] is None and "--no-host-calibration" in pred["host_speed"]["reason"]
    assert "host_speed" not in predict_run(pl, cl, prof)


def test_skip_reasons(monkeypatch):
    monkeypatch.setattr(host_speed, "probe_reference_s", _no_probe)
    good = profile(**CPU_META)
    cases = [
        (calibrate_host_speed(good, device="cuda", model=object()), "on cuda, not cpu"),
        (calibrate_host_speed(None), "no profile"),
        (calibrate_host_speed(profile(), model=object()), "not one of hpp profile's CPU measurements"),
        (calibrate_host_speed(profile(entry(mb=2), **CPU_META), model=object()),
         "no entry (cpu, tp 1, micro-batch 1)"),
        (calibrate_host_speed(profile(entry(), entry("gpu"), **CPU_META), model=object()),
         "2 measured device types"),
        (calibrate_host_speed(profile(**{**CPU_META, "dtype": "int8"}), model=object()), "dtype 'int8'"),
        (calibrate_host_speed(profile(**{**CPU_META, "runtime_model": "no-such-model"})),
         "the runtime cannot build toy"),
    ]
    for hs, reason in cases:
        assert hs.factor is None and reason in hs.reason, hs.reason
    # an emulated type is not a measured one: the base type is the reference
    emu = profile(entry(), entry("cpu-2x"), **CPU_META, emulated={"cpu-2x": {"base": "cpu", "slowdown": 2.0}})
    assert host_speed.reference_of(emu) == ("cpu", 2, 3.0)
    # a GPU run keeps the cost model's prediction and carries no host_speed
    pred = predict_run(two_stage_plan(), cluster(4), good, device="cuda", host_speed=cases[0][0])
    assert "host_speed" not in pred and "host_model" not in pred


def test_a_large_layer_cuts_the_profiles_repeats_to_fit_the_budget(probe_2x):
    slow = replace(entry(), forward_s=(1.0,) * 4, backward_s=(2.0,) * 4)      # 3.1 s per iteration
    hs = calibrate_host_speed(profile(slow, **{**CPU_META, "warmup": 5, "repeats": 20}), model=object(),
                              budget_s=1.5)
    _layer, kw = probe_2x[0]
    assert (kw["warmup"], kw["repeats"]) == (1, 3) and "cut to fit the probe" in hs.reference


def test_the_real_probe_on_the_bundled_profile():
    """The probe itself (measure_layer on gpt-tiny's layer 3), with 1 warm-up + 3 repeats, one round."""
    from hpp.profiles.bundled import load_bundled_profile
    prof = load_bundled_profile("gpt-tiny")
    quick = replace(prof, meta={**prof.meta, "warmup": 1, "repeats": 3})
    hs = calibrate_host_speed(quick, rounds=1)
    assert hs.factor is not None and hs.factor > 0 and len(hs.samples_s) == 1, hs.reason
    assert hs.reference.startswith("gpt-tiny layer 3 (cpu, tp 1, mb 1) forward+backward, CPU time")
    e = quick.entries[("cpu", 1, 1)]
    wrong = replace(quick, entries={**quick.entries, e.key: replace(e, param_bytes=(1,) * 6)})
    hs = calibrate_host_speed(wrong, rounds=1)
    assert hs.factor is None and "parameter bytes" in hs.reason


def test_cli_flag_and_summary(monkeypatch):
    from hpp.runtime import cli
    seen = {}

    class Rep:
        def to_dict(self):
            return {}

    def fake_run_plan(config):
        seen["host_calibration"] = config.emulation.host_calibration
        return Rep()
    for argv, want in ((["p.json", "--steps", "2"], True), (["p.json", "--steps", "2", "--no-host-calibration"],
                                                            False)):
        cli._run(cli._run_parser().parse_args(argv), fake_run_plan)
        assert seen["host_calibration"] is want
    rep = {"plan": "p.json", "model": "toy", "world_size": 4, "steps": 2, "launcher": "fork", "emulate_speed": False,
           "dtype": "float32", "training": {}, "notes": [], "ranks": [],
           "measured": {"iteration_time_s": 0.43, "throughput_samples_per_s": 74.0, "tokens_per_s": 9500.0},
           "collectives": {"count": 2, "bytes": 8, "mode": "block-bucketed", "num_blocks": 2},
           "predicted": {"iteration_time_s": 0.42, "throughput_samples_per_s": 76.0, "time_scale": 1.0,
                         "host_speed": HostSpeed(2.41, profile_s=1.0, here_s=2.41).to_dict()}}
    assert ("predicted 0.4200 s (profile times x 2.41: this host ran the speed probe 2.41 x slower than the "
            "profile's host)") in cli._human_run(rep)
    rep["predicted"]["host_speed"] = HostSpeed(0.8, profile_s=1.0, here_s=0.8).to_dict()
    assert "(profile times x 0.80: this host ran the speed probe 1.25 x faster than the profile's host)" \
        in cli._human_run(rep)
    rep["predicted"]["host_model"] = {"steal": 0.004, "without_steal_iteration_time_s": 0.41}
    assert "hypervisor" not in cli._human_run(rep)              # under half a percent: not worth a word
    rep["predicted"]["host_model"] = {"steal": 0.14, "without_steal_iteration_time_s": 0.376,
                                      "run_cpu_ratio": 1.06, "at_run_cpu_speed_iteration_time_s": 0.4616}
    text = cli._human_run(rep)
    assert "(the hypervisor took 14% of the cores' time during the steps; 0.3760 s without)" in text
    assert "the ranks' ops used 1.06 x the CPU seconds predicted; at their speed the host model gives 0.4616 s" in text
    rep["predicted"]["host_speed"] = HostSpeed.skipped("host calibration off (--no-host-calibration)").to_dict()
    assert "(profile times as measured: host calibration off (--no-host-calibration))" in cli._human_run(rep)


def test_probes_before_and_after_the_run_bracket_its_speed():
    from hpp.runtime.profile.host_speed import bracket
    before = HostSpeed(2.0, reference="ref", profile_s=1.0, here_s=2.0, samples_s=(1.9, 2.0, 2.1), probe_wall_s=0.5)
    after = HostSpeed(3.0, reference="ref", profile_s=1.0, here_s=3.0, samples_s=(2.9, 3.0, 3.1), probe_wall_s=0.4)
    both = bracket(before, after)
    assert both.factor == pytest.approx(2.5) and both.samples_s == (1.9, 2.0, 2.1, 2.9, 3.0, 3.1)  # median of six
    assert both.probe_wall_s == pytest.approx(0.9) and "3 rounds before the run, 3 after" in both.reference
    skipped = HostSpeed.skipped("no")
    assert bracket(skipped, after) is after and bracket(before, skipped) is before
