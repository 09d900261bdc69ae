"""Start the ranks of a run: torchrun (``hpp run``) or fork (tests, quick experiments).

Both launchers return a :class:`LaunchResult` with every rank's exit code and what
it wrote (``rank<r>.json`` or ``rank<r>.error``). A rank that exits with neither
file died abruptly; :meth:`LaunchResult.failure_message` names it first.

Fork start requires torch to be imported in the parent and costs milliseconds;
torchrun (spawn) costs 12-30 s for 5-8 ranks on a 2-core host.

While they wait, both launchers call ``poll()`` (if given) every
:data:`POLL_INTERVAL_S` and once at the end: ``hpp run`` reads the ranks' per-step
lines there (:class:`hpp.runtime.metrics.StepMonitor`).

A run that outlives ``timeout_s`` is ended whole: with torchrun, the agent and every
worker it started (each worker runs in its own session, so killing the agent's process
group alone would leave them running) are found through ``/proc`` and killed;
:attr:`LaunchResult.timed_out` is then set and the failure message says so.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hpp.runtime.worker import WorkerConfig, config_to_json, worker_main, write_atomic

__all__ = ["LaunchResult", "launch_forked", "launch_torchrun", "free_port", "descendants", "kill_tree",
           "POLL_INTERVAL_S"]

logger = logging.getLogger(__name__)

#: Seconds between two ``poll()`` calls while the ranks run.
POLL_INTERVAL_S = 0.2
#: Seconds torchrun's agent gets after SIGTERM to stop its workers before everything is killed.
_TERM_GRACE_S = 5.0


@dataclass(frozen=True)
class LaunchResult:
    """Outcome of one launch.

    Attributes
    ----------
    exit_codes : tuple[int | None, ...]
        Per rank; ``None`` = still running when the launcher gave up (then killed).
    results : tuple[dict | None, ...]
        Per rank, its ``rank<r>.json`` (None if it wrote none).
    errors : tuple[str | None, ...]
        Per rank, its ``rank<r>.error`` text.
    wall_s : float
    out_dir : Path
    timed_out : bool
        The run outlived the launcher's ``timeout_s`` and was killed.
    timeout_s : float or None
        That limit [s].
    """

    exit_codes: tuple[int | None, ...]
    results: tuple[dict[str, Any] | None, ...]
    errors: tuple[str | None, ...]
    wall_s: float
    out_dir: Path
    timed_out: bool = False
    timeout_s: float | None = None

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.exit_codes) and all(r is not None for r in self.results)

    def failed_ranks(self) -> list[int]:
        """Ranks that died without reporting (the likely first failures), else those that reported errors."""
        silent = [r for r, (c, e, res) in enumerate(zip(self.exit_codes, self.errors, self.results))
                  if c != 0 and e is None and res is None]
        return silent or [r for r, e in enumerate(self.errors) if e is not None]

    def failure_message(self) -> str:
        """One line naming the failed rank(s), then what the others reported."""
        if self.ok:
            return ""
        if self.timed_out:
            done = sum(r is not None for r in self.results)
            return (f"the run timed out after {self.timeout_s:g} s (--run-timeout) and every rank was killed; "
                    f"{done} of {len(self.results)} rank(s) had finished")
        failed = self.failed_ranks()
        codes = ", ".join(f"rank {r}: exit {self.exit_codes[r]}" for r in failed)
        others = [e.strip() for e in self.errors if e]
        tail = f"; {len(others)} rank(s) aborted, e.g. {others[0]}" if others else ""
        return f"rank(s) {failed} failed ({codes}){tail}"


def free_port() -> int:
    """A TCP port free on localhost right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _collect(out_dir: Path, world_size: int, codes: list[int | None], wall_s: float, *, timed_out: bool = False,
             timeout_s: float | None = None) -> LaunchResult:
    results: list[dict[str, Any] | None] = []
    errors: list[str | None] = []
    for r in range(world_size):
        rj, re_ = out_dir / f"rank{r}.json", out_dir / f"rank{r}.error"
        results.append(json.loads(rj.read_text()) if rj.exists() else None)
        errors.append(re_.read_text() if re_.exists() else None)
    return LaunchResult(tuple(codes), tuple(results), tuple(errors), wall_s, out_dir, timed_out, timeout_s)


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time in clock ticks)`` of a live process, from ``/proc/<pid>/stat``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()      # after "pid (comm) ": state ppid ... starttime (22nd)
    return int(fields[1]), int(fields[19])


def descendants(pid: int) -> list[tuple[int, int]]:
    """Every live descendant of ``pid`` as ``(pid, start time)`` (Linux ``/proc``; elsewhere: none).

    The start time identifies the process, so that :func:`kill_tree` never signals a
    recycled pid.
    """
    parent: dict[int, int] = {}
    start: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if e.isdigit():
            st = _proc_stat(int(e))
            if st is not None:
                parent[int(e)], start[int(e)] = st
    out: list[tuple[int, int]] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for child, par in parent.items():
            if par == p:
                out.append((child, start[child]))
                todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen, *, grace_s: float = _TERM_GRACE_S) -> None:
    """End ``proc`` and every process it started, whatever session they run in.

    The descendants are listed first (an orphan loses its parent link), then ``proc``
    gets SIGTERM (torchrun's agent then stops its workers), and after ``grace_s`` every
    listed process still alive, and ``proc``, gets SIGKILL.
    """
    tree = descendants(proc.pid)
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace_s)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    tree += [t for t in descendants(proc.pid) if t not in tree]   # started during the grace period
    for pid, started in tree:
        st = _proc_stat(pid)
        if st is not None and st[1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _fork_child(cfg: WorkerConfig, rank: int, world_size: int, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    code = worker_main(cfg, rank=rank, world_size=world_size, out_dir=Path(out_dir))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_forked(cfg: WorkerConfig, *, world_size: int, out_dir: Path, timeout_s: float,
                  poll: Callable[[], Any] | None = None) -> LaunchResult:
    """Fork ``world_size`` ranks of :func:`hpp.runtime.worker.run_worker` and wait at most ``timeout_s``.

    Ranks still alive after ``timeout_s`` are killed (exit code ``None``, ``timed_out``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("fork")
    port = free_port()
    t0 = time.perf_counter()
    procs = [ctx.Process(target=_fork_child, args=(cfg, r, world_size, str(out_dir), port), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = t0 + timeout_s
    while time.perf_counter() < deadline:
        alive = [p for p in procs if p.is_alive()]
        if not alive:
            break
        alive[0].join(min(POLL_INTERVAL_S, max(0.0, deadline - time.perf_counter())))
        if poll is not None:
            poll()
    codes: list[int | None] = []
    timed_out = False
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
            codes.append(None)
            timed_out = True
        else:
            codes.append(p.exitcode)
    if poll is not None:
        poll()
    return _collect(out_dir, world_size, codes, time.perf_counter() - t0, timed_out=timed_out,
                    timeout_s=timeout_s)


def launch_torchrun(cfg: WorkerConfig, *, world_size: int, out_dir: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None, poll: Callable[[], Any] | None = None) -> LaunchResult:
    """Start ``python -m torch.distributed.run --standalone --nproc-per-node N -m hpp.runtime.worker``.

    torchrun's own agent stops every rank when one fails; ``timeout_s`` bounds the
    whole run (then the agent and all its workers are killed, :func:`kill_tree`).
    torchrun's output goes to ``out_dir/torchrun.log``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = out_dir / "worker_config.json"
    write_atomic(cfg_path, config_to_json(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
           "--max-restarts=0", "-m", "hpp.runtime.worker", str(cfg_path), str(out_dir)]
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.num_threads), **(extra_env or {}))
    logger.info("launching: %s", " ".join(cmd))
    log_path = out_dir / "torchrun.log"
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = t0 + timeout_s
        code: int | None = None
        while True:
            try:
                code = proc.wait(min(POLL_INTERVAL_S, max(0.0, deadline - time.perf_counter())))
                break
            except subprocess.TimeoutExpired:
                if poll is not None:
                    poll()
                if time.perf_counter() >= deadline:
                    kill_tree(proc)
                    code, timed_out = None, True
                    break
    if poll is not None:
        poll()
    wall = time.perf_counter() - t0
    output = log_path.read_text(errors="replace")
    if code != 0:
        logger.warning("torchrun exited with %s; its output ends:\n%s", code, "\n".join(output.splitlines()[-30:]))
    else:
        logger.debug("torchrun output:\n%s", output)
    res = _collect(out_dir, world_size, [code] * world_size, wall, timed_out=timed_out, timeout_s=timeout_s)
    if code != 0:   # torchrun reports one code for all; mark ranks without a result as failed
        codes = tuple(0 if r is not None else (code if code is not None else None) for r in res.results)
        res = LaunchResult(codes, res.results, res.errors, res.wall_s, out_dir, timed_out, timeout_s)
    return res
