"""Which slices of which gradients each rank all-reduces, and with whom: :mod:`hpp.runtime.exec.gradsync`'s units.

Each block (a layer range no stage boundary cuts, :func:`hpp.runtime.exec.layout.blocks`)
is held by one stage of every pipeline, at that pipeline's TP degree ``t_h``; each tied
pair (embedding and head) by the stages that hold a copy. :func:`sync_units` lists this
rank's :class:`SyncUnit` (one per block or tied pair it holds) with its :class:`Entry`
slices and the rank set that reduces each.

Finest common shard (as HexiScale does for mixed TP). For a block with
``T = lcm(t_h)``, a parameter sharded along dim ``d`` (a ``Shard(d)`` DTensor; a
plain tensor on a TP-1 stage holds all of it) is cut into ``T`` pieces along ``d``.
Piece ``j`` lies inside the shard of TP rank ``j * t_h // T`` of every holder stage,
so it is SUM-all-reduced among exactly those ranks, one per pipeline: each piece's
gradient is summed once over the pipelines. Replicated parameters (norms, rowwise
biases, anything the TP plan leaves whole) are equal on all TP ranks of a stage;
they are all-reduced over every rank of every holder with TP rank 0 of each stage
contributing its gradient and the others zeros, which is exact and leaves every
copy with the sum. Tied parameters (embedding and head) are one more unit over the
stages that hold a copy, sharded or not.

Pricing (what :func:`hpp.formulation.cost_model.estimate_plan` assumes). The cost
model prices a block as ``ring_allreduce_s(B, H, link)`` per device, with ``H`` the
number of pipelines and ``B`` the largest per-device parameter bytes of the block
among its holders, i.e. ``block bytes / t_min`` for the holder with the smallest TP
degree. Here a rank of a TP-``t`` holder all-reduces ``T / t`` pieces of ``1 / T`` of
each sharded parameter, in groups of ``H`` ranks: sharded bytes ``/ t``, largest at
``t_min``, which is the cost model's ``B``. Replicated parameters add their full bytes
on every TP rank, in a group of ``sum(t_h)`` ranks; the profiles fold them into the
per-device bytes, where they are small (norms and biases).
:class:`hpp.runtime.exec.gradsync.CollectiveStats` records every collective's ranks and bytes so a
test checks these sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpp.errors import HppInputError
from hpp.runtime.exec.layout import GroupLayout, RankRole, ShardGroups
from hpp.runtime.models.api import RuntimeModel
from hpp.runtime.models.stage import StageModule, split_global_name
from hpp.runtime.exec.tensor_parallel import local_tensor, shard_dim

__all__ = ["Entry", "SyncUnit", "sync_units"]


@dataclass(frozen=True)
class Entry:
    """A slice of one parameter's local gradient: ``length`` rows from ``start`` along ``dim`` (or all of it)."""

    param: torch.nn.Parameter
    dim: int | None
    start: int
    length: int
    contribute: bool

    def grad_slice(self) -> torch.Tensor:
        g = local_tensor(self.param.grad)
        return g if self.dim is None else g.narrow(self.dim, self.start, self.length)

    @property
    def numel(self) -> int:
        loc = local_tensor(self.param)
        return loc.numel() if self.dim is None else loc.numel() // max(loc.shape[self.dim], 1) * self.length


@dataclass(frozen=True)
class SyncUnit:
    """One block or tied pair that this rank syncs.

    Attributes
    ----------
    label : str
    order : tuple
        Global launch order key (same on every rank).
    groups : ShardGroups
    entries : tuple of (layer, Entry, rank-set index)
        This rank's slices with the index (in ``groups.rank_sets()``) of the rank set reducing each.
    """

    label: str
    order: tuple
    groups: ShardGroups
    entries: tuple[tuple[int, Entry, int], ...]


def _chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """torch's ``Shard`` chunking: part ``i`` is ``[i c, (i + 1) c)`` clipped to ``n``, ``c = ceil(n / parts)``."""
    c = -(-n // parts)
    return [(min(i * c, n), min((i + 1) * c, n)) for i in range(parts)]


def _param_entries(name: str, p: torch.nn.Parameter, *, groups: ShardGroups, holder_names: list[str],
                   model: RuntimeModel, module, tp_rank: int, my_holder: int,
                   naive_tp: bool) -> list[tuple[Entry, tuple[int, ...]]]:
    """This rank's slices of ``p`` and the rank set that reduces each."""
    degrees = [len(h) for h in groups.holders]
    dims = [shard_dim(model, n, t, module=module if i == my_holder else None) if t > 1 else None
            for i, (n, t) in enumerate(zip(holder_names, degrees))]
    sharded = {d for d in dims if d is not None}
    if not sharded:                                              # replicated everywhere: TP rank 0 contributes
        return [(Entry(p, None, 0, 0, naive_tp or tp_rank == 0), groups.all_ranks)]
    mixed = [degrees[i] for i, d in enumerate(dims) if d is None and degrees[i] > 1]
    if len(sharded) > 1 or mixed:
        raise HppInputError(f"{name} is sharded along dims {sorted(sharded)} at TP degrees "
                            f"{[t for t, d in zip(degrees, dims) if d is not None]} and replicated at TP {mixed} "
                            "by other pipelines", field="tp_plan",
                            fix="shard a parameter alike at every TP degree the plan uses, or re-plan with one TP "
                                "degree for all pipelines")
    d = sharded.pop()
    n, T = p.shape[d], groups.num_pieces
    pieces = _chunk_bounds(n, T)
    for t in degrees:                                            # every piece inside one shard of every holder
        shards = _chunk_bounds(n, t)
        for j, (a, b) in enumerate(pieces):
            lo, hi = shards[j * t // T]
            if a < b and not (lo <= a and b <= hi):
                raise HppInputError(f"{name}: dim {d} of size {n} splits unevenly at TP degrees {sorted(set(degrees))}",
                                    field="tp_plan", fix=f"use TP degrees whose lcm {T} divides {n}, or one TP degree")
    t = degrees[my_holder]
    my_lo, my_hi = _chunk_bounds(n, t)[tp_rank]
    if local_tensor(p).shape[d] != my_hi - my_lo:
        raise RuntimeError(f"{name}: local shard has {local_tensor(p).shape[d]} rows along dim {d}, "
                           f"expected {my_hi - my_lo} (torch changed its Shard chunking?)")
    mine = [j for j, (a, b) in enumerate(pieces) if a < b and j * t // T == tp_rank]
    if len(mine) == 1 and pieces[mine[0]] == (my_lo, my_hi):
        return [(Entry(p, None, 0, 0, True), groups.piece_ranks(mine[0]))]
    return [(Entry(p, d, pieces[j][0] - my_lo, pieces[j][1] - pieces[j][0], True), groups.piece_ranks(j))
            for j in mine]


def sync_units(layout: GroupLayout, role: RankRole, roles: tuple[RankRole, ...], stage: StageModule,
               model: RuntimeModel, *, naive_tp: bool = False) -> list[SyncUnit]:
    """The blocks and tied pairs this rank syncs, with its slices of each parameter.

    ``naive_tp`` is the control experiment: replicated parameters are summed from every
    TP rank (each stage's contribution counted ``t`` times), which must NOT train right.

    Raises
    ------
    HppInputError
        A parameter sharded differently by pipelines of different TP degrees.
    """
    tied_pairs = tuple(model.tied_parameters())
    tied_names = {n for pair in tied_pairs for n in pair}
    modules = {name: stage.get_submodule(name.rpartition(".")[0]) for _l, name, _p in stage.layer_parameters()}
    by_name = {name: (layer, p) for layer, name, p in stage.layer_parameters()}
    holder_of = {r.rank: r for r in roles}
    units: list[SyncUnit] = []

    def build(label: str, order: tuple, groups: ShardGroups, names: dict[str, list[str]]) -> None:
        if not groups.needs_sync or role.rank not in groups.all_ranks:
            return
        my_holder = next(i for i, h in enumerate(groups.holders) if role.rank in h)
        sets = groups.rank_sets()
        entries = []
        for name, holder_names in names.items():
            layer, p = by_name[name]
            for entry, ranks in _param_entries(name, p, groups=groups, holder_names=holder_names, model=model,
                                               module=modules[name], tp_rank=role.tp_rank, my_holder=my_holder,
                                               naive_tp=naive_tp):
                entries.append((layer, entry, sets.index(ranks)))
        if entries:
            units.append(SyncUnit(label, order, groups, tuple(entries)))

    for i, groups in enumerate(layout.blocks):
        names = {name: [name] * len(groups.holders) for name, (layer, _p) in by_name.items()
                 if layer in groups.layers and name not in tied_names}
        build(f"block [{groups.layers[0]}, {groups.layers[-1] + 1})", (0, -i), groups, names)
    for i, ((a, b), groups) in enumerate(zip(tied_pairs, layout.tied)):
        la = split_global_name(a)[0]
        holder_names = [a if holder_of[h[0]].layer_start <= la < holder_of[h[0]].layer_stop else b
                        for h in groups.holders]
        mine = [n for n in (a, b) if n in by_name][:1]           # one Parameter if the stage holds both ends
        build(f"tied {a}-{b}", (1, i), groups, {n: holder_names for n in mine})
    return units
