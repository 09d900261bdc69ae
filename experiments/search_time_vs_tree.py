"""Search time of this checkout against another checkout of hpp (e.g. an earlier commit), side by side in one run.

    git worktree add /tmp/hpp-base <commit>
    python experiments/search_time_vs_tree.py --other /tmp/hpp-base [--sizes 8,16,32] [--types 2,3,4] [--repeats 5]

For each sweep point (:func:`hpp.bench.search_overhead.sweep_points`: n GPUs split evenly over 2-4 types, whole
nodes of 4, G = max(1024, 4n)), ``plan_hpp`` at the default budget runs in a fresh interpreter of each tree,
alternating the two trees ``--repeats`` times (so a load that comes and goes hits both alike); the table gives the
median search wall [s] of each and their ratio (this / other), and the predicted iteration time of each plan (in
its own tree's cost model). Writes experiments/results/search_time_vs_tree.csv.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from hpp.cliparse import Parser
from hpp.fileio import write_dataclass_csv

HERE = Path(__file__).resolve().parents[1]

#: Run in a fresh interpreter of one tree: the point's plan_hpp at the default budget, one JSON line.
_CHILD = """
import json, sys, time
from hpp.bench.search_overhead import sweep_points
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
n, k = int(sys.argv[1]), int(sys.argv[2])
p = next(iter(sweep_points([n], [k])))
prof = load_bundled_profile(p.model)
t0 = time.perf_counter()
r = plan_hpp(p.cluster, prof, p.global_batch_size)
print(json.dumps({"wall_s": time.perf_counter() - t0, "iteration_time_s": r.estimate.iteration_time_s,
                  "gap": r.search.gap}))
"""


@dataclasses.dataclass(frozen=True)
class Row:
    gpus: int
    types: int
    this_wall_s: float              # median over the repeats
    other_wall_s: float
    ratio: float                    # this / other
    this_iteration_time_s: float
    other_iteration_time_s: float
    this_gap: float
    other_gap: float


def _one(tree: Path, n: int, k: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n), str(k)], env=env, cwd=tree, capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"search_time_vs_tree.py: {tree} failed at {n} GPUs x {k} types: "
                         f"{out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(other: Path, sizes: Sequence[int], types: Sequence[int], repeats: int) -> list[Row]:
    rows = []
    for n in sizes:
        for k in types:
            mine, theirs = [], []
            for _ in range(repeats):
                mine.append(_one(HERE, n, k))
                theirs.append(_one(other, n, k))
            a = statistics.median(r["wall_s"] for r in mine)
            b = statistics.median(r["wall_s"] for r in theirs)
            rows.append(Row(n, k, a, b, a / b, mine[0]["iteration_time_s"], theirs[0]["iteration_time_s"],
                            mine[0]["gap"], theirs[0]["gap"]))
            print(f"{n:>5} GPUs x {k} types: this {a:.3f} s, other {b:.3f} s, ratio {a / b:.2f}", file=sys.stderr,
                  flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="search_time_vs_tree.py", description=__doc__.splitlines()[0])
    ap.add_argument("--other", type=Path, required=True, help="another checkout of hpp (its root folder)")
    ap.add_argument("--sizes", default="8,16,32", help="GPU counts (comma-separated)")
    ap.add_argument("--types", default="2,3,4", help="GPU-type counts (comma-separated)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--csv", type=Path, default=HERE / "experiments" / "results" / "search_time_vs_tree.csv")
    args = ap.parse_args(argv)
    if not (args.other / "hpp" / "planner.py").is_file():
        ap.error(f"--other {args.other} is not a checkout of hpp (no hpp/planner.py)")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
        types = [int(x) for x in args.types.split(",")]
    except ValueError:
        ap.error("--sizes and --types take comma-separated integers")
    rows = run(args.other.resolve(), sizes, types, args.repeats)
    write_dataclass_csv(rows, args.csv)
    print("| GPUs | types | this s | other s | this / other | this plan s | other plan s | this gap | other gap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.gpus} | {r.types} | {r.this_wall_s:.3f} | {r.other_wall_s:.3f} | {r.ratio:.2f} | "
              f"{r.this_iteration_time_s:.4f} | {r.other_iteration_time_s:.4f} | {r.this_gap:.1%} | {r.other_gap:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
