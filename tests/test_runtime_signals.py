"""Run control and faults of ``hpp run``: nothing is left running, no half checkpoint is left, and the last
complete checkpoint still resumes.

- Ctrl-C (SIGINT) to ``hpp run`` (torchrun: agent + 4 workers, saving every step): exit 130 within a
  few seconds, one line and no traceback, every process of the run gone, only complete checkpoints,
  the latest resumes exactly (``--verify``);
- SIGTERM to ``hpp run`` (fork launcher): exit 143, every rank gone;
- two hosts, a rank killed (SIGKILL) mid-run: both launchers exit 1, the failing host's line names the
  rank, its exit and the host; every process of both hosts gone;
- two hosts, one host's launcher killed (SIGKILL, it cannot clean up): the other host fails in bounded
  time, the killed host's torchrun agent and workers follow it (parent-death signal), no process
  left, no half checkpoint, the last complete checkpoint resumes.

Processes are followed through ``/proc`` (:func:`hpp.runtime.launch.processes.descendants`: pid and start time,
so a recycled pid is not mistaken for a survivor).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpp.runtime.checkpoint.store import latest_checkpoint, read_checkpoint_meta
from hpp.runtime.cli import run_main
from hpp.runtime.launch.processes import _proc_stat, descendants
from tests.test_runtime_multihost import MODEL, ROOT, VERIFY, finish, start_hosts, two_node_plan

pytestmark = pytest.mark.distributed

STOP_BOUND_S = 10.0          # "within a few seconds": signal to launcher exit
LONG = 100_000               # steps: the runs are stopped long before


def _alive(procs: list[tuple[int, int]]) -> list[int]:
    """The pids of ``procs`` (pid, start time) still running (zombies count as gone)."""
    out = []
    for pid, started in procs:
        st = _proc_stat(pid)
        if st is not None and st[1] == started:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                out.append(pid)
    return out


def _wait_gone(procs: list[tuple[int, int]], bound_s: float) -> list[int]:
    deadline = time.time() + bound_s
    while _alive(procs) and time.time() < deadline:
        time.sleep(0.1)
    return _alive(procs)


def _wait_lines(path: Path, n: int, proc: subprocess.Popen, bound_s: float = 120.0) -> None:
    """Wait until ``path`` (a --metrics-jsonl file) has ``n`` lines, i.e. the run is in its steps."""
    deadline = time.time() + bound_s
    while time.time() < deadline and proc.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {n} steps within {bound_s} s; exit {proc.poll()}: {proc.stderr.read()[-2000:]}")


def _tree(proc: subprocess.Popen, at_least: int, bound_s: float = 30.0) -> list[tuple[int, int]]:
    deadline = time.time() + bound_s
    tree = descendants(proc.pid)
    while len(tree) < at_least and time.time() < deadline:
        time.sleep(0.1)
        tree = descendants(proc.pid)
    return tree


def _only_complete_checkpoints(ck: Path) -> Path:
    names = sorted(p.name for p in ck.iterdir())
    assert names and all(n.startswith("step-") for n in names), names            # no .tmp-step-K / .old-*
    assert all((ck / n / "complete").is_file() for n in names), names
    latest = latest_checkpoint(ck)
    assert latest is not None and read_checkpoint_meta(ck)["path"] == str(latest)
    return latest


def _resume_verifies(plan: str, ck: Path, capsys) -> None:
    """The latest complete checkpoint continues 1 step on one host, equal to single-process training."""
    capsys.readouterr()
    code = run_main([plan, "--steps", "1", "--model", MODEL, "--launcher", "fork", "--resume", str(ck), "--verify",
                     "--run-timeout", "120", "--group-timeout", "30", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert float(VERIFY.search(out).group(1)) <= 1e-9, out


def _hpp_run(plan: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hpp.runtime.cli", "run", plan, "--steps", str(LONG), "--model", MODEL,
           "--run-timeout", "300", "--group-timeout", "30", "--quiet", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_ctrl_c_stops_every_process_exits_130_and_the_last_checkpoint_resumes(tmp_path, capsys):
    plan = two_node_plan(tmp_path / "plan.json")
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    proc = _hpp_run(plan, "--dtype", "float64", "--save", str(ck), "--save-every", "1", "--metrics-jsonl",
                    str(metrics))
    _wait_lines(metrics, 2, proc)
    tree = _tree(proc, 5)                                          # torchrun's agent and the 4 workers
    assert len(tree) >= 5, tree
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    stopped_s = time.perf_counter() - t0
    with capsys.disabled():
        print(f"SIGINT -> exit in {stopped_s:.2f} s")
    assert proc.returncode == 130 and stopped_s < STOP_BOUND_S, (proc.returncode, stopped_s, err[-2000:])
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "hpp run: stopped by SIGINT (Ctrl-C): every local process of the run was ended"
    assert _wait_gone(tree, 2.0) == []
    _only_complete_checkpoints(ck)
    _resume_verifies(plan, ck, capsys)


def test_sigterm_stops_forked_ranks_and_exits_143(tmp_path):
    plan = two_node_plan(tmp_path / "plan.json")
    metrics = tmp_path / "m.jsonl"
    proc = _hpp_run(plan, "--launcher", "fork", "--metrics-jsonl", str(metrics))
    _wait_lines(metrics, 2, proc)
    tree = _tree(proc, 4)
    assert len(tree) >= 4, tree
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    stopped_s = time.perf_counter() - t0
    print(f"SIGTERM -> exit in {stopped_s:.2f} s")
    assert proc.returncode == 143 and stopped_s < STOP_BOUND_S, (proc.returncode, stopped_s, err[-2000:])
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("hpp run: stopped by SIGTERM")
    assert _wait_gone(tree, 2.0) == []


def _worker_of(launcher: subprocess.Popen, local_rank: int) -> int:
    """The pid of the torchrun worker of that local rank under ``launcher``."""
    for pid, _start in descendants(launcher.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hpp.runtime.launch.rank_entry" in cmd and f"LOCAL_RANK={local_rank}".encode() in env:
            return pid
    raise AssertionError(f"no worker of local rank {local_rank}")


def test_a_killed_rank_ends_both_hosts_and_is_named(tmp_path):
    plan = two_node_plan(tmp_path / "plan.json")
    procs = start_hosts(plan, steps=LONG, per_host=lambda r: ("--metrics-jsonl", str(tmp_path / f"m{r}.jsonl")))
    _wait_lines(tmp_path / "m1.jsonl", 2, procs[1])
    trees = [_tree(p, 3) for p in procs]                          # agent + 2 workers per host
    victim = _worker_of(procs[1], 1)                              # host 1, local rank 1 = plan rank 3
    t0 = time.perf_counter()
    os.kill(victim, signal.SIGKILL)
    (c0, _o0, e0), (c1, _o1, e1) = finish(procs, timeout_s=90)
    print(f"rank killed -> both hosts exited in {time.perf_counter() - t0:.2f} s")
    host = socket.gethostname()
    assert (c0, c1) == (1, 1), (e0[-1500:], e1[-1500:])
    line1 = e1.strip().splitlines()[-1]
    assert line1.startswith(f"hpp run: error: run failed: rank 3 failed (rank 3: exit -9, killed by SIGKILL) "
                            f"on host {host} (node rank 1)"), line1
    line0 = e0.strip().splitlines()[-1]       # host 0's ranks only lost host 1's (if torchrun's teardown stopped them
    # before they could report, its own failure line, as before)
    assert line0.startswith("hpp run: error: run failed: the ranks of node rank 1 stopped: this host's ranks [0, 2] "
                            "lost their connection to them (") or \
        (line0.startswith("hpp run: error: run failed: rank") and f"on host {host} (node rank 0)" in line0), line0
    assert "Traceback" not in line0 + line1
    assert _wait_gone(trees[0] + trees[1], 5.0) == []


def test_a_killed_host_launcher_leaves_nothing_and_the_checkpoint_resumes(tmp_path, capsys):
    plan = two_node_plan(tmp_path / "plan.json")
    ck = tmp_path / "ck"
    procs = start_hosts(plan, "--dtype", "float64", "--save", str(ck), "--save-every", "1", steps=LONG,
                        per_host=lambda r: ("--metrics-jsonl", str(tmp_path / f"m{r}.jsonl")))
    _wait_lines(tmp_path / "m0.jsonl", 2, procs[0])
    trees = [_tree(p, 3) for p in procs]
    t0 = time.perf_counter()
    procs[1].kill()                                               # SIGKILL: host 1's launcher cannot clean up
    (c0, _o0, e0), _ = finish(procs, timeout_s=90)
    with capsys.disabled():
        print(f"host launcher killed -> host 0 exited in {time.perf_counter() - t0:.2f} s")
    assert c0 == 1 and "hpp run: error: run failed: " in e0 and "Traceback" not in e0.strip().splitlines()[-1], e0
    assert _wait_gone(trees[0] + trees[1], 10.0) == []            # host 1's agent and workers too
    _only_complete_checkpoints(ck)
    _resume_verifies(plan, ck, capsys)
