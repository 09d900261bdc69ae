"""``hpp run``'s scratch folders: named after the launcher's pid, and those of launchers killed outright (kill -9)
removed by the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hpp.cli import main                                                      # noqa: E402
from hpp.runtime.launch.processes import remove_stale_run_dirs, run_dir_prefix       # noqa: E402
from hpp.runtime.config import RunConfig                                     # noqa: E402
from hpp.runtime.run import run_plan                                          # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_only_folders_of_ended_launchers_are_removed(tmp_path):
    dead = tmp_path / f"{run_dir_prefix(_dead_pid())}abc"
    alive = tmp_path / f"{run_dir_prefix(os.getppid())}def"
    mine = tmp_path / f"{run_dir_prefix()}ghi"
    legacy = tmp_path / "hpp-run-k2j4x9q1"                              # an older hpp's name: whose, unknown
    for d in (dead, alive, mine, legacy):
        d.mkdir()
        (d / "rank0.json").write_text("{}")
    assert remove_stale_run_dirs(tmp_path) == [dead]
    assert not dead.exists() and alive.is_dir() and mine.is_dir() and legacy.is_dir()


def test_a_run_after_a_killed_launcher_removes_its_folder(tmp_path):
    plan = tmp_path / "p.json"
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--quiet", "--out", str(plan)]) == 0
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "hpp.runtime.cli", "run", str(plan), "--steps", "500",
                             "--launcher", "fork", "--quiet", "--no-host-calibration"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    left = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        left = [d for d in scratch.glob(f"{run_dir_prefix(proc.pid)}*") if list(d.glob("rank*.steps.jsonl"))]
        if left:
            break
        time.sleep(0.2)
    assert left, "the run never started"
    os.kill(proc.pid, signal.SIGKILL)                                     # the launcher alone, as kill -9 does
    proc.wait(timeout=30)
    time.sleep(1.0)                                                       # its ranks follow it (parent-death signal)
    assert left[0].is_dir()                                               # what a kill -9 leaves
    run_plan(RunConfig.build(plan, steps=1, launcher="fork", out_dir=scratch, host_calibration=False))
    assert not left[0].exists() and not list(scratch.glob("hpp-run-*"))   # nor the new run's own
