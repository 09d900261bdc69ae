"""Block-wise gradient aggregation across heterogeneous pipelines.

Each block (a layer range no stage boundary cuts, :func:`hpp.runtime.layout.blocks`)
is held by one stage of every pipeline; its gradients are SUM-all-reduced among
exactly those holders, on the block's own process group. Because every pipeline's
loss is already divided by the global batch size, the sum is the full-batch mean
gradient and no rescaling follows.

Two modes:

- bucketed (default): a rank's share of each block is cut into buckets of at most
  ``bucket_bytes`` (parameters in reverse layer order, as backward produces them).
  With ``overlap=True`` a bucket's all-reduce is launched asynchronously from a
  post-accumulate-grad hook as soon as the last micro-batch's backward has
  finalised all its gradients, so the collective runs while backward continues
  on earlier layers. Buckets launch strictly in one fixed order on every rank (as
  in DDP), so ranks that share several groups never wait on each other crosswise.
- naive: one blocking all-reduce per layer after backward, for comparison.

A tied embedding (copies on first and last stages) is taken out of the blocks and
all-reduced over every rank that holds a copy, so that every copy receives the
sum of both uses over all pipelines and stays equal to the single-device weight.

A pipeline with zero micro-batches never fires a hook; :meth:`GradSync.finish`
launches its buckets with the zero gradients it holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpp.runtime.models import StageModule

__all__ = ["Bucket", "CollectiveStats", "GradSync"]

logger = logging.getLogger(__name__)


@dataclass
class CollectiveStats:
    """Gradient collectives of one step, counted once per collective (by the group's smallest rank).

    Attributes
    ----------
    count : int
        All-reduces led by this rank.
    bytes : int
        Their payload [bytes] (each all-reduce counted once, not per participant).
    joined_count : int
        All-reduces this rank took part in.
    launched_in_backward : int
        Of those, launched from a backward hook (overlapping the rest of backward).
    """

    count: int = 0
    bytes: int = 0
    joined_count: int = 0
    launched_in_backward: int = 0


@dataclass
class Bucket:
    """Parameters all-reduced together on one group; ``ranks`` are the group's members."""

    params: list[torch.nn.Parameter]
    group: dist.ProcessGroup | None
    ranks: tuple[int, ...]
    label: str
    ready: int = 0
    work: object | None = None
    flat: torch.Tensor | None = None

    @property
    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


class GradSync:
    """Block-wise gradient all-reduce for one rank's stage.

    Parameters
    ----------
    module : StageModule
        This rank's stage (layers ``[layer_start, layer_stop)``).
    rank : int
    local_blocks : list of ((lo, hi), ranks, group)
        The blocks inside this stage with their holder ranks and process group
        (``None`` where only this rank holds the block).
    tied : (param, ranks, group) or None
        The tied-embedding parameter of this stage, if it holds a copy.
    bucket_bytes : int
        Largest bucket [bytes].
    overlap : bool
        Launch buckets from backward hooks (else all after backward).
    naive : bool
        One blocking all-reduce per layer instead of buckets.
    """

    def __init__(self, module: StageModule, *, rank: int,
                 local_blocks: list[tuple[tuple[int, int], tuple[int, ...], dist.ProcessGroup | None]],
                 tied: tuple[torch.nn.Parameter, tuple[int, ...], dist.ProcessGroup | None] | None = None,
                 bucket_bytes: int = 25 * 2**20, overlap: bool = True, naive: bool = False) -> None:
        self.rank = rank
        self.naive = naive
        self.overlap = overlap and not naive
        self.stats = CollectiveStats()
        self._expected = 0
        self._next = 0
        self._tied = tied
        tied_id = id(tied[0]) if tied is not None else None
        by_layer: dict[int, list[torch.nn.Parameter]] = {}
        for layer, _name, p in module.layer_parameters():
            if id(p) != tied_id:
                by_layer.setdefault(layer, []).append(p)
        self.buckets: list[Bucket] = []
        for (lo, hi), ranks, group in sorted(local_blocks, key=lambda b: -b[0][0]):
            if len(ranks) < 2:
                continue
            if naive:
                for layer in range(hi - 1, lo - 1, -1):
                    self._add_bucket(list(by_layer.get(layer, [])), group, ranks, f"layer {layer}")
                continue
            params = [p for layer in range(hi - 1, lo - 1, -1) for p in reversed(by_layer.get(layer, []))]
            current: list[torch.nn.Parameter] = []
            size = 0
            for p in params:
                nbytes = p.numel() * p.element_size()
                if current and size + nbytes > bucket_bytes:
                    self._add_bucket(current, group, ranks, f"block [{lo}, {hi})")
                    current, size = [], 0
                current.append(p)
                size += nbytes
            self._add_bucket(current, group, ranks, f"block [{lo}, {hi})")
        self._bucket_of: dict[int, int] = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}
        self._count: dict[int, int] = {}
        self._handles = []
        if self.overlap:
            for b in self.buckets:
                for p in b.params:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        logger.debug("rank %d: %d gradient buckets (%s)", rank, len(self.buckets),
                     ", ".join(f"{b.label}: {b.num_bytes} B" for b in self.buckets))

    def _add_bucket(self, params: list[torch.nn.Parameter], group: dist.ProcessGroup | None,
                    ranks: tuple[int, ...], label: str) -> None:
        if params:
            self.buckets.append(Bucket(params, group, ranks, label))

    def begin_step(self, num_micro_batches: int) -> None:
        """Reset for a step in which this stage runs ``num_micro_batches`` backward passes."""
        self._expected = num_micro_batches
        self._next = 0
        self._count = {}
        self.stats = CollectiveStats()
        for b in self.buckets:
            b.ready, b.work, b.flat = 0, None, None

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        c = self._count.get(id(p), 0) + 1
        self._count[id(p)] = c
        if c == self._expected:
            self.buckets[self._bucket_of[id(p)]].ready += 1
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].ready == len(self.buckets[self._next].params):
            self._launch(self.buckets[self._next], async_op=True)
            self.stats.launched_in_backward += 1
            self._next += 1

    def _launch(self, b: Bucket, *, async_op: bool) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in b.params]
        b.flat = torch.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1).clone()
        b.work = dist.all_reduce(b.flat, op=dist.ReduceOp.SUM, group=b.group, async_op=async_op)
        self._count_collective(b.ranks, b.num_bytes)

    def _count_collective(self, ranks: tuple[int, ...], nbytes: int) -> None:
        self.stats.joined_count += 1
        if self.rank == min(ranks):
            self.stats.count += 1
            self.stats.bytes += nbytes

    def finish(self) -> None:
        """Launch what backward did not, wait for everything, write the sums back into ``.grad``."""
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next], async_op=not self.naive)
            self._next += 1
        for b in self.buckets:
            if b.work is not None and hasattr(b.work, "wait"):
                b.work.wait()
            offset = 0
            for p in b.params:
                n = p.numel()
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(b.flat[offset:offset + n].view_as(p))
                offset += n
            b.flat, b.work = None, None
        if self._tied is not None:
            p, ranks, group = self._tied
            if len(ranks) > 1:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
                self._count_collective(ranks, p.numel() * p.element_size())

    def close(self) -> None:
        """Remove the backward hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
