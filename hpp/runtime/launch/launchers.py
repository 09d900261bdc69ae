"""Start the ranks of a run: torchrun (``hpp run``) or fork (tests, quick experiments).

Both launchers return a :class:`LaunchResult` with every rank's exit code and what
it wrote (``rank<r>.json`` or ``rank<r>.error``). A rank that exits with neither
file died abruptly; :meth:`LaunchResult.failure_message` names it first.

Fork start requires torch to be imported in the parent and costs milliseconds;
torchrun (spawn) costs 12-30 s for 5-8 ranks on a 2-core host.

While they wait, both launchers call ``poll()`` (if given) every
:data:`POLL_INTERVAL_S` and once at the end: ``hpp run`` reads the ranks' per-step
lines there (:class:`hpp.runtime.metrics.StepMonitor`).

A run that outlives ``timeout_s`` is ended whole (:func:`hpp.runtime.launch.processes.kill_tree`:
the torchrun agent and every worker it started); :attr:`LaunchResult.timed_out` is then set
and the failure message says so. Inside :func:`hpp.runtime.launch.processes.interrupt_signals`,
SIGINT and SIGTERM end every local process of the run the same way and re-raise
:class:`hpp.runtime.launch.processes.RunInterrupted`; each child is bound to the launcher by a
parent-death signal (:mod:`hpp.runtime.launch.processes`).

Several hosts (:func:`launch_torchrun` with ``nnodes > 1``): each host's launcher starts
torchrun with a static rendezvous (``--rdzv-backend=static``, so torchrun's group rank is
the host's ``--node-rank``) and ``--nproc-per-node`` = this host's ranks of the plan
(:func:`hpp.runtime.launch.binding.host_ranks`); each launcher collects its own ranks' files
(``local_ranks``: their plan ranks).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from hpp.fileio import write_atomic
from hpp.runtime.launch.processes import INTERRUPT_GRACE_S, die_with_parent, free_port, kill_tree, libc_prctl
from hpp.plan_data import plan_from_dict
from hpp.runtime.config import RunConfig, RunFacts
from hpp.runtime.exec.worker import worker_main
from hpp.runtime.launch.binding import worker_binding
from hpp.wording import count

__all__ = ["LaunchResult", "launch_forked", "launch_torchrun", "torchrun_command", "host_label", "POLL_INTERVAL_S",
           "RANK_ENTRY", "worker_config_json", "read_worker_config", "rank_binding"]

logger = logging.getLogger(__name__)

#: Seconds between two ``poll()`` calls while the ranks run.
POLL_INTERVAL_S = 0.2


#: The training ranks' entry point under torchrun (``python -m RANK_ENTRY CONFIG.json OUT_DIR``).
RANK_ENTRY = "hpp.runtime.launch.rank_entry"


def worker_config_json(config: RunConfig, facts: RunFacts) -> str:
    """JSON text of the run for its ranks (read back by :func:`read_worker_config`)."""
    return json.dumps({"config": config.to_dict(), "facts": asdict(facts)})


def read_worker_config(path: str | Path) -> tuple[RunConfig, RunFacts]:
    """Inverse of :func:`worker_config_json`."""
    data = json.loads(Path(path).read_text())
    return RunConfig.from_dict(data["config"]), RunFacts(**data["facts"])


def rank_binding(config: RunConfig, facts: RunFacts, *, local_rank: int, node_rank: int
                 ) -> tuple[int, int | None]:
    """``(plan rank, local GPU index or None)`` of local rank ``local_rank`` on node rank ``node_rank``."""
    plan = plan_from_dict(facts.plan)
    b = worker_binding(plan, nnodes=config.launch.nnodes, node_rank=node_rank, local_rank=local_rank,
                       node_map=facts.node_map)
    return b.rank, b.local_index if config.launch.device == "cuda" else None


def host_label(node_rank: int | None = None) -> str:
    """``"<hostname>"``, with ``" (node rank R)"`` in a run of several hosts."""
    name = socket.gethostname()
    return name if node_rank is None else f"{name} (node rank {node_rank})"


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
    ranks : tuple[int, ...]
        The plan ranks the entries belong to (empty: ``0 .. n-1``, the whole plan on this host).
    host : str
        This host (:func:`host_label`), named in the failure message; empty: not named.
    torchrun_failures : tuple[tuple[int, int], ...]
        ``(plan rank, exit code)`` of each rank torchrun saw fail on this host, its root cause first.
    """

    exit_codes: tuple[int | None, ...]
    results: tuple[dict[str, Any] | None, ...]
    errors: tuple[str | None, ...]
    wall_s: float
    out_dir: Path
    timed_out: bool = False
    timeout_s: float | None = None
    ranks: tuple[int, ...] = ()
    host: str = ""
    torchrun_failures: tuple[tuple[int, int], ...] = ()

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.exit_codes) and all(r is not None for r in self.results)

    @property
    def plan_ranks(self) -> tuple[int, ...]:
        """The plan rank of each entry."""
        return self.ranks or tuple(range(len(self.exit_codes)))

    def failed_ranks(self) -> list[int]:
        """Plan ranks that failed first: those torchrun saw fail that wrote no error (died, e.g. killed), else
        torchrun's root cause; without torchrun's word, those that died without reporting, else those that
        reported errors."""
        if self.torchrun_failures:
            died = self.died_silently(sigterm=True)
            return self.died_silently() or died or [self.torchrun_failures[0][0]]
        pr = self.plan_ranks
        silent = [pr[i] for i, (c, e, res) in enumerate(zip(self.exit_codes, self.errors, self.results))
                  if c != 0 and e is None and res is None]
        return silent or [pr[i] for i, e in enumerate(self.errors) if e is not None]

    def died_silently(self, *, sigterm: bool = False) -> list[int]:
        """Plan ranks of this result that torchrun saw fail and that wrote no error (killed, crashed). A rank the
        agent stopped with SIGTERM while tearing down (before it could write its error, which happens under load)
        is a casualty, not a cause: left out unless ``sigterm``."""
        pr = self.plan_ranks
        return [r for r, c in self.torchrun_failures if r in pr and self.errors[pr.index(r)] is None
                and (sigterm or c != -signal.SIGTERM)]

    def _code(self, rank: int) -> str:
        code = dict(self.torchrun_failures).get(rank, self.exit_codes[self.plan_ranks.index(rank)])
        if code is not None and code < 0:
            try:
                return f"exit {code}, killed by {signal.Signals(-code).name}"
            except ValueError:
                pass
        return f"exit {code}"

    def failure_message(self) -> str:
        """One line naming the failed rank(s) and this host, then what the others reported."""
        if self.ok:
            return ""
        where = f" on host {self.host}" if self.host else ""
        if self.timed_out:
            done = sum(r is not None for r in self.results)
            return (f"the run timed out after {self.timeout_s:g} s (--run-timeout) and every rank{where} was "
                    f"killed; {done} of {count(len(self.results), 'rank')} had finished")
        failed = self.failed_ranks()
        codes = ", ".join(f"rank {r}: {self._code(r)}" for r in failed)
        others = [e.strip() for e in self.errors if e]
        tail = f"; {count(len(others), 'rank')} aborted, e.g. {others[0]}" if others else ""
        who = f"rank {failed[0]}" if len(failed) == 1 else f"ranks {failed}"
        return f"{who} failed ({codes}){where}{tail}"


def _collect(out_dir: Path, ranks: Sequence[int], codes: Sequence[int | None], wall_s: float, *,
             timed_out: bool = False, timeout_s: float | None = None, whole: bool = True, host: str = "",
             torchrun_failures: tuple[tuple[int, int], ...] = ()) -> LaunchResult:
    results: list[dict[str, Any] | None] = []
    errors: list[str | None] = []
    for r in ranks:
        rj, re_ = out_dir / f"rank{r}.json", out_dir / f"rank{r}.error"
        results.append(json.loads(rj.read_text()) if rj.exists() else None)
        errors.append(re_.read_text() if re_.exists() else None)
    return LaunchResult(tuple(codes), tuple(results), tuple(errors), wall_s, out_dir, timed_out, timeout_s,
                        () if whole else tuple(ranks), host, torchrun_failures)


def _fork_child(config: RunConfig, facts: RunFacts, rank: int, world_size: int, out_dir: str, port: int,
                log_file: str | None, parent: int) -> None:
    die_with_parent(signal.SIGKILL, parent=parent)   # the launcher gone (even SIGKILLed): this rank goes too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if log_file is not None:                          # --log-dir: this rank's stdout and stderr
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    cuda_index = rank_binding(config, facts, local_rank=rank, node_rank=0)[1] if config.launch.device == "cuda" \
        else None
    code = worker_main(config, facts, rank=rank, world_size=world_size, out_dir=Path(out_dir), cuda_index=cuda_index)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stop_forked(procs: Sequence[Any], grace_s: float) -> None:
    """SIGTERM every live rank, SIGKILL those still alive after ``grace_s``."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.perf_counter() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.perf_counter()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


def launch_forked(config: RunConfig, facts: RunFacts, *, world_size: int, out_dir: Path, timeout_s: float,
                  poll: Callable[[], Any] | None = None, log_dir: Path | None = None) -> LaunchResult:
    """Fork ``world_size`` ranks of :func:`hpp.runtime.exec.worker.run_worker` and wait at most ``timeout_s``.

    Ranks still alive after ``timeout_s`` are killed (exit code ``None``, ``timed_out``).
    ``log_dir``: each rank's stdout and stderr go to ``log_dir/rank<r>.log``. An exception while
    waiting (:class:`~hpp.runtime.launch.processes.RunInterrupted`, ``KeyboardInterrupt``) stops every rank first.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("fork")
    port = free_port()
    t0 = time.perf_counter()
    procs = [ctx.Process(target=_fork_child, args=(config, facts, r, world_size, str(out_dir), port,
                                                   str(log_dir / f"rank{r}.log") if log_dir is not None else None,
                                                   os.getpid()),
                         daemon=True)
             for r in range(world_size)]
    try:
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
    except BaseException:
        _stop_forked([p for p in procs if p.pid is not None], INTERRUPT_GRACE_S)
        raise
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
    return _collect(out_dir, range(world_size), codes, time.perf_counter() - t0, timed_out=timed_out,
                    timeout_s=timeout_s)


def torchrun_command(config_path: str | Path, out_dir: str | Path, *, nproc: int, nnodes: int = 1,
                     node_rank: int = 0, rdzv_endpoint: str | None = None, log_dir: str | Path | None = None,
                     module: str = RANK_ENTRY) -> list[str]:
    """The torchrun command line of one host (``python -m torch.distributed.run ... -m hpp.runtime.launch.rank_entry``;
    ``module``: another entry point taking ``CONFIG.json OUT_DIR``, e.g. ``hpp.runtime.network.measure``).

    One host without an endpoint: ``--standalone``. Otherwise a static rendezvous at
    ``rdzv_endpoint`` (HOST:PORT of node rank 0; torchrun's group rank = ``node_rank``).
    ``log_dir``: torchrun tees each local rank's stdout/stderr into files under it.

    >>> " ".join(torchrun_command("o/worker_config.json", "o", nproc=2, nnodes=2, node_rank=1,
    ...                           rdzv_endpoint="10.0.0.1:29500")[1:])
    '-m torch.distributed.run --nnodes=2 --node-rank=1 --rdzv-backend=static --rdzv-endpoint=10.0.0.1:29500 \
--nproc-per-node=2 --max-restarts=0 -m hpp.runtime.launch.rank_entry o/worker_config.json o'
    """
    if nnodes == 1 and rdzv_endpoint is None:
        where = ["--standalone"]
    else:
        where = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=static",
                 f"--rdzv-endpoint={rdzv_endpoint}"]
    logs = [f"--log-dir={log_dir}", "--tee=3"] if log_dir is not None else []
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={nproc}", "--max-restarts=0",
            *logs, "-m", module, str(config_path), str(out_dir)]


_FAILURE = re.compile(r"\(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def _torchrun_failures(output: str, local_ranks: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``(plan rank, exit code)`` of each failure in torchrun's error summary, the root cause first."""
    root_at = output.rfind("Root Cause (first observed failure)")
    summary = output[output.rfind("Failures:", 0, root_at if root_at >= 0 else None):] if root_at >= 0 else ""
    found = [(int(m.group(1)), int(m.group(2)), m.start() > summary.find("Root Cause"))
             for m in _FAILURE.finditer(summary)]
    out = [(local_ranks[lr], code) for lr, code, is_root in sorted(found, key=lambda f: not f[2])
           if 0 <= lr < len(local_ranks)]
    return tuple(dict.fromkeys(out))


def _keep_logs(log_dir: Path, out_dir: Path, local_ranks: Sequence[int], node_rank: int) -> None:
    """Copy this host's torchrun output, each rank's stdout/stderr and error file into ``log_dir``."""
    tag = f"-node{node_rank}"
    try:
        shutil.copyfile(out_dir / "torchrun.log", log_dir / f"torchrun{tag}.log")
        runs = sorted((log_dir / f"torchrun{tag}").glob("*/attempt_*"), key=lambda q: q.stat().st_mtime)
        for i, r in enumerate(local_ranks):
            parts = []
            for stream in ("stderr", "stdout"):
                f = runs[-1] / str(i) / f"{stream}.log" if runs else None
                if f is not None and f.exists() and f.stat().st_size:
                    parts.append(f"===== {stream} of rank {r} (local rank {i}) =====\n{f.read_text(errors='replace')}")
            err = out_dir / f"rank{r}.error"
            if err.exists():
                parts.append(f"===== rank{r}.error =====\n{err.read_text(errors='replace')}")
            (log_dir / f"rank{r}.log").write_text("\n".join(parts))
    except OSError as exc:
        logger.warning("could not keep the logs in %s: %s", log_dir, exc)


def _wait(proc: subprocess.Popen, *, deadline: float, poll: Callable[[], Any] | None) -> tuple[int | None, bool]:
    """``(exit code, timed out)`` of torchrun's agent, polling meanwhile; past ``deadline`` (or on an exception
    while waiting, re-raised) the agent and every worker it started are killed."""
    try:
        while True:
            try:
                return proc.wait(min(POLL_INTERVAL_S, max(0.0, deadline - time.perf_counter()))), False
            except subprocess.TimeoutExpired:
                if poll is not None:
                    poll()
                if time.perf_counter() >= deadline:
                    kill_tree(proc)
                    return None, True
    except BaseException:
        kill_tree(proc, grace_s=INTERRUPT_GRACE_S)
        raise


def launch_torchrun(config_json: str, *, num_threads: int, world_size: int, out_dir: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None, poll: Callable[[], Any] | None = None,
                    nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
                    local_ranks: Sequence[int] | None = None, log_dir: Path | None = None,
                    module: str = RANK_ENTRY) -> LaunchResult:
    """Start this host's ranks with torchrun (:func:`torchrun_command`) and wait at most ``timeout_s``.

    torchrun's own agent stops every local rank when one fails; ``timeout_s`` bounds the whole
    run (then the agent and all its workers are killed, :func:`~hpp.runtime.launch.processes.kill_tree`),
    and so does an exception while waiting (:class:`~hpp.runtime.launch.processes.RunInterrupted`), which
    is re-raised.
    torchrun's output goes to ``out_dir/torchrun.log``.

    Parameters
    ----------
    world_size : int
        The plan's ranks (all hosts).
    nnodes, node_rank, rdzv_endpoint
        Several hosts: this host's node rank and the static rendezvous endpoint ``HOST:PORT``.
    local_ranks : sequence of int, optional
        The plan ranks this host starts, in local-rank order (default ``0 .. world_size-1``).
    log_dir : Path, optional
        Keep torchrun's output (``torchrun-node<R>.log``) and each rank's (``rank<r>.log``) here.
    module : str
        The ranks' entry point (``python -m MODULE CONFIG.json OUT_DIR``), which reads ``config_json`` back
        (default: the training ranks', :mod:`hpp.runtime.launch.rank_entry`).
    num_threads : int
        Each rank's ``OMP_NUM_THREADS``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = tuple(range(world_size)) if local_ranks is None else tuple(local_ranks)
    cfg_path = out_dir / "worker_config.json"
    write_atomic(cfg_path, config_json)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(cfg_path, out_dir, nproc=len(ranks), nnodes=nnodes, node_rank=node_rank,
                           rdzv_endpoint=rdzv_endpoint,
                           log_dir=log_dir / f"torchrun-node{node_rank}" if log_dir is not None else None,
                           module=module)
    env = dict(os.environ, OMP_NUM_THREADS=str(num_threads), **(extra_env or {}))
    if log_dir is not None:                           # a kept log says what each rank did (checkpoints, ...)
        env.setdefault("HPP_LOG_LEVEL", "INFO")
    logger.info("launching: %s", " ".join(cmd))
    log_path = out_dir / "torchrun.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        prctl, me = libc_prctl(), os.getpid()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: die_with_parent(signal.SIGTERM, prctl=prctl, parent=me))
        try:
            code, timed_out = _wait(proc, deadline=t0 + timeout_s, poll=poll)
        finally:
            if log_dir is not None:
                log.flush()
                _keep_logs(log_dir, out_dir, ranks, node_rank)
    if poll is not None:
        poll()
    wall = time.perf_counter() - t0
    output = log_path.read_text(errors="replace")
    if code != 0:
        # its stack and summary are its own (ChildFailedError): the ranks' errors say more (LaunchResult)
        logger.info("torchrun exited with %s; its output ends:\n%s", code, "\n".join(output.splitlines()[-30:]))
    else:
        logger.debug("torchrun output:\n%s", output)
    host = host_label(node_rank) if nnodes > 1 else ""
    failures = _torchrun_failures(output, ranks) if code not in (0, None) else ()
    res = _collect(out_dir, ranks, [code] * len(ranks), wall, timed_out=timed_out, timeout_s=timeout_s,
                   whole=local_ranks is None, host=host, torchrun_failures=failures)
    if code != 0:   # torchrun reports one code for all; mark ranks without a result as failed
        codes = tuple(0 if r is not None else (code if code is not None else None) for r in res.results)
        res = LaunchResult(codes, res.results, res.errors, res.wall_s, out_dir, timed_out, timeout_s, res.ranks,
                           host, failures)
    return res
