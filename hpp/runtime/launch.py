"""Start the ranks of a run: torchrun (``hpp run``) or fork (tests, quick experiments).

Both launchers return a :class:`LaunchResult` with every rank's exit code and what
it wrote (``rank<r>.json`` or ``rank<r>.error``). A rank that exits with neither
file died abruptly; :meth:`LaunchResult.failure_message` names it first.

Fork start requires torch to be imported in the parent and costs milliseconds;
torchrun (spawn) costs 12-30 s for 5-8 ranks on a 2-core host.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpp.runtime.worker import WorkerConfig, config_to_json, worker_main, write_atomic

__all__ = ["LaunchResult", "launch_forked", "launch_torchrun", "free_port"]

logger = logging.getLogger(__name__)


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
    """

    exit_codes: tuple[int | None, ...]
    results: tuple[dict[str, Any] | None, ...]
    errors: tuple[str | None, ...]
    wall_s: float
    out_dir: Path

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


def _collect(out_dir: Path, world_size: int, codes: list[int | None], wall_s: float) -> LaunchResult:
    results: list[dict[str, Any] | None] = []
    errors: list[str | None] = []
    for r in range(world_size):
        rj, re_ = out_dir / f"rank{r}.json", out_dir / f"rank{r}.error"
        results.append(json.loads(rj.read_text()) if rj.exists() else None)
        errors.append(re_.read_text() if re_.exists() else None)
    return LaunchResult(tuple(codes), tuple(results), tuple(errors), wall_s, out_dir)


def _fork_child(cfg: WorkerConfig, rank: int, world_size: int, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    code = worker_main(cfg, rank=rank, world_size=world_size, out_dir=Path(out_dir))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_forked(cfg: WorkerConfig, *, world_size: int, out_dir: Path, timeout_s: float) -> LaunchResult:
    """Fork ``world_size`` ranks of :func:`hpp.runtime.worker.run_worker` and wait at most ``timeout_s``.

    Ranks still alive after ``timeout_s`` are killed (exit code ``None``).
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
    for p in procs:
        p.join(max(0.0, deadline - time.perf_counter()))
    codes: list[int | None] = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
            codes.append(None)
        else:
            codes.append(p.exitcode)
    return _collect(out_dir, world_size, codes, time.perf_counter() - t0)


def launch_torchrun(cfg: WorkerConfig, *, world_size: int, out_dir: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> LaunchResult:
    """Start ``python -m torch.distributed.run --standalone --nproc-per-node N -m hpp.runtime.worker``.

    torchrun's own agent stops every rank when one fails; ``timeout_s`` bounds the
    whole run (the process group is then killed).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = out_dir / "worker_config.json"
    write_atomic(cfg_path, config_to_json(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
           "--max-restarts=0", "-m", "hpp.runtime.worker", str(cfg_path), str(out_dir)]
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.num_threads), **(extra_env or {}))
    logger.info("launching: %s", " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        output, _ = proc.communicate()
        code = None
    wall = time.perf_counter() - t0
    if code != 0:
        logger.warning("torchrun exited with %s; its output ends:\n%s", code, "\n".join(output.splitlines()[-30:]))
    else:
        logger.debug("torchrun output:\n%s", output)
    res = _collect(out_dir, world_size, [code] * world_size, wall)
    if code != 0:   # torchrun reports one code for all; mark ranks without a result as failed
        codes = tuple(0 if r is not None else (code if code is not None else None) for r in res.results)
        res = LaunchResult(codes, res.results, res.errors, res.wall_s, out_dir)
    return res
