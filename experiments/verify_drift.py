"""Why ``hpp run --verify`` checks each step: float64 training of the tiny models is chaotic.

For each tiny Hugging Face model, trains in this one process, float64, with ``hpp run``'s defaults
(AdamW, lr 1e-3, weight decay 0.01, constant LR, no clipping) on the synthetic batches of the
README's plans (G = 8 samples per step, seed 0), three ways that are equal in exact arithmetic:

- ``single``: single-device training (``build_stage(model, 0, L)``, ``single_device_step``), what
  ``--verify`` compares with;
- ``halves``: each step's gradient summed as two halves of 4 samples, the arithmetic of the README's
  plan (two one-stage pipelines of 4 samples, their gradients all-reduced); the free-running
  difference ``hpp run --verify`` prints for that plan is ``halves - single``, bit for bit
  (llama-tiny, 200 steps: 2.355432060091589e-07 both);
- ``reversed``: single-device training with each batch's samples in reverse order (only the order
  of the sums changes).

At each reported step it writes the free-running max |halves - single| and max |reversed - single|
over every parameter, and the largest difference so far of a ``halves`` step from one single-device
step taken from ``halves``' own state before it (re-synchronised every step: what ``--verify`` checks).
Writes ``experiments/results/verify_drift.csv``; about 10 minutes for 1,000 steps of the three models
on one idle core.

    python experiments/verify_drift.py [--steps 1000] [--models llama-tiny,opt-tiny,gpt-neo-tiny]
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Sequence

import torch

from hpp.runtime.exec.data import make_batch_source
from hpp.runtime.models.stage import build_stage
from hpp.runtime.exec.training import TrainingConfig, lm_loss, make_optimizer, single_device_step, target_count
from hpp.runtime.models.zoo import load_runtime_model

RESULTS = Path(__file__).resolve().parent / "results"
GLOBAL_BATCH = 8
REPORT_STEPS = (1, 20, 60, 100, 120, 160, 175, 180, 185, 190, 195, 200, 260, 300, 400, 500, 600, 700, 800, 900, 1000)


@dataclass(frozen=True)
class DriftRow:
    """One model after ``step`` steps; differences are max |.| over every parameter value."""

    model: str
    step: int
    halves_vs_single: float            # free-running: what --verify printed before it checked each step
    reversed_vs_single: float          # free-running: single-device training against itself, summed in reverse
    per_step_max_so_far: float         # re-synchronised: max over steps 1..step of one step from halves' state


def _trainer(model, cfg: TrainingConfig):
    module = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=torch.float64)
    return module, make_optimizer([p for _l, _n, p in module.layer_parameters()], cfg)


def _step_in_halves(module, opt, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    """One AdamW step whose gradient is summed as two halves of the batch (the two pipelines' all-reduce)."""
    opt.zero_grad(set_to_none=False)
    denominator = max(1, target_count(targets))
    half = inputs.shape[0] // 2
    for part in (slice(0, half), slice(half, None)):
        lm_loss(module(inputs[part]), targets[part], denominator=denominator).backward()
    opt.step()


def _max_diff(a, b) -> float:
    return max((p.detach() - q.detach()).abs().max().item()
               for (_l, _n, p), (_l2, _n2, q) in zip(a.layer_parameters(), b.layer_parameters()))


def drift(name: str, steps: int) -> list[DriftRow]:
    """The :class:`DriftRow` of ``name`` at each of :data:`REPORT_STEPS` up to ``steps`` (and ``steps``)."""
    model = load_runtime_model(name)
    cfg = TrainingConfig(dtype="float64", total_steps=steps)
    source = make_batch_source(None, model, seed=0, global_batch_size=GLOBAL_BATCH)
    single, halves, backwards, probe = (_trainer(model, cfg) for _ in range(4))
    order = list(range(GLOBAL_BATCH - 1, -1, -1))
    rows, worst = [], 0.0
    for step in range(steps):
        x, y = source.batch(step)
        single_device_step(*single, None, x, y, cfg)
        single_device_step(*backwards, None, x[order], y[order], cfg)
        probe[0].load_state_dict(halves[0].state_dict())           # halves' state before the step
        probe[1].load_state_dict(copy.deepcopy(halves[1].state_dict()))   # its tensors, not shared
        single_device_step(*probe, None, x, y, cfg)
        _step_in_halves(*halves, x, y)
        worst = max(worst, _max_diff(probe[0], halves[0]))
        if step + 1 in REPORT_STEPS or step + 1 == steps:
            rows.append(DriftRow(name, step + 1, _max_diff(halves[0], single[0]), _max_diff(backwards[0], single[0]),
                                 worst))
            print(f"{name:13s} {step + 1:5d}  halves {rows[-1].halves_vs_single:9.2e}  reversed "
                  f"{rows[-1].reversed_vs_single:9.2e}  per step {worst:9.2e}", file=sys.stderr, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--models", type=lambda v: v.split(","), default=["llama-tiny", "opt-tiny", "gpt-neo-tiny"])
    ap.add_argument("--out", type=Path, default=RESULTS / "verify_drift.csv")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)                       # a tiny model: more threads only wait on each other
    rows = [r for name in args.models for r in drift(name, args.steps)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(DriftRow)])
        w.writeheader()
        w.writerows(asdict(r) for r in rows)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
