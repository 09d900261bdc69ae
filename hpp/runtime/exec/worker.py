"""One rank of an HPP run: its (TP-sharded) pipeline stage, the block all-reduces, the optimizer step.

Entry point: :func:`run_worker` over the run's :class:`~hpp.runtime.config.RunConfig` and
:class:`~hpp.runtime.config.RunFacts` plus this rank's own facts (rank, world size, node rank, local GPU), which
the launcher resolves (:mod:`hpp.runtime.launch.rank_entry` under torchrun, :func:`hpp.runtime.launch.launchers.
launch_forked`).

A rank first compares the flags every host must share (:mod:`hpp.runtime.exec.host_agreement`), builds its stage from
the model (:func:`hpp.runtime.models.zoo.load_runtime_model`), shards
it over its stage's TP group (:mod:`hpp.runtime.exec.tensor_parallel`), takes every replicated parameter from its
lowest-rank holder (:func:`hpp.runtime.exec.gradsync.broadcast_initial_parameters`), runs its lane's pipeline schedule
(``return_outputs=False``, shape-only placeholders), syncs gradients block-wise (:mod:`hpp.runtime.exec.gradsync`),
clips and steps (:mod:`hpp.runtime.exec.training`).

Each rank writes ``OUT_DIR/rank<r>.json`` (and ``rank<r>.pt`` with its full, unsharded parameters if asked)
through a temporary file and a rename, or ``rank<r>.error`` with the reason when it fails, so a reader never sees
a half-written file; and one line per step to ``OUT_DIR/rank<r>.steps.jsonl``.

Ranks are the plan's: the launcher hands each its plan rank and, on CUDA, the local GPU its plan device has
(:mod:`hpp.runtime.launch.binding`). ``facts.weights`` (``--weights``): after sharding, the rank
copies its own slices of a Hugging Face folder into its stage (:mod:`hpp.runtime.exec.weights`; ``rank<r>.json``'s
``weights`` says what it read and how much its resident memory grew meanwhile). Checkpoints
(:mod:`hpp.runtime.checkpoint.dcp`): ``facts.resume`` loads
one after the optimizer is built and the steps continue from its step (the data position); ``facts.save_dir``
gets one every ``save_every`` steps and after the last. Steps are numbered globally (``steps.jsonl``'s ``step``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpp.errors import HppInputError
from hpp.fileio import write_atomic
from hpp.plan_data import Plan, plan_from_dict
from hpp.runtime.checkpoint.dcp import load_checkpoint, save_checkpoint
from hpp.runtime.config import RunConfig, RunFacts
from hpp.runtime.exec.data import make_batch_source
from hpp.runtime.exec.gradsync import GradSync, broadcast_initial_parameters
from hpp.runtime.exec.host_agreement import check_hosts_agree
from hpp.runtime.exec.layout import GroupLayout, RankRole, group_layout, rank_roles, split_micro_batches
from hpp.runtime.exec.step import (collective_record, event_records, full_params, make_stage_schedule,
                                   peak_memory_bytes, phase_record, run_schedule_step, stage_flops_per_step)
from hpp.runtime.exec.sync_units import sync_units
from hpp.runtime.exec.tensor_parallel import is_sharded, local_tensor, parallelize_stage
from hpp.runtime.exec.training import (TrainingConfig, clip_by_global_norm, lm_loss, make_lr_scheduler,
                                       make_optimizer, target_count)
from hpp.runtime.exec.verify_steps import StepVerifier
from hpp.runtime.exec.weights import load_weights_folder
from hpp.runtime.host.emulation import Instrument
from hpp.runtime.host.steal import read_cpu_ticks, tick_delta
from hpp.runtime.models.api import IGNORE_INDEX, RuntimeModel
from hpp.runtime.models.stage import build_stage, split_global_name
from hpp.runtime.models.zoo import load_runtime_model

__all__ = ["run_worker", "worker_main", "training_config"]

logger = logging.getLogger(__name__)


def training_config(config: RunConfig, facts: RunFacts) -> TrainingConfig:
    """The run's :class:`TrainingConfig`: ``facts.training`` (resolved by ``hpp run``), its schedule over
    ``config.training.steps`` unless it says otherwise."""
    return TrainingConfig.from_dict({"total_steps": max(1, config.training.steps), **facts.training})


def _agree(refused: HppInputError | None, device: torch.device) -> None:
    """Raise on every rank if any rank refused the plan (its peers would otherwise wait for it until timeout)."""
    flag = torch.tensor([0 if refused is None else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if refused is not None:
        raise refused
    if int(flag.item()):
        raise HppInputError("another rank refused the plan's tensor parallelism (see its error)", field="tp_plan",
                            fix="see the first rank's error")


@dataclass
class _Rank:
    """What one rank trains with, built once before its first step."""

    plan: Plan
    model: RuntimeModel
    role: RankRole
    layout: GroupLayout
    training: TrainingConfig
    device: torch.device
    groups: dict[tuple[int, ...], Any]
    module: Any
    sync: GradSync
    optimizer: torch.optim.Optimizer
    scheduler: Any
    start: int
    flops_per_step: float
    norm_terms: list[tuple[torch.Tensor, bool]]
    verifier: StepVerifier | None
    verify_init: Any
    weights: dict[str, Any] | None
    instrument: Instrument
    schedule: Any
    pstage: Any
    denominator: list[int]


def _device(config: RunConfig, cuda_index: int | None) -> tuple[torch.device, str]:
    if config.launch.device == "cuda":               # the local GPU of the plan's device (the launcher's binding)
        device = torch.device("cuda", 0 if cuda_index is None else cuda_index)
        torch.cuda.set_device(device)
        return device, "nccl"
    return torch.device("cpu"), "gloo"


def _build_rank(config: RunConfig, facts: RunFacts, plan: Plan, model: RuntimeModel, *, rank: int,
                device: torch.device) -> _Rank:
    """Groups, the (TP-sharded) stage, the gradient sync, the optimizer (and the checkpoint loaded), the schedule."""
    spec, ctl, timeout = model.spec, config.controls, timedelta(seconds=config.launch.group_timeout_s)
    tcfg = training_config(config, facts)
    roles = rank_roles(plan)
    role = roles[rank]
    layout = group_layout(plan, tied_layers=tuple((split_global_name(a)[0], split_global_name(b)[0])
                                                  for a, b in model.tied_parameters()))
    groups = {ranks: dist.new_group(list(ranks), timeout=timeout)
              for ranks in layout.creation_order()}          # every rank, same order
    module = build_stage(model, role.layer_start, role.layer_stop, seed=facts.seed, dtype=tcfg.param_dtype,
                         device=device, recompute=role.recompute)
    b, s, h = role.micro_batch_size, spec.seq_len, spec.hidden_size
    flops_per_step = stage_flops_per_step(module, role, seq_len=s, hidden_size=h, training=tcfg)
    refused: HppInputError | None = None
    units: list = []
    try:
        parallelize_stage(module, model, tp_group=groups.get(role.stage_ranks), tp_degree=role.tp_degree,
                          device=device)
        units = [] if ctl.skip_block_allreduce else sync_units(layout, role, roles, module, model,
                                                               naive_tp=ctl.naive_tp)
    except HppInputError as exc:
        refused = exc
    _agree(refused, device)
    weights = load_weights_folder(module, model, facts.weights) if facts.weights else None
    if not facts.resume:                              # a resume loads equal replicas
        broadcast_initial_parameters(units, groups, rank=rank)
    sync = GradSync(module, rank=rank, units=units, groups=groups, bucket_bytes=ctl.bucket_bytes,
                    overlap=ctl.overlap, naive=config.parallelism.naive_allreduce)
    named = list(module.layer_parameters())
    optimizer = make_optimizer([p for _l, _n, p in named], tcfg)
    scheduler = make_lr_scheduler(optimizer, tcfg)
    start = 0
    if facts.resume:                                  # collective; parameters loaded in place (buckets stay)
        start = load_checkpoint(facts.resume, module=module, optimizer=optimizer, scheduler=scheduler,
                                model_name=spec.name, num_layers=spec.num_layers)
    verifier = StepVerifier(model, tcfg, seed=facts.seed, rank=rank, timeout_s=config.launch.group_timeout_s,
                            device=device, weights=facts.weights) if config.verify.enabled else None
    verify_init = verifier.start(module, optimizer, fresh=not facts.resume) if verifier is not None else None
    second = {b for _a, b in model.tied_parameters()}
    norm_terms = [(p, role.pipeline == 0 and name not in second and (role.tp_rank == 0 or is_sharded(p)))
                  for _l, name, p in named]
    instrument = Instrument(slowdown=float(facts.slowdown.get(role.device_type, 1.0)),
                            time_scale=float(facts.time_scale) if facts.slowdown else 1.0)
    denominator = [1]
    schedule = pstage = None
    if role.num_micro_batches > 0:
        lane = layout.lane_ranks[role.pipeline][role.tp_rank]
        pstage, schedule = make_stage_schedule(
            module, stage_index=role.stage_index, num_stages=role.num_stages,
            num_micro_batches=role.num_micro_batches, micro_batch_size=b, seq_len=s, hidden_size=h,
            vocab_size=spec.vocab_size, training=tcfg, device=device, group=groups[lane], schedule=role.schedule,
            loss_fn=lambda out, tgt: lm_loss(out, tgt, denominator=denominator[0]))
        instrument.attach(pstage)
    return _Rank(plan, model, role, layout, tcfg, device, groups, module, sync, optimizer, scheduler, start,
                 flops_per_step, norm_terms, verifier, verify_init, weights, instrument, schedule, pstage, denominator)


def _train_step(r: _Rank, config: RunConfig, source: Any, step: int, *, rank: int) -> dict[str, Any]:
    """One optimizer step of this rank; its timings, loss, collectives and (``--verify``) difference."""
    ctl, role = config.controls, r.role
    if step == ctl.fail_step and rank == ctl.fail_rank:
        logger.error("rank %d: injected failure (%s) at step %d", rank, ctl.fail_mode, step)
        if ctl.fail_mode == "hang":
            time.sleep(2 * config.launch.group_timeout_s)
        os._exit(17)
    r.optimizer.zero_grad(set_to_none=False)          # in place: grads are views of the sync buckets
    r.sync.begin_step(role.num_micro_batches, skip=step == ctl.skip_block_allreduce_step)
    r.instrument.reset()
    lr = r.optimizer.param_groups[0]["lr"]
    dist.barrier()
    ticks0, cpu0 = read_cpu_ticks() if rank == 0 else None, time.process_time()  # host: one reader
    t0 = time.perf_counter()
    inputs, targets = source.batch(step)
    r.denominator[0] = max(1, target_count(targets))
    t_sched = time.perf_counter()
    losses: list[torch.Tensor] = []
    if r.schedule is not None:
        lo, hi = role.sample_offset, role.sample_offset + role.num_samples
        x, y = split_micro_batches(inputs[lo:hi], targets[lo:hi], micro_batch_size=role.micro_batch_size,
                                   ignore_index=IGNORE_INDEX)
        t_sched = time.perf_counter()
        losses = run_schedule_step(r.schedule, x.to(r.device), y.to(r.device), is_first=role.is_first,
                                   is_last=role.is_last)
    t_sync = time.perf_counter()
    r.sync.finish()
    t_opt = time.perf_counter()
    if r.training.clip_grad_norm is not None:
        clip_by_global_norm([(local_tensor(p.grad), c) for p, c in r.norm_terms], r.training.clip_grad_norm)
    r.optimizer.step()
    r.scheduler.step()
    if r.device.type == "cuda":
        torch.cuda.synchronize(r.device)
    t_end = time.perf_counter()
    reports_loss = role.is_last and role.tp_rank == 0 and role.num_micro_batches > 0
    return {"time_s": t_end - t0, "lr": lr, "inputs": inputs, "targets": targets,
            "loss": float(sum(float(l.detach()) for l in losses)) if reports_loss else None,
            "phases": phase_record(t0, t_sched, t_sync, t_opt, t_end, r.instrument,
                                   proc_s=time.process_time() - cpu0, host=tick_delta(ticks0, read_cpu_ticks())),
            "collectives": collective_record(r.sync.stats), "events": event_records(r.instrument, t0)}


def _result(r: _Rank, *, rank: int, log: dict[str, list]) -> dict[str, Any]:
    role, device, ins = r.role, r.device, r.instrument
    result = {"rank": rank, "first_step": r.start, "pipeline": role.pipeline, "stage": role.stage_index,
              "device_id": role.device_id, "device_type": role.device_type,
              "layers": [role.layer_start, role.layer_stop],
              "tp_degree": role.tp_degree, "tp_rank": role.tp_rank, "recompute": role.recompute,
              "num_micro_batches": role.num_micro_batches, "micro_batch_size": role.micro_batch_size,
              "num_samples": role.num_samples, "step_times_s": log["step_times"], "phases": log["phases"],
              "collectives": log["collectives"], "losses": log["losses"], "flops_per_step": r.flops_per_step,
              "outputs_kept": len(r.pstage.output_chunks) if r.pstage is not None else 0,
              "peak_memory_bytes": peak_memory_bytes(device),
              "peak_memory_reserved_bytes": (int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda"
                                             else None),
              "slowdown": ins.slowdown, "time_scale": ins.time_scale, "compute_s": ins.compute_s,
              "cpu_s": ins.cpu_s, "padding_s": ins.padding_s, "events": log["events"]}
    if r.weights is not None:
        result["weights"] = r.weights
    if r.verifier is not None:
        result.update(verify_init=r.verify_init, verify_steps=log["verify"])
    return result


def run_worker(config: RunConfig, facts: RunFacts, *, rank: int, world_size: int, out_dir: Path,
               node_rank: int = 0, cuda_index: int | None = None) -> dict[str, Any]:
    """Run plan rank ``rank`` for ``config.training.steps`` steps; return (and write) its result.

    ``MASTER_ADDR``/``MASTER_PORT`` must be set (torchrun or the fork launcher does). ``node_rank``: this host's
    (several hosts); ``cuda_index``: the local GPU of this rank's plan device (CUDA).

    Returns
    -------
    dict
        ``rank``, ``pipeline``, ``stage``, ``tp_degree``, ``tp_rank``, ``layers``, ``step_times_s``,
        ``phases`` (per step: ``batch_s``, ``schedule_s``, ``sync_wait_s``, ``optimizer_s`` wall
        seconds and the stage's ``compute_s``/``cpu_s``/``padding_s``), ``collectives`` (per step:
        counts, bytes, and the ``records`` of every collective joined), ``losses`` (per step, this
        rank's loss contribution or None), ``flops_per_step``, ``outputs_kept`` (stage outputs the
        pipelining library still holds after the last step: 0), ``peak_memory_bytes``, ``events``.
    """
    plan = plan_from_dict(facts.plan)
    if plan.num_devices != world_size:
        raise HppInputError(f"the plan has {plan.num_devices} devices but the world size is {world_size}",
                            field="pipelines", fix=f"launch exactly {plan.num_devices} ranks")
    model = load_runtime_model(facts.model)
    torch.set_num_threads(config.training.num_threads)
    device, backend = _device(config, cuda_index)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=config.launch.group_timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        check_hosts_agree(config, facts, node_rank=node_rank)
        r = _build_rank(config, facts, plan, model, rank=rank, device=device)
        result = _train(r, config, facts, rank=rank, out_dir=out_dir)
        if config.verify.enabled or config.controls.save_params:   # every rank's full, unsharded parameters
            buf = io.BytesIO()
            torch.save(full_params(r.module, model), buf)
            write_atomic(out_dir / f"rank{rank}.pt", buf.getvalue())
        write_atomic(out_dir / f"rank{rank}.json", json.dumps(result))
        dist.barrier()                                  # nobody tears down while a peer still talks
        return result
    finally:
        dist.destroy_process_group()


def _train(r: _Rank, config: RunConfig, facts: RunFacts, *, rank: int, out_dir: Path) -> dict[str, Any]:
    """The steps: one line each to ``rank<r>.steps.jsonl``, checkpoints as asked; this rank's result."""
    spec, plan = r.model.spec, r.plan
    source = make_batch_source(facts.data, r.model, seed=facts.seed, global_batch_size=plan.global_batch_size)
    steps_path = out_dir / f"rank{rank}.steps.jsonl"
    steps_path.unlink(missing_ok=True)
    log: dict[str, list] = {"step_times": [], "phases": [], "collectives": [], "losses": [], "events": [],
                            "verify": []}
    last = r.start + config.training.steps
    for step in range(r.start, last):
        out = _train_step(r, config, source, step, rank=rank)
        log["step_times"].append(out["time_s"])
        log["losses"].append(out["loss"])
        log["phases"].append(out["phases"])
        log["collectives"].append(out["collectives"])
        if r.verifier is not None:                     # after the step's timings and CPU counters
            log["verify"].append(r.verifier.check(step, out["inputs"], out["targets"], r.module, r.optimizer))
        log["events"] = out["events"]
        done = step + 1
        every = config.checkpoint.save_every
        if facts.save_dir and (done == last or (every and done % every == 0)):
            save_checkpoint(facts.save_dir, step=done, module=r.module, optimizer=r.optimizer,
                            scheduler=r.scheduler, model_name=spec.name, num_layers=spec.num_layers,
                            extra={"seed": facts.seed, "global_batch_size": plan.global_batch_size,
                                   "training": asdict(r.training), "data": facts.data})
        line = {"step": step, "time_s": out["time_s"], "loss": out["loss"], "target_tokens": r.denominator[0],
                "flops": r.flops_per_step, "peak_memory_bytes": peak_memory_bytes(r.device), "lr": out["lr"]}
        if r.verifier is not None:
            line["verify_difference"] = log["verify"][-1]
        with steps_path.open("a") as f:
            f.write(json.dumps(line) + "\n")
    r.sync.close()
    return _result(r, rank=rank, log=log)


def _peers(facts: RunFacts, rank: int) -> list[int]:
    try:
        layout = group_layout(plan_from_dict(facts.plan))
        return sorted({r for g in layout.creation_order() if rank in g for r in g} - {rank})
    except Exception:  # noqa: BLE001 - only for the error message
        return []


def worker_main(config: RunConfig, facts: RunFacts, *, rank: int, world_size: int, out_dir: Path,
                node_rank: int = 0, cuda_index: int | None = None) -> int:
    """:func:`run_worker` that turns any failure into ``rank<r>.error`` and exit code 1."""
    try:
        run_worker(config, facts, rank=rank, world_size=world_size, out_dir=out_dir, node_rank=node_rank,
                   cuda_index=cuda_index)
        return 0
    except BaseException as exc:  # noqa: BLE001 - a rank must report, whatever killed it
        msg = (f"rank {rank} aborted: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
               f" (a peer may have died; this rank shares groups with ranks {_peers(facts, rank)})")
        logger.error("%s", msg)
        logger.debug("%s", traceback.format_exc())
        try:
            write_atomic(out_dir / f"rank{rank}.error", msg + "\n")
        except OSError:
            pass
        return 1
