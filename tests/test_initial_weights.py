"""Every replica starts from the same weights, whatever RNG the user's model initialises from: torch's default
generator is seeded per layer while the runtime builds it, and every replicated slice is broadcast from its
lowest-rank holder before the first step (as DDP broadcasts from rank 0)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json                   # noqa: E402
from hpp.runtime.cli import run_main                                          # noqa: E402
from hpp.runtime.models.stage import build_stage                              # noqa: E402
from hpp.runtime.exec.training import TrainingConfig                          # noqa: E402
from hpp.runtime.models.zoo import load_runtime_model                         # noqa: E402
from tests.rank_launch import fork_ranks                                      # noqa: E402

pytestmark = pytest.mark.distributed


class _Unseeded:
    """llama-tiny whose ``build_layer`` ignores the seed: every parameter redrawn from ``draw(shape)``."""

    def __init__(self, draw) -> None:
        self._base = load_runtime_model("llama-tiny")
        self._draw = draw

    def __getattr__(self, name):
        return getattr(self._base, name)

    def build_layer(self, index, *, seed, dtype):
        layer = self._base.build_layer(index, seed=seed, dtype=dtype)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(self._draw(tuple(p.shape)).to(p.dtype))
        return layer


def torch_global_rng():
    """``--model tests.test_initial_weights:torch_global_rng``: torch.randn with no generator (no seed)."""
    return _Unseeded(lambda shape: 0.02 * torch.randn(shape))


def numpy_fresh_rng():
    """``--model tests.test_initial_weights:numpy_fresh_rng``: numpy seeded from the OS on every draw."""
    return _Unseeded(lambda shape: torch.from_numpy(0.02 * np.random.default_rng().standard_normal(shape)))


def _st(lo, hi, first, tp=1):
    return Stage(lo, hi, "cpu", tp, tuple(range(first, first + tp)))


def test_build_stage_of_a_model_on_torchs_default_rng_is_a_function_of_seed_and_layer():
    model = torch_global_rng()
    a = {n: p.detach().clone() for _l, n, p in build_stage(model, 0, 3, seed=0).layer_parameters()}
    torch.randn(100)                                                  # the global RNG moves on: no matter
    b = {n: p.detach().clone() for _l, n, p in build_stage(model, 2, 5, seed=0).layer_parameters()}
    shared = [n for n in a if n in b]
    assert shared and all(torch.equal(a[n], b[n]) for n in shared)   # layer 2 built alike in both stages
    c = {n: p for _l, n, p in build_stage(model, 0, 3, seed=1).layer_parameters()}
    assert not torch.equal(a[shared[0]], c[shared[0]])               # control: another seed, other weights
    state = torch.get_rng_state()
    build_stage(model, 0, 1, seed=0)
    assert torch.equal(state, torch.get_rng_state())                 # the caller's RNG is left as it was


def test_replicas_of_a_model_on_an_unseeded_numpy_rng_start_equal(tmp_path):
    """Copies that start equal stay equal through a step (the summed gradient is the same on every holder); copies
    that start apart stay apart. Every copy of every name held by several ranks must be equal."""
    plan = Plan("llama-tiny", 7, 5, (Pipeline((_st(0, 3, 0, 2), _st(3, 7, 2, 2)), 2, 3, "1F1B"),
                                     Pipeline((_st(0, 5, 4), _st(5, 7, 5)), 1, 2, "1F1B")), sequence_length=32)
    training = TrainingConfig(optimizer="sgd", lr=1e-3, dtype="float64", total_steps=1)

    def copies(out, **kw):
        res = fork_ranks(plan, "tests.test_initial_weights:numpy_fresh_rng", out, steps=1, training=training,
                         save_params=True, timeout_s=60, launch_timeout_s=180, **kw)
        assert res.ok, res.failure_message()
        held: dict[str, list[torch.Tensor]] = {}
        for r in range(plan.num_devices):
            for name, value in torch.load(out / f"rank{r}.pt").items():
                held.setdefault(name, []).append(value)
        return {n: v for n, v in held.items() if len(v) > 1}

    shared = copies(tmp_path / "a")
    assert len(shared) >= 10                                          # blocks held by both pipelines, tied pairs
    assert all(torch.equal(v[0], x) for v in shared.values() for x in v[1:])
    # control: without the gradient sync's units (and so without the broadcast) the replicas differ
    apart = copies(tmp_path / "b", skip_block_allreduce=True)
    assert any(not torch.equal(v[0], x) for v in apart.values() for x in v[1:])


def test_a_model_on_torchs_default_rng_passes_verify(tmp_path, capsys):
    """Two replicas (TP 1, different cuts): before, each rank and the reference drew their own weights."""
    cluster = {"format": "hpp-cluster", "version": 1, "name": "cpu-4",
               "device_types": {"cpu": {"memory_bytes": 2**30, "gpus_per_node": 4}},
               "nodes": [{"device_type": "cpu", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1e9}],
               "inter_node_bandwidth_bytes_per_s": 1e9}
    plan = Plan("llama-tiny", 7, 4, (Pipeline((_st(0, 3, 0), _st(3, 7, 1)), 1, 2, "1F1B"),
                                     Pipeline((_st(0, 5, 2), _st(5, 7, 3)), 1, 2, "1F1B")), sequence_length=32,
                cluster_ref=cluster)
    write_plan_json(plan, tmp_path / "p.json")
    assert run_main([str(tmp_path / "p.json"), "--steps", "2", "--verify", "--launcher", "fork", "--quiet",
                     "--model", "tests.test_initial_weights:torch_global_rng", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verify"]["max_abs_difference"] < 1e-12
