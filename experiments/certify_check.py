"""Benchmark of issue 21's certificate: the reported bound is never above the exhaustive oracle.

Random small instances (``tests.test_certified.random_instance``: 2-4 device types of 11-96 GB, 6-12
layers, 2-8 GPUs per type, nodes of 2 or 4, links drawn from the bundled public network fits, non-monotone
ones included), each solved by the one solve path (:func:`hpp.formulation.composition.solve.solve`) and compared with the
exhaustive oracle over the unpruned candidates. Writes one CSV row per (instance, solver) and prints a
summary: how many rows the oracle could check, violations, and how often the returned plan was the oracle's
optimum (the worst excess over it otherwise: the incumbent side of the gap); exit 1 on any violation.

    python experiments/certify_check.py --instances 2000 --out experiments/results/certify_check.csv   # README
    python experiments/certify_check.py --instances 2000 --solvers heuristic,cp-sat --judge composition
    python experiments/certify_check.py --instances 200 --judge estimate --max-gpus 3   # cost-model oracle
    python experiments/certify_check.py --instances 500 --per-pair      # version-2 clusters (links per type pair)
    python experiments/certify_check.py --instances 2000 --type-classes \
        --out experiments/results/certify_check_type_classes.csv          # the type-class bound (hpp plan --type-classes)
"""

from __future__ import annotations

import csv
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpp.cliparse import DefaultsRawFormatter, Parser  # noqa: E402
from hpp.errors import HppInputError  # noqa: E402
from hpp.formulation.composition.solve import OPTIMUM_ATOL_S, OPTIMUM_RTOL, check_solver  # noqa: E402
from tests.test_certified import check_instance  # noqa: E402

log = logging.getLogger("certify_check")
FIELDS = ["seed", "solver", "judge", "status", "objective_s", "bound_s", "gap", "oracle_s", "evaluations",
          "candidates", "unpruned_candidates", "non_monotone_links", "wall_s", "violation"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="certify_check", help_command="python experiments/certify_check.py --help",
                description=__doc__.split("\n\n")[0], formatter_class=DefaultsRawFormatter)
    ap.add_argument("--instances", type=int, default=2000, help="random instances (seeds first-seed ...)")
    ap.add_argument("--first-seed", type=int, default=0, help="seed of the first instance")
    ap.add_argument("--solvers", default="heuristic", help="comma-separated: heuristic, cp-sat, milp (each a row)")
    ap.add_argument("--judge", default="composition", choices=["composition", "estimate"],
                    help="price plans and oracle by the search's composition model (fast) or the cost model")
    ap.add_argument("--max-gpus", type=int, default=4, help="most GPUs per type (2-8; the README's runs: 4)")
    ap.add_argument("--max-types", type=int, default=4, help="most GPU types (2-4)")
    ap.add_argument("--max-evaluations", type=int, default=3000, help="oracle cap (multisets) per instance")
    ap.add_argument("--work", type=float, default=0.1, help="exact solvers' deterministic work limit")
    ap.add_argument("--per-pair", action="store_true",
                    help="version-2 clusters: a link per pair of types (issue 19's network model)")
    ap.add_argument("--type-classes", action="store_true", help="the search also runs the type-class bound")
    ap.add_argument("--out", type=Path, default=Path("certify_check.csv"),
                    help="CSV to write (the README's: experiments/results/certify_check.csv)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bad_arg = _check_args(args)
    if bad_arg:
        print(f"certify_check: {bad_arg}", file=sys.stderr)
        return 2
    rows, t0 = [], time.perf_counter()
    solvers = [check_solver(s.strip()) for s in args.solvers.split(",") if s.strip()]
    for seed in range(args.first_seed, args.first_seed + args.instances):
        for solver in solvers:
            t = time.perf_counter()
            violation = ""
            try:
                r = check_instance(seed, solver=solver, judge=args.judge, max_evaluations=args.max_evaluations,
                                   max_gpus_per_type=args.max_gpus, max_types=args.max_types, work=args.work,
                                   per_pair=args.per_pair, type_classes=args.type_classes)
            except AssertionError as exc:
                r, violation = {"seed": seed, "solver": solver, "judge": args.judge}, str(exc)[:300]
                log.error("VIOLATION seed %d %s: %s", seed, solver, violation)
            if r is None:
                continue
            rows.append({**{k: r.get(k, "") for k in FIELDS}, "wall_s": round(time.perf_counter() - t, 4),
                         "violation": violation})
        if (seed + 1) % 100 == 0:
            log.info("%d instances, %d rows, %.0f s", seed + 1 - args.first_seed, len(rows), time.perf_counter() - t0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    bad = [r for r in rows if r["violation"]]
    checked = [r for r in rows if r["oracle_s"] not in ("", None)]
    optimal = [r for r in rows if r["status"] == "OPTIMAL"]
    nonmono = [r for r in checked if r["non_monotone_links"]]
    print(f"{len(rows)} solved (instance, solver) pairs of {args.instances} instances ({args.judge} judge"
          f"{', per-pair links' if args.per_pair else ''}{', type classes' if args.type_classes else ''}); "
          f"checked by the oracle: {len(checked)} of {len(rows)} ({len(nonmono)} with a non-monotone link; the others "
          f"have more multisets than --max-evaluations {args.max_evaluations} and prove nothing); OPTIMAL {len(optimal)}; violations {len(bad)}; {time.perf_counter() - t0:.0f} s; rows in {args.out}")
    missed = [r for r in checked if r["objective_s"] - r["oracle_s"] > OPTIMUM_ATOL_S + OPTIMUM_RTOL * r["oracle_s"]]
    excess = sorted((r["objective_s"] / r["oracle_s"] - 1, r["seed"], r["solver"]) for r in missed)
    print(f"the returned plan was the oracle's optimum (within {OPTIMUM_RTOL:.1%}) on {len(checked) - len(missed)} of "
          f"{len(checked)} checked" + (f"; {len(missed)} worse: median excess {statistics.median(e for e, *_ in excess):.1%}, "
                                       f"worst {excess[-1][0]:.1%} (seed {excess[-1][1]}, {excess[-1][2]})"
                                       if excess else ""))
    if not checked:
        print("certify_check: the oracle checked no instance: nothing is shown; raise --max-evaluations or lower "
              "--max-gpus", file=sys.stderr)
        return 1
    return 1 if bad else 0


def _check_args(args) -> str:
    """'' or a one-line error naming the flag and the fix."""
    if not args.work > 0:
        return f"--work {args.work}: give a positive deterministic work limit"
    for flag, value, lo, hi in (("--instances", args.instances, 1, None), ("--max-gpus", args.max_gpus, 2, 8),
                                ("--max-types", args.max_types, 2, 4), ("--max-evaluations", args.max_evaluations, 1, None)):
        if value < lo or (hi is not None and value > hi):
            return f"{flag} {value}: give {lo}-{hi}" if hi else f"{flag} {value}: give {lo} or more"
    try:
        for name in args.solvers.split(","):
            if name.strip():
                check_solver(name.strip())
    except HppInputError as exc:
        return f"--solvers {args.solvers}: {exc.message}; give heuristic, cp-sat and/or milp, comma-separated"
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
