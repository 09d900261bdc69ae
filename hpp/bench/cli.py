"""Thin CLI of the solver benchmark: ``hpp instances list|export|generate|solve`` and ``hpp bench-solvers``.

``main(argv)`` takes the command name first (``["instances", "list"]``, ``["bench-solvers", ...]``);
:func:`instances_main` and :func:`bench_solvers_main` take the arguments after it. Exit codes as
the ``hpp`` CLI: 0 success, 2 bad input (one line on stderr), 1 anything else (e.g. a failed
consistency check of bench-solvers).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

from hpp.bench.instance_format import InstanceOptions, load_instance, save_instance
from hpp.bench.instances import SyntheticSpec, get_instance, library, synthetic_instance
from hpp.cliparse import Parser, run_command
from hpp.errors import HppInputError

__all__ = ["main", "instances_main", "bench_solvers_main", "format_table", "DEFAULT_OUT_DIR"]

log = logging.getLogger("hpp")
#: Where ``hpp bench-solvers`` writes by default: a folder of its own in the working directory, never the
#: repository's tracked results (``--out-dir experiments/results --force`` regenerates those).
DEFAULT_OUT_DIR = Path("bench_solvers_out")


def _num(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _csv_ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def format_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells under their headers, each column as wide as its widest cell (``<`` left, ``>`` right).

    Examples
    --------
    >>> print(format_table([("name", "<"), ("n", ">")], [["a", "1"], ["bbb", "22"]]))
    name  n
    a     1
    bbb  22
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, (h, _) in enumerate(columns)]
    lines = [[h for h, _ in columns], *rows]
    return "\n".join(" ".join(f"{c:{a}{w}}" for c, (_, a), w in zip(line, columns, widths)).rstrip()
                     for line in lines)


def _instances_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="hpp instances", description="the solver-benchmark instance library")
    sub = ap.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="list the library's instances")
    ls.add_argument("--suite", choices=["quick", "full"], default="quick")
    ls.add_argument("--json", action="store_true")
    ex = sub.add_parser("export", help="write library instances as JSON files (and optionally their CP-SAT models)")
    ex.add_argument("names", nargs="*", help="instance names (default: the whole --suite)")
    ex.add_argument("--suite", choices=["quick", "full"], default="quick")
    ex.add_argument("--out", type=Path, default=Path("instances"), help="output folder (default ./instances)")
    ex.add_argument("--embed-profile", action="store_true", help="embed bundled profiles too")
    ex.add_argument("--cpsat-model", action="store_true",
                    help="also write NAME.cpsat.pb (CpModelProto) and NAME.cpsat.json (variable map)")
    ex.add_argument("--force", action="store_true", help="overwrite files that exist already")
    gen = sub.add_parser("generate", help="write a seeded synthetic instance")
    gen.add_argument("--types", type=int, default=3, help="GPU types, 2-6")
    gen.add_argument("--gpus", type=int, default=32, help="GPUs, 8-4096")
    gen.add_argument("--layers", type=int, default=16, help="layers, 8-128")
    gen.add_argument("--memory-skew", type=float, default=4.0, help="layers the smallest GPU holds")
    gen.add_argument("--speed-skew", type=float, default=3.0, help="slowest / fastest GPU time")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--gbs", type=int, default=256, help="global batch size [samples]")
    gen.add_argument("--gpus-per-node", type=int, default=4)
    gen.add_argument("--max-tp", type=int, default=2)
    gen.add_argument("--micro-batch-sizes", type=_csv_ints, default=(1, 2))
    gen.add_argument("--max-stages", type=int, default=4)
    gen.add_argument("--out", type=Path, required=True, help="instance JSON file to write")
    sv = sub.add_parser("solve", help="solve one instance (file or library name) with one solver")
    sv.add_argument("instance", help="instance JSON file or library name")
    sv.add_argument("--solver", default="cp-sat", help="cp-sat (default), milp or heuristic")
    sv.add_argument("--time-limit", type=float, help="solver wall-clock limit [s] (default 10)")
    sv.add_argument("--work-limit", type=float, metavar="UNITS", help=WORK_LIMIT_HELP)
    sv.add_argument("--workers", type=int, default=1)
    sv.add_argument("--cpsat-params", metavar="TEXT", help='CP-SAT parameters in text format, e.g. "random_seed:1"')
    sv.add_argument("--type-classes", action="store_true", help="also the type-class bound (hpp plan --type-classes)")
    sv.add_argument("--json", action="store_true")
    return ap


#: The help of ``--work-limit`` (both commands).
WORK_LIMIT_HELP = ("deterministic budget per solver instead of a wall-clock limit: CP-SAT work units, HiGHS 2,000 "
                   "nodes per unit (the same rows on any host, loaded or not)")


def _limits(time_limit: float | None, work_limit: float | None, default_s: float) -> tuple[float | None, float | None]:
    """(wall limit [s], work units) of ``--time-limit`` / ``--work-limit``, with the default wall limit when neither
    is given (:func:`~hpp.formulation.composition.settings.bench_settings` refuses both)."""
    return (default_s if time_limit is None and work_limit is None else time_limit), work_limit


def _load(ref: str):
    p = Path(ref)
    return load_instance(p) if p.suffix == ".json" or p.exists() else get_instance(ref)


def instances_main(argv: Sequence[str]) -> int:
    """``hpp instances ...`` (arguments after ``instances``); returns the exit code."""
    args = _instances_parser().parse_args(list(argv))
    if args.action == "list":
        rows = [i.summary() for i in library(args.suite)]
        if args.json:
            print(json.dumps({"suite": args.suite, "instances": rows}))
            return 0
        cols = [("name", "<"), ("family", "<"), ("model", "<"), ("GPUs", ">"), ("types", ">"), ("G", ">"),
                ("stages", ">"), ("tp", ">"), ("mbs", "<")]
        cells = [[r["name"], r["family"], str(r["model"]), str(r["num_gpus"]), str(r["num_types"]),
                  str(r["global_batch_size"]), str(r["max_stages"]), str(r["max_tp"] or "-"),
                  ",".join(map(str, r["micro_batch_sizes"])) if r["micro_batch_sizes"] else "all"] for r in rows]
        print(format_table(cols, cells))
        return 0
    if args.action == "export":
        insts = [get_instance(n) for n in args.names] if args.names else library(args.suite)
        names = [f"{i.name}{ext}" for i in insts for ext in (".json", *((".cpsat.pb", ".cpsat.json")
                                                                       if args.cpsat_model else ()))]
        _check_outputs([args.out / n for n in names], force=args.force, flag="--out")   # before writing any
        for inst in insts:
            path = args.out / f"{inst.name}.json"
            save_instance(inst, path, embed_profile=True if args.embed_profile else None)
            print(path)
            if args.cpsat_model:
                # local (here and below): the solve path loads OR-Tools and SciPy, ~0.6 s of `hpp instances list`
                from hpp.formulation.composition.exact_step import export_cpsat_model

                problem, _ = inst.problem()
                desc = export_cpsat_model(problem, args.out / f"{inst.name}.cpsat.pb")
                (args.out / f"{inst.name}.cpsat.json").write_text(json.dumps(desc, indent=1) + "\n")
                print(desc["path"])
                print(args.out / f"{inst.name}.cpsat.json")
        return 0
    if args.action == "generate":
        spec = SyntheticSpec(num_types=args.types, num_gpus=args.gpus, num_layers=args.layers,
                             memory_skew=args.memory_skew, speed_skew=args.speed_skew, seed=args.seed,
                             global_batch_size=args.gbs, gpus_per_node=args.gpus_per_node,
                             options=InstanceOptions(max_tp=args.max_tp, micro_batch_sizes=args.micro_batch_sizes,
                                                     max_stages=args.max_stages))
        save_instance(synthetic_instance(spec), args.out)
        print(args.out)
        return 0
    # solve
    from hpp.formulation.composition.settings import bench_settings
    from hpp.formulation.composition.solve import solve

    wall, units = _limits(args.time_limit, args.work_limit, 10.0)
    settings = replace(bench_settings(args.solver, wall, args.workers, args.cpsat_params or "", work_units=units),
                       type_classes=args.type_classes)
    inst = _load(args.instance)
    problem, _ = inst.problem()
    res = solve(problem, settings)
    if args.json:
        d = {k: _num(v) for k, v in asdict(res).items()}
        d["counts"] = {str(c): x for c, x in res.counts.items()}
        d["solver_status"] = res.solver_status or None        # as hpp plan --json: null when no exact solver ran
        d["instance"] = inst.name
        print(json.dumps(d))
    else:
        print(f"{inst.name}: {res.solver} {res.status}{' (proven optimal)' if res.proven_optimal else ''}: objective "
              f"{res.objective_s:.6f} s, bound {res.bound_s:.6f} s, gap {res.gap:.3%}, {res.wall_s:.2f} s, "
              f"{res.num_candidates} candidates")
        for c, x in sorted(res.counts.items()):
            print(f"  {x} x {problem.candidates[c].label()}")
    return 0


def _check_outputs(paths: list[Path], *, force: bool, flag: str = "--out-dir") -> None:
    """Refuse to overwrite existing output files without ``--force``; create the folder.

    Raises
    ------
    HppInputError
        An output file exists (and no ``--force``), or the folder cannot be created or written.
    """
    existing = [p for p in paths if p.exists()]
    if existing and not force:
        raise HppInputError(f"{existing[0]} exists" + (f" (and {len(existing) - 1} more output files)"
                                                       if len(existing) > 1 else ""), field=flag,
                            fix=f"give another {flag}" + (" or --prefix" if flag == "--out-dir" else "")
                            + ", or --force to overwrite")
    folder = paths[0].parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HppInputError(f"cannot create {folder} ({exc.strerror})", field=flag,
                            fix="give a writable folder") from None
    if not os.access(folder, os.W_OK):
        raise HppInputError(f"cannot write to {folder}", field=flag, fix="give a writable folder")


def bench_solvers_main(argv: Sequence[str]) -> int:
    """``hpp bench-solvers ...`` (arguments after ``bench-solvers``); returns the exit code."""
    # local: the solve path loads OR-Tools and SciPy (~0.6 s), which `hpp instances list` does not need
    from hpp.bench.solvers import (DEFAULT_TIME_LIMIT_S, check_consistency, plot_performance_profile,
                                  plot_time_to_best, run_bench, summary_table, write_csv)
    from hpp.formulation.composition.settings import SOLVER_NAMES, bench_settings
    from hpp.formulation.composition.solve import check_solver

    ap = Parser(prog="hpp bench-solvers", description="every solver on every instance of a suite")
    ap.add_argument("--suite", choices=["quick", "full"], default="quick")
    ap.add_argument("--time-limit", type=float, help="per solver and instance [s] (default: quick 5, full 30)")
    ap.add_argument("--work-limit", type=float, metavar="UNITS", help=WORK_LIMIT_HELP)
    ap.add_argument("--no-hint", action="store_true",
                    help="the exact solvers start cold (no heuristic plan as hint or cutoff) and each row's plan is "
                         "the solver's own (NO_SOLUTION when it found none)")
    ap.add_argument("--solvers", default=",".join(SOLVER_NAMES), help="comma-separated (default: all)")
    ap.add_argument("--instances", help="comma-separated instance names (default: the whole suite)")
    ap.add_argument("--workers", type=int, default=1, help="CP-SAT workers (default 1; HiGHS uses one)")
    ap.add_argument("--cpsat-params", metavar="TEXT", help='CP-SAT parameters in text format, e.g. "random_seed:1"')
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                    help="folder for the CSV, plots and summary (created if missing)")
    ap.add_argument("--prefix", default="bench_solvers", help="output file prefix")
    ap.add_argument("--force", action="store_true", help="overwrite output files that exist already")
    ap.add_argument("--type-classes", action="store_true",
                    help="every solver also gets the type-class bound (as hpp plan --type-classes)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (rows, violations, files)")
    args = ap.parse_args(list(argv))
    try:
        solvers = [check_solver(s.strip()) for s in args.solvers.split(",") if s.strip()]
    except HppInputError as exc:                 # the flag here is --solvers (a list), not hpp plan's --solver
        raise HppInputError(exc.message, field="--solvers", fix=f"give a comma-separated list of {list(SOLVER_NAMES)}")
    limit, units = _limits(args.time_limit, args.work_limit, DEFAULT_TIME_LIMIT_S[args.suite])
    options = replace(bench_settings("cp-sat", limit, args.workers, args.cpsat_params or "", work_units=units),
                      type_classes=args.type_classes, warm_start=not args.no_hint,
                      solver_answer_only=args.no_hint)
    budget = (f"time limit {limit:g} s" if units is None else f"work limit {units:g} units (deterministic)") + \
        (", no hint" if args.no_hint else "")
    insts = [get_instance(n.strip()) for n in args.instances.split(",")] if args.instances else library(args.suite)

    def progress(r) -> None:
        print(f"{r.instance:<34} {r.solver:<9} {r.status:<9} obj {r.objective_s:10.5f} s  gap "
              f"{r.gap:8.3%}  {r.wall_s:6.2f} s", file=sys.stderr, flush=True)

    out = args.out_dir
    files = {"csv": out / f"{args.prefix}.csv", "time_to_best_png": out / f"{args.prefix}_time_to_best.png",
             "performance_profile_png": out / f"{args.prefix}_profile.png", "summary_txt": out / f"{args.prefix}.txt"}
    _check_outputs(list(files.values()), force=args.force)      # before minutes of solving, not after
    rows = run_bench(insts, solvers=solvers, options=options, on_row=progress)
    write_csv(rows, files["csv"])
    plot_time_to_best(rows, files["time_to_best_png"], time_limit_s=limit)      # None: no wall limit drawn
    plot_performance_profile(rows, files["performance_profile_png"], deterministic=units is not None)
    table = summary_table(rows, deterministic=units is not None, hint=not args.no_hint)
    violations = check_consistency(rows)
    rule = "consistency (no objective below another solver's bound; solvers that prove optimality agree)"
    files["summary_txt"].write_text(f"suite {args.suite}, {budget}, {len(insts)} instances\n{table}\n"
                                    f"{rule}: {'all checks hold' if not violations else violations}\n")
    if args.json:
        print(json.dumps({"suite": args.suite, "time_limit_s": limit, "work_limit": units, "hint": not args.no_hint,
                          "violations": violations,
                          "files": {k: str(v) for k, v in files.items()},
                          "rows": [{k: _num(v) for k, v in r.as_csv().items()} for r in rows]}))
    else:
        print(table)
        print(f"{rule}: all checks hold" if not violations else "consistency VIOLATIONS:\n  " + "\n  ".join(violations))
        print("wrote " + ", ".join(str(v) for v in files.values()))
    return 0 if not violations else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``argv[0]`` is ``instances`` or ``bench-solvers``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"instances": instances_main, "bench-solvers": bench_solvers_main}
    if not argv or argv[0] not in commands:
        print(f"usage: hpp {{{'|'.join(commands)}}} ...", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    return run_command(f"hpp {argv[0]}", lambda: commands[argv[0]](argv[1:]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
