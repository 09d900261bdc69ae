"""``hpp run``'s checks before any rank starts (hpp/runtime/run_checks.py): a CPU host's memory for the ranks'
predicted peaks (a GPU plan of OPT-350 on this 2-core, 24 GiB host used to run until the OS killed a rank), and
the timeline PNG's folder."""

from __future__ import annotations

import pytest

from hpp.errors import HppInputError
from hpp.formulation.cost_model import estimate_plan
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.runtime.run_checks import check_host_memory, check_png_path, mem_available_bytes
from hpp.scenarios import SCENARIOS


def _plan(name: str):
    sc = SCENARIOS[name]
    cluster, profile = sc.cluster(), load_bundled_profile(sc.model)
    return plan_hpp(cluster, profile, sc.global_batch_size, seed_plans={}).plan, cluster, profile


def test_a_gpu_plan_of_a_real_model_is_refused_on_a_cpu_host_that_cannot_hold_it():
    plan, cluster, profile = _plan("opt350-a100x4-v100x4")
    ranks = range(plan.num_devices)
    est = estimate_plan(plan, cluster, profile)
    need = sum(s.memory_bytes * st.tp_degree for p, pe in zip(plan.pipelines, est.pipelines)
               for st, s in zip(p.stages, pe.stages))                       # by hand: every device's stage peak
    with pytest.raises(HppInputError) as exc:
        check_host_memory(plan, cluster, profile, ranks, device="cpu", available_bytes=need * 0.99)
    msg = exc.value.message
    assert f"this host's {plan.num_devices} ranks need about {need / 2**30:.1f} GiB of memory" in msg, msg
    assert "A100-40" in msg and exc.value.field == "pipelines" and "--scenario cpu-hetero-4" in exc.value.fix
    # control: the same plan fits a host with that much memory, and a GPU run is not checked against host memory
    check_host_memory(plan, cluster, profile, ranks, device="cpu", available_bytes=need * 1.01)
    check_host_memory(plan, cluster, profile, ranks, device="cuda", available_bytes=1.0)
    # one host of several checks its own ranks only
    check_host_memory(plan, cluster, profile, [0], device="cpu", available_bytes=need / 2)


def test_the_cpu_demo_fits_and_the_host_reports_its_memory():
    plan, cluster, profile = _plan("cpu-hetero-4")
    avail = mem_available_bytes()
    assert avail is None or avail > 2**28
    check_host_memory(plan, cluster, profile, range(plan.num_devices), device="cpu")


def test_timeline_png_path_needs_an_existing_writable_folder(tmp_path):
    assert check_png_path(None) is None
    assert check_png_path(tmp_path / "t.png") == tmp_path / "t.png"
    with pytest.raises(HppInputError, match="cannot be written") as exc:
        check_png_path(tmp_path / "nodir" / "t.png")
    assert exc.value.field == "timeline" and not (tmp_path / "nodir").exists()
    with pytest.raises(HppInputError):
        check_png_path(tmp_path)                                           # a folder, not a file
