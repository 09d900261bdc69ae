"""Pure layout of a plan on ranks: roles, blocks, process groups and the batch split.

Ranks are numbered pipeline by pipeline, stage by stage (``Plan.device_ids``
order), so that within a pipeline's process group stage ``i`` is the ``i``-th
smallest rank (``new_group`` sorts ranks, and torch's pipelining addresses peers
by group rank). Precondition: every stage has ``tp_degree == 1``.

Blocks are the maximal layer ranges that no pipeline's stage boundary cuts; the
holders of a block are the ranks (one per pipeline) whose stage contains it. Every
rank creates the same groups in the same order (:func:`group_layout`).

>>> from hpp.plan import Plan, Pipeline, Stage
>>> p0 = Pipeline((Stage(0, 2, "cpu", 1, (0,)), Stage(2, 3, "cpu", 1, (1,))), 2, 4)
>>> p1 = Pipeline((Stage(0, 1, "cpu", 1, (2,)), Stage(1, 3, "cpu", 1, (3,))), 1, 3)
>>> plan = Plan("toy", 3, 7, (p0, p1))
>>> blocks(plan)
((0, 1), (1, 2), (2, 3))
>>> block_holders(plan)
((0, 2), (0, 3), (1, 3))
>>> [r.sample_offset for r in rank_roles(plan)]
[0, 0, 4, 4]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpp.errors import HppInputError
from hpp.plan import Plan
from hpp.runtime.models import check_recompute
from hpp.validate import check_samples_sum

__all__ = ["RankRole", "GroupLayout", "rank_roles", "blocks", "block_holders", "group_layout",
           "synthetic_batch", "split_micro_batches"]


@dataclass(frozen=True, slots=True)
class RankRole:
    """What one rank runs.

    Attributes
    ----------
    rank, pipeline, stage_index, num_stages : int
    layer_start, layer_stop : int
        The stage's layers ``[layer_start, layer_stop)``.
    device_id : int
        The plan's (cluster's) device id bound to this rank.
    device_type : str
    micro_batch_size, num_micro_batches, num_samples : int
        Of this rank's pipeline.
    sample_offset : int
        First sample of the global batch that this pipeline processes.
    schedule : str
        ``"1F1B"`` or ``"GPipe"``.
    recompute : str
        The stage's activation recomputation, ``"none"`` or ``"full"``.
    """

    rank: int
    pipeline: int
    stage_index: int
    num_stages: int
    layer_start: int
    layer_stop: int
    device_id: int
    device_type: str
    micro_batch_size: int
    num_micro_batches: int
    num_samples: int
    sample_offset: int
    schedule: str
    recompute: str = "none"

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1


def rank_roles(plan: Plan) -> tuple[RankRole, ...]:
    """One :class:`RankRole` per rank, in rank order.

    Raises
    ------
    HppInputError
        A stage with ``tp_degree > 1`` (not supported by the runtime yet), with a
        recomputation mode the runtime does not execute (``"selective"``), or pipelines
        whose samples do not add up to the global batch (the update would not be the
        global batch's; plans read from JSON are refused earlier, by the same check).
    """
    check_samples_sum(plan)
    roles: list[RankRole] = []
    offset = 0
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            if st.tp_degree != 1 or len(st.device_ids) != 1:
                raise HppInputError(f"stage {s} of pipeline {p} has tp_degree={st.tp_degree}; the runtime "
                                    "supports tensor-parallel degree 1 only", field=f"pipelines[{p}].stages[{s}]"
                                    ".tp_degree", fix="plan with --max-tp 1 (TP > 1 is not supported by hpp run)")
            check_recompute(st.recompute, field=f"pipelines[{p}].stages[{s}].recompute")
            roles.append(RankRole(len(roles), p, s, pipe.num_stages, st.layer_start, st.layer_stop,
                                  st.device_ids[0], st.device_type, pipe.micro_batch_size, pipe.num_micro_batches,
                                  pipe.num_samples, offset, pipe.schedule, st.recompute))
        offset += pipe.num_samples
    return tuple(roles)


def blocks(plan: Plan) -> tuple[tuple[int, int], ...]:
    """Blocks ``(lo, hi)`` in layer order: the union of all pipelines' stage boundaries."""
    cuts = sorted({b for pipe in plan.pipelines for b in pipe.boundaries})
    return tuple(zip(cuts[:-1], cuts[1:]))


def block_holders(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """Per block, the sorted ranks whose stage contains it (one per pipeline)."""
    roles = rank_roles(plan)
    return tuple(tuple(r.rank for r in roles if r.layer_start <= lo and hi <= r.layer_stop)
                 for lo, hi in blocks(plan))


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """Every process group, in creation order: pipelines, then distinct block holder sets, then tied.

    Attributes
    ----------
    pipeline_ranks : tuple[tuple[int, ...], ...]
        Per pipeline, its ranks (stage order = ascending rank).
    block_ranks : tuple[tuple[int, ...], ...]
        Per block, its holders (a block held by one rank needs no collective).
    tied_ranks : tuple[int, ...]
        Ranks holding a copy of the tied embedding (first and last stages); empty if untied.
    """

    pipeline_ranks: tuple[tuple[int, ...], ...]
    block_ranks: tuple[tuple[int, ...], ...]
    tied_ranks: tuple[int, ...]

    def creation_order(self) -> tuple[tuple[int, ...], ...]:
        """Distinct rank sets in the order every rank must create them.

        Every pipeline gets a group (a one-stage pipeline too: torch's stage needs
        a group whose size equals its stage count); block and tied sets only
        where they hold two ranks or more.
        """
        out: list[tuple[int, ...]] = []
        for ranks in self.pipeline_ranks:
            if ranks not in out:
                out.append(ranks)
        for ranks in (*self.block_ranks, self.tied_ranks):
            if len(ranks) > 1 and ranks not in out:
                out.append(ranks)
        return tuple(out)


def group_layout(plan: Plan, *, tie_embeddings: bool = False) -> GroupLayout:
    """The :class:`GroupLayout` of ``plan``."""
    roles = rank_roles(plan)
    pipes = tuple(tuple(r.rank for r in roles if r.pipeline == p) for p in range(plan.num_pipelines))
    tied: tuple[int, ...] = ()
    if tie_embeddings:
        tied = tuple(sorted({r.rank for r in roles if r.is_first or r.is_last}))
    return GroupLayout(pipes, block_holders(plan), tied)


def synthetic_batch(step: int, *, seed: int, global_batch_size: int, seq_len: int,
                    vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token batch of one step: ``(inputs, targets)``, each ``(G, seq_len)`` int64.

    Targets are the inputs shifted by one token (next-token prediction). Every rank
    draws the same batch and keeps its own slice.
    """
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    tokens = torch.randint(0, vocab_size, (global_batch_size, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def split_micro_batches(inputs: torch.Tensor, targets: torch.Tensor, *, micro_batch_size: int,
                        ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a pipeline's samples to ``m * b`` rows so that every micro-batch has the same shape.

    Parameters
    ----------
    inputs, targets : (n, s) int64
        The pipeline's ``n`` samples.

    Returns
    -------
    (inputs, targets) : (m * b, s) int64
        ``m = ceil(n / b)``; padded rows have input token 0 and target
        ``ignore_index``, so they add nothing to the loss or the gradients.
        Chunked in ``m`` equal parts by the schedule, micro-batch ``i`` is exactly
        samples ``[i b, (i + 1) b)`` and the last one holds the partial remainder.
    """
    n = inputs.shape[0]
    m = -(-n // micro_batch_size)
    pad = m * micro_batch_size - n
    if pad:
        inputs = torch.cat([inputs, inputs.new_zeros(pad, inputs.shape[1])])
        targets = torch.cat([targets, targets.new_full((pad, targets.shape[1]), ignore_index)])
    return inputs, targets
