"""Named pruning rules of the HPP search, each switchable for ablation.

Each rule says why it cannot remove the optimum of the planner's model, or says
that it can. "The planner's model" is the search space of
:class:`hpp.formulation.candidates.SearchSpace` costed as in
:mod:`hpp.formulation.composition`.

- ``memory_infeasible``: a shape suffix that cannot hold layers [u, L) for any u
  (with the in-flight micro-batches of its positions) makes every shape ending with
  it infeasible: adding stages in front never changes the suffix's positions from
  the end. Exact.
- ``dominated``: candidate c dominates c' when both have the same micro-batch size,
  c uses no more devices of any type and no more TP groups of any size, and c is no
  worse in bottleneck, fill, optimizer step and per-stage gradient bytes. Replacing
  every copy of c' by a copy of c keeps the plan feasible and no slower. Exact.
- ``incumbent_bound``: a candidate whose single-micro-batch time (its fill) already
  exceeds the incumbent iteration time cannot be in a better plan (every used
  pipeline gets >= 1 micro-batch, and sync and optimizer time are >= 0). Exact.
- ``symmetry``: identical pipelines are one integer count instead of one boolean per
  copy, and devices of one type are counted, not enumerated (devices of a type are
  interchangeable up to the node packing, which is checked exactly). Exact.
- ``canonical_order``: a shape orders its device types by memory capacity, largest
  first (the first stage holds the most in-flight micro-batches). This CAN remove
  the optimum in rare cases (e.g. when the head layer's memory makes a small device
  better at the front); switch it off to search every order of the type groups.
- ``memoise`` (not a pruning rule): stage-cost tables and DP rows are cached; the DP rows
  of all shapes' shared suffixes are computed once, together (batched). Off, each shape
  is balanced on its own with nothing shared (the ablation).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["PruningOptions", "dominates", "exceeds_incumbent"]


@dataclass(frozen=True, slots=True)
class PruningOptions:
    """Switches for the pruning rules and memoisation: the exact ones on by default, ``canonical_order`` off."""

    memory_infeasible: bool = True
    dominated: bool = True
    incumbent_bound: bool = True
    symmetry: bool = True
    canonical_order: bool = False
    memoise: bool = True

    def without(self, name: str) -> "PruningOptions":
        """A copy with rule ``name`` switched off (for ablations)."""
        if name not in {f.name for f in fields(self)}:
            raise ValueError(f"unknown pruning rule {name!r}; known: {[f.name for f in fields(self)]}")
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs[name] = False
        return PruningOptions(**kwargs)

    @staticmethod
    def rule_names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(PruningOptions))


def dominates(a, b) -> bool:
    """True if candidate ``a`` dominates candidate ``b`` (rule ``dominated``; exact).

    Both are :class:`hpp.formulation.candidates.Candidate`.
    """
    if a.micro_batch_size != b.micro_batch_size:
        return False
    if any(a.devices.get(k, 0) > v for k, v in b.devices.items()) or any(k not in b.devices for k in a.devices):
        return False
    if any(a.tp_groups.get(k, 0) > b.tp_groups.get(k, 0) for k in a.tp_groups):
        return False
    pa, pb = a.partition, b.partition
    return (pa.bottleneck_s <= pb.bottleneck_s and pa.fill_s <= pb.fill_s and pa.optimizer_s <= pb.optimizer_s
            and max(pa.stage_param_bytes) <= max(pb.stage_param_bytes))


def exceeds_incumbent(candidate, incumbent_s: float) -> bool:
    """True if even one micro-batch on ``candidate`` takes longer than ``incumbent_s`` (rule ``incumbent_bound``)."""
    return candidate.partition.fill_s > incumbent_s
