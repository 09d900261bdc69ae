"""What ``hpp run`` reports: the measured step (from the ranks' results) beside the cost model's prediction.

:class:`RunReport` is ``hpp run --json``'s object; :func:`summarise_run` reduces the ranks'
``rank<r>.json`` (:func:`hpp.runtime.exec.worker.run_worker`) to the measured iteration time,
throughput, loss, MFU, collectives and per-rank rows; :func:`predict_run` is the prediction of
the same run (:func:`hpp.formulation.cost_model.estimate_plan`, and on CPU the host model
:func:`hpp.runtime.host.time_model.simulate_host_run`).
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from hpp.errors import HppInputError
from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.runtime.host.time_model import host_terms, scale_cpu_work, simulate_host_run
from hpp.runtime.profile.host_speed import HostSpeed
from hpp.runtime.host.steal import background_cores, run_steal
from hpp.runtime.launch.launchers import LaunchResult
from hpp.runtime.exec.layout import blocks
from hpp.runtime.metrics import StepMetrics
from hpp.runtime.profile.profiler import dilate_profile
from hpp.runtime.step_terms import measured_terms, predicted_terms

__all__ = ["RunReport", "predict_run", "summarise_run", "speed_moved_note"]


@dataclass(frozen=True)
class RunReport:
    """What ``hpp run --json`` prints (see :meth:`to_dict`).

    Attributes
    ----------
    measured : dict
        ``iteration_time_s`` (median after warm-up), ``throughput_samples_per_s``,
        ``tokens_per_s`` (= ``throughput_tokens_per_s``: G x seq_len per iteration time),
        ``loss`` (the last step's mean loss per target token; ``losses`` per step),
        ``mfu`` (model FLOPs per step / iteration time / the devices' summed peak FLOP/s;
        ``None`` when a device type's peak is unknown, e.g. CPUs), ``flops_per_step``,
        ``step_times_s`` (all steps), ``pipelines`` (per pipeline: ``schedule_s`` of the
        last step, from the stages' events), ``host_steal`` (on Linux: the stolen share of the
        time this host's cores wanted to run during the kept steps,
        :func:`hpp.runtime.host.steal.run_steal`; else ``None``), ``grad_sync_s`` (median; per step
        ``grad_sync_steps_s``) and ``stages`` (per stage ``compute_s`` and ``p2p_wait_s``): the
        communication terms of :func:`hpp.runtime.step_terms.measured_terms`.
    predicted : dict
        ``iteration_time_s`` and ``throughput_samples_per_s`` from
        :func:`hpp.formulation.cost_model.estimate_plan` at this run's ``time_scale`` (on CPU: the host
        model at this host's speed, ``host_speed``, and the steal measured during the steps,
        ``host_model.steal``, see :func:`predict_run`),
        ``plan_iteration_time_s`` at time scale 1, ``pipelines`` (per stage forward/backward
        seconds), ``grad_sync_s`` and ``stages`` (the cost model's figures beside the measured ones,
        :func:`hpp.runtime.step_terms.predicted_terms`), or ``None`` with ``reason``.
    collectives : dict
        ``count`` and ``bytes`` of gradient all-reduces per step (each counted once), ``mode``.
    ranks : list[dict]
        Per rank: pipeline, stage, device type, layers, ``peak_memory_bytes``, compute and padding seconds
        (last step) and ``phases_s`` (median over the kept steps of each step phase, see
        :func:`hpp.runtime.exec.worker.run_worker`); with ``--weights``, ``weights``: the rank's load
        (:func:`hpp.runtime.exec.weights.load_stage_weights`: ``tensors``, ``bytes``, ``read_bytes``,
        ``rss_before_bytes``, ``peak_rss_growth_bytes`` and its bound ``margin_bytes``).
    dtype, training, data
        The run's dtype, :class:`hpp.runtime.exec.training.TrainingConfig` fields and ``--data`` file.
    verify : dict or None
        With ``--verify``: :meth:`hpp.runtime.exec.reference.VerifyResult.to_dict`.
    hosts : dict
        ``nnodes``, ``node_rank``, ``ranks`` (the plan ranks this host ran) and ``nodes`` (plan nodes).
    checkpoint : dict
        ``resumed_from`` (path) and ``first_step``; ``latest`` (the latest complete checkpoint under ``--save``).
    device : str
        ``cpu`` or ``cuda``: on CPU a rank's ``peak_memory_bytes`` is its process's peak RSS, on CUDA the
        allocator's peak.
    command : list[str] or None
        ``dry_run`` only: this host's torchrun command (nothing was run; ``measured`` is empty).
    """

    plan: str
    model: str
    steps: int
    warmup_steps: int
    world_size: int
    launcher: str
    emulate_speed: bool
    measured: dict[str, Any]
    predicted: dict[str, Any]
    collectives: dict[str, Any]
    ranks: list[dict[str, Any]]
    wall_s: float
    timeline: str | None = None
    notes: list[str] = field(default_factory=list)
    dtype: str = "float32"
    training: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None
    hosts: dict[str, Any] = field(default_factory=dict)
    command: list[str] | None = None
    checkpoint: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict_run(plan: Plan, cluster: Cluster, profile: ModelProfile | None, *, time_scale: float = 1.0,
                device: str = "cpu", emulate_speed: bool = False, host_speed: HostSpeed | None = None,
                steal: float | None = None, run_cpu_s: list[float] | None = None) -> dict[str, Any]:
    """The cost model's prediction of this run; on CPU, the host model's (``hpp.runtime.host.time_model``).

    A CPU run shares this host's cores among its ranks (and pads emulated devices): the host
    model replays the step with processor sharing, and its iteration time is what the run should
    measure (``cost_model_iteration_time_s`` keeps the closed form, ``plan_iteration_time_s`` the
    plan's own estimate, both on the profile as is).

    ``host_speed`` (CPU only; :func:`hpp.runtime.profile.host_speed.calibrate_host_speed`): with a factor,
    the host model runs on the profile with every CPU term x that factor
    (:func:`hpp.runtime.host.time_model.scale_cpu_work`), i.e. at this host's speed, once (the time
    scale pads the CPU time so scaled); ``host_speed`` in the result says what was compared, or why
    not, and ``host_model.profile_as_is_iteration_time_s`` is the host model without the factor.

    ``steal`` (CPU only; :func:`hpp.runtime.host.steal.run_steal`'s ``fraction`` of this run): the share
    of the time the host's cores wanted to run that its hypervisor took; the host model gives every
    computing rank ``1 - steal`` of its core share. ``host_model.steal`` says what was used and
    ``host_model.without_steal_iteration_time_s`` is the host model without it (0 or ``None``: the same).

    ``run_cpu_s`` (CPU only): per rank, the CPU seconds the run's forward/backward ops used (the ranks'
    median ``phases_s.cpu_s``). Their sum over the host model's ``cpu_s`` is ``host_model.run_cpu_ratio``
    (1: the ranks ran at the speed predicted; the host's speed moves within minutes on a virtual
    host), and ``host_model.at_run_cpu_speed_iteration_time_s`` the host model with the CPU terms x that
    ratio too: a diagnostic that separates the host's speed from the schedule model, not a prediction.
    """
    if profile is None:
        return {"iteration_time_s": None, "throughput_samples_per_s": None,
                "reason": "the plan names no profile"}
    try:
        est = estimate_plan(plan, cluster, dilate_profile(profile, time_scale))
        plan_est = est if time_scale == 1.0 else estimate_plan(plan, cluster, profile)
    except HppInputError as exc:
        return {"iteration_time_s": None, "throughput_samples_per_s": None, "reason": str(exc)}
    t_iter, extra = est.iteration_time_s, {}
    if device == "cpu":
        cores = os.cpu_count() or 1
        factor = host_speed.factor if host_speed is not None else None
        here = scale_cpu_work(profile, factor) if factor is not None else profile
        stolen = steal or 0.0
        host = simulate_host_run(plan, cluster, here, cores=cores, emulate_speed=emulate_speed, time_scale=time_scale,
                                 steal=stolen)
        no_steal = host if stolen == 0.0 else simulate_host_run(plan, cluster, here, cores=cores,
                                                                emulate_speed=emulate_speed, time_scale=time_scale)
        as_is = host if factor is None else simulate_host_run(plan, cluster, profile, cores=cores,
                                                              emulate_speed=emulate_speed, time_scale=time_scale,
                                                              steal=stolen)
        ratio = sum(run_cpu_s) / sum(host.cpu_s) if run_cpu_s and sum(host.cpu_s) > 0 else None
        at_run = None if ratio is None or not ratio > 0 else simulate_host_run(
            plan, cluster, scale_cpu_work(profile, (factor or 1.0) * ratio), cores=cores, emulate_speed=emulate_speed,
            time_scale=time_scale, steal=stolen).iteration_time_s
        t_iter = host.iteration_time_s
        extra = {"cost_model_iteration_time_s": est.iteration_time_s,
                 "host_model": {"cores": cores, "cpu_s": list(host.cpu_s),
                                "contention": list(host_terms(profile, cores=cores).contention),
                                "steal": steal, "without_steal_iteration_time_s": no_steal.iteration_time_s,
                                "profile_as_is_iteration_time_s": as_is.iteration_time_s,
                                "run_cpu_ratio": ratio, "at_run_cpu_speed_iteration_time_s": at_run}}
        if host_speed is not None:
            extra["host_speed"] = host_speed.to_dict()
    return {"iteration_time_s": t_iter, "throughput_samples_per_s": plan.global_batch_size / t_iter,
            **extra, "time_scale": time_scale, "plan_iteration_time_s": plan_est.iteration_time_s,
            "pipeline_time_s": est.pipeline_time_s, "grad_sync_s": est.grad_sync_s, "optimizer_s": est.optimizer_s,
            "peak_memory_bytes": est.peak_memory_bytes, "stages": predicted_terms(est)["stages"],
            "pipelines": [{"time_s": p.time_s, "stages": [{"forward_s": s.forward_s, "backward_s": s.backward_s,
                                                          "p2p_s": s.p2p_s,
                                                          "memory_bytes": s.memory_bytes}
                                                         for s in p.stages]} for p in est.pipelines]}


def speed_moved_note(predicted: dict[str, Any], *, low: float = 0.8, high: float = 1.25) -> str | None:
    """A note when the ranks' CPU seconds disagree with the speed probe (``host_model.run_cpu_ratio`` outside
    [low, high]): the host's speed moved between the run and the probe, e.g. another process computed during
    one of them, and the prediction is not one to trust. None otherwise (or without the ratio)."""
    ratio = (predicted.get("host_model") or {}).get("run_cpu_ratio")
    if ratio is None or low <= ratio <= high:
        return None
    return (f"the ranks' ops used {ratio:.2f} x the CPU seconds predicted at the speed probe's speed: the host's "
            f"speed moved between the probe and the run, or the profile's op times do not hold in this run (tiny "
            f"ops are dominated by per-op overhead); the prediction is off by about that factor")


def _joined_collectives(last: list[dict[str, Any]]) -> tuple[int, int]:
    """(all-reduces, their payload [bytes]) of one step that the given ranks took part in, each counted once: a
    collective is its (unit, ranks, bytes) record, as often as one rank of it joined it. On one host, every
    collective (the ranks' own ``count`` summed: each led by its smallest rank); on one of several hosts, those this
    host's ranks joined, whichever host's rank led them."""
    seen: dict[tuple, int] = {}
    for c in last:
        for key, n in Counter((label, tuple(ranks), int(nb)) for label, ranks, nb in c.get("records", [])).items():
            seen.setdefault(key, n)
    return sum(seen.values()), sum(key[2] * n for key, n in seen.items())


def summarise_run(res: LaunchResult, plan: Plan, *, warmup_steps: int, seq_len: int, steps_seen: list[StepMetrics],
                  peak_flops: float | None) -> tuple[dict, dict, list]:
    """The report's ``measured``, ``collectives`` and ``ranks`` (see :class:`RunReport`) from the ranks'
    results and the per-step metrics ``steps_seen`` (:class:`hpp.runtime.metrics.StepMonitor`)."""
    results = [r for r in res.results if r is not None]
    steps = len(results[0]["step_times_s"])
    per_step = [max(r["step_times_s"][i] for r in results) for i in range(steps)]
    kept = per_step[warmup_steps:] if steps > warmup_steps else per_step
    median = statistics.median(kept)
    pipes = []
    for p in range(plan.num_pipelines):
        ev = [e for r in results if r["pipeline"] == p for e in r["events"]]
        span = (max(e["stop_s"] for e in ev) - min(e["start_s"] for e in ev)) if ev else 0.0
        pipes.append({"pipeline": p, "num_samples": plan.pipelines[p].num_samples, "schedule_s": span})
    flops = steps_seen[-1].flops if steps_seen else None
    tokens_per_s = plan.global_batch_size * seq_len / median
    measured = {"iteration_time_s": median, "throughput_samples_per_s": plan.global_batch_size / median,
                "tokens_per_s": tokens_per_s, "throughput_tokens_per_s": tokens_per_s,
                "loss": steps_seen[-1].loss if steps_seen else None,
                "losses": [m.loss for m in steps_seen],
                "flops_per_step": flops,
                "mfu": flops / median / peak_flops if flops is not None and peak_flops else None,
                "peak_flops_per_s": peak_flops,
                "step_times_s": per_step, "pipelines": pipes,
                "host_steal": run_steal(results, warmup_steps=warmup_steps),
                "background_cores": background_cores(results, warmup_steps=warmup_steps),
                **measured_terms(results, warmup_steps=warmup_steps)}
    last = [r["collectives"][-1] for r in results]
    count, nbytes = _joined_collectives(last)
    collectives = {"count": count, "bytes": nbytes,
                   "launched_in_backward_by_rank": [c.get("launched_in_backward", 0) for c in last],
                   "per": "step", "num_blocks": len(blocks(plan))}
    ranks = []
    for r in results:
        row = {k: r.get(k) for k in ("rank", "pipeline", "stage", "device_id", "device_type", "layers", "recompute",
                                     "tp_degree", "tp_rank", "num_micro_batches", "peak_memory_bytes",
                                     "peak_memory_reserved_bytes", "slowdown",
                                     "time_scale", "compute_s", "cpu_s", "padding_s", "flops_per_step")}
        kept_phases = r["phases"][warmup_steps:] if steps > warmup_steps else r["phases"]
        row["phases_s"] = {k: statistics.median(ph[k] for ph in kept_phases) for k in kept_phases[0] if k != "host"}
        if r.get("weights") is not None:
            row["weights"] = r["weights"]
        ranks.append(row)
    return measured, collectives, ranks
