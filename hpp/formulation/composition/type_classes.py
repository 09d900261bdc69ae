"""Type classes: a stronger lower bound of the composition objective, by the device types a plan's candidates
share (the bound's side of the gap; ``SolverSettings(type_classes=True)``, ``hpp plan
--type-classes``).

The copy bound (:mod:`hpp.formulation.composition.copy_bound`) prices each candidate's sync floor on the fastest
link its stage's ring could use, in-node links and the links among nodes of its own type included. A plan whose
candidates hold the same layers on different device types cannot use those: its rings cross types. Every plan
lies in one of k + 1 classes (k device types among the candidates):

- ``A:<t>``: every candidate of the plan uses device type t. Those plans use only the candidates that use t:
  their copy bound.
- ``B``: no device type is used by every candidate. Then every layer's gradient ring holds two device types at
  least: if the ring of some layer held type t only, every candidate would hold that layer on t, so use t, and
  the plan would be in ``A:<t>``. Such a ring spans two nodes at least and crosses from a node of the stage's own
  type to a node of another type, so class B's copy bound prices every sync floor on those cross-type links only
  (:func:`~hpp.formulation.composition.sync_floor.cross_type_links`). Empty (inf) when some type is used by every
  candidate.

Each class's copy bound is a valid bound of the plans in it (the same relaxation on fewer candidates, or with
floors that hold for its plans), and every plan is in some class, so the least over the classes is a lower bound
of every plan. The classes are bounded one after the other (B first), each cut at the least found so far (a cut only lowers
a copy bound, and the result is the least anyway). Cost: k + 1 copy-bound runs; measured in
``experiments/gap_progress.py`` (method ``type-classes``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from hpp.formulation.composition.copy_bound import copy_bound
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.sync_floor import cross_type_links

__all__ = ["TypeClassBound", "type_class_bound"]


@dataclass(frozen=True)
class TypeClassBound:
    """Result of :func:`type_class_bound`: ``bound_s`` the least class bound [s] (inf without candidates),
    ``classes`` each class's bound [s] (``"B"`` first, then ``"A:<type>"``; inf for an empty class; each at most the
    cutoff and the classes before it, where its search was cut), ``wall_s`` [s]."""

    bound_s: float
    classes: dict = field(default_factory=dict)
    wall_s: float = 0.0


def type_class_bound(problem: CompositionProblem, *, cutoff_s: float | None = None) -> TypeClassBound:
    """Lower bound of the composition objective over every plan of ``problem``'s candidates, by type class.

    Parameters
    ----------
    problem : CompositionProblem
        A bound problem (:meth:`CompositionProblem.bound_problem`, usually restricted to the candidates the
        search keeps), as :func:`~hpp.formulation.composition.copy_bound.copy_bound` takes it.
    cutoff_s : float, optional
        The objective of a feasible plan [s]: the result is at most it (as the copy bound's cutoff).

    Returns
    -------
    TypeClassBound
    """
    t0 = time.perf_counter()
    cands = problem.candidates
    types = sorted({t for c in cands for t in c.devices})
    cut = cutoff_s if cutoff_s is not None and math.isfinite(cutoff_s) else None
    out: dict[str, float] = {}
    if len(types) >= 2 and not any(all(t in c.devices for c in cands) for t in types):
        # first: on most inputs it is the least, and it cuts the others early
        out["B"] = v = copy_bound(problem, cutoff_s=cut, max_evals=0, links_of=cross_type_links).bound_s
        cut = v if cut is None else min(cut, v)
    elif types:
        out["B"] = math.inf
    for t in types:
        idx = [i for i, c in enumerate(cands) if t in c.devices]
        out[f"A:{t}"] = v = copy_bound(problem.restricted(idx), cutoff_s=cut, max_evals=0).bound_s
        cut = v if cut is None else min(cut, v)
    return TypeClassBound(min(out.values(), default=math.inf), out, time.perf_counter() - t0)
