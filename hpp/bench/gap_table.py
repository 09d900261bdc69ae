"""The gap table: ``hpp plan``'s gap on every bundled scenario at the default budget, and on the large ones with a
wall-clock budget (``experiments/gap_table.py`` writes it, the README's gap section renders it).

The gap is the one of the solve path (:func:`hpp.formulation.composition.solve.gap`): ``(objective - bound) /
objective``, the objective the returned plan's predicted iteration time, the bound a proven lower bound of it over
every plan of the search space. Each row is one :func:`hpp.planner.plan_hpp` run as ``hpp plan --no-baselines``
runs it (``--time-limit S`` for the budgeted rows).
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["GapTableRow", "DEFAULT_BUDGET", "measure_row", "read_gap_table", "gap_table_markdown",
           "DEFAULT_SCENARIOS", "LARGE_SCENARIOS", "TIME_LIMITS_S"]

#: The ``budget`` of a row at the default (deterministic) budget.
DEFAULT_BUDGET = "default"
#: Every bundled scenario (``hpp scenarios``) but the 4,096-GPU one (minutes of candidates alone).
DEFAULT_SCENARIOS = ("opt350-a100x4-v100x4", "opt350-a100x8-v100x8", "opt350-3types-40", "neo27-a100x16-v100x16",
                     "llama8-3types-40", "opt350-512", "opt350-1024-4types", "cpu-hetero-4")
#: The scenarios also run with a wall-clock budget, and those budgets [s].
LARGE_SCENARIOS = ("opt350-512", "opt350-1024-4types")
TIME_LIMITS_S = (10.0, 30.0, 60.0)


@dataclass(frozen=True)
class GapTableRow:
    """One ``hpp plan --no-baselines`` run: ``budget`` is :data:`DEFAULT_BUDGET` or ``"<S> s"``; times in s."""

    scenario: str
    num_gpus: int
    budget: str
    candidates: int
    objective_s: float
    bound_s: float
    gap: float
    status: str
    source: str
    bound_method: str
    wall_s: float


def measure_row(name: str, *, time_limit_s: float | None = None, workers: int = 0,
                progress: Callable[[str], None] | None = None) -> GapTableRow:
    """Plan bundled scenario ``name`` (no baselines) at the default budget or with ``time_limit_s``."""
    from hpp.formulation.composition.settings import SolverSettings       # lazy: OR-Tools
    from hpp.planner import plan_hpp
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.scenarios import get_scenario

    sc = get_scenario(name)
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    t0 = time.perf_counter()
    res = plan_hpp(cl, prof, sc.global_batch_size, progress=progress,
                   settings=SolverSettings(num_workers=workers, max_time_in_seconds=time_limit_s))
    s = res.search
    budget = DEFAULT_BUDGET if time_limit_s is None else f"{time_limit_s:g} s"
    return GapTableRow(name, cl.num_devices, budget, res.stats["num_candidates"], s.objective_s, s.bound_s, s.gap,
                       s.status, s.source, s.bound_method, time.perf_counter() - t0)


def read_gap_table(path: Path) -> list[GapTableRow]:
    """Rows written by ``experiments/gap_table.py`` ([] if the file does not exist)."""
    if not path.exists():
        return []
    kinds = {f.name: f.type for f in fields(GapTableRow)}
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            out.append(GapTableRow(**{k: (int(v) if kinds[k] == "int" else float(v) if kinds[k] == "float" else v)
                                      for k, v in r.items()}))
    return out


def gap_table_markdown(rows: Sequence[GapTableRow]) -> list[str]:
    """The table (one line per row) and the targets' lines: <= 5 % at the default budget up to 64 GPUs, <= 5 % on the
    large scenarios at the largest time limit, their gap falling as the limit grows."""
    if not rows:
        return []
    out = ["| scenario | GPUs | budget | candidates | plan s | bound s | gap | status | plan from | bound from | "
           "search s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.scenario} | {r.num_gpus} | {r.budget} | {r.candidates} | {r.objective_s:.4f} | "
                   f"{r.bound_s:.4f} | {r.gap:.1%} | {r.status} | {r.source} | {r.bound_method} | {r.wall_s:.1f} |")
    small = [r for r in rows if r.budget == DEFAULT_BUDGET and r.num_gpus <= 64]
    miss = [r for r in small if not r.gap <= 0.05]
    out += ["", f"Target <= 5 % at the default budget up to 64 GPUs: met on {len(small) - len(miss)} of {len(small)}"
            + (" (missed: " + ", ".join(f"{r.scenario} {r.gap:.1%}" for r in miss) + ")" if miss else "") + "."]
    for name in dict.fromkeys(r.scenario for r in rows if r.budget != DEFAULT_BUDGET):
        runs = [r for r in rows if r.scenario == name]
        timed = sorted((float(r.budget.split()[0]), r) for r in runs if r.budget != DEFAULT_BUDGET)
        gaps = [r.gap for _, r in timed]
        falling = all(b <= a + 1e-12 for a, b in zip(gaps, gaps[1:]))
        last = timed[-1][1]
        out.append(f"{name}: gap {', '.join(f'{r.gap:.1%} ({r.budget})' for r in runs)}; <= 5 % at {last.budget}: "
                   f"{'met' if last.gap <= 0.05 else 'not met'}; {'never rising' if falling else 'not monotone'} "
                   f"with the limit.")
    return out


def write_gap_table(rows: Sequence[GapTableRow], path: Path) -> None:
    """Write ``rows`` as CSV (the columns of :class:`GapTableRow`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in fields(GapTableRow)])
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) and math.isfinite(v) else v)
                        for k, v in r.__dict__.items()})
