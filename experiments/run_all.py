"""Regenerate every result of docs/RESULTS.md, then rewrite it (and docs/LAYOUT.md's tree) from the files.

    python experiments/run_all.py [--quick]

Runs, in order: scenarios.py (speedups on the bundled scenarios; --quick: up to 40 GPUs, written to
scenarios_quick.csv, which docs/RESULTS.md does not read), search_overhead.py
(--quick: the small sweep, written to search_overhead_quick.csv, which docs/RESULTS.md does not read; the
full sweep is `python experiments/search_overhead.py`, 20-30 min, and its CSV is reused when present),
cost_model_validation.py, network_scenarios.py (one link vs per-pair links), runtime_validation.py (--quick:
written to runtime_validation_quick.*, which docs/RESULTS.md does not read).
Not rerun here, only read: the memory tables (memory_validation.csv and memory_validation_bf16.csv, which
`python experiments/memory_validation.py [--dtype bfloat16]` writes, about 6 minutes each on two idle
cores) and the gap-progress table (gap_progress.csv, `python experiments/gap_progress.py`, about 12 minutes).
Bounded to about 15 minutes on 2 cores (about 4 with --quick). When a step fails (a non-zero exit) the others
still run, but docs/RESULTS.md is not rewritten, and the exit code is the failed step's.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Sequence

from hpp.bench.evaluation import results_markdown
from hpp.fileio import write_atomic

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "docs" / "RESULTS.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _run(script: str, argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location(script, HERE / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[script] = mod          # dataclasses in the script look their module up
    spec.loader.exec_module(mod)
    print(f"== {script} {' '.join(argv)}", file=sys.stderr, flush=True)
    return mod.main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite docs/RESULTS.md and docs/LAYOUT.md")
    ap.add_argument("--only", type=lambda v: set(v.split(",")),
                    help="run only these (scenarios,search_overhead,cost_model_validation,network_scenarios,runtime_validation; "
                         "'none' = just rewrite docs/RESULTS.md from the files)")
    args = ap.parse_args(argv)
    quick = ["--quick"] if args.quick else []
    so_csv = HERE / "results" / "search_overhead.csv"
    # the results table reads search_overhead.csv, which a plain --quick run leaves alone
    plan = [("scenarios", quick), ("search_overhead", quick if args.quick else ["--out", str(so_csv)])
            if args.quick or not so_csv.exists() else None,
            ("cost_model_validation", []), ("network_scenarios", ["--repeats", "1" if args.quick else "3"]),
            ("runtime_validation", quick + ["--out", str(HERE / "results" / "runtime_validation_quick.csv")]
             if args.quick else [])]
    failed: list[str] = []
    rc = 0
    for step in plan:
        if step and (args.only is None or step[0] in args.only):
            code = _run(*step)
            if code:
                failed.append(f"{step[0]} (exit {code})")
                rc = max(rc, code)
    if failed:        # a failed step's files are old or missing: a results page written from them would mix days or lie
        print(f"run_all: {RESULTS.name} not rewritten: {', '.join(failed)} failed (its error is above); --only STEPS runs "
              f"the others and reads the rest's files as they are", file=sys.stderr)
        return rc
    if not args.no_readme:
        text = RESULTS.read_text()
        if START in text and END in text:
            head, rest = text.split(START, 1)
            _, tail = rest.split(END, 1)
            write_atomic(RESULTS, f"{head}{START}\n{results_markdown(HERE / 'results')}\n{END}{tail}")
        _run("layout_tree", ["--write"])
    return rc


if __name__ == "__main__":
    sys.exit(main())
