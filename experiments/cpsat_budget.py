"""What CP-SAT adds at its default deterministic budget: the evidence for ``SMALL_BUDGET_MAX_CANDIDATES``.

For each input (bundled scenarios that have at most 200 candidates after the presolve, and small synthetic
instances of 2-3 GPU types), the one solve path runs twice on the same problem: with CP-SAT forced on
(``max_candidates=200``, the default budget of ``DEFAULT_DETERMINISTIC_TIME`` work units) and heuristic only
(incumbent + copy/LP bound). Per input it prints the candidates CP-SAT saw, CP-SAT's own status, whether it
moved the bound (``bound_method`` cp-sat/cutoff) or the plan (``source`` cp-sat), both gaps and both CPU times.
The last lines count the inputs where CP-SAT helped, by candidate count.

    python experiments/cpsat_budget.py [--csv experiments/results/cpsat_budget.csv] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpp.bench.instance_format import InstanceOptions  # noqa: E402
from hpp.bench.instances import SyntheticSpec, synthetic_instance
from hpp.formulation.composition.settings import SolverSettings  # noqa: E402
from hpp.formulation.composition.solve import solve  # noqa: E402
from hpp.planner import make_problem  # noqa: E402
from hpp.profiles.bundled import load_bundled_profile  # noqa: E402
from hpp.scenarios import SCENARIOS  # noqa: E402

SCENARIO_NAMES = ("opt350-a100x4-v100x4", "llama8-3types-40")


@dataclasses.dataclass(frozen=True)
class Row:
    input: str
    candidates: int               # candidates CP-SAT saw (left after the presolve)
    cpsat_status: str             # CP-SAT's own status on its model
    cpsat_moved_bound: bool
    cpsat_moved_plan: bool
    gap_with_cpsat: float
    gap_heuristic: float
    cpu_with_cpsat_s: float
    cpu_heuristic_s: float


def _inputs(quick: bool):
    for name in SCENARIO_NAMES:
        sc = SCENARIOS[name]
        for per_pair in (False, True):
            problem, _ = make_problem(sc.cluster(per_pair=per_pair), load_bundled_profile(sc.model),
                                      sc.global_batch_size)
            yield f"{name}{'' if per_pair else '-v1'}", problem
    grid = itertools.product((2, 3), (16, 32), (8, 16), (1, 2), (1, 2, 4))
    for t, g, layers, seed, stages in grid:
        if quick and seed == 2:
            continue
        spec = SyntheticSpec(num_types=t, num_gpus=g, num_layers=layers, seed=seed,
                             options=InstanceOptions(max_tp=2, micro_batch_sizes=(1,) if stages < 4 else (1, 2),
                                                     max_stages=stages))
        yield spec.name, synthetic_instance(spec).problem()[0]


def run(quick: bool) -> list[Row]:
    rows = []
    for name, problem in _inputs(quick):
        t0 = time.process_time()
        with_cpsat = solve(problem, SolverSettings(max_candidates=200, num_workers=1))
        t1 = time.process_time()
        heur = solve(problem, SolverSettings(solver="heuristic", num_workers=1))
        t2 = time.process_time()
        row = Row(name, with_cpsat.num_candidates, with_cpsat.solver_status or "skipped",
                  with_cpsat.bound_method in ("cp-sat", "cutoff"), with_cpsat.source == "cp-sat",
                  with_cpsat.gap, heur.gap, round(t1 - t0, 4), round(t2 - t1, 4))
        rows.append(row)
        print(f"{row.input:34s} cands {row.candidates:4d} cp-sat {row.cpsat_status:11s} bound "
              f"{'moved' if row.cpsat_moved_bound else '-':5s} plan {'moved' if row.cpsat_moved_plan else '-':5s} "
              f"gap {row.gap_with_cpsat:.3%} vs {row.gap_heuristic:.3%}  cpu {row.cpu_with_cpsat_s:.3f} s vs "
              f"{row.cpu_heuristic_s:.3f} s", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=Path("experiments/results/cpsat_budget.csv"))
    ap.add_argument("--quick", action="store_true", help="half the synthetic inputs")
    args = ap.parse_args(argv)
    rows = run(args.quick)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in dataclasses.fields(Row)])
        w.writeheader()
        w.writerows(dataclasses.asdict(r) for r in rows)
    ran = [r for r in rows if r.cpsat_status != "skipped"]
    for lo, hi in ((1, 16), (17, 200)):
        part = [r for r in ran if lo <= r.candidates <= hi]
        helped = [r for r in part if r.cpsat_moved_bound or r.cpsat_moved_plan]
        extra = sum(r.cpu_with_cpsat_s - r.cpu_heuristic_s for r in part)
        print(f"{lo}-{hi} candidates: CP-SAT ran on {len(part)}, moved the bound or the plan on {len(helped)}; "
              f"its extra CPU {extra:.2f} s in all")
    print(f"rows in {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
