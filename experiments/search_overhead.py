"""Search overhead: HPP vs its ablations vs Metis's search (ported) and the single-shape enumeration, in one run.

    python experiments/search_overhead.py --quick          # about 30 s on 2 cores (at most 2 minutes)
    python experiments/search_overhead.py                  # the full sweep (8 .. 1024 GPUs, 2-4 types; ~17 min)

Writes experiments/results/search_overhead.csv and .png (with --quick: search_overhead_quick.csv
and .png, so that the full sweep's files, which the README's table reads, stay) and prints the
summary table.
Rows already measured stay in the CSV if the run is interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Sequence

from hpp.cliparse import Parser
from hpp.errors import HppInputError, InfeasibleError
from hpp.bench.search_overhead import ABLATIONS, measure_point, plot_rows, scenario_points, sweep_points
from hpp.bench.search_report import read_csv, summary_table, write_csv

RESULTS = Path(__file__).resolve().parent / "results"


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _name_list(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="search_overhead", help_command="python experiments/search_overhead.py --help",
                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="small sweep (8-32 GPUs, 2 types), short budgets, ablations up to 16 GPUs")
    ap.add_argument("--sizes", type=_int_list, help="GPU counts of the sweep, e.g. 8,16,32 (each type gets whole "
                                                   "nodes of 4 GPUs, so 7 at 2 types is measured as 8)")
    ap.add_argument("--types", type=_int_list, help="type counts (2,3,4)")
    ap.add_argument("--scenarios", type=_name_list, help="bundled scenarios to add (comma-separated; '' for none)")
    ap.add_argument("--model", default="OPT-350", help="bundled model of the sweep (default OPT-350)")
    ap.add_argument("--repeats", type=int, help="HPP runs per input, median reported (default 5; --quick 3); "
                                                 "the ablations and references run once")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="HPP's wall-clock search budget [s] (default: none, the default deterministic budget)")
    ap.add_argument("--single-shape-budget", type=float, help="cap on the single-shape enumeration [s]")
    ap.add_argument("--single-shape-permute-len", type=int,
                    help="add Metis's group-order permutations to the single-shape search (Metis uses 4; "
                         "default: the canonical order)")
    ap.add_argument("--metis-budget", type=float, help="cap on Metis's search (ported) [s]")
    ap.add_argument("--metis-up-to", type=int, help="run Metis's search only up to this many GPUs")
    ap.add_argument("--ablate-up-to", type=int, help="run the ablations only up to this many GPUs")
    ap.add_argument("--single-shape-up-to", type=int, help="run the single-shape enumeration only up to this many GPUs")
    ap.add_argument("--out", type=Path, help="CSV to write, the PNG beside it (default: results/search_overhead.csv; "
                                              "with --quick results/search_overhead_quick.csv, so that a quick run "
                                              "leaves the full sweep's files alone)")
    ap.add_argument("--append", action="store_true", help="keep the rows already in --out and skip their inputs")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.quick:
        defaults = dict(sizes=[8, 16, 32], types=[2], scenarios=[], repeats=3, single_shape_budget=15.0,
                        ablate_up_to=16, single_shape_up_to=32, metis_budget=30.0, metis_up_to=32)
    else:
        defaults = dict(sizes=[8, 16, 32, 64, 128, 256, 512, 1024], types=[2, 3, 4],
                        scenarios=["opt350-a100x8-v100x8", "opt350-3types-40", "opt350-512", "opt350-1024-4types"],
                        repeats=5, single_shape_budget=120.0, ablate_up_to=64, single_shape_up_to=64,
                        metis_budget=300.0, metis_up_to=64)
    # a value given on the command line wins, 0 included
    opt = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    sizes, types, scen, repeats = opt["sizes"], opt["types"], opt["scenarios"], opt["repeats"]
    budget, ablate_up_to, single_up_to = opt["single_shape_budget"], opt["ablate_up_to"], opt["single_shape_up_to"]
    metis_budget, metis_up_to = opt["metis_budget"], opt["metis_up_to"]
    permute = args.single_shape_permute_len
    bad = [(flag, value, fix) for flag, value, ok, fix in [
        ("--repeats", repeats, repeats >= 1, "give an integer >= 1"),
        ("--time-limit", args.time_limit, args.time_limit is None or args.time_limit > 0, "give seconds > 0"),
        ("--single-shape-budget", budget, budget > 0 and math.isfinite(budget), "give finite seconds > 0"),
        ("--metis-budget", metis_budget, metis_budget > 0 and math.isfinite(metis_budget), "give finite seconds > 0"),
        ("--single-shape-permute-len", permute, permute is None or permute >= 1,
         "give an integer >= 1 (Metis uses 4)"),
        ("--metis-up-to", metis_up_to, metis_up_to >= 0, "give a GPU count >= 0 (0: no Metis search)"),
        ("--ablate-up-to", ablate_up_to, ablate_up_to >= 0, "give a GPU count >= 0 (0: no ablations)"),
        ("--single-shape-up-to", single_up_to, single_up_to >= 0,
         "give a GPU count >= 0 (0: no single-shape search)")] if not ok]
    if args.out is None:
        args.out = RESULTS / ("search_overhead_quick.csv" if args.quick else "search_overhead.csv")
    if bad:
        flag, value, fix = bad[0]
        print(f"search_overhead: error: field '{flag}': {value:g} is out of range. Fix: {fix}", file=sys.stderr)
        return 2
    if not args.out.resolve().parent.is_dir():
        print(f"search_overhead: error: field '--out': folder {args.out.resolve().parent} does not exist. "
              f"Fix: create it first or give another path", file=sys.stderr)
        return 2
    try:   # validate every input before measuring anything
        points = list(sweep_points(sizes, types, model=args.model)) + list(scenario_points(scen))
    except HppInputError as exc:
        print(f"search_overhead: error: {exc}", file=sys.stderr)
        return 2
    for p in points:
        if p.requested_gpus:
            print(f"note: --sizes {p.requested_gpus} at {p.num_types} types is measured as {p.name} "
                  f"(each type gets whole nodes of 4 GPUs)", file=sys.stderr)
    rows = read_csv(args.out) if args.append else []
    done = {r.point for r in rows if r.method == "hpp"}
    points = [p for p in points if p.name not in done]

    def keep(row) -> None:
        rows.append(row)
        write_csv(rows, args.out)          # every row on disk as soon as it is measured
        print(f"  {row.point:<22} {row.method:<24} {row.wall_s:8.3f} s  iter {row.iteration_time_s:8.3f} s  "
              f"{row.status}", file=sys.stderr, flush=True)

    try:
        for p in points:
            ablations = ABLATIONS if p.num_gpus <= ablate_up_to else ()
            try:
                measure_point(p, repeats=repeats, time_limit_s=args.time_limit, ablations=ablations,
                              single_shape=p.num_gpus <= single_up_to, single_shape_budget_s=budget, on_row=keep,
                              single_shape_permute_len=args.single_shape_permute_len,
                              metis=p.num_gpus <= metis_up_to, metis_budget_s=metis_budget)
            except InfeasibleError as exc:      # e.g. the model does not fit this cluster: say so, go on
                print(f"  {p.name:<22} skipped: no feasible plan ({exc.message})", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted: the rows measured so far are in the CSV", file=sys.stderr)
    plot_rows(rows, args.out.with_suffix(".png"))
    print(summary_table(rows))
    print(f"\nCSV: {args.out}\nplot: {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
