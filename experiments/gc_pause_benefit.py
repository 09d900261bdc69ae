"""What freezing the objects before a search (:func:`hpp.gcfreeze.gc_frozen`) buys it.

    python experiments/gc_pause_benefit.py                 # 32 and 64 GPUs, 2 and 4 types, 3 repeats each

Runs :func:`hpp.planner.plan_hpp` on sweep points of the search-overhead benchmark as shipped (frozen),
undecorated (the collector walks every object), and with the collector switched off (``gc.disable``, the
earlier way), alternating, and prints the median wall time of each and the ratios. The plans must be equal.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Sequence

from hpp.bench.search_overhead import sweep_points
from hpp.cliparse import Parser
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.formulation.composition.settings import SolverSettings


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="python experiments/gc_pause_benefit.py", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="32,64", help="GPU counts (default 32,64)")
    ap.add_argument("--types", default="2,4", help="type counts (default 2,4)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per variant and point (default 3)")
    args = ap.parse_args(argv)
    settings = SolverSettings(max_time_in_seconds=5.0, num_workers=0, random_seed=0)
    plain = plan_hpp.__wrapped__
    print(f"{'point':>18s} {'frozen_s':>9s} {'plain_s':>9s} {'gc_off_s':>9s} {'plain/frozen':>13s} "
          f"{'gc_off/frozen':>14s}")
    for p in sweep_points([int(x) for x in args.sizes.split(",")], [int(x) for x in args.types.split(",")]):
        profile = load_bundled_profile(p.model)
        walls: dict[str, list[float]] = {"frozen": [], "plain": [], "gc_off": []}
        plans = {}
        for _ in range(args.repeats):
            for name in walls:
                gc.collect()
                t0 = time.perf_counter()
                if name == "gc_off":
                    gc.disable()
                try:
                    res = (plan_hpp if name == "frozen" else plain)(p.cluster, profile, p.global_batch_size,
                                                                     settings=settings)
                finally:
                    gc.enable()
                walls[name].append(time.perf_counter() - t0)
                plans[name] = res.plan
        assert plans["frozen"] == plans["plain"] == plans["gc_off"], p.name
        a, b, c = (statistics.median(walls[k]) for k in ("frozen", "plain", "gc_off"))
        print(f"{p.name:>18s} {a:9.3f} {b:9.3f} {c:9.3f} {b / a:13.3f} {c / a:14.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
