"""``hpp profile-network`` with several "hosts" on this machine: one launcher per emulated node, gloo on loopback.

Starts one ``hpp profile-network`` per ``--hosts`` entry (``TYPE:COUNT``, node ranks in order) against a
rendezvous on 127.0.0.1, waits for all, and prints node rank 0's summary: per link its latency, peak and fit,
the ``k -> k`` aggregates, and the all-reduces beside the cost model's ring on the fitted link. Every "link" is
loopback TCP between processes of one machine, so the figures describe this host's gloo, not a network.

Usage: ``python experiments/network_profile_local.py [--hosts cpu:2,cpu:2,cpu-2x:2] [--sizes 64KB,256KB,1MB]
[--repeats 5] [--out cluster.json]``; writes ``--out`` (default a temporary file) and prints the summary, and
the ratio measured / predicted of the all-reduces.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpp.cliparse import Parser
from hpp.runtime.network.cli import human_summary
from hpp.runtime.launch.processes import free_port

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="network_profile_local.py", help_command="python experiments/network_profile_local.py --help")
    p.add_argument("--hosts", default="cpu:2,cpu:2,cpu-2x:2", help="one TYPE:COUNT per emulated host")
    p.add_argument("--sizes", default="64KB,256KB,1MB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="the cluster file (default: a temporary one)")
    args = p.parse_args(argv)
    hosts = args.hosts.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "cluster.json"
        port = free_port()
        cmds = [[sys.executable, "-m", "hpp.cli", "profile-network", "--out", str(out), "--force", "--sizes",
                 args.sizes, "--repeats", str(args.repeats), "--nnodes", str(len(hosts)), "--node-rank", str(r),
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--emulate-node-type", h, "--quiet",
                 *(["--json"] if r == 0 else [])] for r, h in enumerate(hosts)]
        t0 = time.perf_counter()
        procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for c in cmds]
        res = [p.communicate() for p in procs]
        wall = time.perf_counter() - t0
        for r, (proc, (_so, se)) in enumerate(zip(procs, res)):
            if proc.returncode != 0:
                sys.stderr.write(f"node rank {r} exited {proc.returncode}: {se.strip()}\n")
                return 1
        summary = json.loads(res[0][0])
    print(human_summary(summary))
    ratios = [a["measured_s"] / a["predicted_s"] for link in summary["links"] for a in link["allreduce"]]
    print(f"all-reduces measured / predicted on the fitted links: {min(ratios):.2f} .. {max(ratios):.2f} "
          f"({len(ratios)} cases); {len(hosts)} launchers, {wall:.1f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
