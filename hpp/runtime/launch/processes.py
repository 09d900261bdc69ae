"""The launchers' operating-system plumbing: run control by signals, children bound to their parent, process trees.

Run control: inside :func:`interrupt_signals` (``hpp run`` wraps the launch in it),
SIGINT and SIGTERM raise :class:`RunInterrupted` in the launcher, which then ends every
local process of the run (SIGTERM, then SIGKILL after a grace of
:data:`INTERRUPT_GRACE_S`) and re-raises; the CLI exits 130 / 143. A launcher killed
outright (SIGKILL) cannot clean up, so its children are bound to it: the torchrun agent
(and each forked rank, and each torchrun worker) gets a parent-death signal (Linux
``prctl(PR_SET_PDEATHSIG)``, :func:`die_with_parent`).

Scratch folders: each run's ranks write their results into a temporary folder named after the launcher's pid
(:func:`run_dir_prefix`); a launcher killed outright leaves its folder behind, so every launcher first removes
the folders of launchers that are gone (:func:`remove_stale_run_dirs`).

A run that outlives its time limit is ended whole: :func:`kill_tree` finds the
torchrun agent and every worker it started through ``/proc`` (each worker runs in its
own session, so killing the agent's process group alone would leave them running) and
kills them, never a recycled pid (:func:`descendants` records each start time).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from hpp.wording import count

__all__ = ["RunInterrupted", "interrupt_signals", "libc_prctl", "die_with_parent", "free_port", "descendants",
           "kill_tree", "INTERRUPT_GRACE_S", "RUN_DIR_PREFIX", "run_dir_prefix", "remove_stale_run_dirs"]

logger = logging.getLogger(__name__)

#: Seconds torchrun's agent gets after SIGTERM to stop its workers before everything is killed.
_TERM_GRACE_S = 5.0
#: Seconds the run's processes get after SIGTERM on Ctrl-C / SIGTERM before they are killed.
INTERRUPT_GRACE_S = 3.0

#: Start of the name of every run's scratch folder (then the launcher's pid, then tempfile's random part).
RUN_DIR_PREFIX = "hpp-run-"


def run_dir_prefix(pid: int | None = None) -> str:
    """``hpp-run-<pid>-``: the prefix of the scratch folder of the launcher ``pid`` (default: this process)."""
    return f"{RUN_DIR_PREFIX}{os.getpid() if pid is None else pid}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's process: alive
        return True
    return True


def remove_stale_run_dirs(parent: str | Path | None = None) -> list[Path]:
    """Remove the scratch folders under ``parent`` (default: the system's temporary folder) of launchers that are
    gone: named ``hpp-run-<pid>-...`` (:func:`run_dir_prefix`), owned by this user, and ``pid`` not running (a
    recycled pid keeps a folder until that process ends too). Returns the folders removed.

    Folders named otherwise (an older hpp's ``hpp-run-<random>``) are left alone: nothing says whose they are.
    """
    import shutil
    import tempfile
    root = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed = []
    try:
        children = list(root.glob(f"{RUN_DIR_PREFIX}*-*"))
    except OSError:
        return []
    for d in children:
        pid = d.name[len(RUN_DIR_PREFIX):].split("-", 1)[0]
        try:
            mine = d.is_dir() and d.stat().st_uid == os.getuid()
        except OSError:
            continue
        if not (pid.isdigit() and mine) or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    if removed:
        logger.info("removed %s of ended runs: %s", count(len(removed), "scratch folder"),
                    ", ".join(map(str, removed)))
    return removed


class RunInterrupted(BaseException):
    """SIGINT or SIGTERM reached the launcher (raised by :func:`interrupt_signals`'s handler).

    A :class:`BaseException`, like :class:`KeyboardInterrupt`, so that no ``except Exception``
    swallows it. :attr:`exit_code` is the shell's convention, ``128 + signum`` (130, 143).
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(signal.Signals(self.signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def interrupt_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`RunInterrupted` (main thread only; else a no-op)."""
    fired: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if fired:                                       # already stopping the run: do not break that off
            logger.warning("stopping the run (%s); please wait", signal.Signals(signum).name)
            return
        fired.append(signum)
        raise RunInterrupted(signum)
    try:
        old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:                                  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def libc_prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), or None."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int, *, prctl: Callable[..., int] | None = None, parent: int | None = None) -> None:
    """Linux: deliver ``sig`` to this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``).

    ``prctl`` resolved beforehand (:func:`libc_prctl`), so that a ``preexec_fn`` imports nothing;
    ``parent``: exit at once if the parent is already gone (it died before the call).
    """
    fn = prctl or libc_prctl()
    if fn is not None:
        fn(1, int(sig), 0, 0, 0)                        # 1 = PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def free_port() -> int:
    """A TCP port free on localhost right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
