"""Gap progress (issue 21): per input, how far each method moves the incumbent and the bound.

    python experiments/gap_progress.py --quick     # 2types-8 and 2types-16, CP-SAT and MILP at 1 unit (< 1 min)
    python experiments/gap_progress.py             # sizes 8-1024 at 2-4 types + 5 bundled scenarios (~10 min;
                                                   # CP-SAT@10 and MILP@10 only on 2types-8, 3types-12, 4types-16)

Methods (hpp/bench/gap_progress.py): heuristic (incumbent + LP bound without the copy bound), default
(``plan_hpp``, no baseline seeds), copy-bound-deep (rel_tol 0, 10x local search), bound-lp-plan (the copy
bound's own LP plan: its relaxed price vs the cost model's), cp-sat and milp on all presolved candidates at
deterministic budgets. Writes experiments/results/gap_progress.csv (with --quick:
gap_progress_quick.csv) one row per method, and prints the per-input summary as a markdown table.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

from hpp.bench.gap_progress import (FULL_SCENARIOS, FULL_SIZES, FULL_TYPES, MAX_EXACT_CANDIDATES, GapRow, gap_points,
                                    limits_lines, measure_inputs, summarise, summary_table)
from hpp.cliparse import Parser, comma_list
from hpp.errors import HppInputError, InfeasibleError
from hpp.fileio import write_dataclass_csv

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="gap_progress", help_command="python experiments/gap_progress.py --help",
                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2types-8 and 2types-16, exact solvers at 1 unit only")
    ap.add_argument("--sizes", type=comma_list(int),
                    help=f"GPU counts of the sweep (default {','.join(map(str, FULL_SIZES))})")
    ap.add_argument("--types", type=comma_list(int), help=f"type counts (default {','.join(map(str, FULL_TYPES))})")
    ap.add_argument("--scenarios", type=comma_list(str), help="bundled scenarios to add (comma-separated; '' for none)")
    ap.add_argument("--cpsat-budgets", type=comma_list(float), help="CP-SAT deterministic budgets (default 1,10)")
    ap.add_argument("--milp-budget", type=float, help="MILP deterministic budget (default 10; 0: no MILP)")
    ap.add_argument("--exact-up-to", type=int,
                    help="run CP-SAT and the MILP only on inputs up to this many GPUs")
    ap.add_argument("--large-on", type=comma_list(str),
                    help="inputs on which CP-SAT budgets above 1 unit and the MILP run (default: full mode "
                         "2types-8,3types-12,4types-16; --quick: all; '' : all)")
    ap.add_argument("--max-exact-candidates", type=int, default=MAX_EXACT_CANDIDATES,
                    help="skip CP-SAT and the MILP above this many presolved candidates")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers (deterministic per count)")
    ap.add_argument("--out", type=Path, help="CSV to write (default results/gap_progress.csv; "
                                              "--quick: results/gap_progress_quick.csv)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.quick:
        defaults = dict(sizes=[8, 16], types=[2], scenarios=[], cpsat_budgets=[1.0], milp_budget=1.0, large_on=[])
    else:
        defaults = dict(sizes=list(FULL_SIZES), types=list(FULL_TYPES), scenarios=list(FULL_SCENARIOS),
                        cpsat_budgets=[1.0, 10.0], milp_budget=10.0, large_on=["2types-8", "3types-12", "4types-16"])
    opt = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    out = args.out or RESULTS / ("gap_progress_quick.csv" if args.quick else "gap_progress.csv")
    try:
        points = list(gap_points(opt["sizes"], opt["types"], opt["scenarios"]))
    except HppInputError as exc:
        print(f"gap_progress: error: {exc}", file=sys.stderr)
        return 2
    rows: list[GapRow] = []
    partial = out.with_name(out.name + ".partial")

    def keep(row: GapRow) -> None:
        rows.append(row)
        write_dataclass_csv(rows, partial)     # every row on disk as soon as it is measured; OUT only when done
        print(f"  {row.input:<22} {row.method:<16} {row.budget:5g} {row.candidates:5d} cands  inc "
              f"{row.incumbent_s:9.5f}  bound {row.bound_s:9.5f}  gap {row.gap:7.2%}  {row.wall_s:7.2f} s  {row.note}",
              file=sys.stderr, flush=True)

    try:
        measure_inputs(points, exact_up_to=args.exact_up_to, large_on=opt["large_on"] or None,
                       cpsat_budgets=opt["cpsat_budgets"], milp_budget=opt["milp_budget"] or None,
                       max_exact_candidates=args.max_exact_candidates, workers=args.workers,
                       on_row=keep)
    except InfeasibleError as exc:
        print(f"gap_progress: stopped, no feasible plan ({exc.message}); the rows so far are in {partial}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: {out} is unchanged; the rows measured so far are in {partial}", file=sys.stderr)
        return 1
    if rows:
        partial.replace(out)
        sums = summarise(rows)
        print(summary_table(sums))
        print("\n".join(["", *limits_lines(sums)]))
    print(f"\nCSV: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
