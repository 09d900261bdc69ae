"""``hpp run`` as a library call: refuse bad input, launch the ranks, measure, compare with the cost model.

:func:`run_plan` takes one :class:`hpp.runtime.config.RunConfig` (built by the CLI from its flags, or in Python
by :meth:`~hpp.runtime.config.RunConfig.build`); the option names below are its fields. It checks and resolves
(:func:`_prepare`), launches (:func:`_launch`) and reports (:func:`_report`).

Preconditions checked before any process starts (each an :class:`HppInputError`,
one line, exit 2 in the CLI): the plan validates against its cluster (and profile
when it names one); the runtime model (``--model`` NAME or MODULE:FUNCTION, default
the plan's) loads, follows the protocol, has the plan's and the profile's layer
count and name, and its heads and MLP width split by every stage's TP degree; the
layout is one the runtime executes (:func:`hpp.runtime.exec.layout.rank_roles`); the
training configuration is valid; ``--data`` exists and fills at least one global
batch; ``--weights`` is a complete Hugging Face folder of the run's model, not given
with ``--resume`` (:func:`hpp.runtime.run_setup.check_weights`); the host can run that many ranks (CUDA: one per visible GPU; CPU: at most
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
with ``verify`` the reference trains the saved steps plus this run's. ``weights`` starts the ranks (and
``verify``'s single-device reference) from a Hugging Face folder instead of the seed's draws
(:mod:`hpp.runtime.exec.weights`). A failed or
interrupted run leaves only complete checkpoints
(:func:`hpp.runtime.run_setup.clean_partial_checkpoints`).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpp.errors import HppInputError
from hpp.fileio import write_atomic
from hpp.plan_data import Plan, plan_to_dict
from hpp.profiles.cluster import Cluster
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.runtime.checkpoint.store import complete_checkpoints
from hpp.runtime.config import RunConfig, RunFacts
from hpp.runtime.exec.data import data_spec, make_batch_source
from hpp.runtime.launch.launchers import launch_forked, launch_torchrun, torchrun_command
from hpp.runtime.profile.host_speed import HostSpeed, bracket, calibrate_host_speed
from hpp.runtime.exec.layout import rank_roles
from hpp.runtime.metrics import StepMonitor, peak_flops_per_s, plan_peak_flops_per_s
from hpp.runtime.launch.processes import remove_stale_run_dirs, run_dir_prefix
from hpp.runtime.exec.reference import verify_run
from hpp.runtime.run_report import RunReport, predict_run, speed_moved_note, summarise_run
from hpp.runtime.run_failure import failure_line
from hpp.runtime.run_setup import (MAX_RANKS_PER_CORE, check_host_capacity, check_resume, check_weights,
                                   clean_partial_checkpoints, host_share, load_run_inputs, model_source, open_metrics,
                                   prepare_save_dir, resolve_run_model, resume_notes, training_config, weights_note)
from hpp.runtime.run_checks import check_device_memory, check_host_memory, check_png_path
from hpp.runtime.timeline import write_timeline_png
from hpp.runtime.exec.host_agreement import hosts_disagree_error
from hpp.runtime.exec.training import TrainingConfig
from hpp.runtime.launch.launchers import worker_config_json
from hpp.wording import count, noun

__all__ = ["RunFailedError", "run_plan", "default_time_scale", "BUSY_HOST_CORES"]

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


@dataclass(frozen=True)
class _Prepared:
    """What :func:`run_plan` resolved before starting anything: the inputs, this host's share, the facts every
    rank gets, and the notes so far."""

    plan: Plan
    cluster: Cluster
    profile: Any
    rt: Any
    share: Any
    facts: RunFacts
    training: TrainingConfig
    meta: dict | None
    save_dir: Path | None
    source: Any
    jsonl: Path | None
    peak: float | None
    gpus: list[str]
    notes: list[str]

    @property
    def start(self) -> int:
        return int(self.meta["step"]) if self.meta is not None else 0

    @property
    def dtype(self) -> str:
        return self.training.dtype


def run_plan(config: RunConfig) -> RunReport:
    """Execute the plan of ``config`` for ``config.training.steps`` optimizer steps and report measured vs predicted.

    ``config`` (:class:`hpp.runtime.config.RunConfig`, e.g. ``RunConfig.build("plan.json", steps=3)``) goes
    unchanged to the launchers and every rank, beside the :class:`~hpp.runtime.config.RunFacts` resolved here once.
    With ``config.launch.dry_run`` everything is checked, ``DIR/worker_config.json`` written and this host's
    torchrun command returned (:attr:`RunReport.command`) without starting anything.

    Raises
    ------
    HppInputError
        Refused before any process starts (see the module docstring).
    RunFailedError
        A rank failed or the run timed out; the message names the rank or the timeout.
    """
    prep = _prepare(config)
    if config.launch.dry_run is not None:
        return _dry_run(Path(config.launch.dry_run), config, prep)
    speed_before = calibrate_host_speed(prep.profile, device=config.launch.device, model=prep.rt) \
        if config.emulation.host_calibration else None
    remove_stale_run_dirs(config.launch.out_dir)      # those of launchers killed outright (kill -9)
    with tempfile.TemporaryDirectory(prefix=run_dir_prefix(), dir=config.launch.out_dir) as tmp:
        res, monitor = _launch(config, prep, Path(tmp))
        verified = verify_run(prep.rt, Path(tmp), prep.share.ranks, res.results, source=prep.source,
                              first_step=prep.start, steps=config.training.steps, seed=prep.facts.seed,
                              training=prep.training, whole=prep.share.whole,
                              num_threads=config.training.num_threads,
                              weights=prep.facts.weights) if config.verify.enabled else None
    return _report(config, prep, res, monitor, speed_before=speed_before, verified=verified)


def _prepare(config: RunConfig) -> _Prepared:
    """Every check before any process starts, and what the ranks get (:class:`RunFacts`)."""
    tr, em, la, ck = config.training, config.emulation, config.launch, config.checkpoint
    plan_path = config.parallelism.plan
    plan, cluster, profile = load_run_inputs(plan_path)
    rank_roles(plan)                                  # layouts the runtime cannot execute are refused here
    world_size = config.parallelism.world_size
    if world_size is not None and world_size != plan.num_devices:
        raise HppInputError(f"the plan has {count(plan.num_devices, 'device')} but the world size is {world_size}",
                            source=str(plan_path), field="pipelines", fix=f"launch {plan.num_devices} ranks")
    share = host_share(plan, cluster, nnodes=la.nnodes, node_rank=la.node_rank, rdzv_endpoint=la.rdzv_endpoint,
                       node_map=la.node_map, emulate_node_type=em.emulate_node_type, device=la.device,
                       launcher=la.launcher)
    check_host_capacity(len(share.ranks), device=la.device, per_core=MAX_RANKS_PER_CORE)
    over_memory = check_device_memory(plan, cluster, profile, source=str(plan_path),
                                      allow=config.parallelism.allow_over_memory)
    check_host_memory(plan, cluster, profile, share.ranks, device=la.device)      # before building the model
    check_png_path(config.report.timeline)
    rt = resolve_run_model(plan, profile, tr.model, source=str(plan_path))
    spec = rt.spec
    notes: list[str] = [over_memory] if over_memory else []
    weights = check_weights(tr.weights, rt, resume=ck.resume) if tr.weights is not None else None
    meta = check_resume(ck.resume, model_name=spec.name, num_layers=spec.num_layers, optimizer=tr.optimizer) \
        if ck.resume is not None else None
    seed, data, training = _resolve_training(config, meta, notes)
    if weights is not None:
        notes.append(weights_note(weights, training.dtype))
    save_dir = prepare_save_dir(ck.save, meta["path"] if meta is not None else None) if ck.save is not None \
        else None
    if meta is not None:
        notes += resume_notes(meta, asdict(training), plan)
        if config.report.progress:
            sys.stderr.write(f"resuming step {meta['step']} from {meta['path']}\n")
    data_desc = data_spec(data) if data is not None else None
    source = make_batch_source(data_desc, rt, seed=seed, global_batch_size=plan.global_batch_size)
    start = int(meta["step"]) if meta is not None else 0
    if source.wraps(start + tr.steps):
        notes.append(f"--data holds {source.num_windows} samples, fewer than {start + tr.steps} steps x "
                     f"{plan.global_batch_size}: the order wraps around")
    jsonl = open_metrics(config.report.metrics_jsonl)
    scale = _emulation_notes(config, plan, cluster, spec, share, notes)
    plan_dict = plan_to_dict(plan)
    if "nodes" not in plan.cluster_ref:               # the ranks bind devices with the plan's cluster
        plan_dict["cluster"] = cluster_to_dict(cluster)
    facts = RunFacts(plan=plan_dict, model=model_source(plan, profile, tr.model), training=asdict(training),
                     seed=seed, data=data_desc,
                     slowdown={n: dt.slowdown for n, dt in cluster.device_types.items()} if em.emulate_speed else {},
                     time_scale=scale, save_dir=str(save_dir.resolve()) if save_dir is not None else None,
                     resume=str(Path(meta["path"]).resolve()) if meta is not None else None,
                     weights=str(weights.path) if weights is not None else None,
                     node_map=list(share.node_map) if share.node_map and not share.whole else None)
    mine = [_device_types(plan)[r] for r in share.ranks]
    gpus = sorted({t for t in mine if peak_flops_per_s(t, training.dtype) is not None})
    peak = plan_peak_flops_per_s(mine, training.dtype) if la.device != "cpu" else None     # MFU n/a on CPU
    if la.device == "cpu" and gpus:
        notes.append(f"this plan is for {', '.join(gpus)} GPUs and runs here on CPU: the measured times are this "
                     "CPU's, the predicted ones the profile's GPU times, so their ratio says nothing about the plan; "
                     "MFU is n/a")
    return _Prepared(plan, cluster, profile, rt, share, facts, training, meta, save_dir, source, jsonl, peak, gpus,
                     notes)


def _resolve_training(config: RunConfig, meta: dict | None, notes: list[str]
                      ) -> tuple[int, str | None, TrainingConfig]:
    """The seed, the data path and the :class:`TrainingConfig` of the run: the flags, else the checkpoint's
    (``meta``, on ``--resume``), else the defaults; ``--verify`` forces float64."""
    tr = config.training
    saved_extra = meta.get("extra", {}) if meta is not None else {}
    saved_training = saved_extra.get("training") or None
    seed = tr.seed
    if seed is None:
        seed = int(saved_extra.get("seed", 0))
    elif "seed" in saved_extra and saved_extra["seed"] != seed:
        notes.append(f"--seed {seed} but the checkpoint was trained with seed {saved_extra['seed']}: "
                     "the data order changes")
    data = tr.data
    if data is None and (saved_extra.get("data") or {}).get("path"):
        data = saved_extra["data"]["path"]               # the resumed run reads on in the checkpoint's data
    run_dtype = tr.dtype or (saved_training or {}).get("dtype") or "float32"
    if config.verify.enabled and meta is not None and (saved_training or {}).get("dtype", "float32") != "float64":
        raise HppInputError(f"--verify compares float64 training, but the checkpoint {meta['path']} was saved by a "
                            f"{(saved_training or {}).get('dtype', 'float32')} run", field="--verify",
                            fix="resume a checkpoint saved by a --verify (float64) run, or drop --verify")
    if config.verify.enabled and run_dtype != "float64":
        if tr.dtype is not None:
            notes.append(f"--verify runs in float64 (--dtype {tr.dtype} ignored)")
        run_dtype = "float64"
    training = training_config(optimizer=tr.optimizer, lr=tr.lr, lr_schedule=tr.lr_schedule,
                               lr_warmup_steps=tr.lr_warmup_steps, clip_grad_norm=tr.clip_grad_norm,
                               weight_decay=tr.weight_decay, dtype=run_dtype, steps=tr.steps,
                               lr_total_steps=tr.lr_total_steps, saved=saved_training)
    return seed, data, training


def _emulation_notes(config: RunConfig, plan: Plan, cluster: Cluster, spec: Any, share: Any,
                     notes: list[str]) -> float:
    """The emulation's time scale; notes on emulation, sequence length, warm-up and this host's share."""
    em, tr = config.emulation, config.training
    if not em.emulate_speed and any(dt.slowdown != 1.0 for dt in cluster.device_types.values()):
        notes.append("the cluster has emulated slowdowns but --emulate-speed is off: all ranks run at full speed")
    scale = (default_time_scale(cluster) if em.time_scale is None else float(em.time_scale)) \
        if em.emulate_speed else 1.0
    if scale > 1.0:
        notes.append(f"emulation at time scale {scale:g}: every device runs {scale:g}x slower than its type says, so "
                     f"that {cluster.num_devices} emulated devices fit {os.cpu_count()} cores; the prediction is "
                     "scaled alike (plan_iteration_time_s is the unscaled one)")
    if plan.sequence_length not in (1, spec.seq_len):
        notes.append(f"the plan says sequence length {plan.sequence_length}; the runtime's {spec.name} uses "
                     f"{spec.seq_len}")
    if tr.warmup_steps >= tr.steps:
        notes.append(f"{count(tr.steps, 'step')} <= warm-up {tr.warmup_steps}: the median includes warm-up steps")
    if not share.whole:
        notes.append(f"host {share.node_rank} of {share.nnodes} (plan node {share.nodes[0]}) runs ranks "
                     f"{list(share.ranks)}: times, loss, memory{' and verify' if config.verify.enabled else ''} "
                     "cover these ranks")
    return scale


def _launch(config: RunConfig, prep: _Prepared, tmp: Path) -> tuple[Any, StepMonitor]:
    """Start this host's ranks and wait for them; a failed run raises (partial checkpoints removed first)."""
    la, share, plan = config.launch, prep.share, prep.plan
    monitor = StepMonitor(tmp, ranks=share.ranks, first_step=prep.start, steps=config.training.steps,
                          global_batch_size=plan.global_batch_size, seq_len=prep.rt.spec.seq_len,
                          peak_flops_per_s=prep.peak, jsonl=prep.jsonl, quiet=not config.report.progress)
    logs = Path(la.log_dir) if la.log_dir is not None else None
    res = None
    try:
        with monitor:
            if config.report.progress and share.nnodes > 1:
                sys.stderr.write(f"host {share.node_rank} of {share.nnodes}: waiting for the other hosts at "
                                 f"{share.rdzv_endpoint} (every host runs hpp run with its --node-rank; "
                                 f"the run stops after {la.run_timeout_s:g} s)\n")
            if la.launcher == "torchrun":
                res = launch_torchrun(worker_config_json(config, prep.facts), num_threads=config.training.num_threads,
                                      world_size=plan.num_devices, out_dir=tmp, timeout_s=la.run_timeout_s,
                                      poll=monitor.poll, nnodes=share.nnodes, node_rank=share.node_rank,
                                      rdzv_endpoint=share.rdzv_endpoint, local_ranks=share.ranks, log_dir=logs)
            else:
                res = launch_forked(config, prep.facts, world_size=plan.num_devices, out_dir=tmp,
                                    timeout_s=la.run_timeout_s, poll=monitor.poll, log_dir=logs)
    finally:
        if prep.save_dir is not None and 0 in share.ranks and (res is None or not res.ok):
            removed = clean_partial_checkpoints(prep.save_dir)
            if removed:
                logger.warning("removed %s %s from %s", noun(len(removed), "unfinished checkpoint"),
                               ", ".join(removed), prep.save_dir)
    if not res.ok:
        disagree = next((m for m in map(hosts_disagree_error, res.errors) if m), None)
        if disagree is not None:                      # bad input only the hosts together could see: exit 2
            raise HppInputError(disagree)
        raise RunFailedError(failure_line(res, share, plan, prep.cluster, steps_seen=len(monitor.metrics),
                                          log_dir=la.log_dir))
    return res, monitor


def _report(config: RunConfig, prep: _Prepared, res: Any, monitor: StepMonitor, *, speed_before: Any,
            verified: Any) -> RunReport:
    """Measured vs predicted, the notes, the timeline and the checkpoint written."""
    la, tr, share, plan, dev = config.launch, config.training, prep.share, prep.plan, config.launch.device
    notes = list(prep.notes)
    measured, collectives, ranks = summarise_run(res, plan, warmup_steps=tr.warmup_steps, seq_len=prep.rt.spec.seq_len,
                                                 steps_seen=monitor.metrics, peak_flops=prep.peak)
    collectives["mode"] = "per-layer" if config.parallelism.naive_allreduce else "block-bucketed"
    speed = bracket(speed_before, calibrate_host_speed(prep.profile, device=dev, model=prep.rt)) if speed_before \
        else HostSpeed.skipped("host calibration off (--no-host-calibration)")
    one_host = len(share.ranks) == plan.num_devices   # the host model (steal, the ranks' CPU speed) is a one-host model
    steal = measured["host_steal"]["fraction"] if one_host and measured.get("host_steal") else None
    predicted = predict_run(plan, prep.cluster, prep.profile, time_scale=prep.facts.time_scale, device=dev,
                            emulate_speed=config.emulation.emulate_speed, host_speed=speed, steal=steal,
                            run_cpu_s=[r["phases_s"]["cpu_s"] for r in ranks] if one_host else None)
    bg = measured.get("background_cores") if one_host and dev == "cpu" else None
    if bg is not None and bg >= BUSY_HOST_CORES:
        notes.append(f"other processes kept about {bg:.1f} of this host's {os.cpu_count()} cores busy during the "
                     "timed steps: the measured times are slower than on a quiet host, and the prediction assumes a "
                     "quiet one")
    notes += [n for n in [speed_moved_note(predicted)] if n and not (dev == "cpu" and prep.gpus)]
    prof_dtype = (prep.profile.meta.get("dtype") if prep.profile is not None else None) or prep.dtype
    if predicted and prof_dtype != prep.dtype:
        notes.append(f"the run computes in {prep.dtype}{' (--verify)' if config.verify.enabled else ''}, the "
                     f"prediction uses the profile's {prof_dtype} times")
    timeline = config.report.timeline
    if timeline is not None:
        write_timeline_png(Path(timeline), plan=plan, results=list(res.results), predicted=predicted)
    return RunReport(**_report_head(config, prep), launcher=la.launcher, measured=measured, predicted=predicted,
                     collectives=collectives, ranks=ranks, wall_s=res.wall_s, timeline=timeline, notes=notes,
                     verify=verified.to_dict() if verified is not None else None,
                     hosts=_hosts(config, share), checkpoint=_checkpoint_record(config, prep))


def _report_head(config: RunConfig, prep: _Prepared) -> dict[str, Any]:
    """The :class:`RunReport` fields a dry run reports too."""
    return dict(plan=config.parallelism.plan, model=prep.rt.spec.name, steps=config.training.steps,
                warmup_steps=config.training.warmup_steps, world_size=prep.plan.num_devices,
                emulate_speed=config.emulation.emulate_speed, dtype=prep.dtype, training=asdict(prep.training),
                data=prep.facts.data, device=config.launch.device)


def _hosts(config: RunConfig, share: Any) -> dict[str, Any]:
    if share.whole and share.rdzv_endpoint is None:
        return {}
    return {"nnodes": share.nnodes, "node_rank": share.node_rank, "node_map": share.node_map,
            "rdzv_endpoint": share.rdzv_endpoint, "emulate_node_type": config.emulation.emulate_node_type,
            "ranks": list(share.ranks), "nodes": list(share.nodes)}


def _checkpoint_record(config: RunConfig, prep: _Prepared) -> dict[str, Any]:
    ck, meta, save_dir = config.checkpoint, prep.meta, prep.save_dir
    if save_dir is None and ck.resume is None:
        return {}
    return {"save_dir": str(save_dir) if save_dir is not None else None, "save_every": ck.save_every,
            "resume": ck.resume, "first_step": prep.start, "resumed_from": meta["path"] if meta is not None else None,
            "latest": str(_written(save_dir, prep.start + config.training.steps)) if save_dir is not None else None}


def _written(save_dir: Path, last_step: int) -> Path | str:
    """The checkpoint this run wrote last (``save_dir/step-<last_step>``), else the latest complete one there."""
    done = complete_checkpoints(save_dir)
    return dict(done).get(last_step) or (done[-1][1] if done else "")


def _dry_run(out: Path, config: RunConfig, prep: _Prepared) -> RunReport:
    """Write ``out/worker_config.json``; the report carries this host's torchrun command."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "worker_config.json", worker_config_json(config, prep.facts))
    share = prep.share
    cmd = torchrun_command(out / "worker_config.json", out, nproc=len(share.ranks), nnodes=share.nnodes,
                           node_rank=share.node_rank, rdzv_endpoint=share.rdzv_endpoint)
    return RunReport(**_report_head(config, prep), launcher="dry-run", measured={}, predicted={}, collectives={},
                     ranks=[], wall_s=0.0, command=cmd, notes=prep.notes)
