"""One rank of an HPP run: its (TP-sharded) pipeline stage, the block all-reduces, the optimizer step.

Entry points: :func:`run_worker` (a library call, used by the fork launcher of the tests) and ``python -m
hpp.runtime.exec.worker CONFIG.json OUT_DIR`` (what ``torchrun`` starts; rank and world size from its environment).

A rank first compares the flags every host must share (:mod:`hpp.runtime.exec.host_agreement`), builds its stage from
the model (``model_name`` through :func:`hpp.runtime.models.zoo.load_runtime_model`, or the legacy ``model`` dict), shards
it over its stage's TP group (:mod:`hpp.runtime.exec.tensor_parallel`), takes every replicated parameter from its
lowest-rank holder (:func:`hpp.runtime.exec.gradsync.broadcast_initial_parameters`), runs its lane's pipeline schedule
(``return_outputs=False``, shape-only placeholders), syncs gradients block-wise (:mod:`hpp.runtime.exec.gradsync`),
clips and steps (:mod:`hpp.runtime.exec.training`).

Each rank writes ``OUT_DIR/rank<r>.json`` (and ``rank<r>.pt`` with its full, unsharded parameters if asked)
through a temporary file and a rename, or ``rank<r>.error`` with the reason when it fails, so a reader never sees
a half-written file; and one line per step to ``OUT_DIR/rank<r>.steps.jsonl``.

Ranks are the plan's (:mod:`hpp.runtime.launch.binding`): under torchrun across several hosts (``nnodes > 1``, static
rendezvous) local rank ``j`` of node rank ``R`` runs as :func:`hpp.runtime.launch.binding.worker_binding`'s rank, not
torchrun's ``RANK``; a CUDA rank uses the local GPU its plan device has. Checkpoints
(:mod:`hpp.runtime.checkpoint.dcp`): ``resume`` loads one after the optimizer is built and the steps continue from its
step (the data position); ``save_dir`` gets one every ``save_every`` steps and after the last. Steps are numbered
globally (``steps.jsonl``'s ``step``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpp.errors import HppInputError
from hpp.fileio import write_atomic
from hpp.plan import plan_from_dict
from hpp.runtime.launch.binding import RankBinding, worker_binding
from hpp.runtime.checkpoint.dcp import load_checkpoint, save_checkpoint
from hpp.runtime.exec.data import make_batch_source
from hpp.runtime.host.emulation import Instrument
from hpp.runtime.exec.gradsync import GradSync, broadcast_initial_parameters
from hpp.runtime.exec.host_agreement import check_hosts_agree
from hpp.runtime.exec.sync_units import sync_units
from hpp.runtime.host.steal import read_cpu_ticks, tick_delta
from hpp.runtime.exec.layout import group_layout, rank_roles, split_micro_batches
from hpp.runtime.models.api import IGNORE_INDEX, RuntimeModel
from hpp.runtime.models.gpt import LegacyGPT, ModelConfig
from hpp.runtime.launch.processes import die_with_parent
from hpp.runtime.models.stage import build_stage, split_global_name
from hpp.runtime.exec.tensor_parallel import is_sharded, local_tensor, parallelize_stage
from hpp.runtime.exec.training import (TrainingConfig, clip_by_global_norm, lm_loss, make_lr_scheduler, make_optimizer,
                                  target_count)
from hpp.runtime.exec.verify_steps import StepVerifier
from hpp.runtime.exec.step import (collective_record, event_records, full_params, make_stage_schedule,
                                      peak_memory_bytes, phase_record, run_schedule_step, stage_flops_per_step)
from hpp.runtime.models.zoo import load_runtime_model

__all__ = ["WorkerConfig", "run_worker", "worker_main", "config_to_json", "resolve_model", "training_config"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a rank needs; plain JSON data.

    Attributes
    ----------
    plan : dict
        The plan's JSON object (:func:`hpp.plan.plan_to_dict`), already validated.
    model_name : str
        A name or ``MODULE:FUNCTION`` for :func:`hpp.runtime.models.zoo.load_runtime_model`.
    model : dict
        Legacy: :class:`hpp.runtime.models.gpt.ModelConfig` fields (used when ``model_name`` is empty,
        with ``tie_embeddings``).
    training : dict or None
        :class:`hpp.runtime.exec.training.TrainingConfig` fields; None: from the legacy
        ``optimizer``/``lr``/``dtype`` (SGD without, AdamW with weight decay 0.01).
    data : dict or None
        For :func:`hpp.runtime.exec.data.make_batch_source` (None: synthetic tokens).
    steps, warmup_steps : int
        Optimizer steps; the first ``warmup_steps`` are left out of the median.
    naive_allreduce, overlap, skip_block_allreduce, naive_tp : bool
        Gradient sync variants: per-layer blocking; launched from backward hooks; the
        control without any block sync; the control that sums replicated parameters
        from every TP rank (both must NOT match single-device training).
    skip_block_allreduce_step : int
        The control of one late fault: no gradient sync in that (global) step only (-1: never).
    verify_steps : bool
        ``--verify``: compare every step with one single-device step from the run's state
        (:class:`hpp.runtime.exec.verify_steps.StepVerifier`; rank 0 computes, every rank records).
    slowdown : dict[str, float]
        Per device type, the emulated slowdown (empty: no emulation).
    time_scale : float
        Common dilation of every emulated device (>= 1; see :mod:`hpp.runtime.host.emulation`).
    timeout_s : float
        Process-group timeout [s]: a dead peer makes this rank fail within it.
    fail_rank, fail_step, fail_mode :
        Fault injection for tests: that rank fails at that (global) step (-1: never), ``"exit"`` or ``"hang"``.
    save_dir, save_every : str or None, int
        Checkpoint root (every rank sees it) and interval in steps (0: only after the last step).
    resume : str or None
        A checkpoint (``save_dir`` or one ``step-K`` folder) to continue from.
    nnodes : int
        Hosts of the run (torchrun ``--nnodes``); ``node_map``: the plan node of each node rank.
    emulate_node_type : str or None
        What the launcher emulated (informative; the launcher checked the host).
    """

    plan: dict
    model: dict = field(default_factory=dict)
    model_name: str = ""
    training: dict | None = None
    data: dict | None = None
    steps: int = 3
    warmup_steps: int = 1
    seed: int = 0
    dtype: str = "float32"
    tie_embeddings: bool = False
    optimizer: str = "sgd"
    lr: float = 0.1
    naive_allreduce: bool = False
    overlap: bool = True
    skip_block_allreduce: bool = False
    skip_block_allreduce_step: int = -1
    naive_tp: bool = False
    verify_steps: bool = False
    bucket_bytes: int = 25 * 2**20
    slowdown: dict = field(default_factory=dict)
    time_scale: float = 1.0
    device: str = "cpu"
    timeout_s: float = 300.0
    num_threads: int = 1
    save_params: bool = False
    fail_rank: int = -1
    fail_step: int = -1
    fail_mode: str = "exit"
    save_dir: str | None = None
    save_every: int = 0
    resume: str | None = None
    nnodes: int = 1
    node_map: list[int] | None = None
    emulate_node_type: str | None = None


def resolve_model(cfg: WorkerConfig) -> RuntimeModel:
    """The run's runtime model: ``model_name`` from the zoo, else the legacy ``model`` dict."""
    if cfg.model_name:
        return load_runtime_model(cfg.model_name)
    return LegacyGPT(ModelConfig(**cfg.model), tie_embeddings=cfg.tie_embeddings)


def training_config(cfg: WorkerConfig) -> TrainingConfig:
    """``cfg.training``, or the legacy fields as a :class:`TrainingConfig`."""
    if cfg.training is not None:
        return TrainingConfig.from_dict({"total_steps": max(1, cfg.steps), **cfg.training})
    return TrainingConfig(optimizer=cfg.optimizer, lr=cfg.lr, weight_decay=0.01 if cfg.optimizer == "adamw" else 0.0,
                          total_steps=max(1, cfg.steps), dtype=cfg.dtype)


def _agree(refused: HppInputError | None, device: torch.device) -> None:
    """Raise on every rank if any rank refused the plan (its peers would otherwise wait for it until timeout)."""
    flag = torch.tensor([0 if refused is None else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if refused is not None:
        raise refused
    if int(flag.item()):
        raise HppInputError("another rank refused the plan's tensor parallelism (see its error)", field="tp_plan",
                            fix="see the first rank's error")


def run_worker(cfg: WorkerConfig, *, rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """Run rank ``rank`` of the plan for ``cfg.steps`` steps; return (and write) its result.

    ``MASTER_ADDR``/``MASTER_PORT`` must be set (torchrun or the fork launcher does).

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
    plan = plan_from_dict(cfg.plan)
    if plan.num_devices != world_size:
        raise HppInputError(f"the plan has {plan.num_devices} devices but the world size is {world_size}",
                            field="pipelines", fix=f"launch exactly {plan.num_devices} ranks")
    model = resolve_model(cfg)
    spec = model.spec
    tcfg = training_config(cfg)
    roles = rank_roles(plan)
    role = roles[rank]
    tied_layers = tuple((split_global_name(a)[0], split_global_name(b)[0]) for a, b in model.tied_parameters())
    layout = group_layout(plan, tied_layers=tied_layers)
    torch.set_num_threads(cfg.num_threads)
    if cfg.device == "cuda":                         # the local GPU of the plan's device (hpp.runtime.launch.binding)
        local = _binding(cfg, plan, local_rank=int(os.environ.get("LOCAL_RANK", rank))).local_index
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=cfg.timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        check_hosts_agree(cfg, node_rank=int(os.environ.get("GROUP_RANK", 0)))
        groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in layout.creation_order():           # every rank, same order
            groups[ranks] = dist.new_group(list(ranks), timeout=timedelta(seconds=cfg.timeout_s))
        module = build_stage(model, role.layer_start, role.layer_stop, seed=cfg.seed, dtype=tcfg.param_dtype,
                             device=device, recompute=role.recompute)
        b, s, h = role.micro_batch_size, spec.seq_len, spec.hidden_size
        flops_per_step = stage_flops_per_step(module, role, seq_len=s, hidden_size=h, training=tcfg)
        refused: HppInputError | None = None
        try:
            parallelize_stage(module, model, tp_group=groups.get(role.stage_ranks), tp_degree=role.tp_degree,
                              device=device)
            units = [] if cfg.skip_block_allreduce else sync_units(layout, role, roles, module, model,
                                                                    naive_tp=cfg.naive_tp)
        except HppInputError as exc:
            refused = exc
        _agree(refused, device)
        if not cfg.resume:                              # a resume loads equal replicas
            broadcast_initial_parameters(units, groups, rank=rank)
        sync = GradSync(module, rank=rank, units=units, groups=groups, bucket_bytes=cfg.bucket_bytes,
                        overlap=cfg.overlap, naive=cfg.naive_allreduce)
        named = list(module.layer_parameters())
        optimizer = make_optimizer([p for _l, _n, p in named], tcfg)
        scheduler = make_lr_scheduler(optimizer, tcfg)
        start = 0
        if cfg.resume:                                  # collective; parameters loaded in place (buckets stay)
            start = load_checkpoint(cfg.resume, module=module, optimizer=optimizer, scheduler=scheduler,
                                    model_name=spec.name, num_layers=spec.num_layers)
        verifier = StepVerifier(model, tcfg, seed=cfg.seed, rank=rank, timeout_s=cfg.timeout_s) \
            if cfg.verify_steps else None
        verify_init = verifier.start(module, optimizer, fresh=not cfg.resume) if verifier is not None else None
        verify_diffs: list[float] = []
        second = {b for _a, b in model.tied_parameters()}
        norm_terms = [(p, role.pipeline == 0 and name not in second and (role.tp_rank == 0 or is_sharded(p)))
                      for _l, name, p in named]
        source = make_batch_source(cfg.data, model, seed=cfg.seed, global_batch_size=plan.global_batch_size)
        denominator = [1]
        instrument = Instrument(slowdown=float(cfg.slowdown.get(role.device_type, 1.0)),
                                time_scale=float(cfg.time_scale) if cfg.slowdown else 1.0)
        schedule = pstage = None
        if role.num_micro_batches > 0:
            lane = layout.lane_ranks[role.pipeline][role.tp_rank]
            pstage, schedule = make_stage_schedule(
                module, stage_index=role.stage_index, num_stages=role.num_stages,
                num_micro_batches=role.num_micro_batches, micro_batch_size=b, seq_len=s, hidden_size=h,
                vocab_size=spec.vocab_size, training=tcfg, device=device, group=groups[lane], schedule=role.schedule,
                loss_fn=lambda out, tgt: lm_loss(out, tgt, denominator=denominator[0]))
            instrument.attach(pstage)

        steps_path = out_dir / f"rank{rank}.steps.jsonl"
        steps_path.unlink(missing_ok=True)
        step_times: list[float] = []
        phases: list[dict[str, float]] = []
        coll: list[dict[str, Any]] = []
        losses_out: list[float | None] = []
        events: list[dict[str, Any]] = []
        reports_loss = role.is_last and role.tp_rank == 0 and role.num_micro_batches > 0
        for step in range(start, start + cfg.steps):
            if step == cfg.fail_step and rank == cfg.fail_rank:
                logger.error("rank %d: injected failure (%s) at step %d", rank, cfg.fail_mode, step)
                if cfg.fail_mode == "hang":
                    time.sleep(2 * cfg.timeout_s)
                os._exit(17)
            optimizer.zero_grad(set_to_none=False)     # in place: grads are views of the sync buckets
            sync.begin_step(role.num_micro_batches, skip=step == cfg.skip_block_allreduce_step)
            instrument.reset()
            lr = optimizer.param_groups[0]["lr"]
            dist.barrier()
            ticks0, cpu0 = read_cpu_ticks() if rank == 0 else None, time.process_time()  # host: one reader
            t0 = time.perf_counter()
            inputs, targets = source.batch(step)
            denominator[0] = max(1, target_count(targets))
            t_sched = time.perf_counter()
            losses: list[torch.Tensor] = []
            if schedule is not None:
                lo, hi = role.sample_offset, role.sample_offset + role.num_samples
                x, y = split_micro_batches(inputs[lo:hi], targets[lo:hi], micro_batch_size=b,
                                           ignore_index=IGNORE_INDEX)
                t_sched = time.perf_counter()
                losses = run_schedule_step(schedule, x.to(device), y.to(device), is_first=role.is_first,
                                           is_last=role.is_last)
            t_sync = time.perf_counter()
            sync.finish()
            t_opt = time.perf_counter()
            if tcfg.clip_grad_norm is not None:
                clip_by_global_norm([(local_tensor(p.grad), c) for p, c in norm_terms], tcfg.clip_grad_norm)
            optimizer.step()
            scheduler.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t_end = time.perf_counter()
            step_loss = float(sum(float(l.detach()) for l in losses)) if reports_loss else None
            step_times.append(t_end - t0)
            losses_out.append(step_loss)
            phases.append(phase_record(t0, t_sched, t_sync, t_opt, t_end, instrument, proc_s=time.process_time() - cpu0,
                                       host=tick_delta(ticks0, read_cpu_ticks())))
            coll.append(collective_record(sync.stats))
            if verifier is not None:                   # after the step's timings and CPU counters
                verify_diffs.append(verifier.check(step, inputs, targets, module, optimizer))
            events = event_records(instrument, t0)
            done = step + 1
            if cfg.save_dir and (done == start + cfg.steps or (cfg.save_every and done % cfg.save_every == 0)):
                save_checkpoint(cfg.save_dir, step=done, module=module, optimizer=optimizer, scheduler=scheduler,
                                model_name=spec.name, num_layers=spec.num_layers,
                                extra={"seed": cfg.seed, "global_batch_size": plan.global_batch_size,
                                       "training": asdict(tcfg), "data": cfg.data})
            line = {"step": step, "time_s": t_end - t0, "loss": step_loss, "target_tokens": denominator[0],
                    "flops": flops_per_step, "peak_memory_bytes": peak_memory_bytes(device), "lr": lr}
            if verifier is not None:
                line["verify_difference"] = verify_diffs[-1]
            with steps_path.open("a") as f:
                f.write(json.dumps(line) + "\n")
        sync.close()
        result = {"rank": rank, "first_step": start, "pipeline": role.pipeline, "stage": role.stage_index,
                  "device_id": role.device_id, "device_type": role.device_type,
                  "layers": [role.layer_start, role.layer_stop],
                  "tp_degree": role.tp_degree, "tp_rank": role.tp_rank, "recompute": role.recompute,
                  "num_micro_batches": role.num_micro_batches, "micro_batch_size": b,
                  "num_samples": role.num_samples, "step_times_s": step_times, "phases": phases, "collectives": coll,
                  "losses": losses_out, "flops_per_step": flops_per_step,
                  "outputs_kept": len(pstage.output_chunks) if pstage is not None else 0,
                  "peak_memory_bytes": peak_memory_bytes(device),
                  "peak_memory_reserved_bytes": (int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda"
                                                 else None),
                  "slowdown": instrument.slowdown,
                  "time_scale": instrument.time_scale, "compute_s": instrument.compute_s, "cpu_s": instrument.cpu_s,
                  "padding_s": instrument.padding_s, "events": events}
        if verifier is not None:
            result.update(verify_init=verify_init, verify_steps=verify_diffs)
        if cfg.save_params:
            tmp = out_dir / f"rank{rank}.pt.tmp"
            torch.save(full_params(module, model), tmp)
            tmp.replace(out_dir / f"rank{rank}.pt")
        write_atomic(out_dir / f"rank{rank}.json", json.dumps(result))
        dist.barrier()                                  # nobody tears down while a peer still talks
        return result
    finally:
        dist.destroy_process_group()


def _peers(cfg: WorkerConfig, rank: int) -> list[int]:
    try:
        layout = group_layout(plan_from_dict(cfg.plan), tie_embeddings=cfg.tie_embeddings)
        return sorted({r for g in layout.creation_order() if rank in g for r in g} - {rank})
    except Exception:  # noqa: BLE001 - only for the error message
        return []


def worker_main(cfg: WorkerConfig, *, rank: int, world_size: int, out_dir: Path) -> int:
    """:func:`run_worker` that turns any failure into ``rank<r>.error`` and exit code 1."""
    try:
        run_worker(cfg, rank=rank, world_size=world_size, out_dir=out_dir)
        return 0
    except BaseException as exc:  # noqa: BLE001 - a rank must report, whatever killed it
        msg = (f"rank {rank} aborted: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
               f" (a peer may have died; this rank shares groups with ranks {_peers(cfg, rank)})")
        logger.error("%s", msg)
        logger.debug("%s", traceback.format_exc())
        try:
            write_atomic(out_dir / f"rank{rank}.error", msg + "\n")
        except OSError:
            pass
        return 1


def _binding(cfg: WorkerConfig, plan, *, local_rank: int) -> RankBinding:
    """This process's :class:`hpp.runtime.launch.binding.RankBinding` (torchrun's ``GROUP_RANK`` = the node rank)."""
    return worker_binding(plan, nnodes=cfg.nnodes, node_rank=int(os.environ.get("GROUP_RANK", 0)),
                          local_rank=local_rank, node_map=cfg.node_map)


def _main(argv: list[str]) -> int:
    die_with_parent(signal.SIGKILL)                   # torchrun's agent gone (killed launcher): no orphan rank
    if len(argv) != 2:
        sys.stderr.write("usage: python -m hpp.runtime.exec.worker CONFIG.json OUT_DIR\n")
        return 2
    cfg = WorkerConfig(**json.loads(Path(argv[0]).read_text()))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cfg.nnodes > 1:                                # torchrun's RANK is not the plan's rank across hosts
        plan = plan_from_dict(cfg.plan)
        try:
            rank, world_size = _binding(cfg, plan, local_rank=int(os.environ["LOCAL_RANK"])).rank, plan.num_devices
        except HppInputError as exc:
            sys.stderr.write(f"hpp worker: error: {exc}\n")
            return 2
    logging.basicConfig(level=os.environ.get("HPP_LOG_LEVEL", "WARNING"),
                        format=f"%(asctime)s %(name)s rank{rank}: %(message)s")
    return worker_main(cfg, rank=rank, world_size=world_size, out_dir=Path(argv[1]))


def config_to_json(cfg: WorkerConfig) -> str:
    """JSON text of ``cfg`` (read back by ``python -m hpp.runtime.exec.worker``)."""
    return json.dumps(asdict(cfg))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
