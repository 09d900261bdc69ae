"""Each runtime model's ``tp_plan`` (+ ``prepare_tp``) at TP 2 computes what the unsharded layer computes.

Two gloo ranks shard every layer with torch's ``parallelize_module`` (the styles of
:mod:`hpp.runtime.models.api`) and compare the forward output and every parameter's full
gradient with the unsharded layer in float64 (1e-12). Control: OPT without ``prepare_tp``
(its attention reshapes by ``self.num_heads``) computes something else.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[1]


def _styles():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {"colwise": ColwiseParallel(), "rowwise": RowwiseParallel(),
            "embedding": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate())}


def _worker(rank: int, cases: list[tuple[str, bool]], init: str, out: str) -> None:
    os.chdir(ROOT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    from hpp.runtime.models.zoo import load_runtime_model
    mesh = init_device_mesh("cpu", (2,))
    result = {}
    for name, prepare in cases:
        m = load_runtime_model(name)
        worst = 0.0
        for l in range(m.spec.num_layers):
            ref, tp = (m.build_layer(l, seed=1, dtype=torch.float64) for _ in range(2))
            if prepare and hasattr(m, "prepare_tp"):
                m.prepare_tp(tp, l, 2)
            parallelize_module(tp, mesh, {p: _styles()[s] for p, s in m.tp_plan(l, 2).items()})
            gen = torch.Generator().manual_seed(l)
            x = (torch.randint(0, m.spec.vocab_size, (2, m.spec.seq_len), generator=gen) if l == 0 else
                 torch.randn(2, m.spec.seq_len, m.spec.hidden_size, generator=gen, dtype=torch.float64))
            a, b = ref(x), tp(x)
            b = b.full_tensor() if isinstance(b, DTensor) else b
            w = torch.randn(a.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
            (a * w).sum().backward()
            (b * w).sum().backward()
            worst = max(worst, float((a - b).detach().abs().max()))
            for p, q in zip(ref.parameters(), tp.parameters()):
                g = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
                worst = max(worst, float((p.grad - g).abs().max()))
        result[f"{name}{'' if prepare else ' without prepare_tp'}"] = worst
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _run(cases: list[tuple[str, bool]]) -> dict[str, float]:
    import hpp.runtime.models.hf_layers  # noqa: F401  (imported once here; the forked ranks inherit it)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        mp.start_processes(_worker, args=(cases, f"file://{d}/init", out), nprocs=2, join=True, start_method="fork")
        return json.loads(Path(out).read_text())


def test_tp2_layers_equal_unsharded_layers_and_prepare_tp_matters():
    names = ["llama-tiny", "opt-tiny", "gpt-neo-tiny", "gpt-tiny", "examples.user_model:build"]
    worst = _run([(n, True) for n in names] + [("opt-tiny", False)])
    control = worst.pop("opt-tiny without prepare_tp")
    assert set(worst) == set(names) and all(v <= 1e-12 for v in worst.values()), worst
    assert control > 1e-6
