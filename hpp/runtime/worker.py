"""One rank of an HPP run: its pipeline stage, the block all-reduces, the optimizer step.

Entry points: :func:`run_worker` (a library call, used by the fork launcher of
the tests) and ``python -m hpp.runtime.worker CONFIG.json OUT_DIR`` (what
``torchrun`` starts; rank and world size come from its environment).

Each rank writes ``OUT_DIR/rank<r>.json`` (and ``rank<r>.pt`` with its parameters
if asked) through a temporary file and a rename, or ``rank<r>.error`` with the
reason when it fails; so a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import logging
import os
import resource
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
from hpp.plan import plan_from_dict
from hpp.runtime.emulation import Instrument
from hpp.runtime.gradsync import GradSync
from hpp.runtime.layout import blocks, group_layout, rank_roles, split_micro_batches, synthetic_batch
from hpp.runtime.reference import make_optimizer
from hpp.runtime.models import IGNORE_INDEX, ModelConfig, build_stage_module, lm_loss, tied_param_names

__all__ = ["WorkerConfig", "run_worker", "worker_main", "write_atomic", "config_to_json"]

logger = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a rank needs; plain JSON data.

    Attributes
    ----------
    plan : dict
        The plan's JSON object (:func:`hpp.plan.plan_to_dict`), already validated.
    model : dict
        :class:`ModelConfig` fields.
    steps, warmup_steps : int
        Optimizer steps; the first ``warmup_steps`` are left out of the median.
    slowdown : dict[str, float]
        Per device type, the emulated slowdown (empty: no emulation).
    time_scale : float
        Common dilation of every emulated device (>= 1; see :mod:`hpp.runtime.emulation`);
        applied only when ``slowdown`` is not empty.
    timeout_s : float
        Process-group timeout [s]: a dead peer makes this rank fail within it.
    fail_rank, fail_step : int
        Fault injection for tests: that rank fails at that step (-1: never).
    fail_mode : str
        ``"exit"`` (the process dies at once) or ``"hang"`` (it stops answering for
        ``2 * timeout_s``, then dies).
    """

    plan: dict
    model: dict
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


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through ``path.tmp`` and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def run_worker(cfg: WorkerConfig, *, rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """Run rank ``rank`` of the plan for ``cfg.steps`` steps; return (and write) its result.

    ``MASTER_ADDR``/``MASTER_PORT`` must be set (torchrun or the fork launcher does).

    Returns
    -------
    dict
        ``rank``, ``pipeline``, ``stage``, ``layers``, ``step_times_s`` (per step [s]),
        ``phases`` (per step: ``batch_s``, ``schedule_s``, ``sync_wait_s``, ``optimizer_s``
        wall seconds and the stage's ``compute_s``/``cpu_s``/``padding_s``),
        ``collectives`` (count and bytes per step, counted once per collective),
        ``peak_memory_bytes``, ``compute_s``/``cpu_s``/``padding_s`` of the last step and its
        ``events`` (forward/backward per micro-batch, seconds from the step start).
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    plan = plan_from_dict(cfg.plan)
    if plan.num_devices != world_size:
        raise HppInputError(f"the plan has {plan.num_devices} devices but the world size is {world_size}",
                            field="pipelines", fix=f"launch exactly {plan.num_devices} ranks")
    mcfg = ModelConfig(**cfg.model)
    role = rank_roles(plan)[rank]
    layout = group_layout(plan, tie_embeddings=cfg.tie_embeddings)
    torch.set_num_threads(cfg.num_threads)
    if cfg.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dtype = _DTYPES[cfg.dtype]
    # NCCL: bind the group to this rank's GPU (else torch guesses it from the rank, and barrier() warns)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=cfg.timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in layout.creation_order():           # every rank, same order
            groups[ranks] = dist.new_group(list(ranks), timeout=timedelta(seconds=cfg.timeout_s))
        module = build_stage_module(mcfg, role.layer_start, role.layer_stop, seed=cfg.seed, dtype=dtype,
                                    tie_embeddings=cfg.tie_embeddings, device=device, recompute=role.recompute)
        params = dict((name, p) for _l, name, p in module.layer_parameters())
        for p in params.values():
            p.grad = torch.zeros_like(p)
        tied = None
        if cfg.tie_embeddings and rank in layout.tied_ranks:
            emb, head = tied_param_names(mcfg)
            tied_p = params.get(emb, params.get(head))
            tied = (tied_p, layout.tied_ranks, groups.get(layout.tied_ranks))
        local_blocks = [((lo, hi), ranks, groups.get(ranks))
                        for (lo, hi), ranks in zip(blocks(plan), layout.block_ranks) if rank in ranks]
        if cfg.skip_block_allreduce:                    # the control experiment: must NOT match
            local_blocks = []
        sync = GradSync(module, rank=rank, local_blocks=local_blocks, tied=tied, bucket_bytes=cfg.bucket_bytes,
                        overlap=cfg.overlap, naive=cfg.naive_allreduce)
        optimizer = make_optimizer(cfg.optimizer, list(params.values()), lr=cfg.lr)

        b, s, h = role.micro_batch_size, mcfg.seq_len, mcfg.hidden_size
        denominator = plan.global_batch_size * s
        instrument = Instrument(slowdown=float(cfg.slowdown.get(role.device_type, 1.0)),
                                time_scale=float(cfg.time_scale) if cfg.slowdown else 1.0)
        schedule = None
        if role.num_micro_batches > 0:
            pgroup = groups.get(layout.pipeline_ranks[role.pipeline])
            in_arg = (torch.zeros(b, s, dtype=torch.long, device=device) if role.is_first
                      else torch.zeros(b, s, h, dtype=dtype, device=device, requires_grad=True))
            out_arg = torch.zeros(b, s, mcfg.vocab_size if role.is_last else h, dtype=dtype, device=device,
                                  requires_grad=True)
            stage = PipelineStage(module, role.stage_index, role.num_stages, device, input_args=in_arg,
                                  output_args=out_arg, group=pgroup)
            instrument.attach(stage)
            cls = Schedule1F1B if role.schedule == "1F1B" else ScheduleGPipe
            schedule = cls(stage, role.num_micro_batches, loss_fn=lambda out, tgt: lm_loss(
                out, tgt, denominator=denominator), scale_grads=False)

        step_times: list[float] = []
        phases: list[dict[str, float]] = []
        coll: list[dict[str, int]] = []
        events: list[dict[str, Any]] = []
        for step in range(cfg.steps):
            if step == cfg.fail_step and rank == cfg.fail_rank:
                logger.error("rank %d: injected failure (%s) at step %d", rank, cfg.fail_mode, step)
                if cfg.fail_mode == "hang":
                    time.sleep(2 * cfg.timeout_s)
                os._exit(17)
            optimizer.zero_grad(set_to_none=False)
            sync.begin_step(role.num_micro_batches)
            instrument.reset()
            dist.barrier()
            t0 = time.perf_counter()
            t_sched = t0
            if schedule is not None:
                inputs, targets = synthetic_batch(step, seed=cfg.seed, global_batch_size=plan.global_batch_size,
                                                  seq_len=s, vocab_size=mcfg.vocab_size)
                lo, hi = role.sample_offset, role.sample_offset + role.num_samples
                x, y = split_micro_batches(inputs[lo:hi], targets[lo:hi], micro_batch_size=b,
                                           ignore_index=IGNORE_INDEX)
                x, y = x.to(device), y.to(device)
                args = (x,) if role.is_first else ()
                kwargs = {"target": y} if role.is_last else {}
                t_sched = time.perf_counter()
                schedule.step(*args, **kwargs)
            t_sync = time.perf_counter()
            sync.finish()
            t_opt = time.perf_counter()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t_end = time.perf_counter()
            step_times.append(t_end - t0)
            phases.append({"batch_s": t_sched - t0, "schedule_s": t_sync - t_sched, "sync_wait_s": t_opt - t_sync,
                           "optimizer_s": t_end - t_opt, "compute_s": instrument.compute_s,
                           "cpu_s": instrument.cpu_s, "padding_s": instrument.padding_s})
            coll.append({"count": sync.stats.count, "bytes": sync.stats.bytes,
                         "joined_count": sync.stats.joined_count,
                         "launched_in_backward": sync.stats.launched_in_backward})
            events = [{"kind": e.kind, "micro_batch": e.micro_batch, "start_s": e.start_s - t0,
                       "stop_s": e.stop_s - t0} for e in instrument.events]
        sync.close()
        result = {"rank": rank, "pipeline": role.pipeline, "stage": role.stage_index, "device_id": role.device_id,
                  "device_type": role.device_type, "layers": [role.layer_start, role.layer_stop],
                  "recompute": role.recompute,
                  "num_micro_batches": role.num_micro_batches, "micro_batch_size": b,
                  "num_samples": role.num_samples, "step_times_s": step_times, "phases": phases, "collectives": coll,
                  "peak_memory_bytes": _peak_memory_bytes(device), "slowdown": instrument.slowdown,
                  "time_scale": instrument.time_scale, "compute_s": instrument.compute_s, "cpu_s": instrument.cpu_s,
                  "padding_s": instrument.padding_s, "events": events}
        if cfg.save_params:
            tmp = out_dir / f"rank{rank}.pt.tmp"
            torch.save({k: v.detach().cpu() for k, v in params.items()}, tmp)
            tmp.replace(out_dir / f"rank{rank}.pt")
        write_atomic(out_dir / f"rank{rank}.json", json.dumps(result))
        dist.barrier()                                  # nobody tears down while a peer still talks
        return result
    finally:
        dist.destroy_process_group()


def worker_main(cfg: WorkerConfig, *, rank: int, world_size: int, out_dir: Path) -> int:
    """:func:`run_worker` that turns any failure into ``rank<r>.error`` and exit code 1."""
    try:
        run_worker(cfg, rank=rank, world_size=world_size, out_dir=out_dir)
        return 0
    except BaseException as exc:  # noqa: BLE001 - a rank must report, whatever killed it
        peers = sorted({r for g in group_layout(plan_from_dict(cfg.plan),
                                                tie_embeddings=cfg.tie_embeddings).creation_order()
                        if rank in g for r in g} - {rank})
        msg = (f"rank {rank} aborted: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
               f" (a peer may have died; this rank shares groups with ranks {peers})")
        logger.error("%s", msg)
        logger.debug("%s", traceback.format_exc())
        try:
            write_atomic(out_dir / f"rank{rank}.error", msg + "\n")
        except OSError:
            pass
        return 1


def _main(argv: list[str]) -> int:
    logging.basicConfig(level=os.environ.get("HPP_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(name)s rank" + os.environ.get("RANK", "?") + ": %(message)s")
    if len(argv) != 2:
        sys.stderr.write("usage: python -m hpp.runtime.worker CONFIG.json OUT_DIR\n")
        return 2
    cfg = WorkerConfig(**json.loads(Path(argv[0]).read_text()))
    return worker_main(cfg, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                       out_dir=Path(argv[1]))


def config_to_json(cfg: WorkerConfig) -> str:
    """JSON text of ``cfg`` (read back by ``python -m hpp.runtime.worker``)."""
    return json.dumps(asdict(cfg))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
