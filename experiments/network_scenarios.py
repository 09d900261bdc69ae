"""Bundled scenarios re-planned with the per-pair network model (issue 19): a before/after table.

"before": the version-1 cluster (one inter-node link between every two nodes, the slowest pair's:
``Scenario.cluster(per_pair=False)``); "after": the version-2 cluster (Sailor's measured link per pair of
GPU types, the bundled default). For each: the plan's predicted iteration time on its own cluster model,
the GPU types it uses, the search's wall and CPU time; and the "before" plan re-estimated on the per-pair
links (what that plan really costs under the new model).

Usage: ``python experiments/network_scenarios.py [--scenarios a,b] [--repeats N] [--csv PATH]``.
Writes CSV rows (``dataclasses.asdict``) and prints the table.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import resource
import statistics
import time
from pathlib import Path
from typing import Sequence

from hpp.cliparse import Parser
from hpp.formulation.cost_model import estimate_plan
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import SCENARIOS

log = logging.getLogger(__name__)

#: The seven bundled GPU scenarios of the README's tables (opt350-4096-6types only on request: minutes).
DEFAULT_SCENARIOS = ("opt350-a100x4-v100x4", "opt350-a100x8-v100x8", "opt350-3types-40", "neo27-a100x16-v100x16",
                     "llama8-3types-40", "opt350-512", "opt350-1024-4types")


@dataclasses.dataclass(frozen=True)
class Row:
    scenario: str
    model: str                      # "before" (one link) or "after" (per pair)
    iteration_time_s: float         # the plan's estimate on its own cluster model
    per_pair_estimate_s: float      # the same plan estimated on the per-pair links
    pipeline_time_s: float
    grad_sync_s: float
    device_types: str               # the GPU types the plan uses, '+'-joined
    gpus_used: int
    search_wall_s: float            # least over the repeats
    search_cpu_s: float             # least CPU seconds over the repeats (this process and its worker processes)
    search_cpu_ratio: float         # median over the repeats of after/before CPU seconds of one interleaved pair


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the search may balance in worker processes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run(names: Sequence[str], repeats: int) -> list[Row]:
    rows = []
    for name in names:
        sc = SCENARIOS[name]
        prof = load_bundled_profile(sc.model)
        after_cluster = sc.cluster()
        models = (("before", sc.cluster(per_pair=False)), ("after", after_cluster))
        runs: dict[str, list] = {label: [] for label, _ in models}
        plan_hpp(models[0][1], prof, sc.global_batch_size)     # warm-up: imports, OR-Tools start, caches of the profile
        for _ in range(repeats):              # interleaved, so that both models see the same load
            for label, cluster in models:
                w0, c0 = time.perf_counter(), _cpu_s()
                res = plan_hpp(cluster, prof, sc.global_batch_size)
                runs[label].append((res, time.perf_counter() - w0, _cpu_s() - c0))
        ratio = statistics.median(a[2] / b[2] for a, b in zip(runs["after"], runs["before"]))
        for label, _ in models:
            res = runs[label][0][0]           # deterministic search: every repeat returns the same plan
            wall, cpu = min(r[1] for r in runs[label]), min(r[2] for r in runs[label])
            stages = [s for p in res.plan.pipelines for s in p.stages]
            rows.append(Row(name, label, res.estimate.iteration_time_s,
                            estimate_plan(res.plan, after_cluster, prof).iteration_time_s,
                            res.estimate.pipeline_time_s, res.estimate.grad_sync_s,
                            "+".join(sorted({s.device_type for s in stages})), sum(len(s.device_ids) for s in stages),
                            wall, cpu, ratio))
            log.info("%s %-6s %.4f s/iter, search CPU %.3f s, after/before %.3f", name, label,
                     rows[-1].iteration_time_s, rows[-1].search_cpu_s, rows[-1].search_cpu_ratio)
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'scenario':<24} {'model':<6} {'iter [s]':>9} {'on per-pair':>11} {'sync [s]':>8} {'GPUs':>5} "
             f"{'wall [s]':>8} {'cpu [s]':>8}  types"]
    for r in rows:
        lines.append(f"{r.scenario:<24} {r.model:<6} {r.iteration_time_s:>9.4f} {r.per_pair_estimate_s:>11.4f} "
                     f"{r.grad_sync_s:>8.4f} {r.gpus_used:>5} {r.search_wall_s:>8.2f} {r.search_cpu_s:>8.2f}  "
                     f"{r.device_types}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="network_scenarios", help_command="python experiments/network_scenarios.py --help",
                    description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help="comma-separated bundled scenarios (hpp scenarios lists them)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="interleaved before/after search pairs per scenario; the CPU ratio is their median "
                             "(run_all.py uses 3, the README's table 15)")
    parser.add_argument("--csv", type=Path, default=Path("experiments/results/network_scenarios.csv"),
                        help="CSV to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown or not names or args.repeats < 1:
        parser.error(f"--scenarios: unknown {unknown[0]!r} (hpp scenarios lists them)" if unknown else
                     "--scenarios: give at least one scenario" if not names else "--repeats: give 1 or more")
    rows = run(names, args.repeats)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in dataclasses.fields(Row)])
        w.writeheader()
        w.writerows(dataclasses.asdict(r) for r in rows)
    print(table(rows))
    ratios = {r.scenario: r.search_cpu_ratio for r in rows}
    worst = max(ratios, key=ratios.get)
    print(f"search CPU after/before (median of {args.repeats} interleaved pairs): max {ratios[worst]:.2f} ({worst}); "
          f"target <= 1.10: {'met' if ratios[worst] <= 1.10 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
