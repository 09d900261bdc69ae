"""Profile -> plan (HPP, uniform, single-shape) -> run -> predicted vs measured, on emulated CPU clusters.

Thin: the logic is in :mod:`hpp.bench.runtime_validation`. Besides the three emulated clusters it
runs scenario cpu-hetero-4's cluster without speed emulation (what ``hpp run PLAN --steps 8``
does; ``--no-closed-loop`` skips it). Writes ``experiments/results/runtime_validation.csv``
(one row per run), ``.png`` (measured and predicted throughput per plan and emulated
cluster), ``_timeline.png`` (HPP's plan on the first cluster, predicted beside measured) and
``_profile.json`` (the profile the predictions use, with its time terms). Prints predicted
vs measured per run and, last, ``time: max |error| X % over N runs``: measured against the
host model's prediction (:mod:`hpp.runtime.host.time_model`; with the real-op probe the profiling
step stores, :mod:`hpp.runtime.host.ops`); the target is 15 % on a quiet host. Before it, the
same with the CPU terms x the run's measured CPU ratio (host speed drift taken out) and with
the other load measured just before each run (``background load corrected``).
``--quick``: two clusters, fewer steps.

    python experiments/runtime_validation.py [--quick] [--steps N] [--time-scale D] [--no-closed-loop]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import torch  # noqa: F401  (the fork launcher needs torch imported in the parent)

from hpp.bench.runtime_validation import DEFAULT_CLUSTERS, QUICK_CLUSTERS, max_abs_error, validate
from hpp.fileio import write_dataclass_csv

RESULTS = Path(__file__).resolve().parent / "results"


def _chart(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    clusters = list(dict.fromkeys(r.cluster for r in rows))
    plans = ["hpp", "uniform", "single-shape"]
    fig, ax = plt.subplots(figsize=(2.6 * len(clusters) + 2, 4))
    w = 0.13
    for j, name in enumerate(plans):
        for i, c in enumerate(clusters):
            r = next((r for r in rows if r.cluster == c and r.plan == name), None)
            if r is None:
                continue
            x = i + (j - 1) * 2 * w
            ax.bar(x - w / 2, r.measured_throughput, w, color=f"C{j}", label=f"{name} measured" if i == 0 else None)
            ax.bar(x + w / 2, r.predicted_throughput, w, color=f"C{j}", alpha=0.35, hatch="//",
                   label=f"{name} predicted" if i == 0 else None)
            if name != "hpp":
                ax.text(x, r.measured_throughput, f"{r.measured_speedup_of_hpp:.2f}x", ha="center", va="bottom",
                        fontsize=7)
    ax.set_xticks(range(len(clusters)))
    ax.set_xticklabels([f"{c}\n(time scale {next(r.time_scale for r in rows if r.cluster == c):g})" for c in clusters])
    ax.set_ylabel("samples/s on this host")
    ax.set_title("gpt-tiny on emulated CPU clusters: measured vs predicted (label: HPP speedup, measured)", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two clusters, 5 steps, quick time terms (< 5 min)")
    ap.add_argument("--steps", type=int, help="optimizer steps per run (default 8; quick 5)")
    ap.add_argument("--time-scale", type=float, help="emulation time scale (default: devices / cores)")
    ap.add_argument("--no-closed-loop", action="store_true",
                    help="skip the cpu-hetero-4 run without emulation (hpp run PLAN --steps 8)")
    ap.add_argument("--out", type=Path, default=RESULTS / "runtime_validation.csv")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    t0 = time.perf_counter()
    specs = QUICK_CLUSTERS if args.quick else DEFAULT_CLUSTERS
    steps = args.steps or (5 if args.quick else 8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = validate(specs, steps=steps, time_scale=args.time_scale, repeats=5 if args.quick else 10,
                    timeline=args.out.with_name(args.out.stem + "_timeline.png"), closed_loop=not args.no_closed_loop,
                    quick=args.quick, profile_out=args.out.with_name(args.out.stem + "_profile.json"))
    write_dataclass_csv(rows, args.out)
    _chart([r for r in rows if r.emulated], args.out.with_suffix(".png"))
    print(f"{'cluster':<12} {'plan':<13} {'dev':>3} {'emu':>3} {'D':>3} {'plan s':>7} {'model s':>7} {'pred s':>7} "
          f"{'meas s':>7} {'error':>6} {'steal':>5} {'nost s':>7} {'cpu':>5} {'norm s':>7} {'err norm':>8} "
          f"{'bg':>4} {'bg s':>7} {'load':>5}")
    for r in rows:
        print(f"{r.cluster:<12} {r.plan:<13} {r.devices_used:>3} {'yes' if r.emulated else 'no':>3} "
              f"{r.time_scale:>3g} {r.predicted_plan_s:>7.3f} {r.predicted_model_s:>7.3f} {r.predicted_s:>7.3f} "
              f"{r.measured_s:>7.3f} {r.error:>+6.0%} {r.steal:>5.0%} {r.predicted_nosteal_s:>7.3f} "
              f"{r.cpu_ratio:>5.2f} {r.predicted_norm_s:>7.3f} "
              f"{r.error_norm:>+8.0%} {r.background:>4.1f} {r.predicted_bg_s:>7.3f} {r.load_before:>5.1f}")
    print("pred s: the host model (cores shared by the ranks, CPU contention, emulation padding, the hypervisor's steal "
          "during the run), what the run should measure; steal: the share of the time the cores wanted to run that the "
          "hypervisor took (hpp.runtime.host.steal); nost s: pred s without it; model s: the cost model's closed form at time scale D; plan s: the plan's own prediction (D = 1); "
          "cpu: CPU seconds the ranks' forward/backward used / predicted (the host's speed vs when profiled); "
          "norm s: pred s with the CPU terms x cpu (steal too); bg: other processes computing on the host just before the run "
          "(hpp.runtime.profile.host_probe.background_load; 0 on a quiet host); bg s: pred s with that background load")
    print(f"{time.perf_counter() - t0:.0f} s; wrote {args.out}; load average now {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores (the 15 % target needs a quiet host: load below 0.5)")
    print(f"time (CPU speed normalised): max |error| {100 * max_abs_error(rows, normalised=True):.1f} % over "
          f"{len(rows)} runs")
    print(f"time (background load corrected): max |error| {100 * max_abs_error(rows, background=True):.1f} % over "
          f"{len(rows)} runs")
    print(f"time: max |error| {100 * max_abs_error(rows):.1f} % over {len(rows)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
