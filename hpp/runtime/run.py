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
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hpp.errors import HppInputError
from hpp.plan import Plan, plan_from_dict, plan_to_dict, read_plan_json
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.runtime.data import data_spec, make_batch_source
from hpp.runtime.launch import LaunchResult, launch_forked, launch_torchrun
from hpp.runtime.layout import blocks, rank_roles
from hpp.runtime.metrics import StepMetrics, StepMonitor, plan_peak_flops_per_s
from hpp.runtime.model_api import RuntimeModel
from hpp.runtime.reference import VerifyResult, train_single_device, verify_against
from hpp.runtime.worker import WorkerConfig

__all__ = ["RunReport", "RunFailedError", "run_plan", "load_run_inputs", "model_source", "resolve_run_model",
           "check_host_capacity", "default_time_scale", "MAX_RANKS_PER_CORE"]

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


def _names_match(plan_model: str, model_arg: str | None, spec_name: str) -> bool:
    """Whether the plan's model name is the runtime model's (bundled aliases and MODULE:FUNCTION allowed)."""
    from hpp.runtime.zoo import canonical_model_name
    key = lambda n: canonical_model_name(n) or n.strip().lower()   # noqa: E731
    return key(plan_model) in {key(spec_name), *([key(model_arg)] if model_arg else [])}


def model_source(plan: Plan, profile: ModelProfile | None, model: str | None) -> str:
    """What to load the run's model from (see :func:`resolve_run_model`)."""
    from hpp.runtime.zoo import canonical_model_name
    if model:
        return model
    if canonical_model_name(plan.model) is None and profile is not None and profile.meta.get("runtime_model"):
        return str(profile.meta["runtime_model"])
    return plan.model


def resolve_run_model(plan: Plan, profile: ModelProfile | None, model: str | None, *, source: str) -> RuntimeModel:
    """The runtime model of a run: ``model`` (a name or MODULE:FUNCTION) or the plan's, checked against both.

    Without ``model``: the plan's model name, or, if that is no bundled name, what the
    plan's profile says the model was loaded from (``meta["runtime_model"]``, written by
    ``hpp profile --model MODULE:FUNCTION``), so ``hpp run PLAN.json`` needs no ``--model``.

    Raises
    ------
    HppInputError
        Unknown name (lists the names), MODULE:FUNCTION that cannot be imported or returns
        the wrong object (names the missing member), a layer count that differs from the
        plan's or the profile's, a model name that differs from the plan's or the profile's
        (naming both), or a plan TP degree the model's heads or MLP width cannot be split by.
    """
    from hpp.runtime.model_api import check_tp_degree
    from hpp.runtime.zoo import check_layers_match, load_runtime_model
    model = model_source(plan, profile, model)
    rt = load_runtime_model(model)
    spec = rt.spec
    check_layers_match(rt, plan.num_layers, source=f"the plan {source}")
    if profile is not None:
        check_layers_match(rt, profile.num_layers, source=f"the profile of {profile.model}")
    if not _names_match(plan.model, model, spec.name):
        raise HppInputError(f"the plan is for model {plan.model!r} but the runtime model is {spec.name!r}",
                            source=source, field="model",
                            fix=f"run it with --model for {plan.model!r}, or plan for {spec.name!r}")
    if profile is not None and not _names_match(profile.model, model, spec.name):
        raise HppInputError(f"the plan's profile is of model {profile.model!r} but the runtime model is "
                            f"{spec.name!r}", source=source, field="profile",
                            fix=f"profile {spec.name!r} (hpp profile --model) and plan with that profile")
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            if st.tp_degree > 1:
                check_tp_degree(spec, st.tp_degree, field=f"pipelines[{p}].stages[{s}].tp_degree")
    return rt


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
                                     "tp_degree", "tp_rank", "num_micro_batches", "peak_memory_bytes", "slowdown",
                                     "time_scale", "compute_s", "cpu_s", "padding_s", "flops_per_step")}
        kept_phases = r["phases"][warmup_steps:] if steps > warmup_steps else r["phases"]
        row["phases_s"] = {k: statistics.median(ph[k] for ph in kept_phases) for k in kept_phases[0]}
        ranks.append(row)
    return measured, collectives, ranks


def _training(*, optimizer: str, lr: float, lr_schedule: str, lr_warmup_steps: int, clip_grad_norm: float | None,
              weight_decay: float | None, dtype: str, steps: int) -> Any:
    """The run's :class:`hpp.runtime.training.TrainingConfig` (validated there: bad values are HppInputError)."""
    from hpp.runtime.training import TrainingConfig
    extra = {} if weight_decay is None else {"weight_decay": weight_decay}
    return TrainingConfig(optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, warmup_steps=lr_warmup_steps,
                          total_steps=steps, clip_grad_norm=clip_grad_norm, dtype=dtype, **extra)


def _device_types(plan: Plan) -> list[str]:
    """One entry per device of the plan (a TP stage counts each of its devices)."""
    return [st.device_type for pipe in plan.pipelines for st in pipe.stages for _d in st.device_ids]


def _open_metrics(path: str | Path | None) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    try:
        p.open("a").close()
    except OSError as exc:
        raise HppInputError(f"--metrics-jsonl {str(path)!r} cannot be written ({exc.strerror})",
                            field="metrics_jsonl", fix="give a writable file path") from None
    return p


def run_plan(plan_path: str | Path, *, steps: int, model: str | None = None, verify: bool = False,
             emulate_speed: bool = False, naive_allreduce: bool = False, timeline: str | Path | None = None,
             launcher: str = "torchrun", device: str = "cpu", warmup_steps: int = 1, world_size: int | None = None,
             seed: int = 0, dtype: str | None = None, optimizer: str = "adamw", lr: float = 1e-3,
             lr_schedule: str = "constant", lr_warmup_steps: int = 0, clip_grad_norm: float | None = None,
             weight_decay: float | None = None, data: str | Path | None = None,
             metrics_jsonl: str | Path | None = None, progress: bool = False, group_timeout_s: float = 120.0,
             run_timeout_s: float = 1800.0, out_dir: str | Path | None = None, time_scale: float | None = None,
             num_threads: int = 1, worker_options: Mapping[str, Any] | None = None) -> RunReport:
    """Execute the plan in ``plan_path`` for ``steps`` optimizer steps and report measured vs predicted.

    Parameters
    ----------
    model : str, optional
        A runtime model name or ``MODULE:FUNCTION`` (default: the plan's model).
    verify : bool
        Run in float64, save every rank's parameters and compare them with single-device
        training (:mod:`hpp.runtime.reference`); the report's ``verify`` holds the result.
    dtype : str, optional
        ``float32`` (default), ``float64`` or ``bfloat16`` (autocast, fp32 master weights).
    optimizer, lr, lr_schedule, lr_warmup_steps, clip_grad_norm, weight_decay
        The training configuration (:class:`hpp.runtime.training.TrainingConfig`).
    data : path, optional
        ``--data FILE`` (:mod:`hpp.runtime.data`); default synthetic tokens.
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

    Raises
    ------
    HppInputError
        Refused before any process starts (see the module docstring).
    RunFailedError
        A rank failed or the run timed out; the message names the rank or the timeout.
    """
    if steps < 1:
        raise HppInputError(f"--steps {steps}", field="steps", fix="run at least 1 step")
    plan, cluster, profile = load_run_inputs(plan_path)
    rt = resolve_run_model(plan, profile, model, source=str(plan_path))
    spec = rt.spec
    model_name = model_source(plan, profile, model)             # what every rank loads
    rank_roles(plan)                                  # layouts the runtime cannot execute are refused here
    if world_size is not None and world_size != plan.num_devices:
        raise HppInputError(f"the plan has {plan.num_devices} devices but the world size is {world_size}",
                            source=str(plan_path), field="pipelines", fix=f"launch {plan.num_devices} ranks")
    check_host_capacity(plan.num_devices, device=device)
    notes: list[str] = []
    run_dtype = dtype or "float32"
    if verify and run_dtype != "float64":
        if dtype is not None:
            notes.append(f"--verify runs in float64 (--dtype {dtype} ignored)")
        run_dtype = "float64"
    training = _training(optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, lr_warmup_steps=lr_warmup_steps,
                         clip_grad_norm=clip_grad_norm, weight_decay=weight_decay, dtype=run_dtype, steps=steps)
    data_desc = data_spec(data) if data is not None else None
    source = make_batch_source(data_desc, rt, seed=seed, global_batch_size=plan.global_batch_size)
    if source.wraps(steps):
        notes.append(f"--data holds {source.num_windows} samples, fewer than {steps} steps x {plan.global_batch_size}: "
                     "the order wraps around")
    jsonl = _open_metrics(metrics_jsonl)
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
    cfg = WorkerConfig(plan=plan_to_dict(plan), model={}, model_name=model_name,
                       training=asdict(training), data=data_desc, steps=steps, warmup_steps=warmup_steps, seed=seed,
                       dtype=run_dtype, optimizer=optimizer, lr=lr, naive_allreduce=naive_allreduce,
                       slowdown=slowdown, time_scale=scale, device=device, timeout_s=group_timeout_s,
                       num_threads=num_threads, save_params=verify, **dict(worker_options or {}))
    peak = plan_peak_flops_per_s(_device_types(plan), run_dtype)
    verified = None
    with tempfile.TemporaryDirectory(prefix="hpp-run-", dir=out_dir) as tmp:
        monitor = StepMonitor(Path(tmp), world_size=plan.num_devices, steps=steps,
                              global_batch_size=plan.global_batch_size, seq_len=spec.seq_len, peak_flops_per_s=peak,
                              jsonl=jsonl, quiet=not progress)
        with monitor:
            launch = launch_torchrun if launcher == "torchrun" else launch_forked
            res = launch(cfg, world_size=plan.num_devices, out_dir=Path(tmp), timeout_s=run_timeout_s,
                         poll=monitor.poll)
        if not res.ok:
            raise RunFailedError(res.failure_message())
        if verify:
            verified = _verify(rt, Path(tmp), plan.num_devices, source=source, steps=steps, seed=seed,
                               training=training)
    measured, collectives, ranks = _summarise(res, plan, warmup_steps=warmup_steps, seq_len=spec.seq_len,
                                              steps_seen=monitor.metrics, peak_flops=peak)
    collectives["mode"] = "per-layer" if naive_allreduce else "block-bucketed"
    predicted = _predict(plan, cluster, profile, time_scale=scale)
    timeline_path = None
    if timeline is not None:
        from hpp.runtime.timeline import write_timeline_png
        write_timeline_png(Path(timeline), plan=plan, results=list(res.results), predicted=predicted)
        timeline_path = str(timeline)
    return RunReport(plan=str(plan_path), model=spec.name, steps=steps, warmup_steps=warmup_steps,
                     world_size=plan.num_devices, launcher=launcher, emulate_speed=emulate_speed, measured=measured,
                     predicted=predicted, collectives=collectives, ranks=ranks, wall_s=res.wall_s,
                     timeline=timeline_path, notes=notes, dtype=run_dtype, training=asdict(training),
                     data=data_desc, verify=verified.to_dict() if verified is not None else None)


def _verify(rt: RuntimeModel, out_dir: Path, world_size: int, *, source: Any, steps: int, seed: int,
            training: Any) -> VerifyResult:
    """Every rank's saved parameters against single-device float64 training (:mod:`hpp.runtime.reference`)."""
    import torch
    rank_params = [torch.load(out_dir / f"rank{r}.pt", map_location="cpu", weights_only=True)
                   for r in range(world_size)]
    ref = train_single_device(rt, source=source, steps=steps, seed=seed, training=training, dtype=torch.float64)
    return verify_against(rank_params, ref)
