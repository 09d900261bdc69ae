"""``hpp run`` as a library call: refuse bad input, launch the ranks, measure, compare with the cost model.

Preconditions checked before any process starts (each an :class:`HppInputError`,
one line, exit 2 in the CLI): the plan validates against its cluster (and profile
when it names one); the runtime model (``--model`` NAME or MODULE:FUNCTION, default
the plan's) loads, follows the protocol, has the plan's and the profile's layer
count and name, and its heads and MLP width split by every stage's TP degree; the
layout is one the runtime executes (:func:`hpp.runtime.exec.layout.rank_roles`); the
training configuration is valid; ``--data`` exists and fills at least one global
batch; the host can run that many ranks (CUDA: one per visible GPU; CPU: at most
:data:`MAX_RANKS_PER_CORE` per core) and, when a world size is imposed, it equals
the plan's device count.

While the ranks run, :class:`hpp.runtime.metrics.StepMonitor` prints one line per
step (loss, samples/s, tokens/s, MFU, peak memory) and writes ``--metrics-jsonl``.
``verify`` runs in float64 and compares every step with one single-device step from the
run's own state before it (:mod:`hpp.runtime.exec.verify_steps`: float64 training is chaotic over
hundreds of steps, each step is not), and reports beside it the free-running difference
of the final parameters from single-device training on the same global batches
(:func:`hpp.runtime.exec.reference.train_single_device`).

Measured iteration time of a step = the slowest rank's time from the common
barrier at the step start to the end of its optimizer step; the report gives the
median over the steps after ``warmup_steps``.

Emulated speeds (``emulate_speed``) run at a time scale ``D >= 1`` (see
:mod:`hpp.runtime.host.emulation`): by default ``D = max(1, devices of the cluster /
cores of this host)``, so that the ranks never need more cores than there are and
every plan on one cluster runs at the same ``D`` (ratios between plans stay
comparable). ``predicted.iteration_time_s`` is then the cost model with every
forward/backward time x ``D`` (what this run should measure);
``predicted.plan_iteration_time_s`` is the plan's own prediction (``D = 1``).

Several hosts (``nnodes > 1``): every host runs ``hpp run`` with its ``node_rank`` and the
same ``rdzv_endpoint``; each checks its devices and starts its own ranks
(:func:`hpp.runtime.run_setup.host_share`), and reports (and verifies) those ranks.
Checkpoints: ``save`` writes ``SAVE/step-K`` (:mod:`hpp.runtime.checkpoint.dcp`) every
``save_every`` steps and after the last; ``resume`` continues from a complete checkpoint
under this plan (any plan of the same model), the steps numbered on from the saved one;
with ``verify`` the reference trains the saved steps plus this run's. A failed or
interrupted run leaves only complete checkpoints
(:func:`hpp.runtime.run_setup.clean_partial_checkpoints`).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from hpp.errors import HppInputError
from hpp.fileio import write_atomic
from hpp.plan import Plan, plan_to_dict
from hpp.profiles.cluster import Cluster
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.runtime.checkpoint.store import complete_checkpoints
from hpp.runtime.exec.data import data_spec, make_batch_source
from hpp.runtime.launch.launchers import launch_forked, launch_torchrun, torchrun_command
from hpp.runtime.profile.host_speed import HostSpeed, bracket, calibrate_host_speed
from hpp.runtime.exec.layout import rank_roles
from hpp.runtime.metrics import StepMonitor, peak_flops_per_s, plan_peak_flops_per_s
from hpp.runtime.launch.processes import remove_stale_run_dirs, run_dir_prefix
from hpp.runtime.exec.reference import verify_run
from hpp.runtime.run_report import RunReport, predict_run, speed_moved_note, summarise_run
from hpp.runtime.run_failure import failure_line
from hpp.runtime.run_setup import (MAX_RANKS_PER_CORE, check_host_capacity, check_resume,
                                   clean_partial_checkpoints, host_share, load_run_inputs, model_source, open_metrics,
                                   prepare_save_dir, resolve_run_model, resume_notes, training_config)
from hpp.runtime.run_checks import check_device_memory, check_host_memory, check_png_path
from hpp.runtime.timeline import write_timeline_png
from hpp.runtime.exec.host_agreement import hosts_disagree_error
from hpp.runtime.exec.worker import WorkerConfig, config_to_json
from hpp.wording import count, noun

__all__ = ["RunReport", "RunFailedError", "run_plan", "load_run_inputs", "model_source", "resolve_run_model",
           "check_host_capacity", "default_time_scale", "MAX_RANKS_PER_CORE"]

logger = logging.getLogger(__name__)


#: other processes' busy cores during the timed steps from which ``hpp run`` says the host was not quiet
BUSY_HOST_CORES = 0.25


class RunFailedError(RuntimeError):
    """A launched run did not complete; the message names the failed rank(s)."""


def default_time_scale(cluster: Cluster, *, cpu_count: int | None = None) -> float:
    """``max(1, devices of the cluster / cores of this host)``: the emulation's time dilation."""
    return max(1.0, cluster.num_devices / float(cpu_count or os.cpu_count() or 1))


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
             log_dir: str | Path | None = None, dry_run: str | Path | None = None,
             host_calibration: bool = True, allow_over_memory: bool = False) -> RunReport:
    """Execute the plan in ``plan_path`` for ``steps`` optimizer steps and report measured vs predicted.

    Parameters
    ----------
    model : str, optional
        A runtime model name or ``MODULE:FUNCTION`` (default: the plan's model).
    verify : bool
        Run in float64, save every rank's parameters and compare them with single-device
        training (:mod:`hpp.runtime.exec.reference`); the report's ``verify`` holds the result.
    dtype : str, optional
        ``float32`` (default; on ``resume`` the checkpoint's), ``float64`` or ``bfloat16`` (autocast,
        fp32 master weights).
    optimizer, lr, lr_schedule, lr_warmup_steps, clip_grad_norm, weight_decay
        The training configuration (:class:`hpp.runtime.exec.training.TrainingConfig`); each one not
        given (None) is the checkpoint's on ``resume``, else the default (:func:`training_config`).
    data : path, optional
        ``--data FILE`` (:mod:`hpp.runtime.exec.data`); default synthetic tokens (on ``resume`` the checkpoint's).
    metrics_jsonl : path, optional
        One JSON line per step (:class:`hpp.runtime.metrics.StepMetrics`; ``step``: the 1-based global step).
    progress : bool
        One line per step on stderr, with a progress bar on a terminal.
    time_scale : float, optional
        Emulation only (default :func:`default_time_scale`): dilates every emulated device.
    num_threads : int
        Each rank's torch compute threads.
    worker_options : Mapping, optional
        Extra :class:`hpp.runtime.exec.worker.WorkerConfig` fields (experiments and tests, e.g.
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
    host_calibration : bool
        CPU: predict at this host's speed (:func:`hpp.runtime.profile.host_speed.calibrate_host_speed`, a probe of
        under 2 s on this host before the run and one after it, :func:`~hpp.runtime.profile.host_speed.bracket`);
        False: the profile's times as measured.
    allow_over_memory : bool
        Run a plan that the cost model predicts not to fit its devices' memory (``--allow-over-memory``; the
        report's notes say so). Default: refused (:func:`hpp.runtime.run_checks.check_device_memory`).

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
    rank_roles(plan)                                  # layouts the runtime cannot execute are refused here
    if world_size is not None and world_size != plan.num_devices:
        raise HppInputError(f"the plan has {count(plan.num_devices, 'device')} but the world size is {world_size}",
                            source=str(plan_path), field="pipelines", fix=f"launch {plan.num_devices} ranks")
    share = host_share(plan, cluster, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                       node_map=node_map, emulate_node_type=emulate_node_type, device=device, launcher=launcher)
    check_host_capacity(len(share.ranks), device=device, per_core=MAX_RANKS_PER_CORE)
    over_memory = check_device_memory(plan, cluster, profile, source=str(plan_path), allow=allow_over_memory)
    check_host_memory(plan, cluster, profile, share.ranks, device=device)      # before building the model
    check_png_path(timeline)
    rt = resolve_run_model(plan, profile, model, source=str(plan_path))
    spec = rt.spec
    model_name = model_source(plan, profile, model)             # what every rank loads
    notes: list[str] = [over_memory] if over_memory else []
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
    save_dir = prepare_save_dir(save, meta["path"] if meta is not None else None) if save is not None else None
    run_dtype = dtype or (saved_training or {}).get("dtype") or "float32"
    if verify and meta is not None and (saved_training or {}).get("dtype", "float32") != "float64":
        raise HppInputError(f"--verify compares float64 training, but the checkpoint {meta['path']} was saved by a "
                            f"{(saved_training or {}).get('dtype', 'float32')} run", field="--verify",
                            fix="resume a checkpoint saved by a --verify (float64) run, or drop --verify")
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
        notes.append(f"{count(steps, 'step')} <= warm-up {warmup_steps}: the median includes warm-up steps")
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
        plan_dict["cluster"] = cluster_to_dict(cluster)
    cfg = WorkerConfig(plan=plan_dict, model={}, model_name=model_name,
                       training=asdict(training), data=data_desc, steps=steps, warmup_steps=warmup_steps, seed=seed,
                       dtype=run_dtype, optimizer=training.optimizer, lr=training.lr, naive_allreduce=naive_allreduce,
                       slowdown=slowdown, time_scale=scale, device=device, timeout_s=group_timeout_s,
                       num_threads=num_threads, save_params=verify, verify_steps=verify,
                       **_worker_fields(share, save_dir=save_dir, save_every=save_every,
                                        resume=meta["path"] if meta is not None else None,
                                        emulate_node_type=emulate_node_type),
                       **dict(worker_options or {}))
    mine = [_device_types(plan)[r] for r in share.ranks]
    gpus = sorted({t for t in mine if peak_flops_per_s(t, run_dtype) is not None})
    peak = plan_peak_flops_per_s(mine, run_dtype) if device != "cpu" else None     # MFU n/a on CPU
    if device == "cpu" and gpus:
        notes.append(f"this plan is for {', '.join(gpus)} GPUs and runs here on CPU: the measured times are this "
                     "CPU's, the predicted ones the profile's GPU times, so their ratio says nothing about the plan; "
                     "MFU is n/a")
    if dry_run is not None:
        return _dry_run(Path(dry_run), cfg, share, plan_path=plan_path, spec=spec, steps=steps,
                        warmup_steps=warmup_steps, world_size=plan.num_devices, emulate_speed=emulate_speed,
                        notes=notes, dtype=run_dtype, training=asdict(training), data=data_desc, device=device)
    verified = None
    speed_before = calibrate_host_speed(profile, device=device, model=rt) if host_calibration else None
    logs = Path(log_dir) if log_dir is not None else None
    remove_stale_run_dirs(out_dir)                    # those of launchers killed outright (kill -9)
    with tempfile.TemporaryDirectory(prefix=run_dir_prefix(), dir=out_dir) as tmp:
        monitor = StepMonitor(Path(tmp), ranks=share.ranks, first_step=start, steps=steps,
                                   global_batch_size=plan.global_batch_size, seq_len=spec.seq_len,
                                   peak_flops_per_s=peak, jsonl=jsonl, quiet=not progress)
        res = None
        try:
            with monitor:
                if progress and share.nnodes > 1:
                    sys.stderr.write(f"host {share.node_rank} of {share.nnodes}: waiting for the other hosts at "
                                     f"{share.rdzv_endpoint} (every host runs hpp run with its --node-rank; "
                                     f"the run stops after {run_timeout_s:g} s)\n")
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
                    logger.warning("removed %s %s from %s", noun(len(removed), "unfinished checkpoint"),
                                   ", ".join(removed), save_dir)
        if not res.ok:
            disagree = next((m for m in map(hosts_disagree_error, res.errors) if m), None)
            if disagree is not None:                  # bad input only the hosts together could see: exit 2
                raise HppInputError(disagree)
            raise RunFailedError(failure_line(res, share, plan, cluster, steps_seen=len(monitor.metrics),
                                              log_dir=log_dir))
        if verify:
            verified = verify_run(rt, Path(tmp), share.ranks, res.results, source=source, first_step=start,
                                  steps=steps, seed=seed, training=training, whole=share.whole, num_threads=num_threads)
    measured, collectives, ranks = summarise_run(res, plan, warmup_steps=warmup_steps, seq_len=spec.seq_len,
                                                 steps_seen=monitor.metrics, peak_flops=peak)
    collectives["mode"] = "per-layer" if naive_allreduce else "block-bucketed"
    speed = bracket(speed_before, calibrate_host_speed(profile, device=device, model=rt)) if speed_before else \
        HostSpeed.skipped("host calibration off (--no-host-calibration)")
    one_host = len(share.ranks) == plan.num_devices   # the host model (steal, the ranks' CPU speed) is a one-host model
    steal = measured["host_steal"]["fraction"] if one_host and measured.get("host_steal") else None
    predicted = predict_run(plan, cluster, profile, time_scale=scale, device=device, emulate_speed=emulate_speed,
                            host_speed=speed, steal=steal,
                            run_cpu_s=[r["phases_s"]["cpu_s"] for r in ranks] if one_host else None)
    bg = measured.get("background_cores") if one_host and device == "cpu" else None
    if bg is not None and bg >= BUSY_HOST_CORES:
        notes.append(f"other processes kept about {bg:.1f} of this host's {os.cpu_count()} cores busy during the timed "
                     "steps: the measured times are slower than on a quiet host, and the prediction assumes a quiet one")
    notes += [n for n in [speed_moved_note(predicted)] if n and not (device == "cpu" and gpus)]
    prof_dtype = (profile.meta.get("dtype") if profile is not None else None) or run_dtype
    if predicted and prof_dtype != run_dtype:
        notes.append(f"the run computes in {run_dtype}{' (--verify)' if verify else ''}, the prediction uses the "
                     f"profile's {prof_dtype} times")
    timeline_path = None
    if timeline is not None:
        write_timeline_png(Path(timeline), plan=plan, results=list(res.results), predicted=predicted)
        timeline_path = str(timeline)
    if checkpoint:
        checkpoint.update(first_step=start, resumed_from=meta["path"] if meta is not None else None,
                          latest=str(_written(save_dir, start + steps)) if save_dir is not None else None)
    return RunReport(plan=str(plan_path), model=spec.name, steps=steps, warmup_steps=warmup_steps,
                     world_size=plan.num_devices, launcher=launcher, emulate_speed=emulate_speed, measured=measured,
                     predicted=predicted, collectives=collectives, ranks=ranks, wall_s=res.wall_s,
                     timeline=timeline_path, notes=notes, dtype=run_dtype, training=asdict(training),
                     data=data_desc, verify=verified.to_dict() if verified is not None else None,
                     hosts={**hosts, "ranks": list(share.ranks), "nodes": list(share.nodes)} if hosts else {},
                     checkpoint=checkpoint, device=device)


def _written(save_dir: Path, last_step: int) -> Path | str:
    """The checkpoint this run wrote last (``save_dir/step-<last_step>``), else the latest complete one there."""
    done = complete_checkpoints(save_dir)
    return dict(done).get(last_step) or (done[-1][1] if done else "")


def _dry_run(out: Path, cfg: WorkerConfig, share: Any, *, plan_path: str | Path, spec: Any, **report: Any
             ) -> RunReport:
    """Write ``out/worker_config.json``; the report carries this host's torchrun command."""
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
