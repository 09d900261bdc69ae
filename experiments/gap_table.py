"""Gap table: `hpp plan`'s gap on every bundled scenario at the default budget, and on the large ones with a
wall-clock budget (the README's gap section renders the CSV).

    python experiments/gap_table.py                   # every scenario at the default budget, opt350-512 and
                                                      # opt350-1024-4types at --time-limit 10, 30, 60 (~4 min)
    python experiments/gap_table.py --limits ''       # the default-budget rows only (~20 s)

Each row is one `hpp plan --no-baselines` run (hpp.bench.gap_table.measure_row); writes
experiments/results/gap_table.csv and prints the table and the targets' lines (<= 5 % at the default budget up to
64 GPUs; <= 5 % on the large scenarios at the largest limit, the gap never rising with the limit). For the large
scenarios it also prices the copy bound's own plan by the bound model and the cost model (what limits their gap),
written to gap_table_relaxation.csv. The budgeted rows depend on the machine's speed and load (wall-clock limits).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpp.bench.gap_table import (DEFAULT_SCENARIOS, LARGE_SCENARIOS, TIME_LIMITS_S, gap_table_markdown,  # noqa: E402
                                 measure_row, relaxation_markdown, relaxation_row, write_rows)
from hpp.cliparse import Parser, comma_list  # noqa: E402
from hpp.errors import HppInputError  # noqa: E402
from hpp.scenarios import SCENARIOS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="gap_table", help_command="python experiments/gap_table.py --help",
                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=comma_list(str), default=list(DEFAULT_SCENARIOS),
                    help="scenarios at the default budget (comma-separated)")
    ap.add_argument("--large", type=comma_list(str), default=list(LARGE_SCENARIOS),
                    help="scenarios also run with each --limits budget")
    ap.add_argument("--limits", type=comma_list(float), default=list(TIME_LIMITS_S), help="wall-clock budgets [s]")
    ap.add_argument("--workers", type=int, default=0, help="processes and CP-SAT workers (0: one per core)")
    ap.add_argument("--out", type=Path, default=RESULTS / "gap_table.csv", help="CSV to write")
    ap.add_argument("--progress", action="store_true", help="the search's progress lines on stderr")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    unknown = [n for n in [*args.scenarios, *args.large] if n not in SCENARIOS]
    if unknown or any(t <= 0 for t in args.limits):
        print(f"gap_table: unknown scenario(s) {unknown} (see `hpp scenarios`)" if unknown else
              f"gap_table: --limits {args.limits}: give positive seconds", file=sys.stderr)
        return 2
    say = (lambda m: print(f"  {m}", file=sys.stderr, flush=True)) if args.progress else None
    rows = []
    try:
        for name in args.scenarios:
            rows.append(measure_row(name, workers=args.workers, progress=say))
            print(f"{name} default: gap {rows[-1].gap:.2%} ({rows[-1].wall_s:.1f} s)", file=sys.stderr, flush=True)
        for name in args.large:
            for limit in args.limits:
                rows.append(measure_row(name, time_limit_s=limit, workers=args.workers, progress=say))
                print(f"{name} {limit:g} s: gap {rows[-1].gap:.2%} ({rows[-1].wall_s:.1f} s)", file=sys.stderr,
                      flush=True)
    except HppInputError as exc:
        print(f"gap_table: {exc}", file=sys.stderr)
        return 2
    write_rows(rows, args.out)
    relax = [relaxation_row(name) for name in args.large]
    if relax:
        write_rows(relax, args.out.with_name(args.out.stem + "_relaxation.csv"))
    print("\n".join(gap_table_markdown(rows) + relaxation_markdown(relax)))
    print(f"\nrows in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
