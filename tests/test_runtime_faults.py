"""A rank that dies or hangs makes every other rank exit in bounded time, naming the failure."""

from __future__ import annotations

import time
from dataclasses import asdict

import pytest

from hpp.plan import Pipeline, Plan, Stage, plan_to_dict
from hpp.runtime.launch import launch_forked
from hpp.runtime.models import ModelConfig
from hpp.runtime.worker import WorkerConfig

pytestmark = pytest.mark.distributed

CFG = ModelConfig("micro", num_blocks=2, hidden_size=16, num_heads=2, seq_len=8, vocab_size=32)


def _plan() -> Plan:
    st = lambda lo, hi, d: Stage(lo, hi, "cpu", 1, (d,))  # noqa: E731
    return Plan("micro", 4, 6, (Pipeline((st(0, 2, 0), st(2, 4, 1)), 2, 4), Pipeline((st(0, 3, 2), st(3, 4, 3)), 1, 2)))


def test_dead_rank_makes_the_others_exit_and_is_named(tmp_path):
    cfg = WorkerConfig(plan=plan_to_dict(_plan()), model=asdict(CFG), steps=4, timeout_s=15, fail_rank=2, fail_step=1)
    t0 = time.perf_counter()
    res = launch_forked(cfg, world_size=4, out_dir=tmp_path, timeout_s=60)
    wall = time.perf_counter() - t0
    assert wall < 30, wall
    assert res.exit_codes[2] == 17 and all(res.exit_codes[r] == 1 for r in (0, 1, 3)), res.exit_codes
    assert res.failed_ranks() == [2]
    assert res.failure_message().startswith("rank(s) [2] failed (rank 2: exit 17)")
    assert all("aborted" in res.errors[r] and "shares groups with ranks" in res.errors[r] for r in (0, 1, 3))
    assert not list(tmp_path.glob("rank*.json")) and not list(tmp_path.glob("*.tmp"))


def test_hung_rank_makes_the_others_time_out(tmp_path):
    timeout_s = 5
    cfg = WorkerConfig(plan=plan_to_dict(_plan()), model=asdict(CFG), steps=4, timeout_s=timeout_s, fail_rank=1,
                       fail_step=1, fail_mode="hang")
    t0 = time.time()
    res = launch_forked(cfg, world_size=4, out_dir=tmp_path, timeout_s=60)
    assert not res.ok and res.exit_codes[1] == 17
    for r in (0, 2, 3):
        assert res.exit_codes[r] == 1 and res.errors[r] is not None
        assert (tmp_path / f"rank{r}.error").stat().st_mtime - t0 < 3 * timeout_s
