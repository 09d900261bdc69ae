"""Cost model vs the 15 real OPT-350 runs on GH200 nodes (Sailor artifact): MAPE <= 6.1 % time, <= 3.0 % memory."""

import pytest

from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan
from hpp.interop import load_any_plan
from hpp.interop.sailor import sailor_measurement
from hpp.plan_data import read_plan_json
from hpp.profiles.bundled import load_bundled_profile


def _errors(sailor_root, config):
    prof = load_bundled_profile("OPT-350")
    runs = sorted((sailor_root / "validation-calibration").glob("*.json"))
    assert len(runs) == 15
    out = {}
    for path in runs:
        meas = sailor_measurement(read_plan_json(path), source=str(path))
        plan, cluster, _ = load_any_plan(path, profile=prof)          # format detected: sailor
        est = estimate_plan(plan, cluster, prof, config=config)
        out[path.stem] = (100 * abs(est.iteration_time_s - meas.iteration_time_s) / meas.iteration_time_s,
                          100 * abs(est.peak_memory_bytes - meas.peak_memory_bytes) / meas.peak_memory_bytes)
    return out


def test_default_cost_model_meets_the_calibration_targets(sailor_root):
    err = _errors(sailor_root, CostModelConfig())
    time_mape = sum(t for t, _ in err.values()) / len(err)
    mem_mape = sum(m for _, m in err.values()) / len(err)
    assert time_mape <= 6.1, err
    assert mem_mape <= 3.0, err
    # no single run far off in memory (the quantity HPP's stage shapes depend on)
    assert max(m for _, m in err.values()) <= 10.0, err


def test_calibrated_model_beats_v1(sailor_root):
    v1, v2 = _errors(sailor_root, CostModelConfig.v1()), _errors(sailor_root, CostModelConfig())
    assert sum(t for t, _ in v2.values()) < sum(t for t, _ in v1.values())
    assert sum(m for _, m in v2.values()) < 0.2 * sum(m for _, m in v1.values())


def test_sailor_measurement_reads_the_run_figures(sailor_root):
    m = sailor_measurement(read_plan_json(sailor_root / "validation-calibration" / "N16_plan_config_N16_D4.json"))
    assert (m.iteration_time_s, m.peak_memory_bytes, m.num_nodes) == (2.72578, 25140658176, 16)


def test_sailor_measurement_refuses_a_missing_figure():
    from hpp.errors import HppInputError
    with pytest.raises(HppInputError, match="real=None is not a positive measurement") as exc:
        sailor_measurement({"max_mem": 1}, source="run.json")
    assert exc.value.source == "run.json" and exc.value.field == "real"


def test_only_the_stale_red_grads_is_flagged(sailor_root):
    """N4_D4's ``red_grads`` (1.06 s of a 1.24 s iteration) is a copy of an iteration time, not a sync time; the
    other 14 runs' (0.3-11 % of theirs) pass."""
    flagged = {}
    for path in sorted((sailor_root / "validation-calibration").glob("*.json")):
        m = sailor_measurement(read_plan_json(path), source=str(path))
        flagged[path.stem.split("plan_config_")[-1]] = m.grad_sync_note
    assert [k for k, note in flagged.items() if note] == ["N4_D4"]
    assert "86% of the measured iteration" in flagged["N4_D4"] and "not used" in flagged["N4_D4"]


def test_a_red_grads_of_half_the_iteration_is_flagged():
    assert not sailor_measurement({"real": 2.0, "max_mem": 1, "red_grads": 0.99}).grad_sync_note
    m = sailor_measurement({"real": 2.0, "max_mem": 1, "red_grads": 1.0})
    assert not m.grad_sync_usable and "50% of the measured iteration (2 s)" in m.grad_sync_note
