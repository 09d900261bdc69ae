"""Tensor parallelism inside one pipeline stage, with ``torch.distributed.tensor.parallel``.

A stage of TP degree ``t`` runs on ``t`` ranks (its TP group). Every rank builds the
stage's full layers from the same seed, then :func:`parallelize_stage` shards each
layer with ``parallelize_module`` over a 1-D ``DeviceMesh`` made from the stage's TP
process group (``DeviceMesh.from_group``), following the model's ``tp_plan``
(:mod:`hpp.runtime.models.api`):

========== =============================================== ==================================
style      torch parallel style                            parameters
========== =============================================== ==================================
colwise    ``ColwiseParallel()``                           weight, bias ``Shard(0)``
rowwise    ``RowwiseParallel()``                           weight ``Shard(1)``, bias ``Replicate``
embedding  ``RowwiseParallel(input_layouts=Replicate())``  ``nn.Embedding`` weight ``Shard(0)``
output     ``ColwiseParallel(output_layouts=Replicate())`` weight, bias ``Shard(0)``
========== =============================================== ==================================

Parameters the plan does not name stay plain tensors, replicated on every TP rank
(norms, and attention where a model leaves it whole); the stage's input and output
stay plain replicated tensors, so pipelining sends them as before. Every rank holds
identical full weights before sharding, so sharding slices locally
(``src_data_rank=None``: no communication). Tied parameters that one stage holds
twice (the embedding and the head of a one-stage pipeline) are re-tied after
sharding (both ends are ``Shard(0)`` of the same ``(V, h)`` table).

:func:`shard_dim` gives the dimension a parameter is sharded along at any TP degree
without sharding anything, which the mixed-TP gradient sync needs for the other
pipelines' degrees (:mod:`hpp.runtime.exec.gradsync`).

Backend: gloo on CPU, NCCL on CUDA (the process group's; the mesh only wraps it).
"""

from __future__ import annotations

import logging
import torch
from torch import nn

from hpp.errors import HppInputError
from hpp.runtime.models.api import TP_STYLES, RuntimeModel, check_tp_degree
from hpp.runtime.models.stage import StageModule, split_global_name, tie_within

__all__ = ["parallel_style", "parallelize_stage", "shard_dim", "local_tensor", "is_sharded"]

logger = logging.getLogger(__name__)


def parallel_style(style: str):
    """The ``torch.distributed.tensor.parallel`` style object of a ``tp_plan`` style name.

    Raises
    ------
    HppInputError
        A style not in :data:`hpp.runtime.models.api.TP_STYLES`.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel()
    if style == "embedding":
        return RowwiseParallel(input_layouts=Replicate())
    if style == "output":
        return ColwiseParallel(output_layouts=Replicate())
    raise HppInputError(f"unknown TP style {style!r}", field="tp_plan", fix=f"use one of {list(TP_STYLES)}")


def _plan_of(model: RuntimeModel, layer: int, tp_degree: int) -> dict[str, str]:
    plan = dict(model.tp_plan(layer, tp_degree)) if tp_degree > 1 else {}
    for path, style in plan.items():
        if style not in TP_STYLES:
            raise HppInputError(f"{model.spec.name}: tp_plan({layer}, {tp_degree}) names style {style!r} for "
                                f"{path!r}", field="tp_plan", fix=f"use one of {list(TP_STYLES)}")
    return plan


def shard_dim(model: RuntimeModel, name: str, tp_degree: int, *, module: nn.Module | None = None) -> int | None:
    """The dimension parameter ``name`` (global, ``layers.<l>.<path>``) is sharded along at ``tp_degree``.

    ``None``: replicated (TP degree 1, a module the plan does not name, or a rowwise bias).
    ``module`` (the parameter's owning module, when at hand) tells an ``nn.Embedding``
    under ``colwise`` (sharded along dim 1) from a linear layer; without it the
    styles are read as the model protocol defines them (colwise/rowwise on linear
    layers, embedding on ``nn.Embedding``, output on the head's linear layer).
    """
    layer, path = split_global_name(name)
    owner, _, leaf = path.rpartition(".")
    style = _plan_of(model, layer, tp_degree).get(owner)
    if style is None:
        return None
    if style == "rowwise":
        return None if leaf == "bias" else 1
    if style == "colwise" and isinstance(module, nn.Embedding):
        return 1
    return 0                                    # colwise / output: weight and bias rows; embedding: rows


def parallelize_stage(stage: StageModule, model: RuntimeModel, *, tp_group, tp_degree: int,
                      device: torch.device) -> object | None:
    """Shard every layer of ``stage`` over its TP group in place; return the ``DeviceMesh`` (None at TP 1).

    Calls ``model.prepare_tp(layer_module, index, tp_degree)`` first where the model
    defines it (e.g. to set a module's local head count).

    Raises
    ------
    HppInputError
        A TP degree the model's heads or MLP width cannot be split by (names both
        numbers, :func:`hpp.runtime.models.api.check_tp_degree`), or an unknown style.
    """
    check_tp_degree(model.spec, tp_degree)
    if tp_degree == 1:
        return None
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = DeviceMesh.from_group(tp_group, device.type)
    prepare = getattr(model, "prepare_tp", None)
    for key, layer in stage.layers.items():
        index = int(key)
        plan = _plan_of(model, index, tp_degree)
        if prepare is not None:
            prepare(layer, index, tp_degree)
        if plan:
            parallelize_module(layer, mesh, {path: parallel_style(style) for path, style in plan.items()},
                               src_data_rank=None)
        logger.debug("layer %d: %s", index, plan)
    layers = {int(k): m for k, m in stage.layers.items()}
    pairs = tuple(model.tied_parameters())
    for a, b in pairs:
        (la, pa), (lb, pb) = split_global_name(a), split_global_name(b)
        if la in layers and lb in layers:
            da, db = (getattr(layers[l].get_parameter(q), "placements", None) for l, q in ((la, pa), (lb, pb)))
            if da != db:
                raise HppInputError(f"{model.spec.name}: tied parameters {a} ({da}) and {b} ({db}) are sharded "
                                    f"differently at TP {tp_degree}", field="tp_plan",
                                    fix="shard both ends of a tied pair alike (embedding and output styles) or neither")
    tie_within(layers, pairs)               # sharding made two Parameters of one tied table: one again
    return mesh


def is_sharded(t: torch.Tensor) -> bool:
    """True for a DTensor with a ``Shard`` placement."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(t, DTensor) and any(isinstance(p, Shard) for p in t.placements)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor of ``t`` (a DTensor's local shard, or ``t`` itself)."""
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t
