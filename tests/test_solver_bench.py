"""The solver benchmark's row (hpp/bench/solvers.py): it holds the solver's SolveResult, and its CSV keeps the
columns of the results already written (experiments/results/bench_solvers.csv); the search benchmark's rows
read back from experiments/results/search_overhead.csv. No solving here (see test_solvers.py)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from hpp.bench.search_report import SearchRow, read_csv
from hpp.bench.solvers import CSV_COLUMNS, BenchRow, summary_table, write_csv
from hpp.formulation.composition.solve import SolveResult

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"


def _row(**kw) -> BenchRow:
    result = SolveResult(solver="milp", status="OPTIMAL", objective_s=2.0, bound_s=2.0, gap=0.0, wall_s=0.5,
                         num_candidates=7, nodes=3, solver_status="OPTIMAL", solver_model_objective_s=1.99,
                         source="milp", bound_method="milp", note="n")
    return BenchRow("inst", "synthetic/types", 16, 2, 16, 9, 0.1, result, **kw)


def test_row_reads_the_results_figures_and_keeps_its_own():
    r = _row(time_to_best_s=0.5, reached_best=True)
    assert (r.solver, r.status, r.objective_s, r.bound_s, r.gap, r.wall_s) == ("milp", "OPTIMAL", 2.0, 2.0, 0.0, 0.5)
    assert r.proven_optimal and r.solver_status == "OPTIMAL" and r.nodes == 3 and r.note == "n"
    assert r.num_candidates == 9                 # the instance's, not the result's 7 (after the presolve)
    with pytest.raises(AttributeError):
        r.no_such_figure
    assert list(r.as_csv()) == list(CSV_COLUMNS)
    assert "milp" in summary_table([r])


def test_csv_columns_are_those_of_the_results_file(tmp_path):
    write_csv([_row()], tmp_path / "b.csv")
    with (tmp_path / "b.csv").open() as f:
        header = next(csv.reader(f))
    assert tuple(header) == CSV_COLUMNS
    results = RESULTS / "bench_solvers.csv"
    if results.exists():
        with results.open() as f:
            assert tuple(next(csv.reader(f))) == CSV_COLUMNS


def test_search_results_read_back():
    rows = read_csv(RESULTS / "search_overhead.csv")
    if not rows:
        pytest.skip("no search_overhead.csv")
    assert all(isinstance(r, SearchRow) for r in rows)
    assert any(r.method == "hpp" and math.isfinite(r.iteration_time_s) for r in rows)
