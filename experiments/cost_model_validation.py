"""Cost model vs 15 real runs: OPT-350 on GH200 (GH-96) nodes, from the Sailor artifact.

Imports every ``validation-calibration/*.json`` plan (Sailor's ``pipeline_list``) with
:func:`hpp.interop.load_any_plan`, predicts it with the bundled OPT-350 profile and the
cost model (v2 = ``CostModelConfig()`` defaults, v1 = ``CostModelConfig.v1()``), and
writes ``experiments/results/cost_model_validation.csv`` (one row per run and model),
``.json`` (the MAPEs) and ``.png`` (predicted vs measured, time and memory).

Cluster: each (replica, stage) of a Sailor plan is one GH-96 node of 4 GPUs running one
TP-4 group; links are Sailor's measured fits (:mod:`hpp.profiles.network`, zone
us-central1-a, one flow per GPU). No constant is fitted per plan.

Usage: ``python experiments/cost_model_validation.py [--runs DIR] [--out DIR]``
"""

from __future__ import annotations

import argparse
import math
import dataclasses
import csv
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hpp.cliparse import run_command
from hpp.errors import HppInputError
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan
from hpp.interop import load_any_plan
from hpp.interop.sailor import sailor_measurement
from hpp.plan_data import read_plan_json
from hpp.profiles.bundled import load_bundled_profile

logger = logging.getLogger("cost_model_validation")
REPO = Path(__file__).resolve().parents[1]
RUNS = REPO.parent / "shared" / "profiles" / "public" / "sailor" / "validation-calibration"
MODELS = {"v2": CostModelConfig(), "v1": CostModelConfig.v1()}


@dataclass(frozen=True, slots=True)
class Row:
    """One run priced by one cost-model version."""

    plan: str
    model: str                     # cost-model version
    num_nodes: int
    dp: int
    pp: int
    micro_batch_size: int
    global_batch_size: int
    measured_time_s: float
    predicted_time_s: float
    time_error_pct: float
    measured_memory_bytes: int
    predicted_memory_bytes: int
    memory_error_pct: float
    predicted_pipeline_s: float
    predicted_grad_sync_s: float
    predicted_optimizer_s: float
    measured_grad_sync_s: float         # nan where the loader flags the run's red_grads (SailorMeasurement)


def _pct(pred: float, real: float) -> float:
    return 100.0 * (pred - real) / real


def validation_rows(runs: Path) -> list[Row]:
    """Every run of ``runs`` priced by every version in :data:`MODELS`.

    Raises
    ------
    HppInputError
        ``runs`` holds no run (the public data is not beside the checkout): the message says what is needed.
    """
    files = sorted(runs.glob("*.json")) if runs.is_dir() else []
    if not files:
        raise HppInputError(f"no Sailor validation runs (*.json) in {runs}: this script needs the public Sailor "
                            f"artifact's validation-calibration folder (eth-easl/sailor cf2c8e3), by default "
                            f"../shared/profiles/public/sailor/validation-calibration beside the checkout",
                            field="--runs", fix="put the artifact there or give --runs DIR")
    profile = load_bundled_profile("OPT-350")
    rows = []
    for path in files:
        meas = sailor_measurement(read_plan_json(path), source=str(path))
        plan, cluster, _ = load_any_plan(path, fmt="sailor", profile=profile)
        for name, config in MODELS.items():
            est = estimate_plan(plan, cluster, profile, config=config)
            rows.append(Row(path.stem.split("plan_config_")[-1], name, meas.num_nodes, plan.num_pipelines,
                            plan.pipelines[0].num_stages, plan.pipelines[0].micro_batch_size,
                            plan.global_batch_size, meas.iteration_time_s, est.iteration_time_s,
                            _pct(est.iteration_time_s, meas.iteration_time_s), meas.peak_memory_bytes,
                            est.peak_memory_bytes, _pct(est.peak_memory_bytes, meas.peak_memory_bytes),
                            est.pipeline_time_s, est.grad_sync_s, est.optimizer_s,
                            meas.grad_sync_s if meas.grad_sync_usable else math.nan))
    return rows


def _plot(rows: list[Row], mape: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, (what, meas, pred, unit, scale) in zip(axes, (
            ("iteration time", "measured_time_s", "predicted_time_s", "s", 1.0),
            ("peak memory per GPU", "measured_memory_bytes", "predicted_memory_bytes", "GB", 1e-9))):
        top = 0.0
        for name, marker in (("v1", "x"), ("v2", "o")):
            xs = [getattr(r, meas) * scale for r in rows if r.model == name]
            ys = [getattr(r, pred) * scale for r in rows if r.model == name]
            key = "time" if unit == "s" else "memory"
            ax.scatter(xs, ys, marker=marker, label=f"hpp {name} (MAPE {mape[name][key]:.1f} %)")
            top = max(top, *xs, *ys)
        ax.plot([0, top * 1.05], [0, top * 1.05], "k--", lw=0.8, label="predicted = measured")
        ax.set_xlabel(f"measured {what} [{unit}]")
        ax.set_ylabel(f"predicted {what} [{unit}]")
        ax.set_title(f"OPT-350 on GH200, 15 Sailor runs: {what}")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0, or 2 with one line when the runs are not there (:func:`validation_rows`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=RUNS, help="Sailor's validation-calibration folder")
    ap.add_argument("--out", type=Path, default=REPO / "experiments" / "results")
    ap.add_argument("--quick", action="store_true", help="accepted for the run-all driver (this script is fast)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return run_command("cost_model_validation", lambda: _validate(args))


def _validate(args: argparse.Namespace) -> int:
    rows = validation_rows(args.runs)
    mape = {name: {"time": sum(abs(r.time_error_pct) for r in rows if r.model == name) / (len(rows) / len(MODELS)),
                   "memory": sum(abs(r.memory_error_pct) for r in rows if r.model == name)
                   / (len(rows) / len(MODELS))} for name in MODELS}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "cost_model_validation"
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in dataclasses.fields(Row)])
        w.writeheader()
        w.writerows(dataclasses.asdict(r) for r in rows)
    stem.with_suffix(".json").write_text(json.dumps(
        {"runs": len(rows) // len(MODELS), "mape_pct": mape, "config_v2": dataclasses.asdict(MODELS["v2"]),
         "source": "eth-easl/sailor cf2c8e3 validation-calibration (MIT, ETH Zurich)"}, indent=1) + "\n")
    _plot(rows, mape, stem.with_suffix(".png"))
    for name in MODELS:
        logger.info("%s: time MAPE %.1f %%, memory MAPE %.1f %%", name, mape[name]["time"], mape[name]["memory"])
    print(json.dumps({"mape_pct": mape, "csv": str(stem.with_suffix(".csv")), "png": str(stem.with_suffix(".png"))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
