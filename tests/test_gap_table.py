"""The gap table (hpp/bench/gap_table.py, experiments/gap_table.py): its rows are hpp plan's figures, its target
lines are computed from them, the relaxation's own plan is priced by both models."""

from __future__ import annotations

import pytest

from hpp.bench.gap_table import (DEFAULT_BUDGET, GapTableRow, gap_table_markdown, measure_row, read_gap_table,
                                 read_relaxation, relaxation_row, write_rows)
from hpp.formulation.composition.solve import gap


def _row(name: str, gpus: int, budget: str, obj: float, bound: float) -> GapTableRow:
    return GapTableRow(name, gpus, budget, 10, obj, bound, gap(obj, bound), "FEASIBLE", "heuristic", "lp", 0.1)


def test_target_lines_are_computed_from_the_rows():
    rows = [_row("a", 8, DEFAULT_BUDGET, 10.0, 9.6), _row("b", 40, DEFAULT_BUDGET, 10.0, 9.0),
            _row("c", 512, DEFAULT_BUDGET, 10.0, 7.0), _row("c", 512, "10 s", 10.0, 8.0), _row("c", 512, "60 s", 10.0, 9.6)]
    text = "\n".join(gap_table_markdown(rows))
    assert "| a | 8 | default | 10 | 10.0000 | 9.6000 | 4.0% |" in text
    assert "met on 1 of 2 (missed: b 10.0%)" in text              # 4 % meets 5 %, 10 % does not
    assert "c: gap 30.0% (default), 20.0% (10 s), 4.0% (60 s); <= 5 % at 60 s: met; never rising" in text
    worse = rows[:4] + [_row("c", 512, "60 s", 10.0, 7.5)]          # the control: 25 % after 20 %
    assert "not met; not monotone with the limit" in "\n".join(gap_table_markdown(worse))


def test_a_row_is_hpp_plans_figures_and_round_trips_through_the_csv(tmp_path):
    r = measure_row("cpu-hetero-4", workers=1)
    assert r.budget == DEFAULT_BUDGET and r.num_gpus == 4 and r.bound_s <= r.objective_s
    assert r.gap == pytest.approx(gap(r.objective_s, r.bound_s), abs=1e-15)
    write_rows([r], tmp_path / "g.csv")
    assert read_gap_table(tmp_path / "g.csv") == [r]


def test_the_relaxations_own_plan_is_priced_below_its_cost_model_time(tmp_path):
    r = relaxation_row("opt350-a100x4-v100x4")
    assert r.relaxed_s <= r.cost_model_s * (1 + 1e-9)              # the bound model is a relaxation of the cost model
    assert r.bound_s * (1 - 1e-9) <= r.relaxed_s <= r.bound_s * (1 + 1e-3)   # the plan that sets the bound
    assert r.cost_model_sync_s >= 0 and " x " in r.plan
    write_rows([r], tmp_path / "r.csv")
    assert read_relaxation(tmp_path / "r.csv") == [r]
