"""Where a scenario's gap lies: the plan's side or the bound's, and which term of the bound
(``experiments/gap_decomposition.py`` writes the rows; the README's gap section renders them).

For a bundled scenario at the default budget (:func:`hpp.planner.plan_hpp` as ``hpp plan --no-baselines``):

- the plan's side: the returned plan's cost-model terms (pipelines, gradient sync, optimizer step) and the best plan
  a wall-clock budget finds (``hpp plan --time-limit``);
- the bound's side: the bound with and without the copy bound's one-node columns
  (:class:`~hpp.formulation.composition.copy_bound_levels.Search`), and the sync floor of the returned plan itself:
  per copy the floor of the column its binding puts it in (whole on one node or crossing nodes), the largest over its
  copies at its pipeline count. ``floor_gap``: the gap a bound would leave that knew the plan's own pipeline and
  optimizer times exactly and only its sync floor (``1 - (pipe + sync floor + optimizer) / objective``): what the sync
  floors alone cost, whatever the relaxation does with the pipeline side.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

__all__ = ["DecompositionRow", "decomposition_row", "decomposition_markdown", "read_decomposition"]


@dataclass(frozen=True)
class DecompositionRow:
    """One scenario's gap decomposed (times in s; gaps as fractions; ``limit_s`` the wall-clock budget of the
    ``limit_objective_s`` run, 0 when none ran)."""

    scenario: str
    num_gpus: int
    objective_s: float
    bound_s: float
    gap: float
    bound_without_one_node_s: float
    pipelines: int
    plan_pipe_s: float
    plan_sync_s: float
    plan_optimizer_s: float
    plan_sync_floor_s: float
    floor_gap: float
    whole_copies: int
    limit_s: float
    limit_objective_s: float


def _whole_on_one_node(cluster, pipeline) -> bool:
    return len({cluster.devices[d].node for s in pipeline.stages for d in s.device_ids}) == 1


def decomposition_row(name: str, *, time_limit_s: float = 0.0) -> DecompositionRow:
    """:class:`DecompositionRow` of bundled scenario ``name`` (one process; ``time_limit_s`` > 0: also a budgeted
    run)."""
    import hpp.planner as planner                         # lazy: OR-Tools
    from hpp.formulation.composition.copy_bound_levels import Search
    from hpp.formulation.composition.settings import SolverSettings
    from hpp.formulation.composition.solve import solve
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import get_scenario

    sc = get_scenario(name)
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    problem, _ = planner.make_problem(cl, prof, sc.global_batch_size, workers=1)
    res = solve(problem, SolverSettings(num_workers=1))
    bp = problem.bound_problem()
    crossed, bp.crossed = bp.crossed, None
    bp.caches = type(bp.caches)()                          # nothing memoised with the columns carries over
    without = solve(problem, SolverSettings(num_workers=1)).bound_s
    bp.crossed, bp.caches = crossed, type(bp.caches)()
    plan, est = problem.estimator(res.counts)
    h = len(plan.pipelines)
    # the planner's binding: copies in candidate order (build_plan), those given samples kept, in the same order
    order = [c for c in sorted(res.counts) for _ in range(res.counts[c])]
    s = Search(bp)
    pen = s.penalty(h, h) - s.opt if h >= 2 else np.zeros(len(s.origin))
    second = {int(c): n for n, c in enumerate(s.origin.tolist()) if n >= len(bp.candidates)}
    floor, whole = 0.0, 0
    for c, pipe in zip(order, plan.pipelines if len(plan.pipelines) == len(order) else [None] * len(order)):
        one = pipe is not None and _whole_on_one_node(cl, pipe)   # unknown (a copy given no sample): any binding's
        whole += one
        col = c if one or c not in second else second[c]
        floor = max(floor, float(pen[col]) if one or c not in second else float(min(pen[c], pen[second[c]])))
    limit_obj = math.nan
    if time_limit_s > 0:
        t0 = time.perf_counter()
        limit_obj = planner.plan_hpp(cl, prof, sc.global_batch_size, settings=SolverSettings(
            num_workers=0, max_time_in_seconds=time_limit_s)).search.objective_s
        time_limit_s = time.perf_counter() - t0
    lower = est.pipeline_time_s + floor + est.optimizer_s
    return DecompositionRow(name, cl.num_devices, res.objective_s, res.bound_s, res.gap, without, h,
                            est.pipeline_time_s, est.grad_sync_s, est.optimizer_s, floor,
                            max(0.0, 1.0 - lower / res.objective_s), whole, time_limit_s, limit_obj)


def decomposition_markdown(rows) -> list[str]:
    """The rows as a markdown table."""
    if not rows:
        return []
    out = ["| scenario | GPUs | plan s | bound s | gap | bound without one-node columns s | pipelines | plan: pipe + "
           "sync + optimizer s | plan's sync floor s | gap from the sync floor alone | copies whole on one node | "
           "plan with a time limit s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        limit = f"{r.limit_objective_s:.4f} ({r.limit_s:.0f} s)" if r.limit_s > 0 else "-"
        out.append(f"| {r.scenario} | {r.num_gpus} | {r.objective_s:.4f} | {r.bound_s:.4f} | {r.gap:.1%} | "
                   f"{r.bound_without_one_node_s:.4f} | {r.pipelines} | {r.plan_pipe_s:.3f} + {r.plan_sync_s:.3f} + "
                   f"{r.plan_optimizer_s:.3f} | {r.plan_sync_floor_s:.3f} | {r.floor_gap:.1%} | {r.whole_copies} | "
                   f"{limit} |")
    return out


def read_decomposition(path: Path) -> list[DecompositionRow]:
    """Rows written by ``experiments/gap_decomposition.py`` ([] if the file does not exist)."""
    if not path.exists():
        return []
    kinds = {f.name: f.type for f in fields(DecompositionRow)}
    with open(path, newline="") as f:
        return [DecompositionRow(**{k: int(v) if kinds[k] == "int" else float(v) if kinds[k] == "float" else v
                                    for k, v in r.items()}) for r in csv.DictReader(f)]
