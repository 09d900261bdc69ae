"""A rank that dies or hangs makes every other rank exit in bounded time, naming the failure; a run that
outlives --run-timeout is killed whole (torchrun's agent and every worker)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpp.plan_data import Pipeline, Plan, Stage
from hpp.runtime.launch.launchers import LaunchResult
from hpp.runtime.launch.processes import descendants, kill_tree
from hpp.runtime.models.gpt import GPT, ModelConfig
from tests.rank_launch import fork_ranks, torchrun_ranks

pytestmark = pytest.mark.distributed

CFG = ModelConfig("micro", num_blocks=2, hidden_size=16, num_heads=2, seq_len=8, vocab_size=32)
MODEL = "tests.test_runtime_faults:micro"


def micro() -> GPT:
    """The test model (:data:`MODEL`)."""
    return GPT(CFG)


def _plan() -> Plan:
    st = lambda lo, hi, d: Stage(lo, hi, "cpu", 1, (d,))  # noqa: E731
    return Plan("micro", 4, 6, (Pipeline((st(0, 2, 0), st(2, 4, 1)), 2, 4), Pipeline((st(0, 3, 2), st(3, 4, 3)), 1, 2)))


def test_dead_rank_makes_the_others_exit_and_is_named(tmp_path):
    res = fork_ranks(_plan(), MODEL, tmp_path, steps=4, timeout_s=15, fail_rank=2, fail_step=1)
    died_at = (tmp_path / "rank2.steps.jsonl").stat().st_mtime        # rank 2's last line: the end of step 0
    assert max((tmp_path / f"rank{r}.error").stat().st_mtime for r in (0, 1, 3)) - died_at < 15
    assert res.exit_codes[2] == 17 and all(res.exit_codes[r] == 1 for r in (0, 1, 3)), res.exit_codes
    assert res.failed_ranks() == [2]
    assert res.failure_message().startswith("rank 2 failed (rank 2: exit 17)")
    assert all("aborted" in res.errors[r] and "shares groups with ranks" in res.errors[r] for r in (0, 1, 3))
    assert not list(tmp_path.glob("rank*.json")) and not list(tmp_path.glob("*.tmp"))


def test_a_rank_the_agent_stopped_is_not_named_as_the_cause(tmp_path):
    """Host 1 of a two-host run: plan rank 3 was SIGKILLed; torchrun's teardown SIGTERMed rank 1 before it
    could write its error (under load), and listed it first. The message names rank 3; with only the
    SIGTERMed rank, that one; with no torchrun word, the silent rank."""
    def res(failures, errors=(None, None)):
        return LaunchResult((-15, -9), (None, None), errors, 1.0, tmp_path, ranks=(1, 3), host="h",
                            torchrun_failures=failures)

    assert res(((1, -15), (3, -9))).failed_ranks() == [3]
    msg = res(((1, -15), (3, -9))).failure_message()
    assert msg.startswith("rank 3 failed (rank 3: exit -9, killed by SIGKILL) on host h"), msg
    assert res(((1, -15),)).failed_ranks() == [1]
    assert res(((3, -9), (1, -15)), errors=("aborted", None)).failed_ranks() == [3]   # rank 1 reported
    assert res(()).failed_ranks() == [1, 3]


def test_hung_rank_makes_the_others_time_out(tmp_path):
    timeout_s = 5
    res = fork_ranks(_plan(), MODEL, tmp_path, steps=4, timeout_s=timeout_s, fail_rank=1, fail_step=1,
                     fail_mode="hang")
    assert not res.ok and res.exit_codes[1] == 17
    hung_at = (tmp_path / "rank1.steps.jsonl").stat().st_mtime      # rank 1's last line: the end of step 0
    for r in (0, 2, 3):
        assert res.exit_codes[r] == 1 and res.errors[r] is not None
        assert (tmp_path / f"rank{r}.error").stat().st_mtime - hung_at < 3 * timeout_s


def _procs_mentioning(text: str) -> list[int]:
    """Live pids whose command line contains ``text`` (Linux /proc)."""
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                cmd = Path(f"/proc/{e}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd and int(e) != os.getpid():
                out.append(int(e))
    return out


def test_kill_tree_ends_grandchildren_in_their_own_session(tmp_path):
    marker = str(tmp_path / "tree-marker")
    script = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}], "
              "start_new_session=True)\n"
              "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, marker], start_new_session=True)
    deadline = time.time() + 20
    while len(_procs_mentioning(marker)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    assert len(_procs_mentioning(marker)) == 2 and len(descendants(proc.pid)) == 1
    kill_tree(proc, grace_s=1.0)
    time.sleep(0.2)
    assert proc.returncode is not None and _procs_mentioning(marker) == []


def test_run_timeout_kills_torchrun_and_every_worker(tmp_path):
    """A hung rank under torchrun: the launcher kills the agent AND its workers and says it timed out."""
    st = lambda lo, hi, d: Stage(lo, hi, "cpu", 1, (d,))  # noqa: E731
    plan = Plan("micro", 4, 2, (Pipeline((st(0, 2, 0), st(2, 4, 1)), 1, 2),))
    seen = []
    res = torchrun_ranks(plan, MODEL, tmp_path, steps=3, timeout_s=600, fail_rank=1, fail_step=0, fail_mode="hang",
                         launch_timeout_s=40, poll=lambda: seen.append(len(_procs_mentioning(str(tmp_path)))))
    assert max(seen) >= 3, seen                          # the agent and both workers ran
    assert res.timed_out and not res.ok and res.exit_codes == (None, None)
    assert res.failure_message().startswith("the run timed out after 40 s (--run-timeout) and every rank was killed")
    time.sleep(0.5)
    assert _procs_mentioning(str(tmp_path)) == []
