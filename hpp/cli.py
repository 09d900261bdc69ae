"""The ``hpp`` command line: thin (parse, call the library, print). See shared CONTRACT.md.

Exit codes: 0 success; 2 bad input or no feasible plan (one line on stderr naming the
file and field, or the memory shortfall); 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from hpp.cliparse import Parser
from hpp.errors import HppInputError

__all__ = ["main"]

log = logging.getLogger("hpp")


def _num(x: float) -> Any:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _estimate_json(est) -> dict[str, Any]:
    return {
        "iteration_time_s": est.iteration_time_s,
        "pipeline_time_s": est.pipeline_time_s,
        "grad_sync_s": est.grad_sync_s,
        "grad_sync_block_s": est.grad_sync_block_s,
        "grad_sync_layer_s": est.grad_sync_layer_s,
        "optimizer_s": est.optimizer_s,
        "throughput_samples_per_s": est.throughput_samples_per_s,
        "throughput_tokens_per_s": est.throughput_tokens_per_s,
        "peak_memory_bytes": est.peak_memory_bytes,
        "fits_memory": est.fits_memory,
        "uses_estimated_profile": est.uses_estimated_profile,
        "pipelines": [{
            "time_s": p.time_s, "num_micro_batches": p.num_micro_batches, "micro_batch_size": p.micro_batch_size,
            "num_samples": p.num_samples, "bottleneck_s": p.bottleneck_s,
            "stages": [{"layers": [s.layer_start, s.layer_stop], "device_type": s.device_type,
                        "tp_degree": s.tp_degree, "recompute": s.recompute, "forward_s": s.forward_s,
                        "backward_s": s.backward_s, "p2p_s": s.p2p_s, "busy_s": s.busy_s, "bubble_s": s.bubble_s,
                        "optimizer_s": s.optimizer_s, "grad_sync_s": s.grad_sync_s,
                        "in_flight_micro_batches": s.in_flight_micro_batches, "memory_bytes": s.memory_bytes,
                        "capacity_bytes": s.capacity_bytes, "headroom_bytes": s.headroom_bytes}
                       for s in p.stages]} for p in est.pipelines],
        "blocks": [{"layers": [b.layer_start, b.layer_stop], "holder_stages": list(b.holders),
                    "bytes": b.num_bytes, "allreduce_s": b.allreduce_s} for b in est.blocks],
    }


def _mem(x: float, unit: float) -> str:
    return f"{x / unit:.1f}"


def _mem_unit(capacity_bytes: float) -> tuple[float, str]:
    """GiB for GPU-sized capacities, MiB below 1 GiB (emulated CPU devices)."""
    return (2**30, "GiB") if capacity_bytes >= 2**30 else (2**20, "MiB")


def _print_estimate(est, plan, out=None) -> None:
    w = (out or sys.stdout).write          # sys.stdout at call time (it may be replaced after import)
    unit, uname = _mem_unit(min(s.capacity_bytes for p in est.pipelines for s in p.stages))
    w(f"{'pipe':>4} {'stage':>5} {'device':>12} {'tp':>2} {'layers':>9} {'rec':>4} {'mb':>3} {'#mb':>4} "
      f"{'fwd+bwd ms':>10} {'p2p ms':>7} {'bubble s':>8} {'sync s':>7} {'memory / capacity':>17}\n")
    for i, (p, pe) in enumerate(zip(plan.pipelines, est.pipelines)):
        for j, (s, se) in enumerate(zip(p.stages, pe.stages)):
            w(f"{i:>4} {j:>5} {s.device_type:>12} {s.tp_degree:>2} {f'[{s.layer_start},{s.layer_stop})':>9} "
              f"{s.recompute[:4]:>4} {p.micro_batch_size:>3} {p.num_micro_batches:>4} "
              f"{1e3 * (se.forward_s + se.backward_s):>10.2f} {1e3 * se.p2p_s:>7.2f} {se.bubble_s:>8.3f} "
              f"{se.grad_sync_s:>7.3f} {_mem(se.memory_bytes, unit):>6}/{_mem(se.capacity_bytes, unit):>6} {uname}\n")
        w(f"     pipeline {i}: {p.num_samples} samples, {pe.time_s:.3f} s\n")
    w(f"blocks: {len(est.blocks)}; gradient sync block-wise {est.grad_sync_block_s:.3f} s "
      f"(per-layer all-reduce would take {est.grad_sync_layer_s:.3f} s)\n")
    w(f"predicted iteration time {est.iteration_time_s:.3f} s = pipelines {est.pipeline_time_s:.3f} + sync "
      f"{est.grad_sync_s:.3f} + optimizer {est.optimizer_s:.3f}; throughput {est.throughput_samples_per_s:.1f} "
      f"samples/s ({est.throughput_tokens_per_s:,.0f} tokens/s); peak memory {_mem(est.peak_memory_bytes, unit)} {uname}\n")
    if not est.fits_memory:
        w("WARNING: some device exceeds its memory capacity (negative headroom above)\n")
    for msg in est.warnings:
        w(f"note: {msg}\n")


# ----------------------------------------------------------------------------- commands


def _check_writable(out: Path | None) -> None:
    """Refuse an ``--out`` whose folder is missing or read-only before any work is done."""
    if out is None:
        return
    parent = Path(out).resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise HppInputError(f"cannot write {out}: folder {parent} does not exist or is not writable",
                            field="--out", fix="create the folder first or give a writable path")


def _check_plan_args(args) -> None:
    """Refuse out-of-range numbers before anything is computed (exit 2, naming the flag)."""
    checks = (("--gbs", args.gbs, 1), ("--max-tp", args.max_tp, 1), ("--max-stages", args.max_stages, 1),
              ("--max-types-per-pipeline", args.max_types_per_pipeline, 1),
              ("--workers", args.workers, 0))
    for flag, value, minimum in checks:
        if value is not None and value < minimum:
            raise HppInputError(f"{flag} {value}", field=flag, fix=f"give an integer >= {minimum}")
    if not args.time_limit > 0:
        raise HppInputError(f"--time-limit {args.time_limit}", field="--time-limit", fix="give a positive number of seconds")
    if not args.baseline_time_limit > 0:
        raise HppInputError(f"--baseline-time-limit {args.baseline_time_limit}", field="--baseline-time-limit",
                            fix="give a positive number of seconds (--no-baselines skips the baselines)")
    if args.micro_batch_sizes is not None and (not args.micro_batch_sizes or min(args.micro_batch_sizes) < 1):
        raise HppInputError(f"--micro-batch-sizes {args.micro_batch_sizes}", field="--micro-batch-sizes",
                            fix="give positive integers, e.g. 1,2,4")
    _check_writable(getattr(args, "out", None))
    if args.scenario and (args.cluster or args.profile or args.model):
        raise HppInputError("--scenario cannot be combined with --cluster/--profile/--model", field="--scenario",
                            fix="use either a bundled scenario or your own cluster and profile")


def _inputs_from_args(args) -> tuple[Any, Any, int, str]:
    from hpp.profiles.bundled import load_bundled_profile
    from hpp.profiles.cluster import load_cluster
    from hpp.profiles.model_profile import load_profile
    from hpp.scenarios import DEFAULT_SCENARIO, get_scenario

    _check_plan_args(args)
    if args.cluster or args.profile or args.model:
        if args.profile and args.model:
            raise HppInputError("give --profile or --model, not both", field="--model",
                                fix="--profile FILE for your own profile, --model NAME for a bundled one")
        # the profile first: an unknown --model is named as such, whatever the cluster
        try:
            profile = load_profile(args.profile) if args.profile else load_bundled_profile(args.model or "OPT-350")
        except HppInputError as exc:          # the library names its argument; here it is the flag
            if args.profile:
                raise
            raise HppInputError(exc.message, field="--model", fix=exc.fix) from None
        if not args.cluster:
            raise HppInputError("--cluster is required with --profile/--model", field="--cluster",
                                fix="give a cluster JSON file, or use --scenario")
        cluster = load_cluster(args.cluster)
        gbs = args.gbs if args.gbs is not None else 1024
        return cluster, profile, gbs, Path(args.cluster).stem
    sc = get_scenario(args.scenario or DEFAULT_SCENARIO)
    return sc.cluster(), load_bundled_profile(sc.model), args.gbs if args.gbs is not None else sc.global_batch_size, \
        sc.name


def cmd_plan(args) -> int:
    from hpp.baselines import run_baselines
    from hpp.formulation.candidates import SearchSpace
    from hpp.formulation.composition import SolverSettings
    from hpp.plan import plan_to_dict, write_plan_json
    from hpp.planner import check_micro_batch_sizes, plan_hpp
    from hpp.resolve import profile_ref_for
    from hpp.validate import validate_plan

    cluster, profile, gbs, name = _inputs_from_args(args)
    space = SearchSpace(micro_batch_sizes=tuple(args.micro_batch_sizes) if args.micro_batch_sizes else None,
                        max_tp=args.max_tp, max_stages=args.max_stages, allow_recompute=not args.no_recompute,
                        max_types_per_pipeline=args.max_types_per_pipeline)
    settings = SolverSettings(max_time_in_seconds=args.time_limit, num_workers=args.workers, random_seed=args.seed,
                              cpsat_on_subset=args.cpsat_on_subset)
    check_micro_batch_sizes(cluster, profile, space)      # refused before the baselines run
    quiet = args.json or args.quiet
    progress = None if quiet else (lambda msg: print(f"[hpp plan] {msg}", file=sys.stderr, flush=True))
    if not args.no_baselines and progress:
        progress(f"baselines: uniform, and single-shape (capped at {args.baseline_time_limit:g} s)")
    baselines = {} if args.no_baselines else run_baselines(cluster, profile, gbs, space=space,
                                                                 time_budget_s=args.baseline_time_limit)
    seeds = {k: b.plan for k, b in baselines.items() if b.plan is not None}
    res = plan_hpp(cluster, profile, gbs, space=space, settings=settings, solver=args.solver,
                   profile_ref=profile_ref_for(profile), progress=progress, seed_plans=seeds)
    validate_plan(res.plan, cluster, profile, source="<planner output>")
    from dataclasses import replace
    predicted = {"iteration_time_s": res.estimate.iteration_time_s,
                 "throughput_samples_per_s": res.estimate.throughput_samples_per_s,
                 "throughput_tokens_per_s": res.estimate.throughput_tokens_per_s,
                 "peak_memory_bytes": res.estimate.peak_memory_bytes}
    plan = replace(res.plan, predicted=predicted)
    if args.out:
        write_plan_json(plan, args.out)
    comp = res.composition
    search = {"wall_s": res.wall_s, "status": comp.status, "gap": _num(comp.gap), "objective_s": _num(comp.objective_s),
              "bound_s": _num(comp.bound_s), "solver": comp.solver, "solve_s": comp.wall_s,
              "num_candidates": comp.num_candidates,
              "stats": {k: (_num(v) if isinstance(v, float) else v) for k, v in res.stats.items()}}
    base_json = {k: {"iteration_time_s": _num(b.iteration_time_s), "throughput_samples_per_s": _num(b.throughput),
                     "speedup_of_hpp": _num(b.iteration_time_s / res.estimate.iteration_time_s)
                     if b.iteration_time_s else None, "wall_s": b.wall_s, "description": b.description,
                     "feasible": b.feasible}
                 for k, b in baselines.items()}
    if args.json:
        out = {"scenario": name, "predicted": _estimate_json(res.estimate), "search": search,
               "baselines": base_json, "plan": plan_to_dict(plan)}   # the summary first, the long plan last
        print(json.dumps(out, indent=1))
        return 0
    print(f"HPP plan for {profile.model} on {name}: {cluster.num_devices} devices "
          f"({', '.join(f'{n} x {t}' for t, n in sorted(cluster.count_by_type().items()))}), global batch {gbs}")
    _print_estimate(res.estimate, plan)
    seen = res.stats.get("cpsat_candidates")
    if seen == 0:
        how = f" (more than {settings.max_candidates}: CP-SAT skipped, the LP bound covers all)"
    elif seen is not None and seen < comp.num_candidates:
        how = f" (CP-SAT saw the best {seen}; the bound covers all)"
    else:
        how = ""
    if comp.solver == "cp-sat" and res.stats.get("plan_from") == "heuristic":
        how += "; the plan is the heuristic incumbent (CP-SAT found none better)"
    print(f"search: {res.wall_s:.2f} s, solver {comp.solver} {comp.status}, objective {comp.objective_s:.4f} s, "
          f"bound {comp.bound_s:.4f} s, gap {comp.gap:.2%}, {comp.num_candidates} candidates{how}")
    if res.stats.get("seeded_from"):
        print(f"plan returned: the {res.stats['seeded_from']} baseline's, which the cost model prices below the "
              f"search's ({comp.objective_s:.3f} s objective); the objective, bound and gap above are the search's")
    for k, b in baselines.items():
        if b.feasible:
            print(f"baseline {k:>12}: {b.iteration_time_s:.3f} s/iter ({b.description}); HPP speedup "
                  f"{b.iteration_time_s / res.estimate.iteration_time_s:.2f}x")
        else:
            print(f"baseline {k:>12}: no feasible plan ({b.description})")
    if args.out:
        print(f"plan written to {args.out}")
    return 0


def cmd_estimate(args) -> int:
    from hpp.formulation.cost_model import estimate_plan
    from hpp.interop import load_any_plan
    from hpp.plan import write_plan_json

    profile = None
    if args.model:
        from hpp.profiles.bundled import load_bundled_profile
        profile = load_bundled_profile(args.model)
    _check_writable(args.out)
    plan, cluster, profile = load_any_plan(args.plan, fmt=args.format, profile=profile, gbs=args.gbs)
    est = estimate_plan(plan, cluster, profile)
    if args.out:
        write_plan_json(plan, args.out)
    if args.json:
        print(json.dumps({"plan": str(args.plan), "format": plan.predicted.get("imported_from", "hpp"),
                          "model": plan.model, "predicted": _estimate_json(est)}, indent=1))
        return 0
    src = plan.predicted.get("imported_from")
    print(f"plan {args.plan}{f' ({src} plan)' if src else ''}: {plan.model}, {plan.num_pipelines} pipelines on "
          f"{plan.num_devices} devices, global batch {plan.global_batch_size}")
    _print_estimate(est, plan)
    if args.out:
        print(f"hpp plan written to {args.out}")
    return 0


def cmd_scenarios(args) -> int:
    from hpp.profiles.cluster import cluster_to_dict
    from hpp.scenarios import DEFAULT_SCENARIO, SCENARIOS, get_scenario

    if args.cluster:   # the scenario's cluster as a cluster file, to edit or to plan with your own profile
        print(json.dumps(cluster_to_dict(get_scenario(args.cluster).cluster()), indent=1))
        return 0

    rows = []
    for s in SCENARIOS.values():
        gpus = " + ".join(f"{n} {t}" for t, n in s.gpus)
        rows.append({"name": s.name, "model": s.model, "global_batch_size": s.global_batch_size, "cluster": gpus,
                     "default": s.name == DEFAULT_SCENARIO})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['name']:<24} {r['model']:<12} gbs {r['global_batch_size']:<5} {r['cluster']}"
              f"{'   (default)' if r['default'] else ''}")
    return 0


def _int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (argparse type; its error names the flag and the value)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4") from None


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="hpp", description="Heterogeneous Pipeline Parallelism: plan and run.")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="more logging on stderr")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="search the best HPP plan (no arguments: the bundled default scenario)")
    p.add_argument("--scenario", help="a bundled scenario (see `hpp scenarios`)")
    p.add_argument("--cluster", type=Path, help="cluster JSON file (instead of --scenario)")
    p.add_argument("--profile", type=Path, help="native profile JSON file (with --cluster)")
    p.add_argument("--model", help="bundled model profile (with --cluster): OPT-350, GPT-Neo-2.7, LLAMA-3-8, gpt-tiny")
    p.add_argument("--gbs", type=int, help="global batch size [samples]")
    p.add_argument("--micro-batch-sizes", type=_int_list,
                   help="comma-separated micro-batch sizes to consider (default: all measured)")
    p.add_argument("--max-tp", type=int, help="largest TP degree")
    p.add_argument("--max-stages", type=int, default=8, help="most stages per pipeline (default 8)")
    p.add_argument("--max-types-per-pipeline", type=int, default=2,
                   help="most GPU types in one pipeline (default 2; 3 searches far more shapes)")
    p.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT time limit [s] (default 10)")
    p.add_argument("--workers", type=int, default=0,
                   help="CP-SAT workers and stage-balance processes (0 = one per core)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed")
    p.add_argument("--cpsat-on-subset", action="store_true",
                   help="with more than 200 candidates, still run CP-SAT on the best 200 (it may improve the plan "
                        "but cannot certify it; default: skip it there)")
    p.add_argument("--solver", default="cp-sat", choices=["cp-sat", "greedy"])
    p.add_argument("--no-recompute", action="store_true", help="forbid activation recomputation")
    p.add_argument("--no-baselines", action="store_true", help="skip the baselines")
    p.add_argument("--baseline-time-limit", type=float, default=30.0,
                   help="cap on the single-shape baseline's enumeration [s] (default 30)")
    p.add_argument("--out", type=Path, help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_plan)

    e = sub.add_parser("estimate", help="validate a plan and predict its iteration time and memory")
    e.add_argument("plan", type=Path)
    e.add_argument("--model", help="bundled profile to use instead of the plan's")
    e.add_argument("--format", choices=["hpp", "sailor", "metis"],
                   help="plan format (default: detected; Sailor and Metis plans are converted, see hpp/interop.py)")
    e.add_argument("--gbs", type=int, help="global batch size [samples] for a Sailor/Metis plan that gives none")
    e.add_argument("--out", type=Path, help="write the (converted) hpp plan here")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_estimate)

    s = sub.add_parser("scenarios", help="list the bundled scenarios")
    s.add_argument("--json", action="store_true")
    s.add_argument("--cluster", metavar="NAME", help="print scenario NAME's cluster as a cluster JSON file")
    s.set_defaults(func=cmd_scenarios)

    # listed for `hpp --help` only: main() hands these to hpp.runtime.cli / hpp.bench_cli before parsing
    sub.add_parser("run", help="execute a plan with torch.distributed (hpp run --help)")
    sub.add_parser("profile", help="measure a model's per-layer profile (hpp profile --help)")
    sub.add_parser("instances", help="the solver-benchmark instance library: list|export|generate|solve")
    sub.add_parser("bench-solvers", help="every solver on every instance of a suite (--suite quick|full)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hpp`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "profile"):   # runtime commands live in hpp.runtime (torch imported only there)
        from hpp.runtime.cli import main as runtime_main
        return runtime_main(argv)
    if argv and argv[0] in ("instances", "bench-solvers"):   # the solver-benchmark commands
        from hpp.bench_cli import main as bench_main
        return bench_main(argv)
    ap = _parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except HppInputError as exc:
        print(f"hpp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hpp {args.command}: interrupted", file=sys.stderr)
        return 1
    except BrokenPipeError:   # e.g. `hpp plan | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
