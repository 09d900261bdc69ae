"""Start a plan's ranks directly (fork or torchrun) for the runtime tests that read the ranks' own results."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpp.plan_data import Plan, plan_to_dict
from hpp.runtime.config import RunConfig, RunFacts
from hpp.runtime.exec.training import TrainingConfig
from hpp.runtime.launch.launchers import LaunchResult, launch_forked, launch_torchrun
from hpp.runtime.launch.launchers import worker_config_json


def sgd(lr: float = 0.1, *, dtype: str = "float32", **kw: Any) -> TrainingConfig:
    """Plain SGD without weight decay at a constant rate: a training whose steps are easy to reason about."""
    return TrainingConfig(optimizer="sgd", lr=lr, weight_decay=0.0, dtype=dtype, **kw)


def rank_job(plan: Plan, model: str, *, steps: int, training: TrainingConfig | None = None, timeout_s: float = 30.0,
             naive_allreduce: bool = False, seed: int = 0, **controls: Any) -> tuple[RunConfig, RunFacts]:
    """The :class:`RunConfig` and :class:`RunFacts` of ``steps`` steps of ``plan`` on ``model`` (a zoo name or
    ``MODULE:FUNCTION``); ``controls``: :class:`hpp.runtime.config.Controls` fields."""
    training = training or sgd()
    config = RunConfig.build("(in memory)", steps=steps, model=model, naive_allreduce=naive_allreduce,
                             group_timeout_s=timeout_s, controls=controls)
    facts = RunFacts(plan=plan_to_dict(plan), model=model,
                     training={**asdict(training), "total_steps": max(1, steps)}, seed=seed)
    return config, facts


def fork_ranks(plan: Plan, model: str, out_dir: Path, *, launch_timeout_s: float = 90.0, **job: Any) -> LaunchResult:
    """Fork every rank of ``plan`` (:func:`rank_job`'s options) and wait at most ``launch_timeout_s``."""
    config, facts = rank_job(plan, model, **job)
    return launch_forked(config, facts, world_size=plan.num_devices, out_dir=out_dir, timeout_s=launch_timeout_s)


def torchrun_ranks(plan: Plan, model: str, out_dir: Path, *, launch_timeout_s: float, poll: Any = None,
                   **job: Any) -> LaunchResult:
    """:func:`fork_ranks` under torchrun (one host)."""
    config, facts = rank_job(plan, model, **job)
    return launch_torchrun(worker_config_json(config, facts), num_threads=config.training.num_threads,
                           world_size=plan.num_devices, out_dir=out_dir, timeout_s=launch_timeout_s, poll=poll)
