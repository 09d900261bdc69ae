"""Learn from the run, closed loop, on the emulated CPU cluster ``cpu-hetero-4``: a profile wrong for one device
type -> plan -> run with ``--calibrate`` -> re-plan on the calibrated profile and links -> run again.

The truth (how fast each emulated device is) comes from one place, the cluster file: ``cpu-2x`` is 2x slower than
``cpu`` (``slowdown: 2``; ``hpp run --emulate-speed`` pads its ops so). The planner's belief comes from another,
the profile: the bundled gpt-tiny profile with the ``cpu-2x`` entries replaced by the ``cpu`` ones and
``meta.emulated.cpu-2x.slowdown = 1`` (its speed off by 2x). Each step is the command a user types
(subprocesses: ``hpp plan``, ``hpp run --json``). Writes ``experiments/results/calibration_loop.csv``: per run
the plan, the measured iteration time (median after the warm-up), the run's prediction
(``predicted.iteration_time_s``: the host model on the run's profile) and its error (measured / predicted - 1); and
the re-plan's predicted speed-up (the first run's plan over the new plan, both as the run predicts on the
calibrated figures: the host model at the first run's time scale and host speed, from ``hpp run --calibrate``)
beside the measured one (first run / second run); and, as diagnostics of the host, the cores other processes kept
busy during the timed steps (``measured.background_cores``), the ranks' CPU seconds over the predicted ones
(``run_cpu_ratio``) and the speed probe's factor. Prints the checks:

- the second run is faster than the first by what the re-plan predicted, within 15 %;
- the second run's |prediction error| <= 10 %, the first run's >= 30 %;

each as the median over ``--loops`` closed loops (each from the wrong profile again), with the count of loops that
meet it: this VM's speed moves by tens of percent between minutes (the speed probe's factor, measured before and
after each run, moved 1.34-1.71 within minutes on a quiet host), which moves each run's prediction with it.

    python experiments/calibration_loop.py [--loops 3] [--steps 8] [--time-scale 8] [--out CSV]

About a minute a loop on this project's 2-core VM; run it with nothing else computing if you can (the prediction
assumes a quiet host). The time scale (>= 2: 4 ranks on 2 cores) pads every op: at 8 the 4 ranks need half a core
between them, so other processes on the host slow them less, and each op's fixed costs (a sleep's overshoot, a
wake-up) are a smaller share of it; at 4 the second run's error was +10 % in the median of 5 loops (2 of 5 within
10 %) with another developer's tests running, at 8 -0.3 % and +8.8 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpp.fileio import write_rows_csv  # noqa: E402
from hpp.profiles.bundled import load_bundled_profile  # noqa: E402
from hpp.profiles.cluster_format import save_cluster  # noqa: E402
from hpp.profiles.model_profile import ModelProfile  # noqa: E402
from hpp.profiles.profile_format import save_profile  # noqa: E402
from hpp.scenarios import get_scenario  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SCENARIO = "cpu-hetero-4"
WRONG_TYPE, BASE_TYPE = "cpu-2x", "cpu"
FIELDS = ("loop", "run", "profile", "plan", "measured_s", "predicted_s", "error", "plan_predicted_s",
          "replan_predicted_speedup", "measured_speedup", "speedup_error", "background_cores", "run_cpu_ratio",
          "host_speed_factor", "time_scale", "steps", "utc")


def wrong_profile() -> ModelProfile:
    """The bundled gpt-tiny profile believing ``cpu-2x`` as fast as ``cpu`` (its speed off by 2x)."""
    p = load_bundled_profile(get_scenario(SCENARIO).model)
    entries = dict(p.entries)
    for key in p.entries:
        if key[0] == WRONG_TYPE:
            entries[key] = replace(p.entries[(BASE_TYPE, key[1], key[2])], device_type=WRONG_TYPE,
                                   note=f"wrong on purpose: the {BASE_TYPE} figures")
    meta = dict(p.meta, emulated={WRONG_TYPE: {"base": BASE_TYPE, "slowdown": 1.0}})
    return replace(p, entries=entries, meta=meta,
                   source=f"experiments/calibration_loop.py: {WRONG_TYPE} believed as fast as {BASE_TYPE}")


def _hpp(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "hpp", *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def plan(work: Path, cluster: Path, profile: Path, name: str, *extra: str) -> tuple[Path, dict]:
    path = work / f"{name}.json"
    rep = _hpp("plan", "--cluster", str(cluster), "--profile", str(profile), "--gbs",
               str(get_scenario(SCENARIO).global_batch_size), "--out", str(path), "--quiet", *extra)
    return path, rep


def run(plan_path: Path, *, steps: int, time_scale: float, calibrate: Path | None = None) -> dict:
    extra = ["--calibrate", str(calibrate), "--force"] if calibrate is not None else []
    return _hpp("run", str(plan_path), "--steps", str(steps), "--emulate-speed", "--time-scale", str(time_scale),
                "--launcher", "fork", "--quiet", *extra)


def _shape(rep: dict) -> str:
    """The plan in one line: per pipeline its stages' device type and layers, and the micro-batch size."""
    out = []
    for p in rep["plan"]["pipelines"]:
        st = " ".join(f"{s['device_type']}[{s['layers'][0]},{s['layers'][1]})" for s in p["stages"])
        out.append(f"{st} b{p['micro_batch_size']}")
    return "; ".join(out)


def one_loop(loop: int, *, steps: int, time_scale: float) -> tuple[list[dict], list[dict]]:
    """One closed loop (wrong profile -> plan -> run --calibrate -> re-plan -> run); its two CSV rows and the
    calibrated figures."""
    with tempfile.TemporaryDirectory(prefix="hpp-calibration-loop-") as tmp:
        work = Path(tmp)
        cluster, wrong, cal = work / "cluster.json", work / "wrong.json", work / "calibrated.json"
        save_cluster(get_scenario(SCENARIO).cluster(), cluster)
        save_profile(wrong_profile(), wrong)
        p1, plan1 = plan(work, cluster, wrong, "plan1")
        run1 = run(p1, steps=steps, time_scale=time_scale, calibrate=cal)
        # the search the run's re-plan check priced (hpp.runtime.calibrate.replan_command)
        p2, plan2 = plan(work, Path(run1["calibration"]["cluster"]), cal, "plan2", "--time-limit",
                         str(run1["calibration"]["replan"]["time_limit_s"]), "--no-baselines")
        run2 = run(p2, steps=steps, time_scale=time_scale)
    replan = run1["calibration"]["replan"]
    predicted_speedup = replan["current_s"] / replan["replan_s"]
    measured_speedup = run1["measured"]["iteration_time_s"] / run2["measured"]["iteration_time_s"]
    utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = []
    for i, (pl, rn, prof) in enumerate(((plan1, run1, "wrong"), (plan2, run2, "calibrated")), start=1):
        meas, pred = rn["measured"]["iteration_time_s"], rn["predicted"]["iteration_time_s"]
        rows.append({"loop": loop, "run": i, "profile": prof, "plan": _shape(pl), "measured_s": meas,
                     "predicted_s": pred, "error": meas / pred - 1.0,
                     "plan_predicted_s": pl["predicted"]["iteration_time_s"],
                     "replan_predicted_speedup": predicted_speedup, "measured_speedup": measured_speedup,
                     "speedup_error": measured_speedup / predicted_speedup - 1.0,
                     "background_cores": rn["measured"].get("background_cores"),
                     "run_cpu_ratio": (rn["predicted"].get("host_model") or {}).get("run_cpu_ratio"),
                     "host_speed_factor": (rn["predicted"].get("host_speed") or {}).get("factor"),
                     "time_scale": time_scale, "steps": steps, "utc": utc})
    return rows, [f for f in run1["calibration"]["figures"] if f["status"] == "calibrated"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=3, help="closed loops, each from the wrong profile (default 3)")
    ap.add_argument("--steps", type=int, default=8, help="hpp run --steps (default 8: 7 after the warm-up)")
    ap.add_argument("--time-scale", type=float, default=8.0, help="hpp run --time-scale (default 8)")
    ap.add_argument("--out", type=Path, default=RESULTS / "calibration_loop.csv",
                    help="CSV written (default experiments/results/calibration_loop.csv, the committed figures)")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    for loop in range(1, args.loops + 1):
        got, figures = one_loop(loop, steps=args.steps, time_scale=args.time_scale)
        rows += got
        for r in got:
            bg = r["background_cores"]
            print(f"loop {loop} run {r['run']} ({r['profile']} profile): {r['plan']}: measured {r['measured_s']:.4f} "
                  f"s, predicted {r['predicted_s']:.4f} s (error {100 * r['error']:+.1f} %; other processes kept "
                  f"{'n/a' if bg is None else f'{bg:.1f}'} cores busy; host speed probe x"
                  f"{r['host_speed_factor']:.2f}, the ranks' CPU x{r['run_cpu_ratio']:.2f} of it)")
        print(f"loop {loop} speed-up: measured {got[0]['measured_speedup']:.3f}x, re-plan predicted "
              f"{got[0]['replan_predicted_speedup']:.3f}x ({100 * got[0]['speedup_error']:+.1f} %); calibrated: "
              + ", ".join(f"{f['what']} x{f['factor']:.3f} (spread {100 * f['spread']:.1f} %, {f['steps']} steps)"
                          for f in figures))
    write_rows_csv(rows, args.out, columns=FIELDS)
    first = [r for r in rows if r["run"] == 1]
    second = [r for r in rows if r["run"] == 2]
    med = lambda xs: statistics.median(xs)      # noqa: E731
    speed_err, err1, err2 = (med([r["speedup_error"] for r in first]), med([r["error"] for r in first]),
                             med([r["error"] for r in second]))
    ok_speed, ok_pred = abs(speed_err) <= 0.15, abs(err2) <= 0.10 and abs(err1) >= 0.30
    n = len(first)
    n_speed = sum(abs(r["speedup_error"]) <= 0.15 for r in first)
    n1, n2 = sum(abs(r["error"]) >= 0.30 for r in first), sum(abs(r["error"]) <= 0.10 for r in second)
    print(f"speed-up vs the re-plan's prediction: median {100 * speed_err:+.1f} % "
          f"({'within' if ok_speed else 'NOT within'} 15 %); within 15 % in {n_speed} of {n} loops")
    print(f"prediction error: median first run {100 * err1:+.1f} % (>= 30 % in {n1} of {n}), second run "
          f"{100 * err2:+.1f} % (<= 10 % in {n2} of {n}): {'meets' if ok_pred else 'does NOT meet'} <= 10 % after, "
          ">= 30 % before")
    print(f"wrote {args.out}")
    return 0 if ok_speed and ok_pred else 1


if __name__ == "__main__":
    sys.exit(main())
