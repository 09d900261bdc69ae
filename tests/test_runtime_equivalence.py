"""HPP runs (heterogeneous pipelines, uneven data, block-wise all-reduce) train exactly like one device.

Fork start (torch imported here, in the parent) keeps each launch to seconds; every
launch is bounded by a timeout so nothing can hang CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpp.plan_data import Pipeline, Plan, Stage
from hpp.runtime.exec.data import make_batch_source
from hpp.runtime.exec.reference import max_param_difference, train_single_device
from hpp.runtime.exec.training import TrainingConfig
from hpp.runtime.models.gpt import GPT, ModelConfig
from tests.rank_launch import fork_ranks, sgd

pytestmark = pytest.mark.distributed

CFG = ModelConfig("micro", num_blocks=4, hidden_size=32, num_heads=2, seq_len=16, vocab_size=64)
STEPS = 3
TOL = 1e-6


def micro() -> GPT:
    """The test model (``tests.test_runtime_equivalence:micro``)."""
    return GPT(CFG)


def micro_tied() -> GPT:
    """The same model with the head tied to the token table."""
    return GPT(CFG, tie_embeddings=True)


def _st(lo: int, hi: int, dev: int, recompute: str = "none") -> Stage:
    return Stage(lo, hi, "cpu", 1, (dev,), recompute)


def three_pipelines() -> Plan:
    """3, 2 and 1 stages; boundaries {2,4} / {3} / {}; m = 4, 1 (< 2 stages, GPipe), 2 (partial: 5 = 3 + 2).

    G = 13 is prime: no pipeline count divides it.
    """
    return Plan("micro", 6, 13, (Pipeline((_st(0, 2, 0), _st(2, 4, 1), _st(4, 6, 2)), 2, 7, "1F1B"),
                                 Pipeline((_st(0, 3, 3), _st(3, 6, 4)), 1, 1, "GPipe"),
                                 Pipeline((_st(0, 6, 5),), 3, 5, "1F1B")))


def with_recompute() -> Plan:
    """:func:`three_pipelines` with full recomputation on four of its six stages (first, middle and last
    stages, the embedding and the head among them; the one-stage pipeline recomputes everything)."""
    return Plan("micro", 6, 13, (Pipeline((_st(0, 2, 0, "full"), _st(2, 4, 1), _st(4, 6, 2, "full")), 2, 7, "1F1B"),
                                 Pipeline((_st(0, 3, 3), _st(3, 6, 4, "full")), 1, 1, "GPipe"),
                                 Pipeline((_st(0, 6, 5, "full"),), 3, 5, "1F1B")))


def with_idle_pipeline() -> Plan:
    """Pipeline 1 gets 0 samples but still joins its blocks' all-reduces."""
    return Plan("micro", 6, 9, (Pipeline((_st(0, 4, 0), _st(4, 6, 1)), 3, 9, "1F1B"),
                                Pipeline((_st(0, 1, 2), _st(1, 3, 3), _st(3, 6, 4)), 2, 0, "1F1B")))


def _run(tmp_path: Path, plan: Plan, *, tie_embeddings: bool = False, optimizer: str = "sgd", lr: float = 0.1,
         **kw) -> tuple[float, bool, int, list[dict]]:
    """The ranks' parameters after :data:`STEPS` float64 steps against single-device training (SGD, or AdamW
    with weight decay 0.01); ``kw``: :func:`tests.rank_launch.rank_job`'s options."""
    model = micro_tied() if tie_embeddings else micro()
    training = sgd(lr, dtype="float64", total_steps=STEPS) if optimizer == "sgd" else \
        TrainingConfig(optimizer="adamw", lr=lr, weight_decay=0.01, dtype="float64", total_steps=STEPS)
    res = fork_ranks(plan, f"tests.test_runtime_equivalence:{'micro_tied' if tie_embeddings else 'micro'}", tmp_path,
                     steps=STEPS, training=training, save_params=True, bucket_bytes=kw.pop("bucket_bytes", 8_000),
                     **kw)
    assert res.ok, res.failure_message()
    params = [torch.load(tmp_path / f"rank{r}.pt") for r in range(plan.num_devices)]
    source = make_batch_source(None, model, seed=0, global_batch_size=plan.global_batch_size)
    ref = train_single_device(model, source=source, steps=STEPS, seed=0, training=training, dtype=torch.float64)
    worst, nan, n = max_param_difference(params, ref)
    assert n == sum(len(p) for p in params) and set().union(*params) == set(ref)   # every parameter compared
    assert not list(tmp_path.glob("*.tmp"))
    return worst, nan, n, list(res.results)


def test_three_heterogeneous_pipelines_match_one_device(tmp_path):
    worst, nan, _n, results = _run(tmp_path, three_pipelines(), lr=0.5)
    assert not nan and worst <= TOL, worst
    assert sum(r["collectives"][-1]["launched_in_backward"] for r in results) > 0   # overlap really happened
    assert [r["outputs_kept"] for r in results] == [0] * 6          # no logits kept after the loss


def test_recomputing_stages_match_one_device(tmp_path):
    """Stages that recompute (torch.utils.checkpoint) still train exactly like one device."""
    worst, nan, _n, results = _run(tmp_path, with_recompute(), lr=0.5)
    assert not nan and worst <= TOL, worst
    assert [r["recompute"] for r in results] == ["full", "none", "full", "none", "full", "full"]
    assert sum(r["collectives"][-1]["launched_in_backward"] for r in results) > 0   # hooks fire under checkpoint


def test_control_without_block_allreduce_fails(tmp_path):
    worst, nan, _n, _ = _run(tmp_path, three_pipelines(), lr=0.5, skip_block_allreduce=True)
    assert not nan and worst > 1e-3, worst


def test_tied_embeddings_with_adamw_match_one_device(tmp_path):
    worst, nan, _n, _ = _run(tmp_path, three_pipelines(), tie_embeddings=True, optimizer="adamw", lr=0.01)
    assert not nan and worst <= TOL, worst


def test_naive_per_layer_allreduce_matches_too(tmp_path):
    worst, nan, _n, results = _run(tmp_path, three_pipelines(), lr=0.5, naive_allreduce=True)
    assert not nan and worst <= TOL, worst
    assert all(r["collectives"][-1]["launched_in_backward"] == 0 for r in results)


def test_zero_sample_pipeline_joins_with_zero_grads(tmp_path):
    worst, nan, _n, results = _run(tmp_path, with_idle_pipeline(), tie_embeddings=True, lr=0.5)
    assert not nan and worst <= TOL, worst
    assert [r["num_micro_batches"] for r in results] == [3, 3, 0, 0, 0]
