"""Runtime overhead: ``hpp run`` vs a plain torch.distributed.pipelining + DDP-style all-reduce script.

Both run the same homogeneous plan in this one process tree, on CPU/gloo: 2 pipelines
x 2 stages, TP 1, the same model (``--model``, default ``gpt-tiny``), global batch,
micro-batches, 1F1B schedule, AdamW and float32. The plain script (:func:`_plain_rank`,
below) is what a user would write by hand: one ``PipelineStage`` + ``Schedule1F1B`` per
rank, then ONE flat all-reduce of the stage's gradients among the stage's replicas (what
DDP does with a single bucket; the model is far below DDP's 25 MiB bucket), then the
optimizer step. ``hpp run`` (:func:`hpp.runtime.run.run_plan`, fork launcher) adds its
block-wise gradient sync, per-step metrics, instrumentation and batch slicing.

A step is timed the same way in both: from a barrier at the step start to the end of
the slowest rank's optimizer step. The two alternate for ``--rounds`` rounds (so that
load from other processes on the host hits both alike); each reports the median over
all kept steps (the first ``--warmup`` of each round left out), and the median of the
rounds' paired ratios (a round's two runs are adjacent in time). Target: ratio
(hpp / plain) <= 1.02.

Wall time on a shared host scatters far more than 2 % (other processes take the
cores; 4 ranks on 2 cores wait for each other). So the benchmark also reports the
CPU seconds the ranks spend per step (user + system of the forked ranks, from
``getrusage(RUSAGE_CHILDREN)``; a short run of ``--warmup + 1`` steps per
implementation gives the start-up CPU, subtracted), which load barely changes: the
extra work ``hpp run`` does per step, whatever the host is doing. Writes
``experiments/results/runtime_overhead.csv`` (both medians, then each round, with the
load average).

    python experiments/runtime_overhead.py [--model gpt-tiny] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Sequence

import torch  # noqa: F401  (the fork launcher needs torch imported in the parent)

RESULTS = Path(__file__).resolve().parent / "results"
_CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "cpu-4",
            "device_types": {"cpu": {"memory_bytes": 8 * 2**30, "gpus_per_node": 4}},
            "nodes": [{"device_type": "cpu", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1e9}],
            "inter_node_bandwidth_bytes_per_s": 1e9}


def _plan(model: str, num_layers: int, *, global_batch: int, micro_batch: int, seq_len: int):
    from hpp.plan_data import Pipeline, Plan, Stage
    cut = num_layers // 2
    pipes = tuple(Pipeline((Stage(0, cut, "cpu", 1, (2 * p,)), Stage(cut, num_layers, "cpu", 1, (2 * p + 1,))),
                           micro_batch, global_batch // 2, "1F1B") for p in range(2))
    return Plan(model, num_layers, global_batch, pipes, sequence_length=seq_len, cluster_ref=_CLUSTER)


# ------------------------------------------------------------------ the plain script, one function per rank
# Imports inside the rank functions and _preload are part of what is measured (what each forked rank loads
# itself); keep them where they are.
def _plain_rank(rank: int, port: int, model_name: str, plan_lo_hi: list, g: int, b: int, steps: int,
                lr: float, out: str) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from hpp.runtime.models.api import IGNORE_INDEX, synthetic_batch
    from hpp.runtime.models.stage import build_stage
    from hpp.runtime.models.zoo import load_runtime_model
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=timedelta(seconds=300))
    pipe_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]        # pipeline p = ranks 2p, 2p+1
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]          # stage s's replicas = ranks s, s+2
    pipe, stage_idx = divmod(rank, 2)
    model = load_runtime_model(model_name)
    spec = model.spec
    lo, hi = plan_lo_hi[stage_idx]
    module = build_stage(model, lo, hi, seed=0, dtype=torch.float32)
    params = [p for p in module.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    first, last = stage_idx == 0, stage_idx == 1
    x_in = (torch.zeros(b, spec.seq_len, dtype=torch.long) if first
            else torch.zeros(b, spec.seq_len, spec.hidden_size, requires_grad=True))
    stage = PipelineStage(module, stage_idx, 2, torch.device("cpu"), input_args=x_in, group=pipe_groups[pipe])
    denom = g * spec.seq_len
    loss_fn = lambda y, t: F.cross_entropy(y.reshape(-1, y.shape[-1]), t.reshape(-1),  # noqa: E731
                                           ignore_index=IGNORE_INDEX, reduction="sum") / denom
    sched = Schedule1F1B(stage, g // 2 // b, loss_fn=loss_fn, scale_grads=False)
    times = []
    for step in range(steps):
        opt.zero_grad(set_to_none=False)
        dist.barrier()
        t0 = time.perf_counter()
        x, y = synthetic_batch(step, seed=0, global_batch_size=g, seq_len=spec.seq_len, vocab_size=spec.vocab_size)
        mine = slice(pipe * g // 2, (pipe + 1) * g // 2)
        sched.step(*((x[mine],) if first else ()), **({"target": y[mine]} if last else {}))
        flat = torch.cat([p.grad.reshape(-1) for p in params])             # DDP-style: one bucket
        dist.all_reduce(flat, group=dp_groups[stage_idx])
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        times.append(time.perf_counter() - t0)
    Path(out, f"plain{rank}.txt").write_text(" ".join(f"{t:.9f}" for t in times))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of every child process waited for so far (the ranks, after join)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_plain(model: str, lo_hi: list, *, g: int, b: int, steps: int, lr: float) -> tuple[list[float], float]:
    """Per-step times [s] of the plain script (slowest rank per step), and its ranks' CPU seconds."""
    from hpp.runtime.launch.processes import free_port
    ctx = mp.get_context("fork")
    cpu0 = _children_cpu_s()
    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        procs = [ctx.Process(target=_plain_rank, args=(r, port, model, lo_hi, g, b, steps, lr, out))
                 for r in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"plain script failed: exit codes {[p.exitcode for p in procs]}")
        per_rank = [[float(t) for t in Path(out, f"plain{r}.txt").read_text().split()] for r in range(4)]
    return [max(ts) for ts in zip(*per_rank)], _children_cpu_s() - cpu0


def run_hpp(plan_path: Path, *, model: str, steps: int, lr: float) -> tuple[list[float], float]:
    """Per-step times [s] of ``hpp run`` (slowest rank per step), and its ranks' CPU seconds."""
    from hpp.runtime.config import RunConfig
    from hpp.runtime.run import run_plan
    cpu0 = _children_cpu_s()
    rep = run_plan(RunConfig.build(plan_path, steps=steps, model=model, launcher="fork", optimizer="adamw", lr=lr,
                                   dtype="float32", warmup_steps=0))
    return list(rep.measured["step_times_s"]), _children_cpu_s() - cpu0


def _preload(model: str) -> None:
    """Import in this process what the ranks import lazily (pipelining, DTensor, the FLOP counter and its
    fake tensors), so that forked ranks start with it: less start-up CPU, and less of its scatter in the
    per-step CPU figure."""
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    from hpp.runtime.models.stage import build_stage
    from hpp.runtime.exec.training import measure_stage_flops
    from hpp.runtime.models.zoo import load_runtime_model
    rt = load_runtime_model(model)
    spec = rt.spec
    measure_stage_flops(build_stage(rt, 0, 1, seed=0), is_first=True, is_last=False, micro_batch_size=1,
                        seq_len=spec.seq_len, hidden_size=spec.hidden_size, dtype=torch.float32)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-tiny")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="steps per round and implementation")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out at the start of each round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "runtime_overhead.csv"))
    args = ap.parse_args(argv)
    from hpp.plan_data import write_plan_json
    from hpp.runtime.models.zoo import load_runtime_model
    spec = load_runtime_model(args.model).spec
    plan = _plan(spec.name, spec.num_layers, global_batch=args.global_batch, micro_batch=args.micro_batch,
                 seq_len=spec.seq_len)
    lo_hi = [(st.layer_start, st.layer_stop) for st in plan.pipelines[0].stages]
    _preload(args.model)
    kept: dict[str, list[float]] = {"hpp run": [], "plain": []}
    per_round: list[dict[str, float]] = []
    cpu_rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        write_plan_json(plan, path)
        run = {"hpp run": lambda n: run_hpp(path, model=args.model, steps=n, lr=1e-3),
               "plain": lambda n: run_plain(args.model, lo_hi, g=args.global_batch, b=args.micro_batch, steps=n,
                                            lr=1e-3)}
        short = args.warmup + 1                          # start-up CPU: subtracted from each round's
        start_cpu = {name: run[name](short)[1] for name in run}
        for rnd in range(args.rounds):
            meds, cpus = {}, {}
            for name in ("hpp run", "plain") if rnd % 2 == 0 else ("plain", "hpp run"):
                t0 = time.perf_counter()
                ts, cpu = run[name](args.steps)
                kept[name] += ts[args.warmup:]
                meds[name] = statistics.median(ts[args.warmup:])
                cpus[name] = (cpu - start_cpu[name]) / (args.steps - short) / 4          # per step and rank
                print(f"round {rnd + 1} {name:<8} median {meds[name] * 1e3:8.2f} ms/step, CPU "
                      f"{cpus[name] * 1e3:7.2f} ms per step and rank ({time.perf_counter() - t0:.1f} s wall, load "
                      f"{os.getloadavg()[0]:.1f})", file=sys.stderr)
            per_round.append(meds)
            cpu_rounds.append(cpus)
    med = {k: statistics.median(v) for k, v in kept.items()}
    cpu = {k: statistics.median(r[k] for r in cpu_rounds) for k in kept}
    ratio = med["hpp run"] / med["plain"]
    paired = statistics.median(r["hpp run"] / r["plain"] for r in per_round)
    common = {"model": args.model, "pipelines": 2, "stages": 2, "global_batch": args.global_batch,
              "micro_batch": args.micro_batch, "cpu_count": os.cpu_count(),
              "load_avg_1min": round(os.getloadavg()[0], 2)}
    rows = [{"row": "all rounds", "implementation": k, **common, "steps_kept": len(v), "median_step_s": med[k],
             "p25_step_s": statistics.quantiles(v, n=4)[0], "p75_step_s": statistics.quantiles(v, n=4)[2],
             "ratio_to_plain": med[k] / med["plain"], "cpu_s_per_step_rank": cpu[k],
             "cpu_ratio_to_plain": cpu[k] / cpu["plain"]} for k, v in kept.items()]
    rows += [{"row": f"round {i + 1}", "implementation": k, **common, "steps_kept": args.steps - args.warmup,
              "median_step_s": r[k], "p25_step_s": "", "p75_step_s": "", "ratio_to_plain": r[k] / r["plain"],
              "cpu_s_per_step_rank": c[k], "cpu_ratio_to_plain": c[k] / c["plain"]}
             for i, (r, c) in enumerate(zip(per_round, cpu_rounds)) for k in ("hpp run", "plain")]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    busy = (f"; but the host was busy (load {common['load_avg_1min']} on {os.cpu_count()} cores): the rounds "
            "scatter more than 2 %, so read the CPU figure" if common["load_avg_1min"] > (os.cpu_count() or 1) else "")
    print(f"hpp run: median {med['hpp run'] * 1e3:.2f} ms/step; plain pipelining + all-reduce: median "
          f"{med['plain'] * 1e3:.2f} ms/step; ratio {ratio:.3f}, median of the {args.rounds} paired rounds' ratios "
          f"{paired:.3f} (target <= 1.02: {'met' if ratio <= 1.02 else 'not met'}{busy}); CPU per step and rank "
          f"{cpu['hpp run'] * 1e3:.2f} vs {cpu['plain'] * 1e3:.2f} ms, ratio {cpu['hpp run'] / cpu['plain']:.3f}; "
          f"load average {common['load_avg_1min']} on {os.cpu_count()} cores; {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
