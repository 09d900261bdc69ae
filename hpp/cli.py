"""The ``hpp`` command line: thin (parse, call the library, print). See docs/CONTRACT.md.

Exit codes: 0 success; 2 bad input or no feasible plan (one line on stderr naming the
file and field, or the memory shortfall); 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from dataclasses import replace

from hpp import __version__
from hpp.baselines import DEFAULT_BASELINE_TIME_LIMIT_S
from hpp.cli_bundled import add_bundled_commands
from hpp.cli_inputs import DEFAULT_GBS, check_writable, estimate_inputs, left_out_types, max_tp_note, plan_inputs
from hpp.cli_output import (baselines_json, estimate_header, estimate_json, idle_alternative, idle_devices_note,
                            named_solver_note, print_estimate, print_memory_breakdown, print_plan_report, search_json)
from hpp.cliparse import DefaultsRawFormatter, Parser, run_command
from hpp.errors import HppInputError
from hpp.formulation.cost_config import CostModelConfig
from hpp.plan_data import plan_to_dict, write_plan_json
from hpp.profiles.bundled import bundled_models
from hpp.profiles.cluster_notes import cluster_notes
from hpp.profiles.cluster_format import CLUSTER_FORMAT_HELP
from hpp.validate import OVER_MEMORY_FLAG, check_fits_memory
from hpp.wording import count

# The search (hpp.planner, hpp.replan, hpp.baselines, hpp.formulation's candidates, cost model and solver
# settings) imports numpy, SciPy and OR-Tools: about 1.4 s, against 0.16 s for `hpp --help` without them
# (measured: python -c "import hpp.cli" vs "import hpp.cli, hpp.planner, hpp.replan, hpp.baselines.single_shape").
# So the commands that search or price a plan import them in their bodies ("lazy: numpy/OR-Tools" below).

__all__ = ["main"]

log = logging.getLogger("hpp")



# ----------------------------------------------------------------------------- commands


def _replan_json(req, res, seed_s: float) -> dict[str, Any] | None:
    """``search.replan`` of the JSON output (None without --exclude-*/--previous)."""
    if not req.excluded and req.previous is None:
        return None
    from hpp.replan import SEED_NAME    # lazy: numpy/OR-Tools
    return {"excluded_device_ids": sorted(req.excluded), "devices_before": (req.full_cluster or req.cluster).num_devices,
            "devices_after": req.cluster.num_devices,
            "device_map": {str(k): v for k, v in (req.id_map or {}).items()},
            "seeded_from_previous": res.stats.get("seeded_from") == SEED_NAME,
            "seed_s": seed_s, "wall_s": seed_s + res.wall_s}


def _request(args, inp):
    """The :class:`~hpp.request.PlanRequest` of ``hpp plan``'s flags (the same builder as :func:`hpp.plan`)."""
    from hpp.request import build_request     # lazy: numpy/OR-Tools (see the module top)

    return build_request(
        inp.cluster, inp.profile, inp.global_batch_size, micro_batch_sizes=args.micro_batch_sizes, max_tp=args.max_tp,
        min_tp=args.min_tp, max_stages=args.max_stages, max_types_per_pipeline=args.max_types_per_pipeline,
        allow_recompute=not args.no_recompute, mixed_tp_pipelines=args.mixed_tp_pipelines, solver=args.solver,
        time_limit_s=args.time_limit, work_limit=args.work_limit, workers=args.workers, seed=args.seed,
        cpsat_params=args.cpsat_params, cpsat_on_subset=args.cpsat_on_subset, type_classes=args.type_classes,
        memory_headroom=args.memory_headroom, optimizer=args.optimizer, baselines=not args.no_baselines,
        baseline_time_limit_s=args.baseline_time_limit, exclude_devices=inp.exclude_devices,
        exclude_nodes=inp.exclude_nodes, previous=inp.previous)


def cmd_plan(args) -> int:
    from hpp.planner import check_micro_batch_sizes     # lazy: numpy/OR-Tools (see the module top)
    from hpp.request import run_request

    t0 = time.perf_counter()
    inp = plan_inputs(args)
    profile, gbs, name, said = inp.profile, inp.global_batch_size, inp.name, inp.said
    request = _request(args, inp)
    cluster, space = request.cluster, request.planner.space
    if request.excluded:
        said.append(f"the cluster without devices {','.join(map(str, sorted(request.excluded)))}: "
                    f"{inp.cluster.num_devices} -> {cluster.num_devices} devices, renumbered node by node")
    try:
        left_out = left_out_types(cluster, profile, space)
    except HppInputError as e:
        if not (args.profile and e.field == "nodes[*].device_type" and not e.source):
            raise
        raise HppInputError(f"{e.message} (--profile {args.profile})", field=e.field, fix=e.fix) from None
    notes = cluster_notes(cluster) + list(left_out.values()) + [n for n in [max_tp_note(cluster, profile, space)] if n]
    check_micro_batch_sizes(cluster, profile, space)      # refused before any progress line
    quiet = args.json or args.quiet
    progress = None if quiet else (lambda msg: print(f"[hpp plan] {msg}", file=sys.stderr, flush=True))
    say = progress or (lambda _msg: None)
    say(f"planning {profile.model} on {name}: {count(cluster.num_devices, 'device')}, global batch {gbs}")
    for line in said:
        say(f"using {line}")
    for line in notes:
        say(f"note: {line}")
    outcome = run_request(request, progress=progress)
    res = outcome.result
    predicted = {"iteration_time_s": res.estimate.iteration_time_s,
                 "throughput_samples_per_s": res.estimate.throughput_samples_per_s,
                 "throughput_tokens_per_s": res.estimate.throughput_tokens_per_s,
                 "peak_memory_bytes": res.estimate.peak_memory_bytes}
    plan = replace(res.plan, predicted=predicted)
    if args.out:
        write_plan_json(plan, args.out)
    t_idle = time.perf_counter()
    if len(set(plan.device_ids)) < cluster.num_devices:
        say(f"{count(cluster.num_devices - len(set(plan.device_ids)), 'device')} idle: pricing the best plans found "
            f"that use them")
    alternative = idle_alternative(res, cluster, gbs)
    idle_s = time.perf_counter() - t_idle
    idle = idle_devices_note(plan, cluster, gbs, left_out=set(left_out) | set(res.stats.get("types_left_out") or ()),
                             predicted_s=res.estimate.iteration_time_s, alternative=alternative)
    notes += [n for n in (idle, named_solver_note(args.solver, res.search, args.cpsat_params)) if n]
    if args.json:
        out = {"scenario": name, "model": profile.model, "global_batch_size": gbs, "notes": notes,
               "predicted": estimate_json(res.estimate),
               "search": search_json(outcome, plan, cluster, gbs, replan=_replan_json(request, res, outcome.seed_s)),
               "baselines": baselines_json(outcome), "plan": plan_to_dict(plan)}   # the summary first, the plan last
        print(json.dumps(out, indent=1))
        return 0
    replanned = request.excluded or request.previous is not None
    print_plan_report(outcome, plan, cluster, name, profile.model, notes,
                      replanned_from=inp.cluster if replanned else None, out=args.out)
    say(f"done in {time.perf_counter() - t0:.1f} s (baselines {outcome.baselines_s:.1f} s, "
        f"HPP search {res.wall_s:.1f} s" + (f", idle-device check {idle_s:.1f} s" if idle_s >= 0.05 else "") + ")")
    return 0


def _add_memory_flags(p) -> None:
    p.add_argument("--memory-headroom", type=float, default=0.0, metavar="FRAC",
                   help="fraction of every device's memory kept free: a stage must fit in capacity x (1 - FRAC) "
                        "minus the framework reserve")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="optimizer the run uses (its states count in memory for profiles measured by hpp profile; "
                        "the bundled GPU profiles keep their calibrated 16 bytes per parameter)")


def _cost_config(args) -> CostModelConfig:
    return CostModelConfig(memory_headroom=args.memory_headroom, optimizer=args.optimizer)


def cmd_estimate(args) -> int:
    from hpp.formulation.cost_model import estimate_plan     # lazy: numpy (see the module top)

    check_writable(args.out)
    plan, cluster, profile = estimate_inputs(args)
    est = estimate_plan(plan, cluster, profile, config=_cost_config(args))
    over = check_fits_memory(est, plan, source=str(args.plan), allow=args.allow_over_memory)
    if args.out:
        write_plan_json(plan, args.out)
    if args.json:
        print(json.dumps({"plan": str(args.plan), "format": plan.predicted.get("imported_from", "hpp"),
                          "model": plan.model, "allowed_over_memory": over is not None, "notes": [over] if over else [],
                          "predicted": estimate_json(est)}, indent=1))
        return 0
    src = plan.predicted.get("imported_from")
    print(estimate_header(args.plan, plan, cluster, src, cluster_file=args.cluster))
    print_estimate(est, plan)
    print_memory_breakdown(est)
    if over:
        print(f"note: {over}")
    if args.out:
        print(f"hpp plan written to {args.out}")
    return 0


def _int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (argparse type; its error names the flag and the value)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4") from None


_PLAN_EPILOG = """\
defaults: with no arguments, the bundled scenario opt350-a100x8-v100x8 (OPT-350, global batch
1024, 8 A100-40 + 8 V100-16); --model/--profile with --scenario replace its model; with
--cluster FILE, --model NAME or --profile FILE is required and --gbs defaults to 1024. The
first progress lines name every default in use. Time limits: --baseline-time-limit bounds both baselines together
(about S + 1 s); --time-limit S is the search's wall-clock budget from its start (default none: a small deterministic
work limit, so the same input, --seed and --workers give the same plan), --work-limit UNITS a deterministic one.

"""


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="hpp", description="Heterogeneous Pipeline Parallelism: plan and run.",
                epilog="Global options (-v, -vv) go before the command: hpp -v run PLAN.json --steps 1")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="more logging on stderr (-vv: debug)")
    ap.add_argument("--version", action="version", version=f"hpp {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    _add_plan_parser(sub)
    _add_estimate_parser(sub)
    add_bundled_commands(sub)
    # listed for `hpp --help` only: main() hands these to hpp.runtime.cli / hpp.bench.cli before parsing
    sub.add_parser("run", help="execute a plan with torch.distributed (hpp run --help)")
    sub.add_parser("profile", help="measure a model's per-layer profile (hpp profile --help)")
    sub.add_parser("profile-network", help="measure the cluster's links into a cluster file (hpp profile-network --help)")
    sub.add_parser("instances", help="the solver-benchmark instance library: list|export|generate|solve")
    sub.add_parser("bench-solvers", help="every solver on every instance of a suite (--suite quick|full)")
    return ap


def _add_plan_parser(sub) -> None:
    """``hpp plan``'s flags (the names :func:`hpp.request.build_request` takes)."""
    p = sub.add_parser("plan", help="search the best HPP plan (no arguments: the bundled default scenario)",
                       formatter_class=DefaultsRawFormatter, epilog=_PLAN_EPILOG + CLUSTER_FORMAT_HELP)
    p.add_argument("--scenario", help="a bundled scenario (see `hpp scenarios`; default opt350-a100x8-v100x8)")
    p.add_argument("--cluster", type=Path, help="cluster JSON file instead of --scenario (format below)")
    p.add_argument("--default-links", action="store_true",
                   help="plan on Sailor's measured fits (one public cloud) for links the cluster file leaves out")
    p.add_argument("--profile", type=Path,
                   help="native profile JSON file (with --cluster, or replacing a --scenario's model)")
    p.add_argument("--model", help=f"bundled model profile (with --cluster, or replacing a --scenario's model): "
                                   f"{', '.join(bundled_models())}")
    p.add_argument("--gbs", type=int, help=f"global batch size [samples] (default: the scenario's; {DEFAULT_GBS} "
                                             f"with --cluster)")
    p.add_argument("--micro-batch-sizes", type=_int_list,
                   help="comma-separated micro-batch sizes to consider (default: all measured)")
    p.add_argument("--max-tp", type=int, help="cap on the measured TP degrees (default: the largest measured that fits "
                                              "a node; a cap that is no measured degree is said in a note)")
    p.add_argument("--min-tp", type=int, default=1, help="smallest TP degree (default 1; --min-tp 2 --max-tp 2: TP 2)")
    p.add_argument("--max-stages", type=int, default=8, help="most stages per pipeline")
    p.add_argument("--max-types-per-pipeline", type=int, default=2, help="most GPU types in one pipeline (3: far more shapes)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="wall-clock budget [s]: the search improves plan and bound until then, with progress lines "
                        "(default none: a small deterministic budget; with one the answer can depend on the load)")
    p.add_argument("--work-limit", type=float, default=None, metavar="UNITS",
                   help="a deterministic budget instead: UNITS of CP-SAT work per exact solver (HiGHS: 2,000 nodes "
                        "per unit) and as much for the cost-model local search")
    p.add_argument("--workers", type=int, default=0,
                   help="CP-SAT workers and stage-balance processes (0 = one per core)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed")
    p.add_argument("--cpsat-on-subset", action="store_true",
                   help="with more candidates than the exact solver's limit (16 at the default budget, 200 with a "
                        "larger max_deterministic_time or a --solver named), still run it on the best ones (it may "
                        "improve the plan but cannot certify it; default: skip it there)")
    p.add_argument("--solver", choices=["cp-sat", "milp", "heuristic"],
                   help="composition solver (default: cp-sat, on up to 16 candidates at the default budget; an exact "
                        "solver named here runs on up to 200)")
    p.add_argument("--type-classes", action="store_true",
                   help="also bound the plans by the GPU types their pipelines share (smaller gap, ~1.4x search time)")
    p.add_argument("--cpsat-params", metavar="TEXT",
                   help='extra CP-SAT parameters in text format, e.g. "num_workers:1,random_seed:1" (applied last)')
    p.add_argument("--no-recompute", action="store_true", help="forbid activation recomputation")
    _add_memory_flags(p)
    p.add_argument("--mixed-tp-pipelines", action="store_true",
                   help="let a pipeline's stages have different TP degrees (hpp run refuses such plans)")
    p.add_argument("--no-baselines", action="store_true", help="skip the baselines")
    p.add_argument("--baseline-time-limit", type=float, default=DEFAULT_BASELINE_TIME_LIMIT_S,
                   help="bound on both baselines together [s] (uniform up to half, single-shape the rest; each "
                        "stops at its deadline with its best plan so far)")
    p.add_argument("--exclude-devices", metavar="IDS",
                   help="comma-separated device ids to leave out (lost GPUs; ids of the cluster before excluding, "
                        "numbered node by node); the rest is renumbered node by node")
    p.add_argument("--exclude-nodes", metavar="IDS", help="comma-separated node indices to leave out")
    p.add_argument("--previous", type=Path, metavar="PLAN.json",
                   help="the plan made before the loss: its pipelines that use no excluded device seed the search "
                        "(the result is never predicted slower than them); without --scenario/--cluster, its "
                        "cluster, profile and global batch are used")
    p.add_argument("--out", type=Path, help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_plan)


def _add_estimate_parser(sub) -> None:
    """``hpp estimate``'s flags."""
    e = sub.add_parser("estimate", help="validate a plan and predict its iteration time and memory")
    e.add_argument("plan", type=Path)
    e.add_argument("--model", help="bundled profile to use instead of the plan's")
    e.add_argument("--format", choices=["hpp", "sailor", "metis"],
                   help="plan format (default: detected; Sailor and Metis plans are converted, see hpp/interop/)")
    e.add_argument("--gbs", type=int, help="global batch size [samples] for a Sailor/Metis plan that gives none")
    e.add_argument("--cluster", type=Path, help="bind the plan's pipelines onto this cluster file and price them there")
    e.add_argument("--default-links", action="store_true",
                   help="take Sailor's measured fits for links the --cluster file leaves out")
    e.add_argument("--out", type=Path, help="write the (converted) hpp plan here")
    _add_memory_flags(e)
    e.add_argument(OVER_MEMORY_FLAG, action="store_true",
                   help="print the estimate of a plan predicted not to fit its devices' memory (default: refused, "
                        "exit 2, naming the stage and the shortfall)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_estimate)


_DISPATCHED = ("run", "profile", "profile-network", "instances", "bench-solvers")


def _global_flags(argv: list[str]) -> tuple[int, list[str]]:
    """(verbosity, the rest): the global flags (-v, -vv, --verbose) before the command are taken off.

    Examples
    --------
    >>> _global_flags(["-vv", "--verbose", "run", "p.json", "-v"])
    (3, ['run', 'p.json', '-v'])
    """
    verbose, i = 0, 0
    while i < len(argv):
        a = argv[i]
        if a == "--verbose":
            verbose += 1
        elif len(a) > 1 and a[0] == "-" and set(a[1:]) == {"v"}:
            verbose += len(a) - 1
        else:
            break
        i += 1
    return verbose, argv[i:]


def _configure_logging(verbose: int) -> None:
    """WARNING, INFO (-v) or DEBUG (-vv) for hpp's loggers, on stderr."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("hpp").setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hpp`` console script; returns the exit code.

    Global flags (``-v``/``-vv``/``--verbose``) go before the command and work for every command.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose, rest = _global_flags(argv)
    if rest and rest[0] in _DISPATCHED:
        _configure_logging(verbose)
        # lazy: each dispatched command loads its own module (hpp.bench.cli loads numpy: 0.36 s against 0.16 s
        # for `import hpp.cli`, measured; hpp.runtime.cli keeps torch out of the planning commands)
        if rest[0] in ("run", "profile", "profile-network"):
            from hpp.replan import search_calibrated       # hpp run --calibrate's re-plan (the runtime has no planner)
            from hpp.runtime.cli import main as runtime_main
            return runtime_main(rest, replan_search=search_calibrated)
        from hpp.bench.cli import main as bench_main
        return bench_main(rest)
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose)
    return run_command(f"hpp {args.command}", lambda: args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
