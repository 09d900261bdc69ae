"""The bundled scenarios re-planned with a shared network: what changed in each plan, and what the change costs.

Two network models on the same (per-pair, measured) links:
- "one-flow": every flow that leaves a node runs at the one-device-to-one-device link, however many leave it at
  once (``Cluster.unshared()``: hpp's model before shared networks);
- "shared": flows leaving a node at once share its measured ``k -> k`` aggregate bandwidth (Sailor's fits, the
  bundled default; :mod:`hpp.formulation.collectives`).
Per scenario and model: the plan's predicted iteration time in its own model, the same plan priced in the shared
model (what it really costs), its terms (pipelines, sync), the devices it uses per type, its TP degrees, stage
counts and pipelines, the most flows sharing a node in its sync, the search's gap and wall time. The "shared" row
of each scenario also says which terms moved.

Usage: ``python experiments/shared_network_replan.py [--scenarios a,b] [--csv PATH]``; prints a markdown table.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from hpp.cliparse import Parser
from hpp.fileio import write_dataclass_csv
from hpp.formulation.cost_model import estimate_plan
from hpp.planner import plan_hpp
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import SCENARIOS

log = logging.getLogger(__name__)

DEFAULT_SCENARIOS = ("opt350-a100x4-v100x4", "opt350-a100x8-v100x8", "opt350-3types-40", "neo27-a100x16-v100x16",
                     "llama8-3types-40", "opt350-512", "opt350-1024-4types")


@dataclasses.dataclass(frozen=True)
class Row:
    scenario: str
    model: str                      # "one-flow" or "shared"
    iteration_time_s: float         # the plan's prediction in its own model
    shared_estimate_s: float        # the same plan priced with the shared network
    pipeline_time_s: float          # in the shared model
    grad_sync_s: float              # in the shared model
    gpus_used: str                  # per device type, e.g. "A100-40:8 V100-16:8"
    tp_degrees: str                 # distinct TP degrees of its stages
    stage_counts: str               # pipelines per stage count, e.g. "2x8"
    pipelines: int
    most_sync_flows: int            # the most flows leaving one node at once in its sync (shared model)
    gap: float
    search_wall_s: float


def _row(name: str, model: str, result, shared_cluster, profile) -> Row:
    plan = result.plan
    est = estimate_plan(plan, shared_cluster, profile)
    used = Counter()
    for p in plan.pipelines:
        for s in p.stages:
            used[s.device_type] += len(s.device_ids)
    stages = Counter(p.num_stages for p in plan.pipelines)
    return Row(name, model, result.estimate.iteration_time_s, est.iteration_time_s, est.pipeline_time_s,
               est.grad_sync_s, " ".join(f"{t}:{n}" for t, n in sorted(used.items())),
               ",".join(str(t) for t in sorted({s.tp_degree for p in plan.pipelines for s in p.stages})),
               " ".join(f"{k}x{n}" for k, n in sorted(stages.items())), plan.num_pipelines,
               max((b.concurrent_flows for b in est.blocks), default=1), result.search.gap, result.search.wall_s)


def run(names: Sequence[str]) -> list[Row]:
    rows = []
    for name in names:
        sc = SCENARIOS[name]
        shared, profile = sc.cluster(), load_bundled_profile(sc.model)
        for model, cluster in (("one-flow", shared.unshared()), ("shared", shared)):
            t0 = time.perf_counter()
            result = plan_hpp(cluster, profile, sc.global_batch_size)
            log.info("%s %s: %.4f s in %.2f s", name, model, result.estimate.iteration_time_s, time.perf_counter() - t0)
            rows.append(_row(name, model, result, shared, profile))
    return rows


def changes(before: Row, after: Row) -> str:
    """What moved between a scenario's one-flow and shared plans, in words."""
    said = []
    if before.gpus_used != after.gpus_used:
        said.append(f"devices {before.gpus_used} -> {after.gpus_used}")
    if before.tp_degrees != after.tp_degrees:
        said.append(f"TP {before.tp_degrees} -> {after.tp_degrees}")
    if before.stage_counts != after.stage_counts:
        said.append(f"stages {before.stage_counts} -> {after.stage_counts}")
    if not said:
        said.append("same plan shape")
    gain = (before.shared_estimate_s - after.shared_estimate_s) / before.shared_estimate_s
    said.append(f"the one-flow plan costs {before.shared_estimate_s:.4f} s when shared "
                f"({before.iteration_time_s:.4f} s predicted): sync {before.grad_sync_s:.3f} s, pipelines "
                f"{before.pipeline_time_s:.3f} s; re-planning gains {gain:.1%}")
    return "; ".join(said)


def table(rows: list[Row]) -> str:
    head = ("| scenario | model | predicted s | priced shared s | pipelines s | sync s | devices used | TP | stages "
            "| most flows | gap | what changed |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    by = {(r.scenario, r.model): r for r in rows}
    for r in rows:
        why = changes(by[(r.scenario, "one-flow")], r) if r.model == "shared" and (r.scenario, "one-flow") in by else ""
        lines.append(f"| {r.scenario} | {r.model} | {r.iteration_time_s:.4f} | {r.shared_estimate_s:.4f} | "
                     f"{r.pipeline_time_s:.3f} | {r.grad_sync_s:.3f} | {r.gpus_used} | {r.tp_degrees} | "
                     f"{r.stage_counts} | {r.most_sync_flows} | {r.gap:.1%} | {why} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="shared_network_replan.py", description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS), help="comma-separated bundled scenarios")
    ap.add_argument("--csv", type=Path, default=Path("experiments/results/shared_network_replan.csv"))
    args = ap.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}")
    rows = run(names)
    write_dataclass_csv(rows, args.csv)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
