"""``hpp run`` as a library call: refuse bad input, launch the ranks, measure, compare with the cost model.

Preconditions checked before any process starts (each an :class:`HppInputError`,
one line, exit 2 in the CLI): the plan validates against its cluster (and profile
when it names one); the runtime model (``--model`` NAME or MODULE:FUNCTION, default
the plan's) loads, follows the protocol, has the plan's and the profile's layer
count and name, and its heads and MLP width split by every stage's TP degree; the
layout is one the runtime executes (:func:`hpp.runtime.layout.rank_roles`); the
training configuration is valid; ``--data`` exists and fills at least one global
batch; the host can run that many ranks (CUDA: one per visible GPU; CPU: at most
:data:`MAX_RANKS_PER_CORE` per core) and, when a world size is imposed, it equals
the plan's device count.

While the ranks run, :class:`hpp.runtime.metrics.StepMonitor` prints one line per
step (loss, samples/s, tokens/s, MFU, peak memory) and writes ``--metrics-jsonl``.
``verify`` runs in float64 and compares every rank's parameters after the last
step with single-device training on the same global batches
(:func:`hpp.runtime.reference.train_single_device`).

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

Several hosts (``nnodes > 1``): every host runs ``hpp run`` with its ``node_rank`` and the
same ``rdzv_endpoint``; each checks its devices and starts its own ranks
(:func:`hpp.runtime.run_setup.host_share`), and reports (and verifies) those ranks.
Checkpoints: ``save`` writes ``SAVE/step-K`` (:mod:`hpp.runtime.checkpoint`) every
``save_every`` steps and after the last; ``resume`` continues from a complete checkpoint
under this plan (any plan of the same model), the steps numbered on from the saved one;
with ``verify`` the reference trains the saved steps plus this run's. A failed or
interrupted run leaves only complete checkpoints
(:func:`hpp.runtime.run_setup.clean_partial_checkpoints`).
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.plan import Plan, plan_to_dict
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.runtime.data import data_spec, make_batch_source
from hpp.runtime.launch import LaunchResult, launch_forked, launch_torchrun
from hpp.runtime.layout import blocks, rank_roles
from hpp.runtime.metrics import StepMetrics, StepMonitor, plan_peak_flops_per_s
from hpp.runtime.model_api import RuntimeModel
from hpp.runtime.reference import VerifyResult, train_single_device, verify_against
from hpp.runtime.run_setup import (MAX_RANKS_PER_CORE, check_host_capacity, check_resume,
                                   clean_partial_checkpoints, host_share, load_run_inputs, model_source, open_metrics,
                                   prepare_save_dir, resolve_run_model, resume_notes, training_config)
from hpp.runtime.worker import WorkerConfig

__all__ = ["RunReport", "RunFailedError", "run_plan", "load_run_inputs", "model_source", "resolve_run_model",
           "check_host_capacity", "default_time_scale", "MAX_RANKS_PER_CORE"]

logger = logging.getLogger(__name__)

class RunFailedError(RuntimeError):
    """A launched run did not complete; the message names the failed rank(s)."""


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
        last step, from the stages' events).
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
    dtype, training, data
        The run's dtype, :class:`hpp.runtime.training.TrainingConfig` fields and ``--data`` file.
    verify : dict or None
        With ``--verify``: :meth:`hpp.runtime.reference.VerifyResult.to_dict`.
    hosts : dict
        ``nnodes``, ``node_rank``, ``ranks`` (the plan ranks this host ran) and ``nodes`` (plan nodes).
    checkpoint : dict
        ``resumed_from`` (path) and ``first_step``; ``latest`` (the latest complete checkpoint under ``--save``).
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_time_scale(cluster: Cluster, *, cpu_count: int | None = None) -> float:
    """``max(1, devices of the cluster / cores of this host)``: the emulation's time dilation."""
    return max(1.0, cluster.num_devices / float(cpu_count or os.cpu_count() or 1))


def _predict(plan: Plan, cluster: Cluster, profile: ModelProfile | None, *, time_scale: float = 1.0,
             device: str = "cpu", emulate_speed: bool = False) -> dict[str, Any]:
    """The cost model's prediction of this run; on CPU, the host model's (``hpp.runtime.host_model``).

    A CPU run shares this host's cores among its ranks (and pads emulated devices): the host
    model replays the step with processor sharing, and its iteration time is what the run should
    measure (``cost_model_iteration_time_s`` keeps the closed form, ``plan_iteration_time_s`` the
    plan's own estimate).
    """
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
    t_iter, extra = est.iteration_time_s, {}
    if device == "cpu":
        from hpp.runtime.host_model import host_terms, simulate_host_run
        cores = os.cpu_count() or 1
        host = simulate_host_run(plan, cluster, profile, cores=cores, emulate_speed=emulate_speed,
                                 time_scale=time_scale)
        t_iter = host.iteration_time_s
        extra = {"cost_model_iteration_time_s": est.iteration_time_s,
                 "host_model": {"cores": cores, "cpu_s": list(host.cpu_s),
                                "contention": list(host_terms(profile, cores=cores).contention)}}
    return {"iteration_time_s": t_iter, "throughput_samples_per_s": plan.global_batch_size / t_iter,
            **extra, "time_scale": time_scale, "plan_iteration_time_s": plan_est.iteration_time_s,
            "pipeline_time_s": est.pipeline_time_s, "grad_sync_s": est.grad_sync_s, "optimizer_s": est.optimizer_s,
            "peak_memory_bytes": est.peak_memory_bytes,
            "pipelines": [{"time_s": p.time_s, "stages": [{"forward_s": s.forward_s, "backward_s": s.backward_s,
                                                          "p2p_s": s.p2p_s}
                                                         for s in p.stages]} for p in est.pipelines]}


def _summarise(res: LaunchResult, plan: Plan, *, warmup_steps: int, seq_len: int, steps_seen: list[StepMetrics],
               peak_flops: float | None) -> tuple[dict, dict, list]:
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
                "step_times_s": per_step, "pipelines": pipes}
    last = [r["collectives"][-1] for r in results]
    collectives = {"count": sum(c["count"] for c in last), "bytes": sum(c["bytes"] for c in last),
                   "launched_in_backward_by_rank": [c.get("launched_in_backward", 0) for c in last],
                   "per": "step", "num_blocks": len(blocks(plan))}
    ranks = []
    for r in results:
        row = {k: r.get(k) for k in ("rank", "pipeline", "stage", "device_id", "device_type", "layers", "recompute",
                                     "tp_degree", "tp_rank", "num_micro_batches", "peak_memory_bytes",
                                     "peak_memory_reserved_bytes", "slowdown",
                                     "time_scale", "compute_s", "cpu_s", "padding_s", "flops_per_step")}
        kept_phases = r["phases"][warmup_steps:] if steps > warmup_steps else r["phases"]
        row["phases_s"] = {k: statistics.median(ph[k] for ph in kept_phases) for k in kept_phases[0]}
        ranks.append(row)
    return measured, collectives, ranks


def _device_types(plan: Plan) -> list[str]:
    """One entry per device of the plan (a TP stage counts each of its devices)."""
    return [st.device_type for pipe in plan.pipelines for st in pipe.stages for _d in st.device_ids]


def run_plan(plan_path: str | Path, *, steps: int, model: str | None = None, verify: bool = False,
             emulate_speed: bool = False, naive_allreduce: bool = False, timeline: str | Path | None = None,
             launcher: str = "torchrun", device: str = "cpu", warmup_steps: int = 1, world_size: int | None = None,
             seed: int | None = None, dtype: str | None = None, optimizer: str | None = None,
             lr: float | None = None, lr_schedule: str | None = None, lr_warmup_steps: int | None = None,
             clip_grad_norm: float | None = None,
             weight_decay: float | None = None, data: str | Path | None = None,
             metrics_jsonl: str | Path | None = None, progress: bool = False, group_timeout_s: float = 120.0,
             run_timeout_s: float = 1800.0, out_dir: str | Path | None = None, time_scale: float | None = None,
             num_threads: int = 1, worker_options: Mapping[str, Any] | None = None, nnodes: int = 1,
             node_rank: int = 0, rdzv_endpoint: str | None = None, node_map: str | Sequence[int] | None = None,
             emulate_node_type: str | None = None, save: str | Path | None = None, save_every: int = 0,
             resume: str | Path | None = None, lr_total_steps: int | None = None,
             log_dir: str | Path | None = None, dry_run: str | Path | None = None) -> RunReport:
    """Execute the plan in ``plan_path`` for ``steps`` optimizer steps and report measured vs predicted.

    Parameters
    ----------
    model : str, optional
        A runtime model name or ``MODULE:FUNCTION`` (default: the plan's model).
    verify : bool
        Run in float64, save every rank's parameters and compare them with single-device
        training (:mod:`hpp.runtime.reference`); the report's ``verify`` holds the result.
    dtype : str, optional
        ``float32`` (default; on ``resume`` the checkpoint's), ``float64`` or ``bfloat16`` (autocast,
        fp32 master weights).
    optimizer, lr, lr_schedule, lr_warmup_steps, clip_grad_norm, weight_decay
        The training configuration (:class:`hpp.runtime.training.TrainingConfig`); each one not
        given (None) is the checkpoint's on ``resume``, else the default (:func:`training_config`).
    data : path, optional
        ``--data FILE`` (:mod:`hpp.runtime.data`); default synthetic tokens (on ``resume`` the checkpoint's).
    metrics_jsonl : path, optional
        One JSON line per step (:class:`hpp.runtime.metrics.StepMetrics`).
    progress : bool
        One line per step on stderr, with a progress bar on a terminal.
    time_scale : float, optional
        Emulation only (default :func:`default_time_scale`): dilates every emulated device.
    num_threads : int
        Each rank's torch compute threads.
    worker_options : Mapping, optional
        Extra :class:`hpp.runtime.worker.WorkerConfig` fields (experiments and tests, e.g.
        ``{"skip_block_allreduce": True}``, the control that must fail ``verify``).
    nnodes, node_rank, rdzv_endpoint, node_map, emulate_node_type
        Several hosts (see :func:`hpp.runtime.run_setup.host_share`): this host starts its share.
    save, save_every : checkpoint directory and interval in steps (0: only after the last step).
    resume : a ``save`` directory (its latest complete checkpoint) or one ``step-K`` folder.
    lr_total_steps : int, optional
        Steps of the LR schedule (default ``steps``; on ``resume`` the checkpoint's).
    seed : int, optional
        Initialisation and data seed (default 0; on ``resume`` the checkpoint's).
    log_dir : path, optional
        Keep torchrun's and each rank's output there (default: none kept).
    dry_run : path, optional
        Check everything, write ``dry_run/worker_config.json`` and return this host's torchrun
        command (:attr:`RunReport.command`) without starting anything (for a launcher of your own).

    Raises
    ------
    HppInputError
        Refused before any process starts (see the module docstring).
    RunFailedError
        A rank failed or the run timed out; the message names the rank or the timeout.
    """
    if steps < 1:
        raise HppInputError(f"--steps {steps}", field="steps", fix="run at least 1 step")
    if save_every < 0:
        raise HppInputError(f"--save-every {save_every}", field="save_every", fix="give K >= 1 (or 0: only at the end)")
    if save_every and save is None:
        raise HppInputError("--save-every without --save", field="save_every", fix="give --save DIR too")
    plan, cluster, profile = load_run_inputs(plan_path)
    rt = resolve_run_model(plan, profile, model, source=str(plan_path))
    spec = rt.spec
    model_name = model_source(plan, profile, model)             # what every rank loads
    rank_roles(plan)                                  # layouts the runtime cannot execute are refused here
    if world_size is not None and world_size != plan.num_devices:
        raise HppInputError(f"the plan has {plan.num_devices} devices but the world size is {world_size}",
                            source=str(plan_path), field="pipelines", fix=f"launch {plan.num_devices} ranks")
    share = host_share(plan, cluster, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                       node_map=node_map, emulate_node_type=emulate_node_type, device=device, launcher=launcher)
    check_host_capacity(len(share.ranks), device=device, per_core=MAX_RANKS_PER_CORE)
    notes: list[str] = []
    meta = check_resume(resume, model_name=spec.name, num_layers=spec.num_layers, optimizer=optimizer) \
        if resume is not None else None
    start = int(meta["step"]) if meta is not None else 0
    saved_extra = meta.get("extra", {}) if meta is not None else {}
    saved_training = saved_extra.get("training") or None
    if seed is None:
        seed = int(saved_extra.get("seed", 0))
    elif "seed" in saved_extra and saved_extra["seed"] != seed:
        notes.append(f"--seed {seed} but the checkpoint was trained with seed {saved_extra['seed']}: "
                     "the data order changes")
    if data is None and (saved_extra.get("data") or {}).get("path"):
        data = saved_extra["data"]["path"]               # the resumed run reads on in the checkpoint's data
    save_dir = prepare_save_dir(save) if save is not None else None
    run_dtype = dtype or (saved_training or {}).get("dtype") or "float32"
    if verify and run_dtype != "float64":
        if dtype is not None:
            notes.append(f"--verify runs in float64 (--dtype {dtype} ignored)")
        run_dtype = "float64"
    training = training_config(optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, lr_warmup_steps=lr_warmup_steps,
                               clip_grad_norm=clip_grad_norm, weight_decay=weight_decay, dtype=run_dtype, steps=steps,
                               lr_total_steps=lr_total_steps, saved=saved_training)
    if meta is not None:
        notes += resume_notes(meta, asdict(training), plan)
        if progress:
            sys.stderr.write(f"resuming step {meta['step']} from {meta['path']}\n")
    data_desc = data_spec(data) if data is not None else None
    source = make_batch_source(data_desc, rt, seed=seed, global_batch_size=plan.global_batch_size)
    if source.wraps(start + steps):
        notes.append(f"--data holds {source.num_windows} samples, fewer than {start + steps} steps x "
                     f"{plan.global_batch_size}: the order wraps around")
    jsonl = open_metrics(metrics_jsonl)
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
    if plan.sequence_length not in (1, spec.seq_len):
        notes.append(f"the plan says sequence length {plan.sequence_length}; the runtime's {spec.name} uses "
                     f"{spec.seq_len}")
    if warmup_steps >= steps:
        notes.append(f"{steps} step(s) <= warm-up {warmup_steps}: the median includes warm-up steps")
    if not share.whole:
        notes.append(f"host {share.node_rank} of {share.nnodes} (plan node {share.nodes[0]}) runs ranks "
                     f"{list(share.ranks)}: times, loss, memory{' and verify' if verify else ''} cover these ranks")
    hosts = {} if share.whole and share.rdzv_endpoint is None else \
        {"nnodes": share.nnodes, "node_rank": share.node_rank, "node_map": share.node_map,
         "rdzv_endpoint": share.rdzv_endpoint, "emulate_node_type": emulate_node_type}
    checkpoint = {} if save_dir is None and resume is None else \
        {"save_dir": str(save_dir) if save_dir is not None else None, "save_every": save_every,
         "resume": str(resume) if resume is not None else None}
    plan_dict = plan_to_dict(plan)
    if "nodes" not in plan.cluster_ref:               # the ranks bind devices with the plan's cluster
        from hpp.profiles.cluster import cluster_to_dict
        plan_dict["cluster"] = cluster_to_dict(cluster)
    cfg = WorkerConfig(plan=plan_dict, model={}, model_name=model_name,
                       training=asdict(training), data=data_desc, steps=steps, warmup_steps=warmup_steps, seed=seed,
                       dtype=run_dtype, optimizer=training.optimizer, lr=training.lr, naive_allreduce=naive_allreduce,
                       slowdown=slowdown, time_scale=scale, device=device, timeout_s=group_timeout_s,
                       num_threads=num_threads, save_params=verify,
                       **_worker_fields(share, save_dir=save_dir, save_every=save_every,
                                        resume=meta["path"] if meta is not None else None,
                                        emulate_node_type=emulate_node_type),
                       **dict(worker_options or {}))
    peak = plan_peak_flops_per_s([_device_types(plan)[r] for r in share.ranks], run_dtype)
    if dry_run is not None:
        return _dry_run(Path(dry_run), cfg, share, plan_path=plan_path, spec=spec, steps=steps,
                        warmup_steps=warmup_steps, world_size=plan.num_devices, emulate_speed=emulate_speed,
                        notes=notes, dtype=run_dtype, training=asdict(training), data=data_desc)
    verified = None
    logs = Path(log_dir) if log_dir is not None else None
    with tempfile.TemporaryDirectory(prefix="hpp-run-", dir=out_dir) as tmp:
        monitor = StepMonitor(Path(tmp), ranks=share.ranks, first_step=start, steps=steps,
                                   global_batch_size=plan.global_batch_size, seq_len=spec.seq_len,
                                   peak_flops_per_s=peak, jsonl=jsonl, quiet=not progress)
        res = None
        try:
            with monitor:
                if launcher == "torchrun":
                    res = launch_torchrun(cfg, world_size=plan.num_devices, out_dir=Path(tmp), timeout_s=run_timeout_s,
                                          poll=monitor.poll, nnodes=share.nnodes, node_rank=share.node_rank,
                                          rdzv_endpoint=share.rdzv_endpoint, local_ranks=share.ranks, log_dir=logs)
                else:
                    res = launch_forked(cfg, world_size=plan.num_devices, out_dir=Path(tmp), timeout_s=run_timeout_s,
                                        poll=monitor.poll, log_dir=logs)
        finally:
            if save_dir is not None and 0 in share.ranks and (res is None or not res.ok):
                removed = clean_partial_checkpoints(save_dir)
                if removed:
                    logger.warning("removed unfinished checkpoint(s) %s from %s", ", ".join(removed), save_dir)
        if not res.ok:
            raise RunFailedError(res.failure_message())
        if verify:
            verified = _verify(rt, Path(tmp), share.ranks, source=source, steps=start + steps, seed=seed,
                               training=training, whole=share.whole)
    measured, collectives, ranks = _summarise(res, plan, warmup_steps=warmup_steps, seq_len=spec.seq_len,
                                              steps_seen=monitor.metrics, peak_flops=peak)
    collectives["mode"] = "per-layer" if naive_allreduce else "block-bucketed"
    predicted = _predict(plan, cluster, profile, time_scale=scale, device=device, emulate_speed=emulate_speed)
    timeline_path = None
    if timeline is not None:
        from hpp.runtime.timeline import write_timeline_png
        write_timeline_png(Path(timeline), plan=plan, results=list(res.results), predicted=predicted)
        timeline_path = str(timeline)
    if checkpoint:
        from hpp.runtime.checkpoint import latest_checkpoint
        checkpoint.update(first_step=start, resumed_from=meta["path"] if meta is not None else None,
                          latest=str(latest_checkpoint(save_dir) or "") if save_dir is not None else None)
    return RunReport(plan=str(plan_path), model=spec.name, steps=steps, warmup_steps=warmup_steps,
                     world_size=plan.num_devices, launcher=launcher, emulate_speed=emulate_speed, measured=measured,
                     predicted=predicted, collectives=collectives, ranks=ranks, wall_s=res.wall_s,
                     timeline=timeline_path, notes=notes, dtype=run_dtype, training=asdict(training),
                     data=data_desc, verify=verified.to_dict() if verified is not None else None,
                     hosts={**hosts, "ranks": list(share.ranks), "nodes": list(share.nodes)} if hosts else {},
                     checkpoint=checkpoint)


def _dry_run(out: Path, cfg: WorkerConfig, share: Any, *, plan_path: str | Path, spec: Any, **report: Any
             ) -> RunReport:
    """Write ``out/worker_config.json``; the report carries this host's torchrun command."""
    from hpp.runtime.launch import torchrun_command
    from hpp.runtime.worker import config_to_json, write_atomic
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "worker_config.json", config_to_json(cfg))
    cmd = torchrun_command(out / "worker_config.json", out, nproc=len(share.ranks), nnodes=share.nnodes,
                           node_rank=share.node_rank, rdzv_endpoint=share.rdzv_endpoint)
    return RunReport(plan=str(plan_path), model=spec.name, launcher="dry-run", measured={}, predicted={},
                     collectives={}, ranks=[], wall_s=0.0, command=cmd, **report)


def _worker_fields(share: Any, *, save_dir: Path | None, save_every: int, resume: str | None,
                   emulate_node_type: str | None) -> dict[str, Any]:
    """The :class:`WorkerConfig` fields of hosts and checkpoints that differ from their defaults."""
    out: dict[str, Any] = {}
    if not share.whole:
        out.update(nnodes=share.nnodes, node_map=list(share.node_map) if share.node_map else None)
    if emulate_node_type:
        out["emulate_node_type"] = emulate_node_type
    if save_dir is not None:
        out.update(save_dir=str(save_dir.resolve()), save_every=save_every)
    if resume is not None:
        out["resume"] = str(Path(resume).resolve())
    return out


def _verify(rt: RuntimeModel, out_dir: Path, ranks: Sequence[int], *, source: Any, steps: int, seed: int,
            training: Any, whole: bool = True) -> VerifyResult:
    """The ranks' saved parameters against single-device float64 training of ``steps`` steps
    (:mod:`hpp.runtime.reference`); ``whole`` False (one host of several): only the names these ranks hold."""
    import torch
    rank_params = [torch.load(out_dir / f"rank{r}.pt", map_location="cpu", weights_only=True) for r in ranks]
    ref = train_single_device(rt, source=source, steps=steps, seed=seed, training=training, dtype=torch.float64)
    if not whole:
        held = {name for params in rank_params for name in params}
        ref = {k: v for k, v in ref.items() if k in held}
    return verify_against(rank_params, ref)
