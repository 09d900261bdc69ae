"""The memory model vs the runtime's real stage step, per stage, at real model size, with no GPU (issue 17).

For ``opt-350``, ``gpt-neo-2.7`` and ``llama-3-8`` (the HF architectures of
:mod:`hpp.runtime.models.zoo`) on one-pipeline plans of 1, 2 and 4 stages (even layer split),
TP 1 and 2:

1. **profile**: the per-layer memory terms (:func:`hpp.runtime.profile.memory_terms.memory_terms`:
   each distinct layer measured ALONE, one micro-batch, FakeTensor + MemTracker) go into a
   native profile entry, written as JSON and read back;
2. **predict**: :func:`hpp.formulation.cost_model.estimate_plan` of the plan with that
   profile (:func:`~hpp.formulation.cost_model.stage_memory_breakdown`): the predicted peak
   of every stage;
3. **measure**: :func:`hpp.runtime.profile.stage_memory.measure_stage_step` runs the stage's real
   training step (the runtime's ``PipelineStage`` + ``Schedule1F1B`` over all micro-batches,
   the loss, the AdamW step) under FakeTensorMode and MemTracker with a fake process group.

The prediction never sees the stage's own measurement. Prints a table and, last,
``memory: max |error| X % over N stages``; writes ``experiments/results/memory_validation.csv``.
Also re-measures the H200 run of ``experiments/results/gpu_check_h200`` (legacy ``opt-350``,
b = 8, 4 micro-batches, SGD) with the runtime as it was (``legacy_waste``) and as it is.

Usage: ``python experiments/memory_validation.py [--quick] [--models M,..] [--stages 1,2,4]
[--tp 1,2] [--dtype float32|bfloat16] [--recompute none|full] [--workers N] [--out CSV]``
(``--quick``: the tiny variants, seconds).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import dataclasses
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpp.formulation.cost_config import CostModelConfig  # noqa: E402
from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import Pipeline, Plan, Stage  # noqa: E402
from hpp.profiles.cluster import Cluster, Link, Node  # noqa: E402
from hpp.profiles.devices import DeviceType  # noqa: E402
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.profiles.profile_format import load_profile, save_profile

logger = logging.getLogger("memory_validation")
OUT = REPO / "experiments" / "results" / "memory_validation.csv"
#: Micro-batch size per model (the H200 plan's b = 8 for OPT-350; the larger models' usual sizes).
MICRO_BATCH = {"opt-350": 8, "gpt-neo-2.7": 2, "llama-3-8": 1, "opt-tiny": 2, "gpt-neo-tiny": 2, "llama-tiny": 2}
DEVICE = "fake-cuda"                  # capacity large enough for every stage: only the peak matters here
GIB = 2**30


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One stage: predicted (profile + cost model) vs measured (MemTracker of the real step) peak."""

    model: str
    num_stages: int
    tp_degree: int
    stage: int
    layer_start: int
    layer_stop: int
    micro_batch_size: int
    num_micro_batches: int
    in_flight: int
    dtype: str
    recompute: str
    predicted_bytes: int
    measured_bytes: int
    error_pct: float
    predicted_phase: str
    pred_parameters: int
    pred_optimizer_states: int
    pred_pipeline_buffers: int
    pred_activations: int
    pred_embedding: int
    pred_head_and_loss: int
    pred_backward_transient: int
    meas_activations: int
    meas_temporaries: int
    measure_s: float


def _splits(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    bounds = [round(i * num_layers / num_stages) for i in range(num_stages + 1)]
    return list(zip(bounds, bounds[1:]))


# The runtime (torch, ~4 s) is imported inside the jobs and the functions that measure: `--help` and the
# cost-model side start without it.
def _terms_job(name: str, b: int, tp: int, dtype: str) -> tuple[dict, float]:
    from hpp.runtime.profile.memory_terms import memory_terms
    from hpp.runtime.models.zoo import load_runtime_model

    t0 = time.perf_counter()
    terms = memory_terms(load_runtime_model(name), micro_batch_size=b, dtype=dtype, tp_degree=tp)
    return dataclasses.asdict(terms), time.perf_counter() - t0


def _measure_job(name: str, spec_fields: dict) -> tuple[int, dict, float]:
    from hpp.runtime.profile.stage_memory import StepSpec, measure_stage_step
    from hpp.runtime.models.zoo import load_runtime_model

    r = measure_stage_step(load_runtime_model(name), StepSpec(**spec_fields))
    return r.peak_bytes, r.breakdown, r.wall_s


def _legacy_job(waste: bool) -> int:
    from hpp.runtime.profile.stage_memory import StepSpec, measure_stage_step
    from hpp.runtime.models.gpt import MODEL_CONFIGS, GPT

    model = GPT(MODEL_CONFIGS["opt-350"])
    spec = StepSpec(0, model.spec.num_layers, 0, 1, 8, 4, optimizer="sgd", device="cuda")
    return measure_stage_step(model, spec, legacy_waste=waste).peak_bytes


def _profile(name: str, terms: dict, num_layers: int, seq_len: int, tmp: Path) -> ModelProfile:
    """A profile entry holding only the memory terms (times 0), written and read back as JSON."""
    from hpp.runtime.profile.memory_terms import MemoryTerms, with_memory_terms

    zeros = (0.0,) * num_layers
    e = with_memory_terms(LayerProfile(DEVICE, terms["tp_degree"], terms["micro_batch_size"], zeros, zeros, zeros,
                                       terms["param_bytes"], terms["step_activation_bytes"], terms["output_bytes"]),
                          MemoryTerms(**terms))
    path = tmp / f"{name}-tp{terms['tp_degree']}.json"
    save_profile(ModelProfile(name, num_layers, seq_len, {e.key: e}, source="memory_validation"), path)
    return load_profile(path)


def _plan(name: str, num_layers: int, seq_len: int, splits: list[tuple[int, int]], tp: int, b: int, m: int,
          recompute: str) -> tuple[Plan, Cluster]:
    n = len(splits) * tp
    link = Link(1e11, 1e-6)
    cluster = Cluster("validation", {DEVICE: DeviceType(DEVICE, 10**15, n)}, (Node(DEVICE, n, link),), link)
    stages = tuple(Stage(lo, hi, DEVICE, tp, tuple(range(i * tp, (i + 1) * tp)), recompute)
                   for i, (lo, hi) in enumerate(splits))
    plan = Plan(name, num_layers, b * m, (Pipeline(stages, b, b * m, "1F1B"),), seq_len)
    return plan, cluster


def run(models: Sequence[str], stages: Sequence[int], tps: Sequence[int], *, dtype: str, recompute: str,
        workers: int, legacy: bool) -> tuple[list[Row], dict]:
    """All rows (and the legacy reproduction figures); see the module docstring."""
    from hpp.runtime.models.zoo import load_runtime_model

    specs = {name: load_runtime_model(name).spec for name in models}
    config = CostModelConfig(optimizer="adamw", framework_bytes=())
    ctx = multiprocessing.get_context("fork")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool, tempfile.TemporaryDirectory() as tmp:
        legacy_f = {w: pool.submit(_legacy_job, w) for w in (True, False)} if legacy else {}
        terms_f = {(name, tp): pool.submit(_terms_job, name, MICRO_BATCH[name], tp, dtype)
                   for name in models for tp in tps}
        jobs = {}
        for name in models:
            ms, b = specs[name], MICRO_BATCH[name]
            for S in stages:
                m = max(2, S)
                for tp in tps:
                    for i, (lo, hi) in enumerate(_splits(ms.num_layers, S)):
                        fields = dict(layer_start=lo, layer_stop=hi, position=i, num_stages=S, micro_batch_size=b,
                                      num_micro_batches=m, recompute=recompute, optimizer="adamw", dtype=dtype,
                                      tp_degree=tp, device="cuda")
                        jobs[(name, S, tp, i)] = (fields, pool.submit(_measure_job, name, fields))
        rows = []
        for (name, S, tp, i), (f, fut) in jobs.items():
            ms = specs[name]
            terms, _ = terms_f[(name, tp)].result()
            profile = _profile(name, terms, ms.num_layers, ms.seq_len, Path(tmp))
            b, m = f["micro_batch_size"], f["num_micro_batches"]
            plan, cluster = _plan(name, ms.num_layers, ms.seq_len, _splits(ms.num_layers, S), tp, b, m, recompute)
            st = estimate_plan(plan, cluster, profile, config=config).pipelines[0].stages[i]
            parts = st.memory_breakdown
            measured, mbd, wall = fut.result()
            err = 100.0 * (st.memory_bytes - measured) / measured
            rows.append(Row(name, S, tp, i, f["layer_start"], f["layer_stop"], b, m, st.in_flight_micro_batches,
                            dtype, recompute, st.memory_bytes, measured, round(err, 3),
                            "optimizer" if parts["phase"] else "backward",
                            parts["parameters"], parts["optimizer_states"], parts["pipeline_buffers"],
                            parts["activations"], parts["embedding"], parts["head_and_loss"],
                            parts["backward_transient"], mbd["activations"], mbd["temporaries"], round(wall, 2)))
            logger.info("%s S=%d TP=%d stage %d: %+.2f %%", name, S, tp, i, err)
        extra = {w: f.result() for w, f in legacy_f.items()}
    return rows, extra


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="memory_validation", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="opt-350,gpt-neo-2.7,llama-3-8")
    p.add_argument("--stages", default="1,2,4")
    p.add_argument("--tp", default="1,2")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--recompute", default="none", choices=("none", "full"))
    p.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    p.add_argument("--quick", action="store_true", help="tiny variants of the three architectures")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("HPP_LOG_LEVEL", "WARNING"), format="%(name)s: %(message)s")
    models = ("opt-tiny", "gpt-neo-tiny", "llama-tiny") if args.quick else tuple(args.models.split(","))
    out = args.out or (OUT.with_name("memory_validation_quick.csv") if args.quick else OUT)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    rows, legacy = run(models, [int(s) for s in args.stages.split(",")], [int(t) for t in args.tp.split(",")],
                       dtype=args.dtype, recompute=args.recompute, workers=args.workers or os.cpu_count() or 1,
                       legacy=not args.quick)
    wall = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in dataclasses.fields(Row)])
        w.writeheader()
        w.writerows(dataclasses.asdict(r) for r in rows)
    print(f"{'model':<13}{'S':>2}{'TP':>3}{'st':>3} {'layers':>8}{'b':>3}{'m':>3}{'k':>3} {'predicted':>10} "
          f"{'measured':>10} {'error':>8}  peak phase")
    for r in rows:
        print(f"{r.model:<13}{r.num_stages:>2}{r.tp_degree:>3}{r.stage:>3} {f'[{r.layer_start},{r.layer_stop})':>8}"
              f"{r.micro_batch_size:>3}{r.num_micro_batches:>3}{r.in_flight:>3} {r.predicted_bytes / GIB:>7.2f} GiB"
              f"{r.measured_bytes / GIB:>7.2f} GiB {r.error_pct:>+7.2f}%  {r.predicted_phase}")
    if legacy:
        print(f"H200 run (legacy opt-350, b=8, 4 micro-batches, SGD, fp32, 1 stage): the runtime as it was "
              f"{legacy[True] / GIB:.2f} GiB (measured on the H200: 51.80 GiB), as it is {legacy[False] / GIB:.2f} GiB")
    print(f"{len(rows)} stages, {wall:.0f} s wall ({args.dtype}, recompute {args.recompute}); CSV {out}")
    print(json.dumps({"max_abs_error_pct": max(abs(r.error_pct) for r in rows), "stages": len(rows),
                      "wall_s": round(wall, 1), "parent_cpu_s": round(time.process_time() - cpu0, 1)}))
    print(f"memory: max |error| {max(abs(r.error_pct) for r in rows):.2f} % over {len(rows)} stages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
