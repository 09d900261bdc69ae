"""Speed emulation pads to a multiple of the op's CPU time (robust to a busy host); time dilation."""

from __future__ import annotations

import pytest

from hpp.runtime.host.emulation import Instrument
from hpp.runtime.profile.profiler import dilate_profile, profile_model


class FakeClocks:
    """Wall and CPU clocks driven by the wrapped function."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def op(self, wall_s: float, cpu_s: float):
        def fn(_chunk):
            self.wall += wall_s
            self.cpu += cpu_s
        return fn


@pytest.mark.parametrize("slowdown,scale,wall,cpu,pad", [
    (1.0, 1.0, 0.010, 0.005, 0.0),      # no emulation: never padded, even when descheduled
    (2.0, 1.0, 0.010, 0.010, 0.010),    # uncontended: pad (k - 1) x
    (2.0, 1.0, 0.015, 0.010, 0.005),    # waited 5 ms for a core: padded less, same op length
    (2.0, 1.0, 0.030, 0.010, 0.0),      # waited longer than the target: no pad (and no negative sleep)
    (1.0, 2.0, 0.015, 0.010, 0.005),    # time scale alone slows a 1x device
    (3.0, 2.0, 0.010, 0.010, 0.050),
])
def test_padding_targets_cpu_time_times_factor(monkeypatch, slowdown, scale, wall, cpu, pad):
    clocks = FakeClocks()
    slept = []
    monkeypatch.setattr("hpp.runtime.host.emulation.time.sleep", slept.append)
    inst = Instrument(slowdown=slowdown, time_scale=scale, clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu)
    inst.wrap(clocks.op(wall, cpu), "F")(0)
    assert sum(slept) == pytest.approx(pad) and inst.padding_s == pytest.approx(pad)
    assert inst.cpu_s == pytest.approx(cpu) and inst.compute_s == pytest.approx(wall)


def test_bad_factors_are_refused():
    with pytest.raises(ValueError):
        Instrument(slowdown=0.5)
    with pytest.raises(ValueError):
        Instrument(time_scale=0.9)


def test_dilate_profile_scales_compute_not_optimizer():
    prof = profile_model("gpt-tiny", micro_batch_sizes=(1,), warmup=0, repeats=1)
    assert dilate_profile(prof, 1.0) is prof
    d = dilate_profile(prof, 2.5)
    e, f = prof.layer_profile("cpu", 1, 1), d.layer_profile("cpu", 1, 1)
    assert f.forward_s == pytest.approx(tuple(2.5 * x for x in e.forward_s))
    assert f.backward_s == pytest.approx(tuple(2.5 * x for x in e.backward_s))
    assert f.optimizer_s == e.optimizer_s and d.meta["time_scale"] == 2.5
    assert "thread_time" in prof.meta["clock"] and "load_average" in prof.meta
