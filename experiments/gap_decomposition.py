"""Where the gap lies: per scenario the plan's terms, the bound with and without the one-node columns, and the gap the
returned plan's own sync floor leaves (hpp.bench.gap_decomposition).

    python experiments/gap_decomposition.py                       # the scenarios above 5 % at the default budget
    python experiments/gap_decomposition.py --time-limit 60       # also the best plan a 60 s budget finds

Writes experiments/results/gap_decomposition.csv and prints the table.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpp.bench.gap_decomposition import DecompositionRow, decomposition_markdown, decomposition_row  # noqa: E402
from hpp.cliparse import Parser  # noqa: E402
from hpp.fileio import write_dataclass_csv  # noqa: E402
from hpp.scenarios import SCENARIOS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT = ("opt350-3types-40", "neo27-a100x16-v100x16", "opt350-512", "opt350-1024-4types")


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="gap_decomposition", help_command="python experiments/gap_decomposition.py --help",
                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=lambda v: [x for x in v.split(",") if x], default=list(DEFAULT),
                    help="comma-separated bundled scenarios")
    ap.add_argument("--time-limit", type=float, default=0.0, help="also plan with this wall-clock budget [s] (0: no)")
    ap.add_argument("--out", type=Path, default=RESULTS / "gap_decomposition.csv", help="CSV to write")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown or args.time_limit < 0:
        print(f"gap_decomposition: unknown scenario(s) {unknown} (see `hpp scenarios`)" if unknown else
              f"gap_decomposition: --time-limit {args.time_limit}: give 0 or more seconds", file=sys.stderr)
        return 2
    rows = []
    for name in args.scenarios:
        rows.append(decomposition_row(name, time_limit_s=args.time_limit))
        print(f"{name}: gap {rows[-1].gap:.2%}", file=sys.stderr, flush=True)
    write_dataclass_csv(rows, args.out, row_type=DecompositionRow)
    print("\n".join(decomposition_markdown(rows)))
    print(f"\nrows in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
