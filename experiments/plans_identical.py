"""The plans ``hpp plan`` writes for the bundled scenarios, this checkout against another, byte for byte.

    git worktree add /tmp/hpp-before <commit>
    python experiments/plans_identical.py --other /tmp/hpp-before [--scenarios a,b] [--workers 1]

For a change that must not change behaviour (a refactor): each scenario is planned by
``hpp plan --scenario NAME --no-baselines --quiet --workers W --out FILE`` (the default, deterministic budget)
in a fresh interpreter of each tree, and the two files are compared byte for byte (their SHA-256 is printed).
The default scenarios are the bundled GPU scenarios up to 1,024 GPUs and cpu-hetero-4. Exit 0 when every pair
is identical, 1 otherwise (the first differing line is printed), 2 on bad input.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from hpp.cliparse import Parser

HERE = Path(__file__).resolve().parents[1]

#: The bundled scenarios compared by default (the scale check opt350-4096-6types takes minutes: on request).
SCENARIOS = ("opt350-a100x4-v100x4", "opt350-a100x8-v100x8", "opt350-3types-40", "neo27-a100x16-v100x16",
             "llama8-3types-40", "opt350-512", "opt350-1024-4types", "cpu-hetero-4")

_CHILD = "import sys; from hpp.cli import main; sys.exit(main(sys.argv[1:]))"


def plan_file(tree: Path, scenario: str, out: Path, workers: int) -> bytes:
    """The bytes of the plan file ``hpp plan`` of ``tree`` writes for ``scenario``.

    Raises
    ------
    RuntimeError
        ``hpp plan`` failed (its stderr's last line is in the message).
    """
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = ["plan", "--scenario", scenario, "--no-baselines", "--quiet", "--workers", str(workers), "--out", str(out)]
    got = subprocess.run([sys.executable, "-c", _CHILD, *argv], env=env, cwd=tree, capture_output=True, text=True)
    if got.returncode != 0:
        last = (got.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{tree}: hpp plan --scenario {scenario} exited {got.returncode}: {last}")
    return out.read_bytes()


def first_difference(a: bytes, b: bytes) -> str:
    """The first line where ``a`` and ``b`` differ, as ``line N: A | B`` ('' when equal)."""
    for i, (x, y) in enumerate(zip(a.decode().splitlines(), b.decode().splitlines()), 1):
        if x != y:
            return f"line {i}: {x.strip()[:80]} | {y.strip()[:80]}"
    return "" if a == b else "one file is longer"


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="plans_identical.py", description=__doc__.splitlines()[0])
    ap.add_argument("--other", type=Path, required=True, help="the other checkout's root (its hpp/ is imported)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated bundled scenario names")
    ap.add_argument("--workers", type=int, default=1, help="stage-balance processes (the plans do not depend on it)")
    args = ap.parse_args(argv)
    if not (args.other / "hpp" / "__init__.py").is_file():
        print(f"plans_identical.py: error: --other {args.other}: no hpp/ package there. Fix: give the root of "
              f"another checkout of hpp", file=sys.stderr)
        return 2
    same = 0
    names = [s for s in args.scenarios.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            mine = plan_file(HERE, name, Path(tmp) / f"this-{name}.json", args.workers)
            theirs = plan_file(args.other.resolve(), name, Path(tmp) / f"other-{name}.json", args.workers)
            ok = mine == theirs
            same += ok
            digest = hashlib.sha256(mine).hexdigest()[:16]
            print(f"{name:<24} {'identical' if ok else 'DIFFERENT'}  sha256 {digest}"
                  f"{'' if ok else ' vs ' + hashlib.sha256(theirs).hexdigest()[:16] + '  ' + first_difference(mine, theirs)}")
    print(f"{same} of {len(names)} plans identical")
    return 0 if same == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
