"""HPP's own search (no baseline seeds) against every baseline it can express, on the same input and space.

    python experiments/search_vs_baselines.py              # the 9 bundled scenarios + LLAMA-3-8 16 A100 + 32 V100
    python experiments/search_vs_baselines.py --cases opt350-a100x4-v100x4

Issue 21: HPP's search must be at least as fast as every baseline on every bundled scenario and on
LLAMA-3-8 for 16 A100-40 + 32 V100-16 (GBS 256 and 512). The baselines search HPP's space (same
limits), so HPP can express their plans. Writes experiments/results/search_vs_baselines.csv; exit 1
when a baseline wins somewhere.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

from hpp.cliparse import Parser
from hpp.errors import HppInputError
from hpp.fileio import write_dataclass_csv
from hpp.formulation.space_limits import SearchSpace
from hpp.bench.search_overhead import BaselineCheck, baseline_cases, baseline_check

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="search_vs_baselines", help_command="python experiments/search_vs_baselines.py --help",
                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--max-types-per-pipeline", type=int, default=SearchSpace().max_types_per_pipeline,
                    help="the space of HPP and the baselines (default: HPP's default)")
    ap.add_argument("--baseline-budget", type=float, default=60.0, help="seconds for the baselines of one case")
    ap.add_argument("--out", type=Path, default=RESULTS / "search_vs_baselines.csv")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    names = [x for x in args.cases.split(",") if x] if args.cases else None
    cases = baseline_cases(names)
    if names and len(cases) != len(names):
        known = [c[0] for c in baseline_cases()]
        print(f"search_vs_baselines: error: field '--cases': unknown case among {names}. Fix: use names from "
              f"{known}", file=sys.stderr)
        return 2
    try:
        space = SearchSpace(max_types_per_pipeline=args.max_types_per_pipeline)
    except HppInputError as exc:
        print(f"search_vs_baselines: error: {exc}", file=sys.stderr)
        return 2
    rows: list[BaselineCheck] = []
    for case, model, gbs, cluster in cases:
        got = baseline_check(case, model, gbs, cluster, space=space, baseline_budget_s=args.baseline_budget)
        rows.extend(got)
        for r in got:
            print(f"{r.case:<28} {r.baseline:<13} HPP {r.hpp_iteration_s:10.3f} s  baseline "
                  f"{r.baseline_iteration_s:10.3f} s  {'ok' if r.ok else 'BASELINE FASTER'}  ({r.baseline_note[:60]})",
                  flush=True)
    write_dataclass_csv(rows, args.out, row_type=BaselineCheck)
    bad = [r for r in rows if not r.ok]
    print(f"HPP >= every baseline: {'yes' if not bad else 'NO'} ({len(rows) - len(bad)} of {len(rows)} comparisons)"
          f"\nCSV: {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
