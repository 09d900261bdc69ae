"""Thin entry points of ``hpp run`` and ``hpp profile`` (dispatched to from :mod:`hpp.cli`; ``hpp profile-network``'s
is :mod:`hpp.runtime.network.cli`).

Exit codes: 0 success; 2 bad input (one line on stderr); 1 a run that failed
(the line names the failed rank, or says it timed out) or a ``--verify`` that found a
difference above its tolerance; 130 / 143 a run stopped by Ctrl-C / SIGTERM (every
local process of the run ended first, no traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from typing import Any, Callable, Sequence

from hpp.cliparse import Parser, run_command
from hpp.errors import HppInputError
from hpp.runtime.launch.processes import RunInterrupted, interrupt_signals
from hpp.runtime.step_terms import summary_lines
from hpp.wording import count

__all__ = ["run_main", "profile_main", "main", "few_steps_note"]

logger = logging.getLogger(__name__)


def _run_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hpp run", description="Execute an HPP plan with torch.distributed.")
    p.add_argument("plan", help="plan JSON (hpp plan --out)")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps")
    p.add_argument("--model", help="runtime model NAME or MODULE:FUNCTION (default: the plan's model)")
    p.add_argument("--verify", action="store_true",
                   help="run in float64 and compare every rank's parameters with single-device training on the "
                        "same batches; exit 1 above 1e-9")
    p.add_argument("--dtype", choices=("float32", "float64", "bfloat16"),
                   help="float32 (default), float64, or bfloat16 (autocast mixed precision, fp32 master weights); "
                        "on --resume this and every training setting not given is the checkpoint's")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), help="default adamw")
    p.add_argument("--lr", type=float, help="peak learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=float, help="AdamW weight decay (default: the training config's)")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"),
                   help="constant (default) or cosine decay after the warm-up")
    p.add_argument("--lr-warmup-steps", "--warmup-steps-lr", dest="lr_warmup_steps", type=int,
                   help="linear learning-rate warm-up steps (default 0)")
    p.add_argument("--clip-grad-norm", type=float, help="clip gradients to this global norm (default: off)")
    p.add_argument("--data", help="training data: a local .txt (byte-level tokens) or .npy of token ids "
                                  "(default: synthetic tokens; on --resume the checkpoint's)")
    p.add_argument("--weights", metavar="DIR",
                   help="start from a local Hugging Face model folder (config.json + safetensors) of the run's OPT, "
                        "GPT-Neo or Llama model; each rank reads only its own slices (not with --resume)")
    p.add_argument("--metrics-jsonl", help="write one JSON line of metrics per step here")
    p.add_argument("--quiet", action="store_true", help="no per-step lines on stderr")
    p.add_argument("--emulate-speed", action="store_true", help="pad compute by the device types' slowdown")
    p.add_argument("--time-scale", type=float,
                   help="with --emulate-speed: slow every device by this common factor >= 1 "
                        "(default: max(1, cluster devices / host cores))")
    p.add_argument("--no-host-calibration", dest="host_calibration", action="store_false",
                   help="CPU: predict with the profile's times as measured (default: a probe of one profiled layer "
                        "scales them to this host's speed)")
    p.add_argument("--threads", type=int, default=1, help="torch compute threads per rank (default 1)")
    p.add_argument("--naive-allreduce", action="store_true", help="one blocking all-reduce per layer")
    p.add_argument("--timeline", help="write predicted vs measured Gantt chart PNG here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--calibrate", metavar="OUT.json",
                   help="write the plan's profile corrected by the run's measured stage times to OUT.json and its "
                        "cluster with corrected links to OUT.cluster.json, and say whether re-planning on them pays "
                        "(hpp.runtime.calibrate)")
    p.add_argument("--force", action="store_true", help="with --calibrate: overwrite OUT.json and OUT.cluster.json")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--launcher", choices=("torchrun", "fork"), default="torchrun",
                   help="torchrun (default) or fork (fast start, single host)")
    p.add_argument("--warmup-steps", type=int, default=1,
                   help="first steps left out of the timing median (not LR warm-up: see --lr-warmup-steps; "
                        "default 1)")
    p.add_argument("--world-size", type=int, help="refuse unless the plan has exactly this many devices")
    p.add_argument("--allow-over-memory", action="store_true",
                   help="run a plan that the cost model predicts not to fit its devices' memory (default: refused, "
                        "exit 2, naming the stage and the shortfall; the report's notes say when this was given)")
    p.add_argument("--seed", type=int, help="initialisation and data seed (default 0; on --resume the checkpoint's)")
    p.add_argument("--group-timeout", type=float, default=120.0, help="process-group timeout [s]")
    p.add_argument("--run-timeout", type=float, default=1800.0,
                   help="whole-run timeout [s]: every rank is then killed and the run fails")
    p.add_argument("--log-dir", help="keep torchrun's and each rank's output here (rank<r>.log; default: none kept)")
    p.add_argument("--dry-run", metavar="DIR",
                   help="check everything, write DIR/worker_config.json and print this host's torchrun command "
                        "instead of running it")
    h = p.add_argument_group("several hosts (one hpp run per host, torchrun static rendezvous)")
    h.add_argument("--nnodes", type=int, default=1, help="hosts of the run (default 1)")
    h.add_argument("--node-rank", type=int, default=0, help="this host's node rank, 0..nnodes-1 (default 0)")
    h.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="address of the host with node rank 0 and a free port")
    h.add_argument("--node-map", metavar="N0,N1,...",
                   help="the plan node each node rank plays (default: the plan's used nodes in order)")
    h.add_argument("--emulate-node-type", metavar="TYPE[:COUNT]",
                   help="CPU: this host plays a node of TYPE with COUNT devices (default $HPP_EMULATE_NODE_TYPE)")
    c = p.add_argument_group("checkpoints (torch.distributed.checkpoint, keyed by parameter name)")
    c.add_argument("--save", metavar="DIR", help="write DIR/step-K after the last step (and every --save-every)")
    c.add_argument("--save-every", type=int, default=0, metavar="K", help="also save every K steps (default 0: off)")
    c.add_argument("--resume", metavar="DIR",
                   help="continue from the latest complete checkpoint in DIR (or a DIR/step-K), under this plan")
    c.add_argument("--lr-total-steps", type=int,
                   help="steps of the LR schedule (default --steps; on --resume the checkpoint's)")
    return p


def _fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def _predicted_stage_mb(pr: dict, rank: dict) -> float | None:
    """The cost model's predicted peak memory [MiB] of ``rank``'s stage (per device), None when not predicted."""
    try:
        return pr["pipelines"][rank["pipeline"]]["stages"][rank["stage"]]["memory_bytes"] / 2**20
    except (KeyError, IndexError, TypeError):
        return None


def _human_run(rep: dict) -> str:
    m, pr, c = rep["measured"], rep["predicted"], rep["collectives"]
    on_cpu = rep.get("device", "cpu") == "cpu"
    pred = (f"{pr['iteration_time_s']:.4f} s" if pr.get("iteration_time_s") is not None
            else f"n/a ({pr.get('reason')})")
    if pr.get("time_scale", 1.0) != 1.0 and pr.get("plan_iteration_time_s") is not None:
        pred += f" (time scale {pr['time_scale']:g}; the plan's own {pr['plan_iteration_time_s']:.4f} s)"
    hs = pr.get("host_speed")
    if hs and hs.get("factor") is not None:
        f = hs["factor"]
        pred += (f" (profile times x {f:.2f}: this host ran the speed probe {max(f, 1 / f):.2f} x "
                 f"{'slower' if f >= 1 else 'faster'} than the profile's host)")
    elif hs:
        pred += f" (profile times as measured: {hs.get('reason')})"
    hm = pr.get("host_model") or {}
    if (hm.get("steal") or 0.0) >= 0.005:
        pred += (f" (the hypervisor took {hm['steal']:.0%} of the cores' time during the steps; "
                 f"{hm['without_steal_iteration_time_s']:.4f} s without)")
    diag = (f"  host speed       the ranks' ops used {hm['run_cpu_ratio']:.2f} x the CPU seconds predicted; "
            f"at their speed the host model gives {hm['at_run_cpu_speed_iteration_time_s']:.4f} s (a diagnostic)"
            if hm.get("at_run_cpu_speed_iteration_time_s") is not None else None)
    tr = rep.get("training") or {}
    hosts = rep.get("hosts") or {}
    part = (f"; host {hosts['node_rank']} of {hosts['nnodes']}: this host's ranks' share of the global loss"
            if (hosts.get("nnodes") or 1) > 1 else "")
    joined = "; those this host's ranks joined" if part else ""
    lines = [f"hpp run {rep['plan']}: model {rep['model']}, {count(rep['world_size'], 'rank')}, "
             f"{count(rep['steps'], 'step')} "
             f"({rep['launcher']}, emulate-speed {'on' if rep['emulate_speed'] else 'off'}, {rep.get('dtype')}, "
             f"{tr.get('optimizer')} lr {tr.get('lr')})",
             f"  iteration time   measured {m['iteration_time_s']:.4f} s (median after warm-up)   predicted {pred}",
             *([diag] if diag else []),
             f"  throughput       measured {m['throughput_samples_per_s']:.2f} samples/s, "
             f"{m['tokens_per_s']:.0f} tokens/s"
             + (f"   predicted {pr['throughput_samples_per_s']:.2f} samples/s"
                if pr.get("throughput_samples_per_s") is not None else ""),
             f"  loss             {_fmt(m.get('loss'), '.4f')} (last step{part})   MFU {_fmt(m.get('mfu'), '.2%')}",
             f"  grad all-reduce  {c['count']} per step, {count(c['bytes'], 'byte')} ({c['mode']}, "
             f"{count(c['num_blocks'], 'block')}"
             f"{joined})",
             *summary_lines(m, pr),
             f"  rank pipe stage  tp device          layers   rec   #mb  {'peak_RSS_MB' if on_cpu else 'peak_mem_MB'}"
             f"  pred_mem_MB  compute_s  padding_s"]
    for r in rep["ranks"]:
        tp = f"{r.get('tp_rank') or 0}/{r.get('tp_degree') or 1}"
        lines.append(f"  {r['rank']:>4} {r['pipeline']:>4} {r['stage']:>5} {tp:>3} {r['device_type']:<15} "
                     f"[{r['layers'][0]:>2},{r['layers'][1]:>3}) {(r.get('recompute') or 'none'):>5} "
                     f"{r['num_micro_batches']:>4} {r['peak_memory_bytes'] / 2**20:>12.1f} "
                     f"{_fmt(_predicted_stage_mb(pr, r), '>12.1f')} {r['compute_s']:>10.4f} {r['padding_s']:>10.4f}")
    if on_cpu and rep["ranks"]:
        lines.append("  memory           on CPU peak_RSS_MB is each rank process's peak resident memory (Python, torch "
                     "and the gloo buffers included), not the device memory that pred_mem_MB predicts")
    loads = [r for r in rep["ranks"] if r.get("weights")]
    if loads:
        lines.append(weights_line(loads))
    ck = rep.get("checkpoint") or {}
    if ck.get("resumed_from"):
        lines.append(f"  resumed          from {ck['resumed_from']} (steps {ck['first_step'] + 1}.."
                     f"{ck['first_step'] + rep['steps']})")
    if ck.get("latest"):
        lines.append(f"  checkpoint       {ck['latest']} (complete)")
    lines += [f"  note: {n}" for n in rep["notes"]]
    if rep.get("timeline"):
        lines.append(f"  timeline: {rep['timeline']}")
    return "\n".join(lines)


def weights_line(ranks: list[dict]) -> str:
    """The report's ``--weights`` line: what the ranks loaded and the largest growth of a rank's resident memory
    while loading, against that rank's bound (``ranks[i].weights``, :func:`hpp.runtime.exec.weights.load_stage_weights`).

    >>> w = lambda n, b, g, m: {"tensors": n, "bytes": b, "peak_rss_growth_bytes": g, "margin_bytes": m}
    >>> print(weights_line([{"rank": 0, "weights": w(20, 2**20, 3 * 2**20, 2**24)},
    ...                     {"rank": 1, "weights": w(19, 3 * 2**20, 5 * 2**20, 2**24)}]))   # doctest: +NORMALIZE_WHITESPACE
      weights load     2 ranks read 39 tensors, 4.0 MiB (their slices); resident memory grew by at most 5.0 MiB
      while loading (rank 1; its bound 16.0 MiB; every rank stayed within its own)
    """
    ws = [(r["rank"], r["weights"]) for r in ranks]
    worst_rank, worst = max(ws, key=lambda rw: rw[1]["peak_rss_growth_bytes"])
    over = [rank for rank, w in ws if w["peak_rss_growth_bytes"] > w["margin_bytes"]]
    within = "every rank stayed within its own" if not over else \
        f"ABOVE its own on rank{'s' if len(over) > 1 else ''} {', '.join(map(str, over))}"
    mib = 2**20
    return (f"  weights load     {count(len(ws), 'rank')} read {sum(w['tensors'] for _r, w in ws)} tensors, "
            f"{sum(w['bytes'] for _r, w in ws) / mib:.1f} MiB (their slices); resident memory grew by at most "
            f"{worst['peak_rss_growth_bytes'] / mib:.1f} MiB while loading (rank {worst_rank}; its bound "
            f"{worst['margin_bytes'] / mib:.1f} MiB; {within})")


def _verify_line(v: dict) -> str:
    """The ``verify:`` line (the per-step check, which decides) and, under it, the free-running comparison."""
    tail = f"; {count(len(v['missing']), 'parameter')} saved by no rank, e.g. {v['missing'][0]}" if v["missing"] else ""
    if v["steps_checked"] < v["steps"]:
        tail += f"; only {v['steps_checked']} of {count(v['steps'], 'step')} were checked"
    step_name = lambda k: "the initial parameters" if k == 0 else f"step {k}"  # noqa: E731
    where = "" if v.get("worst_step") is None else f"; worst: {step_name(v['worst_step'])}"
    if v.get("first_failed_step") is not None:
        where += f"; first above the tolerance: {step_name(v['first_failed_step'])}"
    line = (f"verify: max |difference| {v['max_abs_difference']:.3g} over {count(v['num_parameters'], 'parameter')} "
            f"({count(v['num_copies'], 'piece')} on the ranks, copies and TP shards; each of {count(v['steps'], 'step')} against "
            f"one single-device step from the run's state before it{where}; tolerance {v['tolerance']:g}): "
            f"{'ok' if v['passed'] else 'FAILED'}{tail}")
    free = v.get("free_running_difference")
    if free is None:
        return line
    line += f"\nverify: free-running, the final parameters differ from single-device training by {free:.3g}"
    if v.get("reordered_difference") is not None:
        line += (f"; single-device training differs from itself by {v['reordered_difference']:.3g} when each "
                 "batch's samples are only summed in reverse order (float64 training amplifies rounding over "
                 "many steps, which is why each step is checked from the run's own state)")
    return line


def run_main(argv: Sequence[str] | None = None, *, replan_search: Callable[..., Any] | None = None) -> int:
    """``hpp run PLAN.json --steps N [...]``; exit 1 if ``--verify`` finds a difference above 1e-9.

    ``replan_search``: the planner for ``--calibrate``'s re-plan check
    (:func:`hpp.runtime.calibrate.replan_check`; ``hpp``'s command line gives
    :func:`hpp.replan.search_calibrated`); without it the check is left out and the console says so.
    Bad input: ``hpp run: error: ...`` and exit 2 (:func:`hpp.cliparse.run_command`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _run_parser().parse_args(argv)
    args.command_line = shlex.join(["hpp", "run", *argv])       # what --calibrate records as its source
    args.replan_search = replan_search
    return run_command("hpp run", lambda: _run_command(args))


def _run_command(args: argparse.Namespace) -> int:
    """Run the plan and print the report; a failed run exits 1, a stopped one 130 / 143."""
    # here, not on top: torch and the runtime take 2-6 s to import (-X importtime); --help stays instant
    from hpp.runtime.run import RunFailedError, run_plan
    if args.calibrate is not None:
        _check_calibrate(args)
    try:
        with interrupt_signals():
            rep = _run(args, run_plan)
    except RunFailedError as exc:
        sys.stderr.write(f"hpp run: error: run failed: {exc}\n")
        return 1
    except (RunInterrupted, KeyboardInterrupt) as exc:
        code = exc.exit_code if isinstance(exc, RunInterrupted) else 130
        name = "SIGINT (Ctrl-C)" if code == 130 else str(exc)
        sys.stderr.write(f"hpp run: stopped by {name}: every local process of the run was ended\n")
        return code
    if rep.get("command"):
        print(json.dumps(rep) if args.json else "\n".join([shlex.join(rep["command"]),
                                                            *(f"  note: {n}" for n in rep["notes"])]))
        return 0
    few = few_steps_note(args.steps, args.warmup_steps)
    if few:
        rep["notes"] = [*rep.get("notes", []), few]
    cal_lines = _calibrate(args, rep) if args.calibrate is not None else []
    print(json.dumps(rep) if args.json else "\n".join([_human_run(rep), *cal_lines]))
    if args.json and cal_lines:
        sys.stderr.write("\n".join(cal_lines) + "\n")
    if rep.get("verify") is not None:
        line = _verify_line(rep["verify"])
        (sys.stderr if args.json else sys.stdout).write(line + "\n")
        return 0 if rep["verify"]["passed"] else 1
    return 0


def _check_calibrate(args: argparse.Namespace) -> None:
    """``--calibrate``'s refusals that need no run (:func:`hpp.runtime.calibrate.check_before_run`)."""
    from hpp.runtime.calibrate import check_before_run
    from hpp.runtime.run_setup import load_run_inputs
    if args.dry_run is not None or args.nnodes > 1:
        raise HppInputError("--calibrate needs the whole run on this host", field="--calibrate",
                            fix="drop --dry-run / --nnodes, or --calibrate")
    _plan, _cluster, profile = load_run_inputs(args.plan)
    check_before_run(args.calibrate, force=args.force, steps=args.steps, warmup_steps=args.warmup_steps,
                     device=args.device, emulate_speed=args.emulate_speed, has_profile=profile is not None,
                     plan_path=args.plan)


def _calibrate(args: argparse.Namespace, rep: dict) -> list[str]:
    """Calibrate from the run report ``rep``, write OUT.json and OUT.cluster.json, add ``rep["calibration"]``; the
    console lines."""
    from hpp.runtime.calibrate import calibrate_run, calibration_lines, replan_check, run_predictor, write_calibrated
    from hpp.runtime.run_setup import load_run_inputs
    plan, cluster, profile = load_run_inputs(args.plan)
    cal = calibrate_run(rep, plan, cluster, profile, source=args.command_line,
                        plan_path=str(args.plan))
    paths = write_calibrated(cal, args.calibrate, force=args.force)
    if args.replan_search is None:
        rep["calibration"] = {"profile": str(paths[0]), "cluster": str(paths[1]), **cal.calibration.to_dict(),
                              "replan": None}
        return calibration_lines(cal, None, paths, (rep.get("predicted") or {}).get("iteration_time_s"),
                                 (rep.get("measured") or {}).get("iteration_time_s"))
    check = replan_check(plan, cal, search=args.replan_search, predict=run_predictor(rep, cal))
    rep["calibration"] = {"profile": str(paths[0]), "cluster": str(paths[1]), **cal.calibration.to_dict(),
                          "replan": {k: v for k, v in check.items() if k != "plan"}}
    return calibration_lines(cal, check, paths, (rep.get("predicted") or {}).get("iteration_time_s"),
                             (rep.get("measured") or {}).get("iteration_time_s"))


def few_steps_note(steps: int, warmup_steps: int) -> str | None:
    """A note when the measured median is over fewer than 3 steps after the warm-up (None otherwise).

    The numbers are not changed; the note says over how many steps the median is and which ``--steps``
    gives 3 after the warm-up.

    >>> print(few_steps_note(2, 1))       # doctest: +NORMALIZE_WHITESPACE
    the measured iteration time is the median of 1 step after the warm-up of 1: use --steps 4 or more
    for a steadier figure
    >>> few_steps_note(4, 1) is None
    True
    """
    kept, enough = steps - warmup_steps, warmup_steps + 3
    if kept >= 3:
        return None
    if kept <= 0:            # the run's own note says the median includes the warm-up steps
        return f"use --steps {enough} or more for a median over 3 steps after the warm-up of {warmup_steps}"
    return (f"the measured iteration time is the median of {kept} step{'s' if kept > 1 else ''} after the warm-up of "
            f"{warmup_steps}: use --steps {enough} or more for a steadier figure")


def _run(args: argparse.Namespace, run_plan) -> dict:
    """``run_plan`` over the run configuration of the parsed flags; the report as a dict."""
    from hpp.runtime.config import RunConfig
    return run_plan(RunConfig.from_args(args)).to_dict()


def _profile_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hpp profile", description="Measure a runtime model's per-layer profile.")
    p.add_argument("--model", required=True,
                   help="runtime model NAME (e.g. llama-tiny, opt-350) or MODULE:FUNCTION (your own model)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--micro-batch-sizes", default="1,2,4", help="comma-separated, e.g. 1,2,4")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--out", required=True, help="native profile JSON to write")
    p.add_argument("--device-type", help="device type name of the entries (default: the device)")
    p.add_argument("--emulate", action="append", default=[], metavar="NAME=K",
                   help="also write an emulated device type NAME with compute x K (repeatable)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="CPU compute threads (hpp run uses 1 per rank)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="time the layers as hpp run --dtype runs them (bfloat16: autocast, fp32 weights)")
    p.add_argument("--no-memory-terms", action="store_true",
                   help="skip measuring the runtime step's memory per layer (FakeTensorMode + MemTracker)")
    p.add_argument("--time-terms", action=argparse.BooleanOptionalAction, default=None,
                   help="also measure the runtime step's time terms on this host (the loss per micro-batch size, "
                        "the schedule's cost per micro-batch and step, gloo send/recv latency, CPU contention; "
                        "about 80 s, less with --quick-time-terms) into each entry's step_time. Default: on with "
                        "--device cpu, off with cuda (measured on this host's CPU and gloo: not a GPU's)")
    p.add_argument("--quick-time-terms", action="store_true", help="fewer repeats for the time terms")
    p.add_argument("--json", action="store_true")
    return p


def _parse_sizes(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HppInputError(f"--micro-batch-sizes {text!r}", field="micro_batch_sizes",
                            fix="give comma-separated integers, e.g. 1,2,4") from None


def _parse_emulate(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, _, k = item.partition("=")
        try:
            out[name.strip()] = float(k)
        except ValueError:
            raise HppInputError(f"--emulate {item!r}", field="emulate", fix="write NAME=K, e.g. cpu-2x=2") from None
        if not name.strip():
            raise HppInputError(f"--emulate {item!r}", field="emulate", fix="write NAME=K, e.g. cpu-2x=2")
    return out


def profile_main(argv: Sequence[str] | None = None) -> int:
    """``hpp profile --model NAME --device cpu|cuda --micro-batch-sizes 1,2,4 --out PROFILE.json``.

    Bad input: ``hpp profile: error: ...`` and exit 2 (:func:`hpp.cliparse.run_command`).
    """
    args = _profile_parser().parse_args(argv)
    return run_command("hpp profile", lambda: _profile_command(args))


def _profile_command(args: argparse.Namespace) -> int:
    """Measure, write and summarise the profile."""
    # here, not on top: torch and the runtime take 2-6 s to import (-X importtime); --help stays instant
    from hpp.runtime.profile.profiler import profile_model, scale_profile, write_profile
    from hpp.runtime.profile.time_terms import add_measured_time_terms
    time_terms = args.device == "cpu" if args.time_terms is None else args.time_terms
    if time_terms and args.device != "cpu":
        raise HppInputError("--time-terms with --device cuda", field="time_terms",
                            fix="drop --time-terms: the time terms are measured on this host's CPU and gloo "
                                "(profile on the CPU host you will run on)")
    emulate = _parse_emulate(args.emulate)
    prof = profile_model(args.model, device=args.device, micro_batch_sizes=_parse_sizes(args.micro_batch_sizes),
                         tp_degree=args.tp, device_type=args.device_type, warmup=args.warmup,
                         repeats=args.repeats, num_threads=args.threads,
                         mixed_precision=args.dtype == "bfloat16", memory_terms=not args.no_memory_terms)
    if time_terms:                   # before the emulated types: they get the base's terms, emulated
        prof = add_measured_time_terms(prof, model=args.model, quick=args.quick_time_terms)
    if emulate:
        prof = scale_profile(prof, emulate, base_device_type=args.device_type or args.device)
    write_profile(prof, args.out)
    summary = {"out": args.out, "model": prof.model, "num_layers": prof.num_layers,
               "entries": [list(k) for k in sorted(prof.entries)], "time_terms": time_terms,
               "forward_backward_s": {f"{k[0]}/mb{k[2]}": sum(e.forward_s) + sum(e.backward_s)
                                      for k, e in sorted(prof.entries.items())}}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"wrote {args.out}: {prof.model}, {prof.num_layers} layers")
        for k, v in summary["forward_backward_s"].items():
            print(f"  {k:<24} forward+backward {v * 1e3:8.2f} ms per micro-batch")
    return 0


def main(argv: Sequence[str] | None = None, *, replan_search: Callable[..., Any] | None = None) -> int:
    """``python -m hpp.runtime.cli run|profile|profile-network ...`` (``replan_search``: see :func:`run_main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if argv and argv[0] == "run":
        return run_main(argv[1:], replan_search=replan_search)
    if argv and argv[0] == "profile":
        return profile_main(argv[1:])
    if argv and argv[0] == "profile-network":
        from hpp.runtime.network.cli import profile_network_main
        return profile_network_main(argv[1:])
    sys.stderr.write("usage: python -m hpp.runtime.cli run|profile|profile-network ...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
