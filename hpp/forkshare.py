"""Shares of one search step run side by side: the first in this process, the others in forked children.

Used by the candidates' stage balance (shares of the micro-batch sizes) and the LP bound (shares
of the sync classes). A child inherits the parent's memory (fork), runs its share and sends the
result back through a pipe; its exception is re-raised here, and a child that dies without an
answer has its share run here. Results are in task order, so the caller's merge is deterministic.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Callable, Sequence

__all__ = ["usable_cores", "can_fork", "run_shares"]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:        # pragma: no cover (macOS, Windows)
        return os.cpu_count() or 1


def can_fork() -> bool:
    """True where the ``fork`` start method exists (Linux; not Windows)."""
    return "fork" in multiprocessing.get_all_start_methods()


def _child(conn, run: Callable[[Any], Any], task: Any) -> None:     # pragma: no cover (child process)
    try:
        conn.send(("ok", run(task)))
    except BaseException as exc:       # noqa: BLE001 - sent to the parent, which re-raises it
        conn.send(("error", exc))
    finally:
        conn.close()


def run_shares(run: Callable[[Any], Any], tasks: Sequence[Any], *,
               merge: Callable[[list[Any]], Any] | None = None) -> Any:
    """``[run(t) for t in tasks]``, with ``tasks[1:]`` each in a forked child while this process runs ``tasks[0]``.

    ``merge``: when given, ``merge(results)`` is returned instead; it runs here as soon as every
    result has arrived, before the children are reaped, so that their exit (the kernel tearing
    down a copy of this process: ~3 ms) overlaps it instead of delaying it.

    Raises
    ------
    BaseException
        Whatever ``run`` or ``merge`` raised, here or in a child (the other children are stopped).
    """
    ctx = multiprocessing.get_context("fork")
    children = []
    for task in tasks[1:]:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(send, run, task), daemon=True)
        proc.start()
        send.close()
        children.append((proc, recv, task))
    try:
        out = [run(tasks[0])]
        for proc, recv, task in children:
            try:
                kind, got = recv.recv()
            except EOFError:                 # the child died: run its share here
                kind, got = "ok", run(task)
            if kind == "error":
                raise got
            out.append(got)
        result = merge(out) if merge is not None else out
    except BaseException:
        for proc, _, _ in children:          # nobody will read their results
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        for proc, recv, _ in children:
            recv.close()
            proc.join()
    return result
