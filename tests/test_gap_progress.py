"""Gap progress (hpp/bench/gap_progress.py): every method on a tiny real input
(OPT-350 on 2 A100-40 + 2 V100-16, G = 64), with pinned figures, and every bound at most its incumbent."""

from __future__ import annotations

import csv
import math

import pytest

from hpp.bench.gap_progress import METHODS, GapRow, limits_lines, measure_input, summarise, summary_table
from hpp.bench.search_overhead import BenchPoint
from hpp.fileio import write_dataclass_csv
from hpp.scenarios import make_cluster


@pytest.fixture(scope="module")
def rows() -> list[GapRow]:
    gpus = {"A100-40": 2, "V100-16": 2}
    p = BenchPoint("tiny", 4, 2, "OPT-350", 64, make_cluster("tiny", gpus))
    return measure_input(p, cpsat_budgets=(0.2,), milp_budget=0.2, workers=1)


def test_every_method_has_a_row_and_each_bound_is_at_most_its_incumbent(rows):
    assert [r.method for r in rows] == list(METHODS)
    for r in rows:
        if r.method == "bound-lp-plan":      # one plan's relaxed price: no bound
            assert r.bound_s != r.bound_s and r.relaxed_s <= r.incumbent_s * (1 + 1e-9), r
            continue
        assert math.isfinite(r.incumbent_s) and r.bound_s == r.bound_s, r
        assert r.bound_s <= r.incumbent_s * (1 + 1e-9), r
        assert r.gap == pytest.approx((r.incumbent_s - r.bound_s) / r.incumbent_s)
        assert r.candidates == 89            # every candidate of the space (the bound's set)


def test_real_values_on_the_tiny_input(rows):
    by = {r.method: r for r in rows}
    # every method ends at the heuristic's plan (judged by the cost model)
    for r in rows:
        if r.method != "bound-lp-plan":
            assert r.incumbent_s == pytest.approx(5.75435, rel=1e-4)
    # the LP without the copy bound is the weakest bound; the copy bound lifts it (default, deep)
    assert by["heuristic"].bound_s == pytest.approx(4.94569, rel=1e-4)
    assert by["default"].bound_s == pytest.approx(5.41266, rel=1e-4)
    assert by["copy-bound-deep"].bound_s >= by["default"].bound_s * (1 - 1e-9)
    # the type classes lift it further (the plan mixes A100 and V100 pipelines: class B's rings cross the types)
    assert by["type-classes"].bound_method == "type-classes"
    assert by["type-classes"].bound_s == pytest.approx(5.62312, rel=1e-4)
    # class B (rings across types) is bounded first; the A classes (every pipeline on an A100, or every one on a
    # V100) set the bound
    assert "classes: B 5.6882 s, A:A100-40 5.62312 s, A:V100-16 5.62312 s" in by["type-classes"].note
    # both exact solvers prove their bound model's optimum (with a budget their model has the copy bound's per-type
    # sync floors): the copy bound's value, no more; with a budget the type-class bound runs too and sets the bound
    for name in ("cp-sat", "milp"):
        assert by[name].solver_status == "OPTIMAL"
        assert by[name].solver_model_s == pytest.approx(5.41266, rel=1e-4)
        assert by[name].bound_s == pytest.approx(by["type-classes"].bound_s, rel=1e-9)
    # the bound's own plan: its relaxed value is what the copy bound proves (at most the judged price of it)
    lp = by["bound-lp-plan"]
    assert lp.relaxed_s >= by["default"].bound_s * (1 - 1e-9) and lp.relaxed_s <= lp.incumbent_s * (1 + 1e-9)
    # 1 x 2xA100-40 + 1 x 2xV100-16, relaxed 5.41266 s, the cost model 6.34802 s (the two pipelines' ring crosses
    # the A100-V100 link, which the per-candidate sync floor does not know)
    assert lp.relaxed_s == pytest.approx(5.41266, rel=1e-4) and lp.incumbent_s == pytest.approx(6.34802, rel=1e-4)
    assert "1.00 x 2xA100-40 b=2, 1.00 x 2xV100-16 b=1" in lp.note
    # the bound model prices the incumbent plan itself within 1.5 % of its judged time (the cost model's two
    # transfers that leave the A100 node at once share its network; the bound model's links are one flow's)
    assert by["default"].plan_bound_model_s <= by["default"].incumbent_s
    assert by["default"].plan_bound_model_s == pytest.approx(by["default"].incumbent_s, rel=1.5e-2)


def test_summary_and_csv(rows, tmp_path):
    (s,) = summarise(rows)
    assert s.side_moved == "bound" and s.best_incumbent_method == "default" and s.best_bound_method == "type-classes"
    assert s.default_gap == pytest.approx(0.0594, abs=5e-4) and s.remaining_gap == pytest.approx(0.0228, abs=5e-4)
    table = summary_table([s])
    assert table.splitlines()[2].startswith("| tiny | 4 | 89 | 5.9% |")
    assert "| 5.4127 vs 6.3480 | cp-sat@0.2 OPTIMAL (its model 5.413 s); milp@0.2 OPTIMAL (its model 5.413 s) |" in table
    limits = limits_lines([s])
    assert limits[0].startswith("Beyond the default search, the methods moved the incumbent or the bound on 1 of 1")
    assert "tiny 5.413 vs 6.348 s" in limits[1]            # the relaxation is loose at the bound's own plan
    path = tmp_path / "g.csv"
    write_dataclass_csv(rows, path)
    got = list(csv.DictReader(path.open()))
    assert [g["method"] for g in got] == list(METHODS)
    assert all(float(g["bound_s"]) <= float(g["incumbent_s"]) * (1 + 1e-9) for g in got if g["method"] != "bound-lp-plan")
