"""Predicted speedup of HPP over the uniform and single-shape baselines on every bundled scenario.

    python experiments/scenarios.py [--quick] [--time-limit S]

Writes experiments/results/scenarios.csv and scenarios.png and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from hpp.bench.evaluation import plot_speedups, scenario_line, scenario_rows, write_rows
from hpp.scenarios import SCENARIOS

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the GPU scenarios up to 40 GPUs only")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="HPP's wall-clock search budget [s] (default: none, the default deterministic budget)")
    ap.add_argument("--single-shape-budget", type=float, default=60.0, help="cap on the single-shape search [s]")
    ap.add_argument("--out", type=Path, help="CSV to write (default results/scenarios.csv; with --quick "
                    "results/scenarios_quick.csv, so that a quick run leaves the README's file alone)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = RESULTS / ("scenarios_quick.csv" if args.quick else "scenarios.csv")
    names = [n for n, s in SCENARIOS.items() if not args.quick or sum(c for _, c in s.gpus) <= 40]
    rows = scenario_rows(names, time_limit_s=args.time_limit, single_shape_budget_s=args.single_shape_budget)
    write_rows(rows, args.out)
    plot_speedups(rows, args.out.with_suffix(".png"))
    for r in rows:
        print(scenario_line(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
