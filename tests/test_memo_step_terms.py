"""The planner's memoised tables price profiles with the runtime step's terms like the cost model."""

from __future__ import annotations

from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.memory_model import stage_memory_breakdown
from hpp.formulation.cost_model import stage_time_s
from hpp.profiles.cluster import Link
from hpp.profiles.model_profile import LayerProfile
from hpp.formulation.stage_costs import build_stage_cost_table

CFG = CostModelConfig(framework_bytes=())
L = 5


def _entry(**step) -> LayerProfile:
    z = (1e-3,) * L
    return LayerProfile("X", 1, 2, z, z, z, (1000, 4000, 4000, 4000, 3000), (500, 900, 900, 900, 700),
                        (64, 64, 64, 64, 256), **step)


STEP = dict(step_activation_bytes=(600, 1000, 1100, 1000, 800), backward_transient_bytes=(50, 300, 300, 300, 900),
            loss_activation_bytes=700, tied_param_bytes=0)


def test_step_memory_tables_are_the_cost_models_peak_at_the_largest_micro_batch_count():
    e = _entry(**STEP)
    G = 7                                                      # b = 2: at most ceil(7 / 2) = 4 micro-batches
    t = build_stage_cost_table(e, capacity_bytes=10**9, link=Link(1e9, 0.0), config=CFG, global_batch_size=G)
    assert t.step is not None and t.max_micro_batches == 4
    for S, position in ((1, 0), (2, 0), (2, 1), (3, 1)):
        k = min(4, S - position)
        for rec in (False, True):
            table = t.memory_bytes(k, rec)
            for u in range(L):
                for v in range(u + 1, L + 1):
                    if (u > 0) != (position > 0) or (v < L) != (position < S - 1):
                        continue
                    want = stage_memory_breakdown(e, u, v, position=position, num_stages=S, num_micro_batches=4,
                                                  recompute="full" if rec else "none", config=CFG)["peak"]
                    assert table[u, v] == want, (S, position, rec, u, v)
    # control: without G the tables price the in-flight count only, which is less (fewer receive buffers)
    lower = build_stage_cost_table(e, capacity_bytes=10**9, link=Link(1e9, 0.0), config=CFG)
    assert lower.memory_bytes(1, False)[1, L] < t.memory_bytes(1, False)[1, L]


def test_public_profiles_keep_the_calibrated_formula_and_headroom_lowers_the_capacity():
    e = _entry()
    t = build_stage_cost_table(e, capacity_bytes=10**9, link=Link(1e9, 0.0), config=CFG, global_batch_size=8)
    assert t.step is None and t.capacity_bytes == CFG.usable_memory_bytes(10**9)
    h = build_stage_cost_table(e, capacity_bytes=10**9, link=Link(1e9, 0.0),
                               config=CostModelConfig(framework_bytes=(), memory_headroom=0.05))
    assert h.capacity_bytes == int(10**9 * 0.95) - CFG.reserve_bytes
    link = Link(1e9, 0.0)
    for u, v in ((0, 2), (1, 3), (2, L)):
        want = stage_time_s(e, u, v, "none", link_in=link if u > 0 else None, link_out=link if v < L else None,
                            config=CFG)
        assert abs(t.compute_none_s[u, v] - want) <= 1e-15 * want
    assert t.compute_none_s[3, 1] == float("inf")
