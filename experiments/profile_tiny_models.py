"""Regenerate the bundled CPU profiles of the tiny runtime models (opt-tiny, gpt-neo-tiny, llama-tiny).

    python experiments/profile_tiny_models.py [--models llama-tiny,...] [--repeats 20] [--warmup 5]
    python experiments/profile_tiny_models.py --time-terms-only [--models gpt-tiny,opt-tiny,...]

Per model: ``hpp profile``'s measurement (:func:`hpp.runtime.profile.profiler.profile_model`) on
one CPU thread at micro-batch sizes 1, 2, 4 (device type ``cpu``), TP degree 2 entries,
and the emulated 2x slower type ``cpu-2x`` (:func:`~hpp.runtime.profile.profiler.scale_profile`
of both TP degrees, as cpu-hetero-4's gpt-tiny profile).

TP 2 (``--tp2 measure``, the default) is MEASURED: two gloo ranks (forked, one compute
thread each) shard each layer as ``hpp run`` does (:func:`hpp.runtime.exec.tensor_parallel.
parallelize_stage`) and time it with :func:`hpp.runtime.profile.profiler.measure_layer` (CPU time of
the compute thread, so DTensor's dispatch and the ranks' share of compute are counted; time
spent waiting for the peer in an all-reduce is not); an entry takes the slower rank's
median per layer; param_bytes are one rank's local shards; activation_bytes and
output_bytes are TP 1's (an upper bound / the whole hidden state a stage sends).
``--tp2 derive`` instead DERIVES TP 2 from TP 1 without measuring:

- forward, backward and optimizer seconds = TP 1 / 2 (perfect split, no TP overhead
  priced: far too optimistic on CPU, where DTensor's per-op overhead dominates tiny layers);
- param_bytes = the bytes one TP rank holds under the model's ``tp_plan(layer, 2)``
  (colwise weight and bias, rowwise weight, vocabulary tables halved; norms,
  position tables and rowwise biases whole);
- activation_bytes and output_bytes = TP 1's.

Each TP 2 entry says which in its note. Every entry then gets the runtime step's time terms
(``step_time``: loss, schedule overhead, gloo send/recv) and the profile the host's CPU
contention (``meta["host_time"]``), measured once for all models
(:mod:`hpp.runtime.profile.time_terms`); no memory terms (the bundled CPU profiles keep the
calibrated memory formula, so cpu-hetero-4's plans stay as they are).
``--time-terms-only`` adds the time terms to the existing files (any bundled CPU profile,
``gpt-tiny`` included) and leaves their measured layers alone.

Writes ``hpp/profiles/data/profile-<model>.json`` (``--out-dir`` to write elsewhere) and
prints one JSON line per model.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.profile_format import load_profile, save_profile
from hpp.runtime.profile.profiler import profile_model, scale_profile  # noqa: E402
from hpp.runtime.profile.time_terms import HostStepTerms, add_measured_time_terms, measure_host_step_terms  # noqa: E402
from hpp.runtime.models.stage import build_stage  # noqa: E402
from hpp.runtime.exec.tensor_parallel import local_tensor, parallelize_stage  # noqa: E402
from hpp.runtime.models.zoo import load_runtime_model  # noqa: E402

log = logging.getLogger("profile_tiny_models")
TINY_MODELS = ("opt-tiny", "gpt-neo-tiny", "llama-tiny")
DERIVED_TP = 2


def tp_param_bytes(model, index: int, tp_degree: int, *, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of layer ``index``'s parameters on ONE rank under ``model.tp_plan(index, tp_degree)``."""
    layer = model.build_layer(index, seed=0, dtype=dtype)
    plan = model.tp_plan(index, tp_degree)
    total = 0
    for name, p in layer.named_parameters():
        owner, _, leaf = name.rpartition(".")
        style = plan.get(owner)
        sharded = style is not None and not (leaf == "bias" and style in ("rowwise", "embedding"))
        total += p.numel() * p.element_size() // (tp_degree if sharded else 1)
    return total


def derive_tp(profile: ModelProfile, model, tp_degree: int) -> ModelProfile:
    """Add TP ``tp_degree`` entries derived from every TP 1 entry (module docstring)."""
    params = tuple(tp_param_bytes(model, l, tp_degree) for l in range(profile.num_layers))
    entries = dict(profile.entries)
    for e in [e for e in profile.entries.values() if e.tp_degree == 1]:
        d = replace(e, tp_degree=tp_degree, forward_s=tuple(t / tp_degree for t in e.forward_s),
                    backward_s=tuple(t / tp_degree for t in e.backward_s),
                    optimizer_s=tuple(t / tp_degree for t in e.optimizer_s), param_bytes=params,
                    note=f"derived, not measured: TP {tp_degree} = TP 1 ({e.device_type}) forward, backward and "
                         f"optimizer seconds / {tp_degree} (TP all-reduces not priced), param_bytes = one rank's "
                         f"share under the model's tp_plan, activation_bytes and output_bytes = TP 1's "
                         f"(experiments/profile_tiny_models.py)")
        entries[d.key] = d
    return replace(profile, entries=entries,
                   meta=dict(profile.meta, derived_tp={"degree": tp_degree, "rule": "seconds / TP; param_bytes "
                             "from tp_plan; activation and output bytes as TP 1"}))


def _tp_worker(rank: int, name: str, tp: int, sizes: Sequence[int], warmup: int, repeats: int, init: str,
               out_dir: str) -> None:
    """One TP rank: every layer sharded as hpp run shards it, timed at every micro-batch size."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=tp)
    model = load_runtime_model(name)
    spec = model.spec
    gen = torch.Generator().manual_seed(0)            # same draws on every rank: replicated inputs
    rows: dict[int, list[dict]] = {b: [] for b in sizes}
    for l in range(spec.num_layers):
        stage = build_stage(model, l, l + 1, seed=0, dtype=torch.float32)
        parallelize_stage(stage, model, tp_group=dist.group.WORLD, tp_degree=tp, device=torch.device("cpu"))
        local_bytes = sum(local_tensor(p).numel() * local_tensor(p).element_size() for p in stage.parameters())
        for b in sizes:
            def make_input(l: int = l, b: int = b) -> torch.Tensor:
                if l == 0:
                    return torch.randint(0, spec.vocab_size, (b, spec.seq_len), generator=gen)
                return torch.randn(b, spec.seq_len, spec.hidden_size, generator=gen).requires_grad_(True)
            dist.barrier()
            r = _timed(stage, make_input, warmup=warmup, repeats=repeats)
            rows[b].append({**r, "param_bytes": local_bytes})
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({str(b): v for b, v in rows.items()}))
    dist.destroy_process_group()


def _timed(layer, make_input, *, warmup: int, repeats: int) -> dict[str, float]:
    """Median forward/backward/optimizer CPU seconds of ``layer`` (hpp.runtime.profile.profiler.measure_layer's loop)."""
    params = list(layer.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    fwd, bwd, step = [], [], []
    x = make_input()
    for i in range(warmup + repeats):
        t0 = time.thread_time()
        y = layer(x)
        t1 = time.thread_time()
        y.backward(torch.ones_like(y))
        t2 = time.thread_time()
        opt.step()
        t3 = time.thread_time()
        opt.zero_grad(set_to_none=False)
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t3 - t2)
    return {"forward_s": statistics.median(fwd), "backward_s": statistics.median(bwd),
            "optimizer_s": statistics.median(step)}


def measure_tp(profile: ModelProfile, name: str, tp: int, *, warmup: int, repeats: int) -> ModelProfile:
    """Add TP ``tp`` entries for device type ``cpu``, measured on ``tp`` forked gloo ranks (module docstring)."""
    import hpp.runtime.models.hf_layers  # noqa: F401  (imported once; the forked ranks inherit it)
    sizes = sorted({k[2] for k in profile.entries if k[0] == "cpu" and k[1] == 1})
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_tp_worker, args=(name, tp, sizes, warmup, repeats, f"file://{d}/init", d), nprocs=tp,
                           join=True, start_method="fork")
        ranks = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(tp)]
    entries = dict(profile.entries)
    for b in sizes:
        e = profile.entries[("cpu", 1, b)]
        per_rank = [r[str(b)] for r in ranks]
        slowest = {k: tuple(max(rows[l][k] for rows in per_rank) for l in range(profile.num_layers))
                   for k in ("forward_s", "backward_s", "optimizer_s", "param_bytes")}
        d_ = replace(e, tp_degree=tp, forward_s=slowest["forward_s"], backward_s=slowest["backward_s"],
                     optimizer_s=slowest["optimizer_s"], param_bytes=tuple(int(x) for x in slowest["param_bytes"]),
                     note=f"measured on {tp} gloo ranks sharded as hpp run shards them (tensor_parallel."
                          f"parallelize_stage): median of {repeats} after {warmup} warm-up, CPU time of each rank's "
                          f"compute thread (waits for the peer not counted), the slower rank per layer; param_bytes "
                          f"= one rank's shards; activation_bytes and output_bytes = TP 1's "
                          f"(experiments/profile_tiny_models.py)")
        entries[d_.key] = d_
    return replace(profile, entries=entries, meta=dict(profile.meta, measured_tp={
        "degree": tp, "ranks": tp, "clock": "thread_time of each rank's compute thread, slower rank per layer"}))


def make_profile(name: str, *, sizes: Sequence[int], repeats: int, warmup: int, tp2: str = "measure",
                 shared: HostStepTerms | None = None) -> ModelProfile:
    model = load_runtime_model(name)
    prof = profile_model(name, device="cpu", micro_batch_sizes=sizes, warmup=warmup, repeats=repeats,
                         num_threads=1, memory_terms=False)
    if tp2 == "measure":
        prof = measure_tp(prof, name, DERIVED_TP, warmup=warmup, repeats=repeats)
    else:
        prof = derive_tp(prof, model, DERIVED_TP)
    prof = scale_profile(prof, {"cpu-2x": 2.0}, base_device_type="cpu")
    prof = add_measured_time_terms(prof, model=name, shared=shared)
    load = prof.meta["load_average"]
    how = "measured on 2 gloo ranks" if tp2 == "measure" else "derived from TP 1"
    source = (f"measured on this project's CPU host by experiments/profile_tiny_models.py (hpp.runtime.profile.profiler, "
              f"{repeats} repeats after {warmup} warm-up): machine {platform.node()!r} ({platform.machine()}, "
              f"{load['cores']} cores, 1-minute load {load['before']} before and {load['after']} after, other jobs "
              f"running), torch {torch.__version__}, {prof.meta['date']}; CPU time of one compute thread; cpu-2x = "
              f"cpu x 2 (emulated); TP {DERIVED_TP} entries {how} (see their notes); runtime step time terms "
              f"and host contention by hpp.runtime.profile.time_terms. The bundled CPU profile of {name} "
              f"(hpp.runtime.models.hf).")
    return replace(prof, source=source, licence="MIT (this project)")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="profile_tiny_models", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(TINY_MODELS))
    p.add_argument("--micro-batch-sizes", default="1,2,4")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out-dir", type=Path, default=ROOT / "hpp" / "profiles" / "data")
    p.add_argument("--tp2", choices=("measure", "derive"), default="measure",
                   help="TP 2 entries: measured on 2 gloo ranks (default) or derived from TP 1")
    p.add_argument("--time-terms-only", action="store_true",
                   help="only add the runtime step's time terms to the existing profile files")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sizes = tuple(int(x) for x in args.micro_batch_sizes.split(","))
    shared = measure_host_step_terms()                 # model-independent: once for every model
    for name in args.models.split(","):
        out = args.out_dir / f"profile-{name}.json"
        if args.time_terms_only:
            src = ROOT / "hpp" / "profiles" / "data" / f"profile-{name}.json"
            prof = add_measured_time_terms(load_profile(src), model=name, shared=shared)
            note = " Runtime step time terms and host contention added by experiments/profile_tiny_models.py"
            prof = replace(prof, source=prof.source.split(note)[0].rstrip() + note + " --time-terms-only "
                           f"(hpp.runtime.profile.time_terms, 1-minute load {prof.meta['host_time']['load_average']}).")
        else:
            prof = make_profile(name, sizes=sizes, repeats=args.repeats, warmup=args.warmup, tp2=args.tp2,
                                shared=shared)
        save_profile(prof, out)
        ms = {f"cpu_tp{t}_mb{b}_fwd_bwd_ms": round(1e3 * (sum(e.forward_s) + sum(e.backward_s)), 3)
              for (dev, t, b), e in sorted(prof.entries.items()) if dev == "cpu"}
        print(json.dumps({"model": name, "out": str(out), "num_layers": prof.num_layers,
                          "entries": len(prof.entries), **ms}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
