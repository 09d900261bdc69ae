"""Closed-loop validation: profile -> plan (HPP and baselines) -> run -> predicted vs measured.

For each emulated heterogeneous CPU cluster (fast devices at 1x, slow ones k x
slower with a smaller memory cap) this module profiles ``gpt-tiny`` once, plans it
with HPP (:func:`hpp.planner.plan_hpp`), the uniform and the single-shape
baselines (:mod:`hpp.baselines`), runs all three plans with the runtime (fork
launcher, gloo, speed emulation at a common time scale ``D``) and returns one
:class:`ValidationRow` per plan: measured and predicted iteration time and
throughput, HPP's measured and predicted speedup, and where the time went.

Gap breakdown (all from the ranks' own clocks, medians over the kept steps):

- ``cpu_ratio``: CPU time the stages' forward/backward actually used / what the
  profile says (> 1: the run computes more than the profile measured, e.g. the
  loss, PipelineStage bookkeeping, the all-reduce launches in backward hooks);
- ``wall_over_cpu``: wall time of those ops / their CPU time (> 1: the ranks
  waited for a core, the host was oversubscribed);
- ``gaps_s``: on the rank with the longest schedule, schedule time not spent in
  its forward/backward ops (p2p transfers, waiting on neighbours, Python);
- ``tail_s``: batch preparation + gradient sync wait + optimizer step (slowest rank).

Times are "host" seconds: a run at time scale ``D`` takes about ``D`` times the
emulated cluster's time; the ratios between plans of one cluster do not depend on ``D``.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from hpp.plan import Plan, write_plan_json
from hpp.profiles.cluster import Cluster
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import ModelProfile, profile_to_dict

__all__ = ["EmulatedCluster", "ValidationRow", "DEFAULT_CLUSTERS", "QUICK_CLUSTERS", "build_cluster",
           "profile_for", "plan_all", "run_and_compare", "validate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EmulatedCluster:
    """Fast devices (1x, ``fast_memory_bytes``) and slow ones (``slowdown`` x, ``slow_memory_bytes``)."""

    name: str
    num_fast: int
    num_slow: int
    slowdown: float
    global_batch_size: int
    fast_memory_bytes: int = 40_000_000
    slow_memory_bytes: int = 16_000_000

    @property
    def slow_type(self) -> str:
        return f"cpu-{self.slowdown:g}x"


#: Caps as in scenario cpu-hetero-4: a fast device holds gpt-tiny whole, a slow one about half of it.
DEFAULT_CLUSTERS = (
    EmulatedCluster("4w-2x", 2, 2, 2.0, 32),
    EmulatedCluster("5w-3x", 2, 3, 3.0, 36),
    EmulatedCluster("6w-2x", 2, 4, 2.0, 48, slow_memory_bytes=12_000_000),
)
QUICK_CLUSTERS = DEFAULT_CLUSTERS[:2]


@dataclass(frozen=True)
class ValidationRow:
    """One plan run on one cluster (times in host seconds, throughput in samples/s)."""

    cluster: str
    workers: int
    plan: str
    description: str
    devices_used: int
    time_scale: float
    predicted_plan_s: float          # the plan's prediction on the emulated cluster (D = 1)
    predicted_s: float               # the same at this run's time scale D
    measured_s: float                # median over kept steps
    measured_spread: float           # (max - min) / median of the kept steps
    error: float                     # measured / predicted - 1
    measured_throughput: float       # host samples/s
    predicted_throughput: float
    measured_speedup_of_hpp: float   # this plan's measured time / HPP's (same cluster)
    predicted_speedup_of_hpp: float
    cpu_ratio: float
    wall_over_cpu: float
    gaps_s: float
    tail_s: float
    load_average: float


def build_cluster(spec: EmulatedCluster) -> Cluster:
    """The :class:`Cluster` of ``spec`` (two nodes, loopback links)."""
    from hpp.scenarios import make_emulated_cluster
    types = (DeviceType("cpu", spec.fast_memory_bytes, max(spec.num_fast, 1)),
             DeviceType(spec.slow_type, spec.slow_memory_bytes, max(spec.num_slow, 1), slowdown=spec.slowdown))
    return make_emulated_cluster(spec.name, types, {"cpu": spec.num_fast, spec.slow_type: spec.num_slow})


def profile_for(specs: Sequence[EmulatedCluster], *, model: str = "gpt-tiny", micro_batch_sizes=(1, 2, 4),
                repeats: int = 10, warmup: int = 3) -> ModelProfile:
    """Profile ``model`` on this CPU (one thread) and add each slow type as a scaled copy."""
    from hpp.runtime.profiler import profile_model, scale_profile
    prof = profile_model(model, device="cpu", micro_batch_sizes=micro_batch_sizes, repeats=repeats, warmup=warmup)
    return scale_profile(prof, {s.slow_type: s.slowdown for s in specs}, base_device_type="cpu")


def plan_all(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *, time_limit_s: float = 5.0,
             seed: int = 0) -> dict[str, tuple[Plan, str]]:
    """HPP, uniform and single-shape plans (name -> (plan, description)); every plan embeds ``profile``."""
    from hpp.baselines import single_shape_baseline, uniform_baseline
    from hpp.formulation.composition import SolverSettings
    from hpp.planner import plan_hpp
    ref = {"embedded": profile_to_dict(profile)}
    settings = SolverSettings(max_time_in_seconds=time_limit_s, num_workers=1, random_seed=seed)
    res = plan_hpp(cluster, profile, global_batch_size, settings=settings, profile_ref=ref)
    out = {"hpp": (res.plan, f"{res.plan.num_pipelines} pipelines, {res.composition.status}")}
    for name, fn in (("uniform", uniform_baseline), ("single-shape", single_shape_baseline)):
        kw = {"time_budget_s": 30.0} if name == "single-shape" else {}
        b = fn(cluster, profile, global_batch_size, **kw)
        if b.plan is None:
            logger.warning("%s: no feasible plan (%s)", name, b.description)
            continue
        out[name] = (replace(b.plan, profile_ref=ref), b.description)
    return out


def _breakdown(rep) -> dict[str, float]:
    ranks, pred = rep.ranks, rep.predicted
    stages = [s for p in pred["pipelines"] for s in p["stages"]]
    cpu_expected = cpu_used = wall = 0.0
    for r, st in zip(sorted(ranks, key=lambda r: r["rank"]), stages):
        factor = (r["slowdown"] or 1.0) * (r["time_scale"] or 1.0)
        cpu_expected += r["num_micro_batches"] * (st["forward_s"] + st["backward_s"]) / factor
        cpu_used += r["phases_s"]["cpu_s"]
        wall += r["phases_s"]["compute_s"]
    crit = max(ranks, key=lambda r: r["phases_s"]["schedule_s"])
    ph = crit["phases_s"]
    return {"cpu_ratio": cpu_used / cpu_expected if cpu_expected else float("nan"),
            "wall_over_cpu": wall / cpu_used if cpu_used else float("nan"),
            "gaps_s": ph["schedule_s"] - ph["compute_s"] - ph["padding_s"],
            "tail_s": max(r["phases_s"]["batch_s"] + r["phases_s"]["sync_wait_s"] + r["phases_s"]["optimizer_s"]
                          for r in ranks)}


def run_and_compare(spec: EmulatedCluster, plans: dict[str, tuple[Plan, str]], *, steps: int = 6,
                    time_scale: float | None = None, work_dir: Path | None = None,
                    timeline: Path | None = None) -> list[ValidationRow]:
    """Run every plan of one cluster with the runtime (fork, emulated speeds) and compare."""
    from hpp.runtime.run import run_plan
    reports = {}
    with tempfile.TemporaryDirectory(prefix="hpp-validate-", dir=work_dir) as tmp:
        for name, (plan, _desc) in plans.items():
            path = Path(tmp) / f"{spec.name}-{name}.json"
            write_plan_json(plan, path)
            reports[name] = run_plan(path, steps=steps, emulate_speed=True, launcher="fork", time_scale=time_scale,
                                     timeline=timeline if (name == "hpp" and timeline is not None) else None,
                                     run_timeout_s=300.0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    ref = reports["hpp"]
    rows = []
    for name, rep in reports.items():
        plan, desc = plans[name]
        m, p = rep.measured, rep.predicted
        kept = m["step_times_s"][rep.warmup_steps:] or m["step_times_s"]
        med = m["iteration_time_s"]
        rows.append(ValidationRow(
            spec.name, spec.num_fast + spec.num_slow, name, desc, plan.num_devices, p["time_scale"],
            p["plan_iteration_time_s"], p["iteration_time_s"], med, (max(kept) - min(kept)) / med,
            med / p["iteration_time_s"] - 1.0, m["throughput_samples_per_s"], p["throughput_samples_per_s"],
            med / ref.measured["iteration_time_s"], p["iteration_time_s"] / ref.predicted["iteration_time_s"],
            **_breakdown(rep), load_average=load))
        logger.info("%s %s: measured %.4f s, predicted %.4f s", spec.name, name, med, p["iteration_time_s"])
    return rows


def validate(specs: Sequence[EmulatedCluster] = DEFAULT_CLUSTERS, *, steps: int = 6, time_scale: float | None = None,
             repeats: int = 10, time_limit_s: float = 5.0, seed: int = 0,
             timeline: Path | None = None) -> list[ValidationRow]:
    """Profile once, then plan and run every cluster of ``specs``; all rows, cluster by cluster."""
    profile = profile_for(specs, repeats=repeats)
    rows: list[ValidationRow] = []
    for i, spec in enumerate(specs):
        cluster = build_cluster(spec)
        plans = plan_all(cluster, profile, spec.global_batch_size, time_limit_s=time_limit_s, seed=seed)
        rows += run_and_compare(spec, plans, steps=steps, time_scale=time_scale,
                                timeline=timeline if i == 0 else None)
    return rows


def median_abs_error(rows: Sequence[ValidationRow]) -> float:
    """Median |measured / predicted - 1| over rows."""
    return statistics.median(abs(r.error) for r in rows)
