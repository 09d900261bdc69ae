"""Thin entry point of ``hpp profile-network`` (dispatched to from :mod:`hpp.cli`): flags, progress, the summary.

Exit codes: 0 the cluster file was written (node rank 0) or this host's measurements ended (the others);
2 bad input, or a host that did not answer (the roll call) or stopped answering (the measurements), one
line on stderr naming it; 1 another failure (the failed rank); 130 / 143 stopped by Ctrl-C / SIGTERM
(every local process ended first).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Sequence

from hpp.cliparse import Parser, run_command
from hpp.errors import HppInputError
from hpp.runtime.launch.processes import RunInterrupted, interrupt_signals
from hpp.wording import count

__all__ = ["profile_network_main", "parse_sizes", "DEFAULT_SIZES"]

#: 1 MB .. 1 GB, doubling (11 sizes): the range of Sailor's public fits.
DEFAULT_SIZES = ",".join(f"{2 ** i}MB" for i in range(11))
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*$")


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated message sizes, bytes or with a unit (KB/MB/GB = 1e3/1e6/1e9, KiB/MiB/GiB).

    >>> parse_sizes("64KiB, 1MB,2GB")
    [65536, 1000000, 2000000000]

    Raises
    ------
    HppInputError
        A size that is not a positive number of bytes, an unknown unit, fewer than two different sizes.
    """
    out = []
    for part in text.split(","):
        m = _SIZE.match(part)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS or not float(m.group(1)) * _UNITS[unit] >= 1:
            raise HppInputError(f"--sizes {text!r}: {part.strip()!r} is not a message size", field="--sizes",
                                fix="give comma-separated sizes in bytes or with KB, MB, GB (KiB, MiB, GiB), "
                                    "e.g. 64KB,1MB,16MB")
        out.append(int(float(m.group(1)) * _UNITS[unit]))
    if len(set(out)) < 2:
        raise HppInputError(f"--sizes {text!r} gives {count(len(set(out)), 'size')}", field="--sizes",
                            fix="give at least two different sizes (the fit needs the bandwidth's change with size)")
    return out


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="hpp profile-network",
               description="Measure the cluster's links (point to point and all-reduce, one flow and k -> k flows, "
                           "inside a node and between each pair of node types and zones) with torch.distributed "
                           "(NCCL on GPUs, gloo on CPU) and write them as a cluster file for hpp plan/estimate "
                           "--cluster. Run it on every host, like hpp run.")
    p.add_argument("--out", required=True, help="the cluster file to write (node rank 0 writes it)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="message sizes of the fit, comma-separated, bytes or KB/MB/GB (KiB/MiB/GiB) (default 1MB, "
                        "2MB, .. 1GB; on CPU give small ones, e.g. 64KB,256KB,1MB)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per size")
    p.add_argument("--warmup", type=int, default=1, help="untimed repeats before them")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: NCCL on this host's GPUs if it has some and emulates nothing, else gloo")
    p.add_argument("--name", help="the cluster's name (default: --out's file name)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the summary)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    h = p.add_argument_group("several hosts (one hpp profile-network per host, like hpp run)")
    h.add_argument("--nnodes", type=int, default=1, help="hosts of the run (default 1)")
    h.add_argument("--node-rank", type=int, default=0, help="this host's node rank, 0..nnodes-1 (default 0)")
    h.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="node rank 0's address and a free port (its roll call listens there; torchrun gets another)")
    h.add_argument("--emulate-node-type", metavar="TYPE:COUNT",
                   help="CPU: this host plays a node of COUNT devices of TYPE, COUNT gloo processes "
                        "(default $HPP_EMULATE_NODE_TYPE)")
    h.add_argument("--zone", help="this host's zone (all hosts or none): links between zones are measured too")
    h.add_argument("--rendezvous-timeout", type=float, default=120.0,
                   help="seconds to wait for every host to answer before naming those that did not")
    h.add_argument("--run-timeout", type=float, default=1800.0, help="whole-measurement timeout [s]")
    h.add_argument("--group-timeout", type=float, default=120.0,
                   help="process-group timeout [s]: a peer that stops answering fails the ranks within it")
    return p


def _gb(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 1e9:.3f}"


def _fit(fit: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in fit) + "]" if fit else "none"


def human_summary(s: dict[str, Any]) -> str:
    """The summary as ``hpp profile-network`` prints it."""
    if s.get("out") is None:
        return f"hpp profile-network: this host's measurements ended; {s.get('note', 'node rank 0 writes the file')}"
    hosts = ", ".join(f"{h['device_type']}:{h['num_devices']}" + (f"@{h['zone']}" if h.get("zone") else "")
                      for h in s["hosts"])
    sizes = s["sizes_bytes"]
    lines = [f"hpp profile-network: wrote {s['out']} ({count(len(s['hosts']), 'host')}: {hosts}; {s['backend']}; "
             f"{count(len(sizes), 'message size')} {sizes[0]}..{sizes[-1]} bytes, {count(s['repeats'], 'repeat')}; "
             f"{s['wall_s']:.1f} s; written by {s['written_by']})",
             f"  {'link':<32} {'flows':>5} {'latency_us':>10} {'peak_GB/s':>9}  fit_GB/s [a, b, c] at L = "
             f"log2(bytes/1e6)   largest fit error"]
    for link in s["links"]:
        name = f"{link['kind']} {' - '.join(link['between'])}"
        lines.append(f"  {name:<32} {1:>5} {link['latency_s'] * 1e6:>10.1f} {_gb(link['max_bytes_per_s']):>9}  "
                     f"{_fit(link['fit_gb_per_s']):<40} {link['largest_fit_error']:.1%}")
        for a in link["aggregate"]:
            lines.append(f"  {'':<32} {a['flows']:>5} {'(total)':>10} {_gb(a['max_bytes_per_s']):>9}  "
                         f"{_fit(a['fit_gb_per_s'])}")
    lines.append("  all-reduce at the largest size, measured vs the cost model's ring on the fitted link:")
    for link in s["links"]:
        name = f"{link['kind']} {' - '.join(link['between'])}"
        top = [a for a in link["allreduce"] if a["bytes"] == max(x["bytes"] for x in link["allreduce"])]
        for a in top:
            lines.append(f"  {name:<32} {a['flows']:>5} x {a['ranks_per_group']} ranks: measured "
                         f"{a['measured_s'] * 1e3:.3f} ms, predicted {a['predicted_s'] * 1e3:.3f} ms "
                         f"(bus {_gb(a['bus_bytes_per_s'])} GB/s)")
    lines += [f"  note: {n}" for n in s.get("notes", [])]
    return "\n".join(lines)


def profile_network_main(argv: Sequence[str] | None = None) -> int:
    """``hpp profile-network --out CLUSTER.json [...]``; see the module docstring for the exit codes."""
    args = _parser().parse_args(argv)
    return run_command("hpp profile-network", lambda: _command(args))


def _command(args: argparse.Namespace) -> int:
    # here, not on top: the measurement imports torch (seconds); --help and bad flags stay instant
    from hpp.runtime.network.profile import NetworkProfileError, profile_network
    sizes = parse_sizes(args.sizes)
    say = None if (args.quiet or args.json) else \
        (lambda msg: print(f"[hpp profile-network] {msg}", file=sys.stderr, flush=True))
    try:
        with interrupt_signals():
            summary = profile_network(out=args.out, sizes_bytes=sizes, repeats=args.repeats, warmup=args.warmup,
                                      device=args.device, nnodes=args.nnodes, node_rank=args.node_rank,
                                      rdzv_endpoint=args.rdzv_endpoint, emulate_node_type=args.emulate_node_type,
                                      zone=args.zone, force=args.force, rendezvous_timeout_s=args.rendezvous_timeout,
                                      run_timeout_s=args.run_timeout, group_timeout_s=args.group_timeout,
                                      name=args.name, progress=say)
    except NetworkProfileError as exc:
        sys.stderr.write(f"hpp profile-network: error: {exc}\n")
        return exc.exit_code
    except (RunInterrupted, KeyboardInterrupt) as exc:
        code = exc.exit_code if isinstance(exc, RunInterrupted) else 130
        sys.stderr.write(f"hpp profile-network: stopped by {'SIGINT (Ctrl-C)' if code == 130 else exc}: every "
                         "local process was ended\n")
        return code
    print(json.dumps(summary) if args.json else human_summary(summary))
    return 0
