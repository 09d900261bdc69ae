"""The one line of a failed ``hpp run`` (:func:`hpp.runtime.run_failure.failure_line`): a lost host named by the
hosts that survive it, a rendezvous hint on a multi-host timeout before any step, and the ``--log-dir`` hint."""

from __future__ import annotations

from pathlib import Path

from hpp.runtime.launch.launchers import LaunchResult
from hpp.runtime.run_failure import failure_line
from hpp.runtime.run_setup import HostShare
from hpp.runtime.run_setup import load_run_inputs
from tests.test_runtime_multihost import two_node_plan

RESET = ("rank {r} aborted: RuntimeError: [pair.cc:537] Read error [127.0.0.1]:32664: Connection reset by peer. GLHF! "
         "(a peer may have died; this rank shares groups with ranks {peers})\n")


def _inputs(tmp_path: Path):
    plan, cluster, _profile = load_run_inputs(two_node_plan(tmp_path / "p.json"))
    return plan, cluster


def _res(errors, *, codes=(1, 1), timed_out=False, failures=((2, 1),)) -> LaunchResult:
    return LaunchResult(codes, (None, None), tuple(errors), 3.0, Path("/tmp"), timed_out, 150.0, (0, 2),
                        "vm (node rank 0)", failures)


HOST0 = HostShare(2, 0, "127.0.0.1:29500", None, (0, 2), (0,))


def test_lost_connections_name_the_host_that_went_away(tmp_path):
    plan, cluster = _inputs(tmp_path)
    res = _res([RESET.format(r=0, peers="[1, 2]"), RESET.format(r=2, peers="[0, 1, 3]")])
    assert failure_line(res, HOST0, plan, cluster) == (
        "the ranks of node rank 1 stopped: this host's ranks [0, 2] lost their connection to them (Connection reset "
        "by peer); the cause is in that host's output (node rank 0 stopped its own ranks)")
    # the control: on the host whose rank 2 was killed (SIGKILL, no error of its own), rank 0's lost connection is
    # not the story: the killed rank is named, as before
    killed = _res([RESET.format(r=0, peers="[1, 2]"), None], failures=((2, -9),))
    assert failure_line(killed, HOST0, plan, cluster).startswith("rank 2 failed (rank 2: exit -9, killed by SIGKILL)")


def test_control_an_error_of_its_own_is_told_as_before_with_the_log_hint(tmp_path):
    plan, cluster = _inputs(tmp_path)
    own = "rank 2 aborted: ValueError: bad batch (a peer may have died; this rank shares groups with ranks [0, 3])\n"
    res = _res([RESET.format(r=0, peers="[1, 2]"), own])
    line = failure_line(res, HOST0, plan, cluster)
    assert line == res.failure_message() + " (--log-dir DIR keeps each rank's output)"
    assert line.startswith("rank 2 failed (rank 2: exit 1) on host vm (node rank 0); 2 ranks aborted")
    assert failure_line(res, HOST0, plan, cluster, log_dir="logs") == res.failure_message()
    one = HostShare(1, 0, None, None, (0, 1, 2, 3), (0, 1))          # one host: connection errors are its own
    assert "stopped:" not in failure_line(_res([RESET.format(r=0, peers="[1, 2]"), None]), one, plan, cluster)


def test_a_multi_host_timeout_before_any_step_asks_about_the_rendezvous(tmp_path):
    plan, cluster = _inputs(tmp_path)
    res = _res([None, None], codes=(None, None), timed_out=True, failures=())
    assert failure_line(res, HOST0, plan, cluster) == (
        "the run timed out after 150 s (--run-timeout) and every rank on host vm (node rank 0) was killed; 0 of 2 "
        "ranks had finished; no step had started: did every host start hpp run with its own --node-rank, "
        "--nnodes 2 and the same --rdzv-endpoint 127.0.0.1:29500?")
    assert "no step had started" not in failure_line(res, HOST0, plan, cluster, steps_seen=3)
