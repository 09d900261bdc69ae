"""The hypervisor's steal: counters, the run's fraction, and the host model's use of it."""

from __future__ import annotations

import pytest

from hpp.runtime.host.time_model import simulate_host_run
from hpp.runtime.host.steal import CpuTicks, parse_cpu_line, read_cpu_ticks, run_steal, steal_fraction, tick_delta
from tests.test_time_truth import cluster, entry, plan, profile


def test_the_cpu_line_is_read_as_busy_idle_and_steal_core_seconds():
    t = parse_cpu_line("cpu  500 20 80 1000 30 10 40 150 0 0", ticks_per_s=100.0)
    assert t == CpuTicks(busy_s=6.5, idle_s=10.3, steal_s=1.5)      # user+nice+system+irq+softirq = 650 ticks
    for bad in ("cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3", ""):
        with pytest.raises(ValueError):
            parse_cpu_line(bad, ticks_per_s=100.0)
    with pytest.raises(ValueError):
        CpuTicks(-1.0, 0.0, 0.0)
    now = read_cpu_ticks()                                           # Linux here; None elsewhere
    assert now is None or now.busy_s > 0


def test_the_fraction_is_stolen_over_busy_plus_stolen_time_idle_left_out():
    a, b = CpuTicks(10.0, 50.0, 1.0), CpuTicks(13.0, 90.0, 2.0)
    d = tick_delta(a, b)
    assert d == {"busy_s": 3.0, "idle_s": 40.0, "steal_s": 1.0}
    assert steal_fraction([d]) == pytest.approx(0.25)                # 1 / (3 + 1): the 40 idle s do not count
    assert steal_fraction([d, {"busy_s": 4.0, "idle_s": 0.0, "steal_s": 0.0}]) == pytest.approx(1 / 8)
    assert steal_fraction([d, None]) is None and tick_delta(a, None) is None
    assert steal_fraction([{"busy_s": 0.0, "idle_s": 5.0, "steal_s": 0.0}]) is None


def test_the_run_fraction_skips_the_warm_up_steps_of_the_first_rank():
    host = [{"busy_s": 1.0, "idle_s": 0.0, "steal_s": 9.0},         # warm-up: not counted
            {"busy_s": 3.0, "idle_s": 1.0, "steal_s": 1.0}, {"busy_s": 3.0, "idle_s": 1.0, "steal_s": 0.0}]
    ranks = [{"rank": 1, "phases": [{"host": None}] * 3}, {"rank": 0, "phases": [{"host": h} for h in host]}]
    got = run_steal(ranks, warmup_steps=1)
    assert got == {"fraction": pytest.approx(1 / 7), "steal_s": 1.0, "busy_s": 6.0, "steps": 2}
    assert run_steal(ranks[:1], warmup_steps=1) is None               # counters missing (not Linux)


def test_steal_slows_the_cpu_work_not_the_sync_and_not_the_cpu_seconds():
    p = plan([[(0, 4, 0)], [(0, 4, 1)]], 2)                  # one stage: F 4, B 8, twice; optimizer 0.4
    base = simulate_host_run(p, cluster(2), profile(entry()), cores=2, emulate_speed=False)
    stolen = simulate_host_run(p, cluster(2), profile(entry()), cores=2, emulate_speed=False, steal=0.2)
    sync = base.grad_sync_s
    assert base.iteration_time_s == pytest.approx(24 + sync + 0.4)
    assert stolen.iteration_time_s == pytest.approx((24 + 0.4) / 0.8 + sync)
    assert stolen.cpu_s == pytest.approx(base.cpu_s)          # a stolen second is charged to no thread
    # oversubscribed: two ranks on one core get 0.5 x 0.8 of it each
    one = simulate_host_run(p, cluster(2), profile(entry()), cores=1, emulate_speed=False, steal=0.2)
    assert one.iteration_time_s == pytest.approx((2 * 24 + 2 * 0.4) / 0.8 + sync)
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError):
            simulate_host_run(p, cluster(2), profile(entry()), cores=2, emulate_speed=False, steal=bad)


def test_steal_does_not_shorten_the_emulation_padding():
    p = plan([[(0, 4, 0)], [(0, 4, 1)]], 1)                  # padded x 2: an op lasts 2 x the CPU it used
    base = simulate_host_run(p, cluster(2), profile(entry()), cores=2, emulate_speed=True, time_scale=2.0)
    stolen = simulate_host_run(p, cluster(2), profile(entry()), cores=2, emulate_speed=True, time_scale=2.0,
                               steal=0.5)
    # an op of c CPU s takes 2c wall s when half is stolen, and the padding to 2c then adds nothing
    assert stolen.iteration_time_s == pytest.approx(base.iteration_time_s + 0.4)   # only the optimizer, 0.4 -> 0.8


def test_a_run_whose_cpu_seconds_disagree_with_the_probe_says_so():
    from hpp.runtime.run_report import speed_moved_note
    assert speed_moved_note({"host_model": {"run_cpu_ratio": 1.1}}) is None
    assert speed_moved_note({"host_model": {"run_cpu_ratio": None}}) is None and speed_moved_note({}) is None
    assert "0.54 x the CPU seconds" in speed_moved_note({"host_model": {"run_cpu_ratio": 0.54}})
    assert "1.40 x" in speed_moved_note({"host_model": {"run_cpu_ratio": 1.4}})


def test_background_cores_are_the_host_busy_time_the_ranks_did_not_use():
    """Hand-computed: 2 kept steps of 0.5 s; the host was busy 1.6 + 1.4 core-s, the two ranks used 0.6 + 0.5 and
    0.4 + 0.3 CPU s: others kept (3.0 - 1.8) / 1.0 = 1.2 cores busy. The warm-up step is left out."""
    from hpp.runtime.host.steal import background_cores

    def rank(r, procs, busy=None):
        phases = [{"proc_s": c, "host": None if busy is None else {"busy_s": b, "idle_s": 0.0, "steal_s": 0.0}}
                  for c, b in zip(procs, busy or [None] * len(procs))]
        return {"rank": r, "step_times_s": [9.0, 0.5, 0.5], "phases": phases}
    r0 = rank(0, [5.0, 0.6, 0.5], busy=[9.0, 1.6, 1.4])
    r1 = rank(1, [5.0, 0.4, 0.3])
    assert background_cores([r1, r0], warmup_steps=1) == pytest.approx(1.2)
    assert background_cores([r0, rank(1, [5.0, 1.5, 1.5])], warmup_steps=1) == 0.0     # never below 0
    old = {"rank": 1, "step_times_s": [9.0, 0.5, 0.5], "phases": [{}, {}, {}]}       # an older worker: no proc_s
    assert background_cores([r0, old], warmup_steps=1) is None
    assert background_cores([rank(0, [5.0, 0.6, 0.5]), r1], warmup_steps=1) is None   # no host counters
