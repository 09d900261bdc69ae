"""Block-wise gradient aggregation across heterogeneous pipelines, with mixed TP degrees.

Each block (a layer range no stage boundary cuts, :func:`hpp.runtime.exec.layout.blocks`)
is held by one stage of every pipeline, at that pipeline's TP degree ``t_h``. Every
parameter's full gradient must be summed exactly once over the pipelines; the loss
is already divided by the global batch's target-token count, so the sum is the
full-batch gradient and nothing is rescaled.

How (finest common shard, mixed TP, tied pairs, what the cost model prices) is in
:mod:`hpp.runtime.exec.sync_units`: its :func:`~hpp.runtime.exec.sync_units.sync_units` gives
each rank's slices and the rank set reducing each; :class:`GradSync` buckets and
all-reduces them. :class:`CollectiveStats` records every collective's ranks and bytes so a
test checks the sizes the cost model assumes.

Two modes:

- bucketed (default): a block's pieces are grouped by the rank set that reduces
  them and cut into buckets of at most ``bucket_bytes`` (parameters in reverse layer
  order, as backward produces them). With ``overlap=True`` a bucket's all-reduce is
  launched asynchronously from a post-accumulate-grad hook once the last micro-batch
  has finalised all its gradients, while backward continues. Buckets launch in one
  fixed global order (block, rank set, chunk), so ranks that share several groups
  never wait on each other crosswise.
- naive: one blocking all-reduce per layer and rank set after backward (comparison).

No gradient copies: where a bucket holds whole local gradients (every case but a
shard that a mixed-TP block cuts further), the parameters' ``.grad`` are views into
the bucket's flat buffer, which is all-reduced in place (DDP's
``gradient_as_bucket_view``); only cut shards go through a per-step buffer. Grads
must therefore be zeroed in place (``zero_grad(set_to_none=False)``).

A pipeline with zero micro-batches never fires a hook; :meth:`GradSync.finish`
launches its buckets with the zero gradients it holds.

``begin_step(n, skip=True)`` leaves one step unsynchronised (each rank keeps its own
gradients): the control that ``--verify`` must catch however late it happens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hpp.runtime.exec.sync_units import Entry, SyncUnit
from hpp.runtime.models.stage import StageModule
from hpp.runtime.exec.tensor_parallel import local_tensor

__all__ = ["CollectiveStats", "Bucket", "GradSync", "broadcast_initial_parameters"]

logger = logging.getLogger(__name__)


@dataclass
class CollectiveStats:
    """Gradient collectives of one step.

    Attributes
    ----------
    count, bytes : int
        All-reduces led by this rank (the group's smallest rank) and their payload [bytes]:
        summed over ranks, each collective is counted once.
    joined_count, joined_bytes : int
        All-reduces this rank took part in, and the bytes it contributed to them.
    launched_in_backward : int
        Of those, launched from a backward hook (overlapping the rest of backward).
    records : list of (label, ranks, bytes)
        Every collective this rank joined: its unit (``"block [lo, hi)"`` or ``"tied a-b"``),
        its sorted ranks and its payload [bytes].
    """

    count: int = 0
    bytes: int = 0
    joined_count: int = 0
    joined_bytes: int = 0
    launched_in_backward: int = 0
    records: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)


@dataclass
class Bucket:
    """Gradient slices all-reduced together on one group; ``ranks`` are the group's members."""

    entries: list[Entry]
    group: dist.ProcessGroup | None
    ranks: tuple[int, ...]
    label: str
    hooked: bool = True
    ready: int = 0
    work: object | None = None
    flat: torch.Tensor | None = None
    views: bool = False                     # the params' grads are views of ``flat`` (kept between steps)
    params: list[torch.nn.Parameter] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.params = list({id(e.param): e.param for e in self.entries}.values())

    @property
    def num_bytes(self) -> int:
        return sum(e.numel * e.param.element_size() for e in self.entries)


class GradSync:
    """Block-wise (finest-common-shard) gradient all-reduce for one rank's stage.

    Parameters
    ----------
    stage : StageModule
        This rank's stage (after TP sharding). Its parameters' ``.grad`` are set here.
    rank : int
    units : list of SyncUnit
        From :func:`sync_units` (empty: no sync, e.g. the control run).
    groups : {rank set: ProcessGroup}
        The process groups of :meth:`hpp.runtime.exec.layout.GroupLayout.creation_order`.
    bucket_bytes : int
        Largest bucket [bytes].
    overlap : bool
        Launch buckets from backward hooks (else all after backward).
    naive : bool
        One blocking all-reduce per layer and rank set instead of buckets.
    """

    def __init__(self, stage: StageModule, *, rank: int, units: list[SyncUnit],
                 groups: dict[tuple[int, ...], dist.ProcessGroup], bucket_bytes: int = 25 * 2**20,
                 overlap: bool = True, naive: bool = False) -> None:
        self.rank = rank
        self.naive = naive
        self.overlap = overlap and not naive
        self.stats = CollectiveStats()
        self._expected = 0
        self._next = 0
        self._skip = False
        self.buckets: list[Bucket] = []
        keyed: list[tuple[tuple, Bucket]] = []
        for u in units:
            sets = u.groups.rank_sets()
            hooked = u.order[0] == 0
            by_key: dict[tuple, list[Entry]] = {}
            for layer, e, s in sorted(u.entries, key=lambda x: -x[0]):      # reverse layer order
                by_key.setdefault((-layer if naive else 0, s), []).append(e)
            for (lkey, s), entries in sorted(by_key.items()):
                chunks = [entries] if naive else self._chunk(entries, bucket_bytes)
                for c, chunk in enumerate(chunks):
                    label = u.label if not naive else f"{u.label} layer {-lkey}"
                    keyed.append(((u.order, lkey, s, c), Bucket(chunk, groups.get(sets[s]), sets[s], label, hooked)))
        self.buckets = [b for _k, b in sorted(keyed, key=lambda kb: kb[0])]
        self._buckets_of: dict[int, list[Bucket]] = {}
        for b in self.buckets:
            for p in b.params:
                self._buckets_of.setdefault(id(p), []).append(b)
        self._view_ptr: dict[int, int] = {}
        for b in self.buckets:
            if all(e.dim is None and len(self._buckets_of[id(e.param)]) == 1 for e in b.entries):
                self._make_views(b)
        for _l, _n, p in stage.layer_parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._count: dict[int, int] = {}
        self._handles = []
        if self.overlap:
            for p in {id(p): p for b in self.buckets if b.hooked for p in b.params}.values():
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        logger.debug("rank %d: %d gradient buckets (%s)", rank, len(self.buckets),
                     ", ".join(f"{b.label} {b.ranks}: {b.num_bytes} B" for b in self.buckets))

    @staticmethod
    def _chunk(entries: list[Entry], bucket_bytes: int) -> list[list[Entry]]:
        out: list[list[Entry]] = [[]]
        size = 0
        for e in entries:
            nbytes = e.numel * e.param.element_size()
            if out[-1] and (size + nbytes > bucket_bytes or e.param.dtype != out[-1][0].param.dtype):
                out.append([])
                size = 0
            out[-1].append(e)
            size += nbytes
        return [c for c in out if c]

    def _make_views(self, b: Bucket) -> None:
        """Allocate the bucket's flat buffer once and make each parameter's grad a view of it."""
        from torch.distributed.tensor import DTensor

        p0 = b.entries[0].param
        b.flat = torch.zeros(sum(e.numel for e in b.entries), dtype=p0.dtype, device=local_tensor(p0).device)
        offset = 0
        for e in b.entries:
            loc = local_tensor(e.param)
            view = b.flat[offset:offset + loc.numel()].view(loc.shape)
            if e.param.grad is not None:
                view.copy_(local_tensor(e.param.grad))
            if isinstance(e.param, DTensor):
                e.param.grad = DTensor.from_local(view, e.param.device_mesh, e.param.placements, shape=e.param.shape,
                                                  stride=e.param.stride(), run_check=False)
            else:
                e.param.grad = view
            self._view_ptr[id(e.param)] = view.data_ptr()
            offset += loc.numel()
        b.views = True

    def begin_step(self, num_micro_batches: int, *, skip: bool = False) -> None:
        """Reset for a step in which this stage runs ``num_micro_batches`` backward passes.

        ``skip``: the control: no all-reduce this step (every rank must skip the same step).
        """
        self._expected = num_micro_batches
        self._skip = skip
        self._next = 0
        self._count = {}
        self.stats = CollectiveStats()
        for b in self.buckets:
            b.ready, b.work = 0, None
            if not b.views:
                b.flat = None

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if self._skip:
            return
        c = self._count.get(id(p), 0) + 1
        self._count[id(p)] = c
        if c == self._expected:
            for b in self._buckets_of[id(p)]:
                b.ready += 1
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if not (b.hooked and b.ready == len(b.params)):
                return
            self._launch(b, async_op=True)
            self.stats.launched_in_backward += 1
            self._next += 1

    def _launch(self, b: Bucket, *, async_op: bool) -> None:
        if b.views:
            for e in b.entries:
                if local_tensor(e.param.grad).data_ptr() != self._view_ptr[id(e.param)]:
                    raise RuntimeError("GradSync: a gradient was replaced, not accumulated in place; zero grads "
                                       "with zero_grad(set_to_none=False)")
                if not e.contribute:
                    local_tensor(e.param.grad).zero_()
        else:
            b.flat = torch.empty(sum(e.numel for e in b.entries), dtype=b.entries[0].param.dtype,
                                 device=local_tensor(b.entries[0].param).device)
            offset = 0
            for e in b.entries:
                part = b.flat[offset:offset + e.numel]
                if e.contribute:
                    part.view(e.grad_slice().shape).copy_(e.grad_slice())
                else:
                    part.zero_()
                offset += e.numel
        b.work = dist.all_reduce(b.flat, op=dist.ReduceOp.SUM, group=b.group, async_op=async_op)
        nbytes = b.num_bytes
        self.stats.joined_count += 1
        self.stats.joined_bytes += nbytes
        self.stats.records.append((b.label, b.ranks, nbytes))
        if self.rank == min(b.ranks):
            self.stats.count += 1
            self.stats.bytes += nbytes

    def finish(self) -> None:
        """Launch what backward did not, wait for everything, write the sums back where they are copies."""
        if self._skip:
            return
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next], async_op=not self.naive)
            self._next += 1
        for b in self.buckets:
            if b.work is not None and hasattr(b.work, "wait"):
                b.work.wait()
            b.work = None
            if b.views:
                continue
            offset = 0
            for e in b.entries:
                e.grad_slice().copy_(b.flat[offset:offset + e.numel].view(e.grad_slice().shape))
                offset += e.numel
            b.flat = None

    def close(self) -> None:
        """Remove the backward hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []


def broadcast_initial_parameters(units: list[SyncUnit], groups: dict[tuple[int, ...], dist.ProcessGroup], *,
                                 rank: int) -> int:
    """Make every copy of every parameter slice this rank syncs equal to the copy of the lowest rank that holds it,
    before the first step (DDP broadcasts the initial parameters from rank 0 alike).

    The same slices and rank sets as the gradients' (:func:`hpp.runtime.exec.sync_units.sync_units`): each set's
    lowest rank contributes its values, the others zeros, and one SUM all-reduce per rank set and dtype leaves the
    lowest rank's values everywhere (exactly: x + 0 = x). Units in their global order (:class:`GradSync`'s), so
    ranks that share several groups never wait on each other crosswise. A model that draws its weights from
    ``(seed, index)`` alone, as the protocol asks, is left as it was; one that does not (numpy's or Python's RNG)
    would otherwise start its replicas from different weights, and they would never agree.

    Returns
    -------
    int
        Parameter elements this rank took part in syncing.
    """
    done = 0
    with torch.no_grad():
        for u in sorted(units, key=lambda u: u.order):
            sets = u.groups.rank_sets()
            by_key: dict[tuple[int, str], list[Entry]] = {}
            for _layer, e, s in u.entries:
                by_key.setdefault((s, str(e.param.dtype)), []).append(e)
            for (s, _dtype), entries in sorted(by_key.items()):
                ranks = sets[s]
                slices = [_param_slice(e) for e in entries]
                flat = torch.cat([x.reshape(-1) for x in slices])
                if rank != min(ranks):
                    flat.zero_()
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=groups.get(ranks))
                offset = 0
                for x in slices:
                    x.copy_(flat[offset:offset + x.numel()].view(x.shape))
                    offset += x.numel()
                done += flat.numel()
    return done


def _param_slice(e: Entry) -> torch.Tensor:
    """The local values of ``e``'s slice of its parameter (a view: writing it writes the parameter)."""
    p = local_tensor(e.param)
    return p if e.dim is None else p.narrow(e.dim, e.start, e.length)
