"""Pure layout of a plan on ranks: roles, lanes, blocks, shard pieces, process groups, batch split.

Ranks are numbered pipeline by pipeline, stage by stage, and within a stage by TP
rank (``Plan.device_ids`` order): the ``k``-th device of a stage is its TP rank
``k``. A pipeline's TP degree must be uniform (every stage the same ``t``), so the
pipeline splits into ``t`` *lanes*: lane ``k`` is the ``k``-th TP rank of every
stage, and each lane is one ``torch.distributed.pipelining`` pipeline with its own
process group (within it stage ``i`` is the ``i``-th smallest rank, as ``new_group``
sorts ranks and pipelining addresses peers by group rank). The ``t`` ranks of a
stage form its TP group.

Blocks are the maximal layer ranges that no pipeline's stage boundary cuts; the
holders of a block are the stages (one per pipeline) that contain it. Holders may
differ in TP degree ``t_h``: the block's *finest common shard* cuts each sharded
parameter into ``T = lcm(t_h)`` pieces; piece ``j`` is held by TP rank
``j * t_h // T`` of each holder stage, so it is all-reduced among exactly one rank
per holder (:meth:`ShardGroups.piece_ranks`). Replicated parameters are all-reduced
over every rank of every holder (:attr:`ShardGroups.all_ranks`; TP rank 0 of each
stage contributes, see :mod:`hpp.runtime.exec.gradsync`). Tied parameters (an embedding
and a head) get the same structure over the stages that hold a copy. Every rank
creates the same groups in the same order (:meth:`GroupLayout.creation_order`).

>>> from hpp.plan_data import Plan, Pipeline, Stage
>>> p0 = Pipeline((Stage(0, 2, "cpu", 2, (0, 1)), Stage(2, 3, "cpu", 2, (2, 3))), 2, 4)
>>> p1 = Pipeline((Stage(0, 1, "cpu", 1, (4,)), Stage(1, 3, "cpu", 1, (5,))), 1, 3)
>>> plan = Plan("toy", 3, 7, (p0, p1))
>>> blocks(plan)
((0, 1), (1, 2), (2, 3))
>>> layout = group_layout(plan)
>>> layout.lane_ranks
(((0, 2), (1, 3)), ((4, 5),))
>>> layout.blocks[1].holders, layout.blocks[1].num_pieces, layout.blocks[1].piece_ranks(1)
(((0, 1), (5,)), 2, (1, 5))
>>> [r.sample_offset for r in rank_roles(plan)]
[0, 0, 0, 0, 4, 4]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hpp.errors import HppInputError
from hpp.plan_data import Plan
from hpp.runtime.models.stage import check_recompute

__all__ = ["RankRole", "ShardGroups", "GroupLayout", "rank_roles", "blocks", "block_holders", "group_layout",
           "split_micro_batches"]


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
    tp_degree, tp_rank : int
        The stage's TP degree and this rank's index in it (= its lane).
    stage_ranks : tuple[int, ...]
        The stage's ranks (its TP group), TP rank order.
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
    tp_degree: int = 1
    tp_rank: int = 0
    stage_ranks: tuple[int, ...] = ()

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1


def _check_uniform_tp(plan: Plan) -> None:
    for p, pipe in enumerate(plan.pipelines):
        degrees = sorted({st.tp_degree for st in pipe.stages})
        if len(degrees) > 1:
            raise HppInputError(f"pipeline {p} mixes TP degrees {degrees} across its stages; the runtime runs one "
                                "TP degree per pipeline (its lanes must line up stage to stage)",
                                field=f"pipelines[{p}].stages[*].tp_degree",
                                fix="re-plan; hpp plan emits one TP degree per pipeline")
        for s, st in enumerate(pipe.stages):
            if len(st.device_ids) != st.tp_degree:
                raise HppInputError(f"stage {s} of pipeline {p} has tp_degree={st.tp_degree} but "
                                    f"{len(st.device_ids)} device ids", field=f"pipelines[{p}].stages[{s}].device_ids",
                                    fix="give exactly tp_degree device ids")


def rank_roles(plan: Plan) -> tuple[RankRole, ...]:
    """One :class:`RankRole` per rank, in rank order.

    Raises
    ------
    HppInputError
        A pipeline whose stages differ in TP degree, or a recomputation mode the runtime
        does not execute (``"selective"``). (Samples that do not add up to the global batch
        cannot reach here: :class:`hpp.plan_data.Plan` refuses them at construction.)
    """
    _check_uniform_tp(plan)
    roles: list[RankRole] = []
    offset = 0
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            check_recompute(st.recompute, field=f"pipelines[{p}].stages[{s}].recompute")
            first = len(roles)
            ranks = tuple(range(first, first + st.tp_degree))
            for k, dev in enumerate(st.device_ids):
                roles.append(RankRole(len(roles), p, s, pipe.num_stages, st.layer_start, st.layer_stop, dev,
                                      st.device_type, pipe.micro_batch_size, pipe.num_micro_batches,
                                      pipe.num_samples, offset, pipe.schedule, st.recompute, st.tp_degree, k, ranks))
        offset += pipe.num_samples
    return tuple(roles)


def blocks(plan: Plan) -> tuple[tuple[int, int], ...]:
    """Blocks ``(lo, hi)`` in layer order: the union of all pipelines' stage boundaries."""
    cuts = sorted({b for pipe in plan.pipelines for b in pipe.boundaries})
    return tuple(zip(cuts[:-1], cuts[1:]))


def _holder_stages(roles: tuple[RankRole, ...], layers: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The rank tuples of the stages that hold any of ``layers`` (one per stage, rank order)."""
    out: list[tuple[int, ...]] = []
    for r in roles:
        if r.tp_rank == 0 and any(r.layer_start <= l < r.layer_stop for l in layers):
            out.append(r.stage_ranks)
    return tuple(out)


def block_holders(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """Per block, the sorted ranks of the stages that contain it (one stage per pipeline)."""
    roles = rank_roles(plan)
    return tuple(tuple(sorted(r.rank for r in roles if r.layer_start <= lo and hi <= r.layer_stop))
                 for lo, hi in blocks(plan))


@dataclass(frozen=True, slots=True)
class ShardGroups:
    """The holders of one block (or tied pair) and how its parameters' pieces map to ranks.

    Attributes
    ----------
    layers : tuple[int, ...]
        The layers this unit covers (a block's ``range(lo, hi)``, or a tied pair's two layers).
    holders : tuple[tuple[int, ...], ...]
        Per holder stage, its ranks in TP rank order (stage ``h`` has TP degree ``len(holders[h])``).
    """

    layers: tuple[int, ...]
    holders: tuple[tuple[int, ...], ...]

    @property
    def num_pieces(self) -> int:
        """``T = lcm(t_h)``: pieces per sharded parameter (the finest common shard)."""
        return math.lcm(*(len(h) for h in self.holders))

    def piece_ranks(self, j: int) -> tuple[int, ...]:
        """Sorted ranks holding piece ``j``: TP rank ``j * t_h // T`` of every holder."""
        T = self.num_pieces
        return tuple(sorted(h[j * len(h) // T] for h in self.holders))

    @property
    def all_ranks(self) -> tuple[int, ...]:
        """Every rank of every holder (the group of replicated parameters)."""
        return tuple(sorted(r for h in self.holders for r in h))

    @property
    def needs_sync(self) -> bool:
        """Two holder stages or more (one stage's TP ranks hold disjoint shards or equal copies)."""
        return len(self.holders) > 1

    def rank_sets(self) -> tuple[tuple[int, ...], ...]:
        """The groups this unit all-reduces on: pieces ``0 .. T-1`` then the replicated group."""
        if not self.needs_sync:
            return ()
        sets = [self.piece_ranks(j) for j in range(self.num_pieces)]
        return tuple(dict.fromkeys((*sets, self.all_ranks)))


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """Every process group, in creation order: lanes, TP groups, block groups, tied groups.

    Attributes
    ----------
    pipeline_ranks : tuple[tuple[int, ...], ...]
        Per pipeline, its ranks.
    lane_ranks : tuple[tuple[tuple[int, ...], ...], ...]
        Per pipeline, per lane ``k``, the ``k``-th TP rank of each stage (stage order = ascending rank).
    stage_ranks : tuple[tuple[int, ...], ...]
        Per stage of every pipeline (pipeline by pipeline), its TP group.
    blocks : tuple[ShardGroups, ...]
        Per block (layer order), its holders and pieces.
    tied : tuple[ShardGroups, ...]
        Per tied pair, the stages holding a copy of it (empty if nothing is tied).
    """

    pipeline_ranks: tuple[tuple[int, ...], ...]
    lane_ranks: tuple[tuple[tuple[int, ...], ...], ...]
    stage_ranks: tuple[tuple[int, ...], ...]
    blocks: tuple[ShardGroups, ...]
    tied: tuple[ShardGroups, ...] = ()

    @property
    def block_ranks(self) -> tuple[tuple[int, ...], ...]:
        """Per block, all ranks of its holders."""
        return tuple(b.all_ranks for b in self.blocks)

    @property
    def tied_ranks(self) -> tuple[int, ...]:
        """Ranks holding a copy of a tied parameter (empty if untied)."""
        return tuple(sorted({r for t in self.tied for r in t.all_ranks}))

    def creation_order(self) -> tuple[tuple[int, ...], ...]:
        """Distinct rank sets in the order every rank must create them.

        Every lane gets a group (a one-stage lane too: torch's stage needs a group
        whose size equals its stage count); TP, block and tied sets only where they
        hold two ranks or more.
        """
        out: dict[tuple[int, ...], None] = {}
        for lanes in self.lane_ranks:
            for ranks in lanes:
                out.setdefault(ranks)
        for ranks in self.stage_ranks:
            if len(ranks) > 1:
                out.setdefault(ranks)
        for unit in (*self.blocks, *self.tied):
            for ranks in unit.rank_sets():
                if len(ranks) > 1:
                    out.setdefault(ranks)
        return tuple(out)


def group_layout(plan: Plan, *, tie_embeddings: bool = False,
                 tied_layers: tuple[tuple[int, int], ...] = ()) -> GroupLayout:
    """The :class:`GroupLayout` of ``plan``.

    Parameters
    ----------
    tie_embeddings : bool
        Shorthand for ``tied_layers=((0, L - 1),)`` (the GPT's tied embedding).
    tied_layers : tuple of (layer, layer)
        The layer indices of each tied parameter pair (``RuntimeModel.tied_parameters``).
    """
    roles = rank_roles(plan)
    if tie_embeddings and not tied_layers:
        tied_layers = ((0, plan.num_layers - 1),)
    pipes = tuple(tuple(r.rank for r in roles if r.pipeline == p) for p in range(plan.num_pipelines))
    lanes = tuple(tuple(tuple(r.rank for r in roles if r.pipeline == p and r.tp_rank == k)
                        for k in range(plan.pipelines[p].stages[0].tp_degree))
                  for p in range(plan.num_pipelines))
    stages = tuple(r.stage_ranks for r in roles if r.tp_rank == 0)
    blks = tuple(ShardGroups(tuple(range(lo, hi)), _holder_stages(roles, (lo,))) for lo, hi in blocks(plan))
    tied = tuple(ShardGroups(tuple(sorted({a, b})), _holder_stages(roles, (a, b))) for a, b in tied_layers)
    return GroupLayout(pipes, lanes, stages, blks, tied)


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
