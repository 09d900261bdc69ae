"""Search time at the default budget, this checkout against another one (e.g. an older commit), side by side.

    git worktree add ../base fea958e          # the code to compare with
    python experiments/search_time_compare.py --base ../base [--sizes 8,16,32] [--types 2,3,4] [--repeats 5]

For each input of the search-overhead sweep (`hpp.bench.search_overhead.sweep_points`: OPT-350 on N GPUs split
evenly over K types, nodes of 4, global batch max(1024, 4 N)) and each bundled scenario named with --scenarios,
both checkouts run `plan_hpp` at the default budget (no time limit, one worker unless --workers: the call
`experiments/search_overhead.py` times) in fresh processes, alternately, --repeats times each after one warm-up,
and the median wall time is printed with the ratio new / base and each run's gap. Writes a CSV (--out).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: What each process runs (in the checkout on its PYTHONPATH): one input, warm-up + repeats timed.
_PROBE = r"""
import json, sys, time
from hpp.formulation.composition.settings import SolverSettings
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import SCENARIOS
from hpp.bench.search_overhead import sweep_points
kind, name, repeats, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "scenario":
    sc = SCENARIOS[name]; cl, prof, gbs = sc.cluster(), load_bundled_profile(sc.model), sc.global_batch_size
else:
    k, n = name.split("types-")
    p = next(sweep_points([int(n)], [int(k)]))
    cl, prof, gbs = p.cluster, load_bundled_profile(p.model), p.global_batch_size
walls = []
for i in range(repeats + 1):
    t = time.perf_counter()
    r = plan_hpp(cl, prof, gbs, settings=SolverSettings(num_workers=workers, random_seed=0))
    if i:
        walls.append(time.perf_counter() - t)
print(json.dumps({"walls": walls, "gap": r.search.gap, "objective_s": r.search.objective_s,
                  "bound_s": r.search.bound_s, "candidates": r.stats.get("num_candidates", 0)}))
"""


def _run(checkout: Path, kind: str, name: str, repeats: int, workers: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, "-c", _PROBE, kind, name, str(repeats), str(workers)], env=env,
                         capture_output=True, text=True, cwd=str(checkout), check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{checkout} {name}: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its root: the folder holding hpp/)")
    ap.add_argument("--sizes", default="8,16,32", help="GPU counts of the sweep")
    ap.add_argument("--types", default="2,3,4", help="type counts of the sweep")
    ap.add_argument("--scenarios", default="", help="bundled scenarios too (comma-separated)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per input and checkout (median)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two checkouts per input")
    ap.add_argument("--workers", type=int, default=1, help="plan_hpp's workers (0: one per core)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "search_time_compare.csv")
    args = ap.parse_args(argv)
    if not (args.base / "hpp" / "planner.py").exists():
        print(f"search_time_compare: --base {args.base}: no hpp/planner.py there", file=sys.stderr)
        return 2
    inputs = [("sweep", f"{k}types-{n}") for n in map(int, args.sizes.split(",")) for k in map(int, args.types.split(","))
              if n >= 4 * k] + [("scenario", s) for s in args.scenarios.split(",") if s]
    rows = []
    print(f"{'input':<24} {'base s':>8} {'new s':>8} {'new/base':>8} {'base gap':>8} {'new gap':>8}")
    for kind, name in inputs:
        got = {"base": [], "new": []}
        gaps = {}
        for _ in range(args.rounds):
            for who, where in (("base", args.base), ("new", ROOT)):
                r = _run(where, kind, name, args.repeats, args.workers)
                got[who] += r["walls"]
                gaps[who] = r["gap"]
        b, n = statistics.median(got["base"]), statistics.median(got["new"])
        rows.append({"input": name, "base_s": b, "new_s": n, "ratio": n / b, "base_gap": gaps["base"],
                     "new_gap": gaps["new"], "runs": len(got["new"])})
        print(f"{name:<24} {b:8.3f} {n:8.3f} {n / b:8.2f} {gaps['base']:8.2%} {gaps['new']:8.2%}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    worst = max(rows, key=lambda r: r["ratio"])
    print(f"worst ratio new/base {worst['ratio']:.2f} ({worst['input']}); rows in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
