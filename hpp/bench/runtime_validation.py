"""Closed-loop validation: profile -> plan (HPP and baselines) -> run -> predicted vs measured.

For each emulated heterogeneous CPU cluster (fast devices at 1x, slow ones k x
slower with a smaller memory cap) this module profiles ``gpt-tiny`` once on this host
(per-layer times, and the runtime step's time terms and the host's CPU contention,
:mod:`hpp.runtime.profile.time_terms`), plans it with HPP (:func:`hpp.planner.plan_hpp`), the
uniform and the single-shape baselines (:mod:`hpp.baselines.single_shape`), runs the plans with the
runtime (fork launcher, gloo; speed emulation at the common time scale ``D`` of
:func:`hpp.runtime.run.default_time_scale`, or none for a cluster with ``emulate=False``,
whose ranks then all run at the host's speed) and returns one :class:`ValidationRow` per run.

Predictions of a run (host seconds):

- ``predicted_s``: :func:`hpp.runtime.host.time_model.simulate_host_run`, the step as this
  host executes it (ranks sharing its cores, CPU contention, emulation padding, the
  real-op probe measured with the profile: kappa past the cores and the CPU an op pays
  after a wait, :mod:`hpp.runtime.host.ops`, and ``steal``, the share of the time the
  cores wanted to run that the hypervisor took during the run's kept steps,
  :mod:`hpp.runtime.host.steal`); the target compares the measured time with this
  (``error``); ``predicted_nosteal_s`` is the same without the steal;
- ``predicted_model_s``: the cost model's closed form at this run's ``D`` (dedicated cores);
- ``predicted_plan_s``: the plan's own prediction (``D = 1``, the emulated cluster).

CPU-time check (the wall clock of a shared host also measures other processes' load):
``cpu_ratio`` = CPU seconds the ranks' forward/backward ops used (``time.thread_time``, the
worker's ``cpu_s``) / what the host model predicts they use: 1 when the host ran at the
speed it was profiled at. ``predicted_norm_s`` is the host model with every CPU term of
the profile x ``cpu_ratio`` (the host's speed during the run), and ``error_norm`` the error
against it: the model's error with the host's speed drift taken out. ``background`` is the number of
other processes computing on the host just before the run (:func:`hpp.runtime.profile.host_probe.background_load`): 0 on
a quiet host; ``predicted_bg_s`` is the host model with that many always-busy processes
beside the ranks (informative: the load changes while the run lasts).
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from hpp.baselines.single_shape import single_shape_baseline
from hpp.baselines.uniform import uniform_baseline
from hpp.formulation.composition.settings import SolverSettings
from hpp.plan_data import Plan, write_plan_json
from hpp.planner import plan_hpp
from hpp.profiles.cluster import Cluster
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.profile_format import profile_to_dict, save_profile
from hpp.runtime.host.time_model import scale_cpu_work, simulate_host_run
from hpp.scenarios import make_emulated_cluster

# hpp.runtime.profile.profiler, time_profile, host_probe and run are imported inside the functions that use them: they
# load torch (~4 s), which building clusters and planning do not need.

__all__ = ["EmulatedCluster", "ValidationRow", "DEFAULT_CLUSTERS", "QUICK_CLUSTERS", "CLOSED_LOOP",
           "build_cluster", "profile_for", "plan_all", "run_and_compare", "validate", "max_abs_error",
           "median_abs_error"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EmulatedCluster:
    """Fast devices (1x, ``fast_memory_bytes``) and slow ones (``slowdown`` x, ``slow_memory_bytes``).

    ``emulate=False`` runs the plans without speed emulation (every rank at the host's speed).
    """

    name: str
    num_fast: int
    num_slow: int
    slowdown: float
    global_batch_size: int
    fast_memory_bytes: int = 40_000_000
    slow_memory_bytes: int = 16_000_000
    emulate: bool = True

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
#: Scenario cpu-hetero-4's cluster run as ``hpp run PLAN --steps 8`` (no emulation): the plan's devices are cores.
CLOSED_LOOP = EmulatedCluster("cpu-hetero-4", 2, 2, 2.0, 32, emulate=False)


@dataclass(frozen=True)
class ValidationRow:
    """One plan run on one cluster (times in host seconds, throughput in samples/s; see the module docstring)."""

    cluster: str
    workers: int
    plan: str
    description: str
    devices_used: int
    emulated: bool
    time_scale: float
    predicted_plan_s: float
    predicted_model_s: float
    predicted_s: float
    measured_s: float                # median over kept steps
    measured_spread: float           # (max - min) / median of the kept steps
    error: float                     # measured / predicted - 1
    measured_throughput: float
    predicted_throughput: float
    measured_speedup_of_hpp: float   # this plan's measured time / HPP's (same cluster)
    predicted_speedup_of_hpp: float
    cpu_ratio: float
    steal: float                     # hypervisor's share of the time the cores wanted to run (run's kept steps)
    predicted_nosteal_s: float       # the host model without the steal
    predicted_norm_s: float
    error_norm: float
    background: float
    predicted_bg_s: float
    wall_over_cpu: float
    tail_s: float
    load_before: float
    load_after: float


def build_cluster(spec: EmulatedCluster) -> Cluster:
    """The :class:`Cluster` of ``spec`` (one node per device type, loopback links)."""
    types = (DeviceType("cpu", spec.fast_memory_bytes, max(spec.num_fast, 1)),
             DeviceType(spec.slow_type, spec.slow_memory_bytes, max(spec.num_slow, 1), slowdown=spec.slowdown))
    return make_emulated_cluster(spec.name, types, {"cpu": spec.num_fast, spec.slow_type: spec.num_slow})


def profile_for(specs: Sequence[EmulatedCluster], *, model: str = "gpt-tiny", micro_batch_sizes=(1, 2, 4),
                repeats: int = 10, warmup: int = 3, time_terms: bool = True, quick: bool = False) -> ModelProfile:
    """Profile ``model`` on this CPU (one thread), add each slow type as a scaled copy, then the time terms."""
    from hpp.runtime.profile.profiler import profile_model, scale_profile
    from hpp.runtime.profile.time_terms import add_measured_time_terms
    prof = profile_model(model, device="cpu", micro_batch_sizes=micro_batch_sizes, repeats=repeats, warmup=warmup,
                         memory_terms=False)          # the emulated memory caps are set for the calibrated formula
    prof = scale_profile(prof, {s.slow_type: s.slowdown for s in specs}, base_device_type="cpu")
    return add_measured_time_terms(prof, model=model, quick=quick) if time_terms else prof


def plan_all(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *, time_limit_s: float | None = None,
             seed: int = 0, baselines: bool = True) -> dict[str, tuple[Plan, str]]:
    """HPP, uniform and single-shape plans (name -> (plan, description)); every plan embeds ``profile``."""
    ref = {"embedded": profile_to_dict(profile)}
    settings = SolverSettings(max_time_in_seconds=time_limit_s, num_workers=1, random_seed=seed)
    res = plan_hpp(cluster, profile, global_batch_size, settings=settings, profile_ref=ref)
    out = {"hpp": (res.plan, f"{res.plan.num_pipelines} pipelines, {res.search.status}")}
    for name, fn in (("uniform", uniform_baseline), ("single-shape", single_shape_baseline)) if baselines else ():
        kw = {"time_budget_s": 30.0} if name == "single-shape" else {}
        b = fn(cluster, profile, global_batch_size, **kw)
        if b.plan is None:
            logger.warning("%s: no feasible plan (%s)", name, b.description)
            continue
        out[name] = (replace(b.plan, profile_ref=ref), b.description)
    return out


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _measured_cpu(rep) -> float:
    return sum(r["phases_s"]["cpu_s"] for r in rep.ranks)


def _predict(plan: Plan, cluster: Cluster, profile: ModelProfile, *, emulate: bool, time_scale: float,
             cpu_factor: float = 1.0, background: float = 0.0, steal: float = 0.0):
    prof = scale_cpu_work(profile, cpu_factor) if cpu_factor != 1.0 else profile
    return simulate_host_run(plan, cluster, prof, cores=os.cpu_count() or 1, emulate_speed=emulate,
                             time_scale=time_scale, background=background, steal=steal)


def run_and_compare(spec: EmulatedCluster, plans: dict[str, tuple[Plan, str]], profile: ModelProfile, *,
                    steps: int = 8, time_scale: float | None = None, work_dir: Path | None = None,
                    timeline: Path | None = None) -> list[ValidationRow]:
    """Run every plan of one cluster with the runtime (fork launcher) and compare with the predictions."""
    from hpp.runtime.profile.host_probe import background_load
    from hpp.runtime.config import RunConfig
    from hpp.runtime.run import run_plan
    cluster = build_cluster(spec)
    rows: list[ValidationRow] = []
    ref_measured = ref_predicted = None
    with tempfile.TemporaryDirectory(prefix="hpp-validate-", dir=work_dir) as tmp:
        for name, (plan, desc) in plans.items():
            path = Path(tmp) / f"{spec.name}-{name}.json"
            write_plan_json(plan, path)
            bg, load0 = background_load(), _load()
            rep = run_plan(RunConfig.build(path, steps=steps, emulate_speed=spec.emulate, launcher="fork",
                                           time_scale=time_scale,
                                           timeline=timeline if (name == "hpp" and timeline is not None) else None,
                                           run_timeout_s=600.0, host_calibration=False))   # the profile is this host's, just measured
            load1 = _load()
            m, p = rep.measured, rep.predicted
            D = float(p.get("time_scale") or 1.0)
            steal = (m.get("host_steal") or {}).get("fraction") or 0.0
            host = _predict(plan, cluster, profile, emulate=spec.emulate, time_scale=D, steal=steal)
            nosteal = _predict(plan, cluster, profile, emulate=spec.emulate, time_scale=D)
            ratio = _measured_cpu(rep) / sum(host.cpu_s) if sum(host.cpu_s) > 0 else float("nan")
            norm = _predict(plan, cluster, profile, emulate=spec.emulate, time_scale=D, cpu_factor=ratio, steal=steal)
            with_bg = _predict(plan, cluster, profile, emulate=spec.emulate, time_scale=D,
                               background=bg if bg == bg else 0.0, steal=steal)
            kept = m["step_times_s"][rep.warmup_steps:] or m["step_times_s"]
            med = m["iteration_time_s"]
            ref_measured = ref_measured or med
            ref_predicted = ref_predicted or host.iteration_time_s
            cpu = _measured_cpu(rep)
            wall = sum(r["phases_s"]["compute_s"] for r in rep.ranks)
            rows.append(ValidationRow(
                spec.name, spec.num_fast + spec.num_slow, name, desc, plan.num_devices, spec.emulate, D,
                float(p.get("plan_iteration_time_s") or float("nan")),
                float(p.get("cost_model_iteration_time_s") or p.get("iteration_time_s") or float("nan")),
                host.iteration_time_s, med, (max(kept) - min(kept)) / med, med / host.iteration_time_s - 1.0,
                m["throughput_samples_per_s"], plan.global_batch_size / host.iteration_time_s,
                med / ref_measured, host.iteration_time_s / ref_predicted, ratio, steal, nosteal.iteration_time_s,
                norm.iteration_time_s,
                med / norm.iteration_time_s - 1.0, bg, with_bg.iteration_time_s,
                wall / cpu if cpu else float("nan"),
                max(r["phases_s"]["batch_s"] + r["phases_s"]["sync_wait_s"] + r["phases_s"]["optimizer_s"]
                    for r in rep.ranks), load0, load1))
            logger.info("%s %s: measured %.4f s, predicted %.4f s (host model; normalised %.4f s; cost model %.4f s)",
                        spec.name, name, med, host.iteration_time_s, norm.iteration_time_s, rows[-1].predicted_model_s)
    return rows


def validate(specs: Sequence[EmulatedCluster] = DEFAULT_CLUSTERS, *, steps: int = 8, time_scale: float | None = None,
             repeats: int = 10, time_limit_s: float | None = None, seed: int = 0, timeline: Path | None = None,
             closed_loop: bool = True, quick: bool = False, profile_out: Path | None = None) -> list[ValidationRow]:
    """Profile once, then plan and run every cluster of ``specs`` (and :data:`CLOSED_LOOP`); all rows in order.

    ``profile_out``: where to save the profile the predictions use (with its time terms).
    """
    all_specs = tuple(specs) + ((CLOSED_LOOP,) if closed_loop else ())
    profile = profile_for(all_specs, repeats=repeats, quick=quick)
    if profile_out is not None:
        save_profile(profile, profile_out)
    rows: list[ValidationRow] = []
    for i, spec in enumerate(all_specs):
        plans = plan_all(build_cluster(spec), profile, spec.global_batch_size, time_limit_s=time_limit_s, seed=seed,
                         baselines=spec.emulate)
        rows += run_and_compare(spec, plans, profile, steps=steps, time_scale=time_scale,
                                timeline=timeline if i == 0 else None)
    return rows


def max_abs_error(rows: Sequence[ValidationRow], *, normalised: bool = False, background: bool = False) -> float:
    """Largest |measured / predicted - 1| over rows (``normalised``: against ``predicted_norm_s``;
    ``background``: against ``predicted_bg_s``, the prediction with the other load measured before each run)."""
    if background:
        return max(abs(r.measured_s / r.predicted_bg_s - 1.0) for r in rows)
    return max(abs(r.error_norm if normalised else r.error) for r in rows)


def median_abs_error(rows: Sequence[ValidationRow]) -> float:
    """Median |measured / predicted - 1| over rows."""
    return statistics.median(abs(r.error) for r in rows)
