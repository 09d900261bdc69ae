"""Differential check of the search against the exhaustive cost-model oracle on random instances (the `slow` test's
run, with a CSV and a summary).

    python experiments/search_truth.py --instances 2000                      # the slow marker's run (hours on 2 cores)
    python experiments/search_truth.py --instances 100 --max-gpus 2 --limit 3000   # the default suite's
    python experiments/search_truth.py --instances 200 --work 0.2            # the budgeted search (deterministic)

Instances and oracle: `tests/search_truth.py` (five families of 2-4 GPU types with disagreeing speed, memory and link
orderings, non-monotone link fits; the oracle prices every composition of the unpruned candidates, bound by the
planner's own binding rules, with the cost model). Each instance is planned by `plan_hpp` (no baseline seeds) and
compared: violations are an OPTIMAL plan above the optimum (beyond the optimality tolerance), a bound above the
optimum, a plan below it (the oracle missed a plan). Prints the counts of OPTIMAL and FEASIBLE answers, the
violations, and the excess of the returned plan over the optimum (median and worst, over the FEASIBLE answers and
over all); exit 1 on any violation.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpp.formulation.composition.settings import SolverSettings  # noqa: E402
from tests.search_truth import Check, check_instance, instance_or_none  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def summary(rows: Sequence[Check]) -> list[str]:
    """The summary lines of a run."""
    out = []
    for label in dict.fromkeys(r.settings for r in rows):
        rs = [r for r in rows if r.settings == label]
        opt = [r for r in rs if r.status == "OPTIMAL"]
        feas = [r for r in rs if r.status == "FEASIBLE"]
        bad = [r for r in rs if r.violations]
        ex_f = sorted(r.excess for r in feas)
        ex_a = sorted(r.excess for r in rs)
        worse = [r for r in rs if r.excess > 1e-3]
        fams = {f: sum(r.family == f for r in rs) for f in dict.fromkeys(r.family for r in rs)}
        out.append(f"{label}: {len(rs)} instances ({', '.join(f'{f} {n}' for f, n in fams.items())}); OPTIMAL "
                   f"{len(opt)}, FEASIBLE {len(feas)}; violations {len(bad)}"
                   + (f" (first: {bad[0].family} seed {bad[0].seed}: {bad[0].violations[0]})" if bad else ""))
        if ex_f:
            w = max(feas, key=lambda r: r.excess)
            out.append(f"  excess over the exhaustive optimum, FEASIBLE answers: median {statistics.median(ex_f):.2%}, "
                       f"worst {ex_f[-1]:.1%} ({w.family} seed {w.seed})")
        out.append(f"  all answers: median {statistics.median(ex_a):.2%}, worst {ex_a[-1]:.1%}; the plan was the "
                   f"optimum (within 0.1 %) on {len(rs) - len(worse)} of {len(rs)}; median gap "
                   f"{statistics.median(r.bound_s and (r.objective_s - r.bound_s) / r.objective_s for r in rs):.2%}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=2000, help="instances the oracle checks")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--max-gpus", type=int, default=3, help="most GPUs per type (1-3)")
    ap.add_argument("--limit", type=int, default=50_000, help="most compositions the oracle enumerates per instance")
    ap.add_argument("--work", type=float, default=None,
                    help="also plan each instance with this deterministic budget (the budgeted search)")
    ap.add_argument("--out", type=Path, default=RESULTS / "search_truth.csv")
    args = ap.parse_args(argv)
    if args.instances < 1 or not 1 <= args.max_gpus <= 3 or args.limit < 1 or (args.work is not None
                                                                                and not args.work > 0):
        print("search_truth: give --instances >= 1, --max-gpus 1-3, --limit >= 1, --work > 0", file=sys.stderr)
        return 2
    variants = [("default", SolverSettings(num_workers=1))]
    if args.work is not None:
        variants.append((f"work {args.work:g}", SolverSettings(num_workers=1, deterministic_time=args.work)))
    rows: list[Check] = []
    seed, done, t0 = args.first_seed, 0, time.perf_counter()
    while done < args.instances:
        inst = instance_or_none(seed, max_gpus_per_type=args.max_gpus)
        seed += 1
        if inst is None:
            continue
        got = [check_instance(inst, s, label=label, limit=args.limit) for label, s in variants]
        if got[0] is None:
            continue
        rows += got
        done += 1
        for r in got:
            if r.violations:
                print(f"VIOLATION {r.family} seed {r.seed} ({r.settings}): {'; '.join(r.violations)}", file=sys.stderr)
        if done % 100 == 0:
            print(f"{done} instances, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        fields = [k for k in asdict(rows[0]) if k != "violations"] + ["violations"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            d = asdict(r)
            d["violations"] = " | ".join(r.violations)
            w.writerow(d)
    print("\n".join(summary(rows)))
    print(f"{time.perf_counter() - t0:.0f} s; rows in {args.out}")
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
