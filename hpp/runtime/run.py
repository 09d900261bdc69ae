"""``hpp run`` as a library call: refuse bad input, launch the ranks, measure, compare with the cost model.

Preconditions checked before any process starts (each an :class:`HppInputError`):
the plan validates against its cluster (and profile when it names one), every
stage has TP degree 1 and recompute ``"none"`` or ``"full"``, the model has the plan's layer count, the host can run
that many ranks (CUDA: one per visible GPU; CPU: at most
:data:`MAX_RANKS_PER_CORE` per core) and, when a world size is imposed, it equals
the plan's device count.

Measured iteration time of a step = the slowest rank's time from the common
barrier at the step start to the end of its optimizer step; the report gives the
median over the steps after ``warmup_steps``.

Emulated speeds (``emulate_speed``) run at a time scale ``D >= 1`` (see
:mod:`hpp.runtime.emulation`): by default ``D = max(1, devices of the cluster /
cores of this host)``, so that the ranks never need more cores than there are and
every plan on one cluster runs at the same ``D`` (ratios between plans stay
comparable). ``predicted.iteration_time_s`` is then the cost model with every
forward/backward time x ``D`` (what this run should measure);
``predicted.plan_iteration_time_s`` is the plan's own prediction (``D = 1``).
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpp.errors import HppInputError
from hpp.plan import Plan, plan_from_dict, plan_to_dict, read_plan_json
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.runtime.launch import LaunchResult, launch_forked, launch_torchrun
from hpp.runtime.layout import blocks, rank_roles
from hpp.runtime.models import ModelConfig, get_model_config
from hpp.runtime.worker import WorkerConfig

__all__ = ["RunReport", "RunFailedError", "run_plan", "load_run_inputs", "check_host_capacity", "default_time_scale",
           "MAX_RANKS_PER_CORE"]

logger = logging.getLogger(__name__)

#: CPU ranks allowed per core (each rank is one process with one compute thread).
MAX_RANKS_PER_CORE = 8


class RunFailedError(RuntimeError):
    """A launched run did not complete; the message names the failed rank(s)."""


@dataclass(frozen=True)
class RunReport:
    """What ``hpp run --json`` prints (see :meth:`to_dict`).

    Attributes
    ----------
    measured : dict
        ``iteration_time_s`` (median after warm-up), ``throughput_samples_per_s``,
        ``throughput_tokens_per_s``, ``step_times_s`` (all steps), ``pipelines``
        (per pipeline: ``schedule_s`` of the last step, from the stages' events).
    predicted : dict
        ``iteration_time_s`` and ``throughput_samples_per_s`` from
        :func:`hpp.formulation.cost_model.estimate_plan` at this run's ``time_scale``,
        ``plan_iteration_time_s`` at time scale 1, ``pipelines`` (per stage forward/backward
        seconds), or ``None`` with ``reason``.
    collectives : dict
        ``count`` and ``bytes`` of gradient all-reduces per step (each counted once), ``mode``.
    ranks : list[dict]
        Per rank: pipeline, stage, device type, layers, ``peak_memory_bytes``, compute and padding seconds
        (last step) and ``phases_s`` (median over the kept steps of each step phase, see
        :func:`hpp.runtime.worker.run_worker`).
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_run_inputs(path: str | Path) -> tuple[Plan, Cluster, ModelProfile | None]:
    """Read and validate a plan; a plan without a profile is allowed (no prediction then).

    Raises
    ------
    HppInputError
    """
    from hpp.resolve import load_plan_inputs, resolve_cluster
    from hpp.validate import validate_plan
    path = Path(path)
    data = read_plan_json(path)
    if isinstance(data, dict) and data.get("profile"):
        return load_plan_inputs(path)
    plan = plan_from_dict(data, source=str(path))
    cluster = resolve_cluster(plan.cluster_ref, base=path.parent, source=str(path))
    validate_plan(plan, cluster, None, source=str(path))
    return plan, cluster, None


def check_host_capacity(world_size: int, *, device: str, cpu_count: int | None = None) -> None:
    """Refuse a run that needs more ranks than this host can hold.

    Raises
    ------
    HppInputError
    """
    if device == "cuda":
        import torch
        n = torch.cuda.device_count()
        if world_size > n:
            raise HppInputError(f"the plan needs {world_size} devices but this host has {n} CUDA device(s)",
                                field="pipelines", fix="run on a host with enough GPUs or plan for fewer devices")
        return
    cores = cpu_count or os.cpu_count() or 1
    limit = MAX_RANKS_PER_CORE * cores
    if world_size > limit:
        raise HppInputError(f"the plan needs {world_size} devices but this host can run at most {limit} CPU ranks "
                            f"({MAX_RANKS_PER_CORE} per core x {cores} cores)", field="pipelines",
                            fix="plan for fewer devices or run on a larger host")


def _model_for(plan: Plan, model: str | None) -> ModelConfig:
    name = model or plan.model
    try:
        cfg = get_model_config(name)
    except HppInputError as exc:
        raise HppInputError(f"the runtime has no model {name!r}", field="model",
                            fix=f"pass --model with one of the runtime's models ({exc.fix.split('of ')[-1]})") from None
    if cfg.num_layers != plan.num_layers:
        raise HppInputError(f"model {cfg.name} has {cfg.num_layers} layers but the plan has {plan.num_layers}",
                            field="num_layers", fix="pass --model with a model of the plan's layer count")
    return cfg


def default_time_scale(cluster: Cluster, *, cpu_count: int | None = None) -> float:
    """``max(1, devices of the cluster / cores of this host)``: the emulation's time dilation."""
    return max(1.0, cluster.num_devices / float(cpu_count or os.cpu_count() or 1))


def _predict(plan: Plan, cluster: Cluster, profile: ModelProfile | None, *, time_scale: float = 1.0
             ) -> dict[str, Any]:
    if profile is None:
        return {"iteration_time_s": None, "throughput_samples_per_s": None,
                "reason": "the plan names no profile"}
    try:
        from hpp.formulation.cost_model import estimate_plan
        from hpp.runtime.profiler import dilate_profile
        est = estimate_plan(plan, cluster, dilate_profile(profile, time_scale))
        plan_est = est if time_scale == 1.0 else estimate_plan(plan, cluster, profile)
    except (HppInputError, ImportError) as exc:
        return {"iteration_time_s": None, "throughput_samples_per_s": None, "reason": str(exc)}
    return {"iteration_time_s": est.iteration_time_s, "throughput_samples_per_s": est.throughput_samples_per_s,
            "time_scale": time_scale, "plan_iteration_time_s": plan_est.iteration_time_s,
            "pipeline_time_s": est.pipeline_time_s, "grad_sync_s": est.grad_sync_s, "optimizer_s": est.optimizer_s,
            "peak_memory_bytes": est.peak_memory_bytes,
            "pipelines": [{"time_s": p.time_s, "stages": [{"forward_s": s.forward_s, "backward_s": s.backward_s,
                                                          "p2p_s": s.p2p_s}
                                                         for s in p.stages]} for p in est.pipelines]}


def _summarise(res: LaunchResult, plan: Plan, *, warmup_steps: int, seq_len: int) -> tuple[dict, dict, list]:
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
    measured = {"iteration_time_s": median, "throughput_samples_per_s": plan.global_batch_size / median,
                "throughput_tokens_per_s": plan.global_batch_size * seq_len / median,
                "step_times_s": per_step, "pipelines": pipes}
    last = [r["collectives"][-1] for r in results]
    collectives = {"count": sum(c["count"] for c in last), "bytes": sum(c["bytes"] for c in last),
                   "launched_in_backward_by_rank": [c.get("launched_in_backward", 0) for c in last],
                   "per": "step", "num_blocks": len(blocks(plan))}
    ranks = []
    for r in results:
        row = {k: r.get(k) for k in ("rank", "pipeline", "stage", "device_id", "device_type", "layers", "recompute",
                                     "num_micro_batches", "peak_memory_bytes", "slowdown", "time_scale",
                                     "compute_s", "cpu_s", "padding_s")}
        kept_phases = r["phases"][warmup_steps:] if steps > warmup_steps else r["phases"]
        row["phases_s"] = {k: statistics.median(ph[k] for ph in kept_phases) for k in kept_phases[0]}
        ranks.append(row)
    return measured, collectives, ranks


def run_plan(plan_path: str | Path, *, steps: int, model: str | None = None, emulate_speed: bool = False,
             naive_allreduce: bool = False, timeline: str | Path | None = None, launcher: str = "torchrun",
             device: str = "cpu", warmup_steps: int = 1, world_size: int | None = None, seed: int = 0,
             dtype: str = "float32", optimizer: str = "sgd", lr: float = 1e-3, group_timeout_s: float = 120.0,
             run_timeout_s: float = 1800.0, out_dir: str | Path | None = None,
             time_scale: float | None = None, num_threads: int = 1) -> RunReport:
    """Execute the plan in ``plan_path`` for ``steps`` optimizer steps and report measured vs predicted.

    ``time_scale`` (emulation only; default :func:`default_time_scale`) dilates every
    emulated device; ``num_threads`` is each rank's torch compute threads.

    Raises
    ------
    HppInputError
        Refused before any process starts (see the module docstring).
    RunFailedError
        A rank failed; the message names it.
    """
    if steps < 1:
        raise HppInputError(f"--steps {steps}", field="steps", fix="run at least 1 step")
    plan, cluster, profile = load_run_inputs(plan_path)
    rank_roles(plan)                                            # TP > 1 and selective recompute refused here
    if world_size is not None and world_size != plan.num_devices:
        raise HppInputError(f"the plan has {plan.num_devices} devices but the world size is {world_size}",
                            source=str(plan_path), field="pipelines", fix=f"launch {plan.num_devices} ranks")
    check_host_capacity(plan.num_devices, device=device)
    mcfg = _model_for(plan, model)
    notes: list[str] = []
    slowdown = {name: dt.slowdown for name, dt in cluster.device_types.items()} if emulate_speed else {}
    if not emulate_speed and any(dt.slowdown != 1.0 for dt in cluster.device_types.values()):
        notes.append("the cluster has emulated slowdowns but --emulate-speed is off: all ranks run at full speed")
    if time_scale is not None and not time_scale >= 1.0:
        raise HppInputError(f"--time-scale {time_scale}", field="time_scale", fix="use a factor >= 1 (1 = no dilation)")
    scale = (default_time_scale(cluster) if time_scale is None else float(time_scale)) if emulate_speed else 1.0
    if scale > 1.0:
        notes.append(f"emulation at time scale {scale:g}: every device runs {scale:g}x slower than its type says, so "
                     f"that {cluster.num_devices} emulated devices fit {os.cpu_count()} cores; the prediction is "
                     "scaled alike (plan_iteration_time_s is the unscaled one)")
    if plan.sequence_length not in (1, mcfg.seq_len):
        notes.append(f"the plan says sequence length {plan.sequence_length}; the runtime's {mcfg.name} uses "
                     f"{mcfg.seq_len}")
    if warmup_steps >= steps:
        notes.append(f"{steps} step(s) <= warm-up {warmup_steps}: the median includes warm-up steps")
    cfg = WorkerConfig(plan=plan_to_dict(plan), model=asdict(mcfg), steps=steps, warmup_steps=warmup_steps, seed=seed,
                       dtype=dtype, optimizer=optimizer, lr=lr, naive_allreduce=naive_allreduce,
                       slowdown=slowdown, time_scale=scale, device=device, timeout_s=group_timeout_s,
                       num_threads=num_threads)
    with tempfile.TemporaryDirectory(prefix="hpp-run-", dir=out_dir) as tmp:
        launch = launch_torchrun if launcher == "torchrun" else launch_forked
        res = launch(cfg, world_size=plan.num_devices, out_dir=Path(tmp), timeout_s=run_timeout_s)
        if not res.ok:
            raise RunFailedError(res.failure_message())
    measured, collectives, ranks = _summarise(res, plan, warmup_steps=warmup_steps, seq_len=mcfg.seq_len)
    collectives["mode"] = "per-layer" if naive_allreduce else "block-bucketed"
    predicted = _predict(plan, cluster, profile, time_scale=scale)
    timeline_path = None
    if timeline is not None:
        from hpp.runtime.timeline import write_timeline_png
        write_timeline_png(Path(timeline), plan=plan, results=list(res.results), predicted=predicted)
        timeline_path = str(timeline)
    return RunReport(plan=str(plan_path), model=mcfg.name, steps=steps, warmup_steps=warmup_steps,
                     world_size=plan.num_devices, launcher=launcher, emulate_speed=emulate_speed, measured=measured,
                     predicted=predicted, collectives=collectives, ranks=ranks, wall_s=res.wall_s,
                     timeline=timeline_path, notes=notes)
