"""The one line ``hpp run`` prints when its ranks fail (:class:`~hpp.runtime.launch.launchers.LaunchResult`),
with what a host of a multi-host run can tell beyond its own ranks: that another host's ranks stopped (this
host's ranks only lost their connections to them: gloo's "Connection reset by peer", none died on its own), or
that no step started before ``--run-timeout`` (the other hosts never joined the rendezvous)."""

from __future__ import annotations

import re
from typing import Any, Sequence

from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.runtime.launch.binding import host_ranks
from hpp.runtime.launch.launchers import LaunchResult

__all__ = ["failure_line", "LOST_CONNECTION"]

#: what a rank's error says when its peer's process went away (gloo's TCP transport, torch's store)
LOST_CONNECTION = re.compile(r"Connection (reset|closed) by peer|Broken pipe|Connection refused|Socket closed")
_PEERS = re.compile(r"shares groups with ranks \[([\d, ]*)\]")


def _host_of(plan: Plan, cluster: Cluster, nnodes: int, node_map: Sequence[int] | None) -> dict[int, int]:
    """plan rank -> node rank of the host that starts it."""
    return {b.rank: i for i in range(nnodes) for b in host_ranks(plan, nnodes=nnodes, node_rank=i,
                                                                 node_map=node_map, cluster=cluster)}


def failure_line(res: LaunchResult, share: Any, plan: Plan, cluster: Cluster, *, steps_seen: int = 0,
                 log_dir: str | None = None) -> str:
    """The failure of ``res`` in one line (:meth:`LaunchResult.failure_message`), told as a lost host when every
    rank of this host that reported an error lost its connection to a rank of another host (``share``: this host's
    :class:`~hpp.runtime.run_setup.HostShare`), and with a rendezvous hint when a multi-host run timed out before
    any step (``steps_seen``: steps the monitor saw). ``log_dir`` None: says how to keep the ranks' output."""
    line = res.failure_message()
    keep = "" if log_dir is not None else " (--log-dir DIR keeps each rank's output)"
    if share.nnodes <= 1:
        return line + keep
    if res.timed_out:
        if steps_seen == 0:
            line += ("; no step had started: did every host start hpp run with its own --node-rank, --nnodes "
                     f"{share.nnodes} and the same --rdzv-endpoint {share.rdzv_endpoint}?")
        return line
    errors = [e.strip() for e in res.errors if e]
    # a local rank that died without a word (killed, crashed) is the cause here, whatever its peers then reported
    if res.died_silently() or not errors or not all(LOST_CONNECTION.search(e) for e in errors):
        return line + keep
    peers = {int(r) for e in errors for m in _PEERS.finditer(e) for r in m.group(1).split(",") if r.strip()}
    host_of = _host_of(plan, cluster, share.nnodes, share.node_map)
    gone = sorted({host_of[r] for r in peers if r in host_of} - {share.node_rank})
    who = f"node rank {', '.join(map(str, gone))}" if gone else "another host"
    first = LOST_CONNECTION.search(errors[0]).group(0)
    return (f"the ranks of {who} stopped: this host's ranks {sorted(share.ranks)} lost their connection to them "
            f"({first}); the cause is in that host's output (node rank {share.node_rank} stopped its own ranks)")
