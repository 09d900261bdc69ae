"""What the hosts of a multi-host run must be given alike, and the check the ranks make of it at the rendezvous.

Every host starts its own ``hpp run`` (:mod:`hpp.runtime.run_setup`, ``host_share``), so nothing but the ranks
themselves can see that two hosts were given different flags: a host with another ``--save`` writes half a
checkpoint, another ``--steps`` leaves its peers waiting, another ``--dtype`` or ``--seed`` trains another model.
The ranks compare them first thing after ``init_process_group`` (:func:`check_hosts_agree`); the launcher
recognises the error in a rank's report (:func:`hosts_disagree_error`) and exits 2 with it on every host.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch.distributed as dist

from hpp.errors import HppInputError
from hpp.runtime.config import RunConfig, RunFacts

__all__ = ["AGREED_FLAGS", "HOSTS_DISAGREE", "check_hosts_agree", "hosts_disagree_error"]

#: What every host of a multi-host run must be given alike: a :class:`~hpp.runtime.config.RunFacts` field or a
#: :class:`~hpp.runtime.config.RunConfig` ``section.field`` (``training.<key>``: a key of the facts' resolved
#: ``training`` dict) -> the flag of ``hpp run`` that sets it. A host with another ``--save`` would
#: write half a checkpoint, another ``--steps`` would leave its peers waiting, another ``--dtype`` or ``--seed``
#: would train another model: the ranks compare them first (:func:`check_hosts_agree`).
AGREED_FLAGS: dict[str, str] = {
    "plan": "PLAN.json (its content)", "model": "--model", "steps": "--steps", "seed": "--seed",
    "dtype": "--dtype", "data": "--data", "weights": "--weights", "save_dir": "--save", "save_every": "--save-every", "resume": "--resume",
    "verify": "--verify", "naive_allreduce": "--naive-allreduce", "device": "--device",
    "training.optimizer": "--optimizer", "training.lr": "--lr", "training.weight_decay": "--weight-decay",
    "training.lr_schedule": "--lr-schedule", "training.warmup_steps": "--lr-warmup-steps",
    "training.min_lr_ratio": "the LR schedule's min_lr_ratio", "training.total_steps": "--lr-total-steps",
    "training.clip_grad_norm": "--clip-grad-norm", "training.dtype": "--dtype (--verify: float64)"}

#: How the error of hosts started with different flags begins (the launcher recognises it in a rank's error).
HOSTS_DISAGREE = "the hosts of this run were started with different flags"


def _agreed_values(config: RunConfig, facts: RunFacts) -> dict[str, Any]:
    """This host's value of every :data:`AGREED_FLAGS` entry (the plan as a digest of its JSON)."""
    from_config = {"steps": config.training.steps, "save_every": config.checkpoint.save_every,
                   "verify": config.verify.enabled, "naive_allreduce": config.parallelism.naive_allreduce,
                   "device": config.launch.device, "dtype": facts.training.get("dtype")}
    out: dict[str, Any] = {}
    for key in AGREED_FLAGS:
        if key == "plan":
            out[key] = hashlib.sha256(json.dumps(facts.plan, sort_keys=True).encode()).hexdigest()[:12]
        elif key.startswith("training."):
            out[key] = facts.training.get(key.split(".", 1)[1])
        elif key in from_config:
            out[key] = from_config[key]
        else:
            out[key] = getattr(facts, key)
    return out


def check_hosts_agree(config: RunConfig, facts: RunFacts, *, node_rank: int) -> None:
    """Refuse, on every rank of every host, a run whose hosts were given different :data:`AGREED_FLAGS`
    (collective over the world when ``config.launch.nnodes > 1``: every rank's values are gathered, so every rank
    raises the same error and none goes on; one host: nothing to compare).

    Raises
    ------
    HppInputError
        Starting with :data:`HOSTS_DISAGREE`: the first differing flag with each host's value, and how many more.
    """
    if config.launch.nnodes <= 1:                # one host: one config for every rank
        return
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (node_rank, _agreed_values(config, facts)))
    hosts = dict(sorted(gathered))                                # node rank -> its values (one per host)
    differ = [k for k in AGREED_FLAGS if len({json.dumps(v[k], sort_keys=True) for v in hosts.values()}) > 1]
    if not differ:
        return
    key = differ[0]
    shown = "; ".join(f"node rank {n}: {'not given' if v[key] is None or v[key] is False else repr(v[key])}"
                      for n, v in hosts.items())
    more = f" (and {len(differ) - 1} more: {', '.join(AGREED_FLAGS[k] for k in differ[1:])})" if len(differ) > 1 else ""
    raise HppInputError(f"{HOSTS_DISAGREE}: {AGREED_FLAGS[key]} differs ({shown}){more}", field=AGREED_FLAGS[key],
                        fix="start hpp run on every host with the same plan and the same --steps, --save, --resume, "
                            "--verify, --dtype, --seed, --model, --data, --weights and training flags")


def hosts_disagree_error(error_text: str | None) -> str | None:
    """The :func:`check_hosts_agree` error in a rank's ``rank<r>.error`` text (:func:`worker_main`), else None."""
    if not error_text or HOSTS_DISAGREE not in error_text:
        return None
    return HOSTS_DISAGREE + error_text.split(HOSTS_DISAGREE, 1)[1].rsplit(" (a peer may have died", 1)[0].strip()
