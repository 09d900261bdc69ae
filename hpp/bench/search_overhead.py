"""Search-overhead benchmark: HPP vs its ablations vs the Metis-style single-shape enumerations.

Everything is measured in ONE run, side by side on the same input (cluster, profile,
global batch): the full HPP planner, the planner with each pruning rule and the
memoisation switched off in turn, Metis's own search ported onto HPP's cost model
(:func:`hpp.baselines.metis.metis_search`, method ``metis``: the reference of the targets)
and the replicated single-shape enumeration (:func:`hpp.baselines.single_shape.single_shape_baseline`,
method ``single-shape``). Each row records the wall seconds (median of repeats), the
candidates the solver saw (for ``metis``: strategies layer-partitioned), the cache hit
rate, the predicted iteration time (cost model) and the solver gap.

The row type, its CSV and the summary and target checks are in :mod:`hpp.bench.search_report`
(re-exported here). The thin script is ``experiments/search_overhead.py``.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from hpp.baselines.metis import metis_search
from hpp.baselines.single_shape import run_baselines, single_shape_baseline
from hpp.bench.search_report import (OTHER_REFERENCE, REFERENCE,
                                     SearchRow)
from hpp.errors import HppInputError
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.composition.settings import SolverSettings
from hpp.planner import plan_hpp
from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.cluster import Cluster
from hpp.profiles.profile_format import load_profile
from hpp.pruning.rules import PruningOptions
from hpp.scenarios import SCENARIOS, get_scenario, make_cluster

__all__ = ["BenchPoint", "sweep_points", "scenario_points", "measure_point", "plot_rows", "TYPE_MIXES", "ABLATIONS",
           "BaselineCheck", "baseline_check", "baseline_cases"]

log = logging.getLogger(__name__)

#: GPU types added one by one for the 2-, 3- and 4-type sweeps.
TYPE_MIXES = {2: ("A100-40", "V100-16"), 3: ("A100-40", "V100-16", "GH-96"),
              4: ("A100-40", "V100-16", "GH-96", "A100-80")}
#: Rules switched off one at a time (canonical_order is already off by default: it is not exact).
ABLATIONS = ("memory_infeasible", "dominated", "incumbent_bound", "symmetry", "memoise")


@dataclass(frozen=True)
class BenchPoint:
    """One input: a name, the cluster, the model and the global batch size."""

    name: str
    num_gpus: int
    num_types: int
    model: str
    global_batch_size: int
    cluster: Cluster
    #: the GPU count asked for (``--sizes``), where the sweep rounded it to whole nodes; 0 otherwise
    requested_gpus: int = 0



def sweep_points(sizes: Iterable[int], type_counts: Iterable[int], *, model: str = "OPT-350") -> Iterator[BenchPoint]:
    """Clusters of ``n`` GPUs split evenly over 2, 3 or 4 types (whole nodes of 4), G = max(1024, 4 n).

    Everything is validated before the first point is yielded.

    Raises
    ------
    HppInputError
        A type count without a mix in :data:`TYPE_MIXES`, a GPU count < 1, a model without a bundled
        profile, or a GPU type of a mix that the model's profile lacks.
    """
    sizes, type_counts = list(sizes), list(type_counts)
    try:
        profile = load_bundled_profile(model)
    except HppInputError as exc:       # the benchmark's flag is --model, and it takes bundled profiles only
        raise HppInputError(exc.message, field="--model", fix=f"use one of {list(bundled_models())}") from None
    usable = [j for j, mix in sorted(TYPE_MIXES.items()) if set(mix) <= set(profile.device_types)]
    for k in type_counts:
        if k not in TYPE_MIXES:
            raise HppInputError(f"no GPU-type mix with {k} types", field="--types", fix=f"use {sorted(TYPE_MIXES)}")
        missing = sorted(set(TYPE_MIXES[k]) - set(profile.device_types))
        if missing:
            raise HppInputError(f"the {k}-type mix {list(TYPE_MIXES[k])} includes {missing[0]!r}, which has no "
                                f"{profile.model} profile", field="--types",
                                fix=f"use --types {','.join(map(str, usable))} with {profile.model}" if usable
                                else "use another --model")
    for n in sizes:
        if n < 1:
            raise HppInputError(f"GPU count {n}", field="--sizes", fix="give positive GPU counts, e.g. 8,16,32")
    seen: set[str] = set()
    for k in type_counts:
        for n in sizes:
            per = max(4, (n // k) // 4 * 4)
            gpus = {t: per for t in TYPE_MIXES[k]}
            gpus[TYPE_MIXES[k][0]] += max(0, n - per * k)
            total = sum(gpus.values())
            if f"{k}types-{total}" in seen:      # two sizes rounding to the same cluster (8 and 16 at 4 types)
                continue
            seen.add(f"{k}types-{total}")
            yield BenchPoint(f"{k}types-{total}", total, k, model, max(1024, 4 * total),
                             make_cluster(f"{k}types-{total}", gpus), requested_gpus=n if n != total else 0)


def _check_profiled(model: str, profiled: Iterable[str], types: Iterable[str], *, field: str) -> None:
    missing = sorted(set(types) - set(profiled))
    if missing:
        raise HppInputError(f"GPU type {missing[0]!r} has no {model} profile", field=field,
                            fix=f"use GPU types the profile has: {sorted(profiled)}")


def scenario_points(names: Iterable[str]) -> Iterator[BenchPoint]:
    """The bundled scenarios named (all validated, names and profiles, before the first is yielded).

    Raises
    ------
    HppInputError
        An unknown scenario name, or a GPU type of its cluster that its model's profile lacks.
    """
    scs = []
    for n in names:
        try:
            scs.append(get_scenario(n))
        except HppInputError as exc:       # the benchmark's flag is --scenarios
            raise HppInputError(exc.message, field="--scenarios", fix=exc.fix) from None
    for sc in scs:
        if not sc.device_types:        # emulated types come with their own profile entries
            _check_profiled(sc.model, load_bundled_profile(sc.model).device_types, dict(sc.gpus), field="--scenarios")
    for sc in scs:
        cl = sc.cluster()
        yield BenchPoint(sc.name, cl.num_devices, len(cl.count_by_type()), sc.model, sc.global_batch_size, cl)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def measure_point(p: BenchPoint, *, repeats: int = 3, time_limit_s: float | None = None, ablations: Iterable[str] = ABLATIONS,
                  ablation_repeats: int = 1, single_shape: bool = True, single_shape_budget_s: float | None = 60.0,
                  num_workers: int = 0, on_row: Callable[[SearchRow], None] | None = None,
                  single_shape_permute_len: int | None = None, metis: bool = True,
                  metis_budget_s: float | None = 300.0) -> list[SearchRow]:
    """Measure HPP (``repeats`` times, median), its ablations, Metis's search and the single-shape one on ``p``.

    ``single_shape_permute_len``: Metis's group-order permutations in the single-shape search
    (None: the canonical order; see :func:`hpp.baselines.single_shape.single_shape_baseline`). ``metis`` /
    ``metis_budget_s``: run :func:`hpp.baselines.metis.metis_search` (one run, it is deterministic)
    with this time budget [s]; a budget hit marks the row TRUNCATED.
    """
    profile = load_bundled_profile(p.model)
    settings = SolverSettings(max_time_in_seconds=time_limit_s, num_workers=num_workers, random_seed=0)
    rows = []
    variants = [("hpp", PruningOptions())] + [(f"hpp-no-{r}", PruningOptions().without(r)) for r in ablations]
    for method, pruning in variants:
        walls, res = [], None
        for _ in range(repeats if method == "hpp" else ablation_repeats):
            res = plan_hpp(p.cluster, profile, p.global_batch_size, pruning=pruning, settings=settings)
            walls.append(res.wall_s)
        assert res is not None
        cache = res.stats.get("cache", {})
        row = SearchRow(p.name, p.num_gpus, p.num_types, method, _median(walls), " ".join(f"{w:.3f}" for w in walls),
                       int(res.stats.get("num_candidates", 0)), float(cache.get("hit_rate", math.nan)),
                       res.estimate.iteration_time_s, res.search.gap, res.search.status)
        rows.append(row)
        if on_row:
            on_row(row)
    if metis:
        t0 = time.perf_counter()
        ref = metis_search(p.cluster, profile, p.global_batch_size, time_budget_s=metis_budget_s)
        row = SearchRow(p.name, p.num_gpus, p.num_types, "metis", time.perf_counter() - t0, "", ref.candidates,
                       math.nan, ref.iteration_time_s, math.nan, "TRUNCATED" if ref.truncated else "COMPLETE",
                       f"{ref.inter_stage_plans} inter-stage plans; {ref.description}")
        rows.append(row)
        if on_row:
            on_row(row)
    if not single_shape:
        return rows
    t0 = time.perf_counter()
    base = single_shape_baseline(p.cluster, profile, p.global_batch_size, space=SearchSpace(),
                                 time_budget_s=single_shape_budget_s, max_permute_len=single_shape_permute_len)
    truncated = "truncated" in base.description
    row = SearchRow(p.name, p.num_gpus, p.num_types, "single-shape", time.perf_counter() - t0, "",
                   base.candidates, math.nan, base.iteration_time_s, math.nan,
                   "TRUNCATED" if truncated else "COMPLETE", base.description)
    rows.append(row)
    if on_row:
        on_row(row)
    return rows


def plot_rows(rows: list[SearchRow], path: Path) -> None:
    """Search seconds vs GPUs, log-log, one line per (method, type count) of the sweep points."""
    # local: matplotlib.pyplot adds ~2 s to start-up; only the plot needs it
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    series: dict[tuple[str, int], list[tuple[int, float, bool]]] = {}
    for r in rows:
        if r.point.startswith(f"{r.num_types}types-"):          # the sweep, not the named scenarios
            series.setdefault((r.method, r.num_types), []).append((r.num_gpus, r.wall_s, r.status == "TRUNCATED"))
    colours = {2: "tab:blue", 3: "tab:orange", 4: "tab:green"}
    for (method, k), pts in sorted(series.items(), key=lambda kv: (kv[0][0] != "hpp", kv[0])):
        pts.sort()
        xs, ys = [x for x, _, _ in pts], [y for _, y, _ in pts]
        if method == "hpp":
            ax.plot(xs, ys, "-o", color=colours.get(k), linewidth=2.2, label=f"HPP ({k} types)")
        elif method in (REFERENCE, OTHER_REFERENCE):
            style, label = (("-.^", f"Metis's search, ported ({k} types)") if method == REFERENCE
                            else ("--s", f"single-shape, replicated ({k} types)"))
            ax.plot(xs, ys, style, color=colours.get(k), linewidth=1.6 if method == REFERENCE else 1.0,
                    alpha=1.0 if method == REFERENCE else 0.6, label=label)
            for x, y, trunc in pts:
                if trunc:
                    ax.annotate("cut", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
        else:
            ax.plot(xs, ys, ":", color=colours.get(k), linewidth=0.8, alpha=0.6,
                    label=f"ablations ({k} types)" if method == "hpp-no-memoise" else None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("search wall time [s] (HPP: median of repeats; references: one run)")
    ax.set_title("Configuration search overhead (OPT-350); dotted: HPP with one rule or the memo off; "
                 "'cut' = enumeration stopped at its budget", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper right")     # the right half above 10 s holds no data
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass(frozen=True)
class BaselineCheck:
    """HPP's own search (no baseline seeds) against one baseline on one input (a CSV row)."""

    case: str
    baseline: str
    hpp_iteration_s: float
    baseline_iteration_s: float
    hpp_wall_s: float
    baseline_note: str

    @property
    def ok(self) -> bool:
        """HPP's plan is at least as fast (1e-9 relative), or the baseline found no plan."""
        return not math.isfinite(self.baseline_iteration_s) or \
            self.hpp_iteration_s <= self.baseline_iteration_s * (1 + 1e-9)


def baseline_cases(names: Iterable[str] | None = None) -> list[tuple[str, str, int, Cluster]]:
    """(case name, model, global batch, cluster): every bundled scenario (or those ``names``) and
    LLAMA-3-8 on 16 A100-40 + 32 V100-16 at global batch 256 and 512."""
    out = []
    for sc in SCENARIOS.values():
        if names is None or sc.name in names:
            out.append((sc.name, sc.model, sc.global_batch_size, sc.cluster()))
    for g in (256, 512):
        name = f"llama8-a100x16-v100x32-g{g}"
        if names is None or name in names:
            out.append((name, "LLAMA-3-8", g, make_cluster(name, {"A100-40": 16, "V100-16": 32})))
    return out


def baseline_check(case: str, model: str, global_batch_size: int, cluster: Cluster, *,
                   space: SearchSpace = SearchSpace(), baseline_budget_s: float | None = 60.0,
                   profile=None) -> list[BaselineCheck]:
    """HPP's search, not seeded with any baseline plan, against every baseline on the same input and space.

    The baselines search the space HPP searches (:func:`hpp.baselines.single_shape.run_baselines` with ``space``), so
    HPP can express each of their plans and must be at least as fast (``BaselineCheck.ok``).
    """
    if profile is None:
        try:
            profile = load_bundled_profile(model)
        except HppInputError:
            profile = load_profile(model)
    res = plan_hpp(cluster, profile, global_batch_size, space=space)
    base = run_baselines(cluster, profile, global_batch_size, space=space, time_budget_s=baseline_budget_s)
    return [BaselineCheck(case, name, res.estimate.iteration_time_s, b.iteration_time_s, res.wall_s, b.description)
            for name, b in base.items()]
