"""The solve path's budgeted phase: with more than the default budget, improve the plan and the bound until the
budget ends (:func:`hpp.formulation.composition.solve.solve`, step 5).

A budget (:class:`Budget`) is wall-clock seconds (``--time-limit T``: the answer may then depend on the machine's
load) and/or deterministic work units (``--work-limit U``: CP-SAT's own units; HiGHS
:data:`~hpp.formulation.composition.exact_step.MILP_NODES_PER_WORK_UNIT` nodes per unit; one cost-model evaluation
:func:`eval_work` units), so that a work-limited search gives the same answer on any machine.

What it runs, each step only while the budget lasts:

1. :func:`cost_model_local_search` from the best plan so far: one copy less, one more or one swapped, among the
   plan's candidates and a pool, each neighbour priced by the cost model itself (the binding and
   :func:`~hpp.formulation.cost_model.estimate_plan`, through the problem's estimator), cheapest by the search
   model first. The heuristics rank plans by the search model, which ranks some plans differently from the cost
   model (its sync assumes where the binding puts copies); this step ranks them by the reported time.
2. The exact solver on every candidate left after the presolve (at every size; without its default-budget limit
   of :data:`~hpp.formulation.composition.settings.SMALL_BUDGET_MAX_CANDIDATES`), on the bound problem reduced by
   :func:`exact_model_candidates` (exact for its model), the best plan as hint and its time as cutoff: its bound
   counts when it is above the LP's, its answer is judged by the cost model (then step 1 again from it).

The type-class bound (:mod:`.type_classes`) runs before them whenever there is a budget. Every bound any step
proves is a lower bound of the cost model's time over every plan of the candidates, whatever the step found
(see the steps' own modules); none depends on how far a step got.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hpp.formulation.composition.heuristics import _fill_in_order
from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.composition.problem import CompositionProblem
from hpp.pruning.rules import DominanceKeys, dominance_order, undominated_mask

__all__ = ["Budget", "EVAL_WORK", "LOCAL_POOL", "PAIR_POOL", "cost_model_local_search", "eval_work", "exact_model_candidates",
           "local_search_pool"]

#: Deterministic work units one cost-model evaluation costs per 32 GPUs (at least 1 x): about its seconds
#: (measured: 1-7 ms on the bundled scenarios up to 40 GPUs, 42 ms at 1,024), see :func:`eval_work`.
EVAL_WORK = 0.002
#: Candidates the cost-model local search may add besides the plan's own.
LOCAL_POOL = 40


@dataclass
class Budget:
    """What is left of a budget: wall seconds until ``deadline`` (a :func:`time.perf_counter` value; None: no wall
    limit) and deterministic ``work`` units (inf: none).

    >>> b = Budget(None, 1.0)
    >>> b.spend(0.4); round(b.work, 2), b.exhausted()
    (0.6, False)
    >>> b.spend(1.0); b.exhausted()
    True
    """

    deadline: float | None
    work: float = math.inf

    def __post_init__(self) -> None:
        if self.deadline is None and not math.isfinite(self.work):
            raise ValueError("a budget needs a deadline or a finite work limit")

    def left_s(self) -> float:
        """Wall seconds left (inf without a deadline)."""
        return math.inf if self.deadline is None else max(0.0, self.deadline - time.perf_counter())

    def spend(self, units: float) -> None:
        self.work -= units

    def exhausted(self) -> bool:
        return self.work <= 0 or self.left_s() <= 0

    def share(self, fraction: float) -> "Budget":
        """A budget of ``fraction`` of what is left (of both limits), for one step; spend it on this one too."""
        deadline = None if self.deadline is None else time.perf_counter() + fraction * self.left_s()
        return Budget(deadline, fraction * self.work if math.isfinite(self.work) else math.inf)


def eval_work(problem: CompositionProblem) -> float:
    """Work units of one cost-model evaluation on ``problem``: :data:`EVAL_WORK` per 32 GPUs, at least once.

    >>> from types import SimpleNamespace as NS
    >>> eval_work(NS(cluster=NS(num_devices=8))), eval_work(NS(cluster=NS(num_devices=1024)))
    (0.002, 0.064)
    """
    return EVAL_WORK * max(1.0, problem.cluster.num_devices / 32)


def local_search_pool(problem: CompositionProblem, plans: Sequence[dict], extra: Sequence[int] = (),
                      size: int = LOCAL_POOL) -> list[int]:
    """Candidates a cost-model local search may add: those of ``plans``, then ``extra`` (e.g. the copy bound's LP
    pool), then the heuristics' candidates of least solo objective, up to ``size`` besides the plans' own."""
    from hpp.formulation.composition.heuristics import _least_solo, _solo_floors_s    # the heuristics' ranking

    own = list(dict.fromkeys(c for p in plans for c in p))
    out = list(own)
    for c in extra:
        if c not in out and len(out) < len(own) + size:
            out.append(c)
    if len(out) < len(own) + size:
        idx = problem.heuristic_indices
        floor = _solo_floors_s(problem)
        members = [c for c in idx if math.isfinite(floor[c])]
        for c in _least_solo(problem, members, floor, size):
            if c not in out and len(out) < len(own) + size:
                out.append(c)
    return out


#: Pool candidates (the first of the pool) that the two-for-one moves of :func:`cost_model_local_search` add.
PAIR_POOL = 12


def _moves(problem: CompositionProblem, counts: dict[int, int], pool: Sequence[int]) -> list[dict[int, int]]:
    """The neighbours of ``counts`` (:func:`cost_model_local_search`), in a fixed order."""
    def less(t: dict, c: int) -> dict:
        t = dict(t)
        t[c] -= 1
        if not t[c]:
            del t[c]
        return t

    def more(t: dict, *ds: int) -> dict:
        t = dict(t)
        for d in ds:
            t[d] = t.get(d, 0) + 1
        return t

    used = list(counts)
    pairs = [(d, e) for i, d in enumerate(pool[:PAIR_POOL]) for e in pool[i:PAIR_POOL]]
    out = [less(counts, c) for c in used]
    out += [more(counts, d) for d in pool]
    for c in used:
        fewer = less(counts, c)
        out += [more(fewer, d) for d in pool if d != c]
        out += [more(fewer, d, e) for d, e in pairs]
    for i, c in enumerate(used):
        for c2 in used[i:]:
            if c2 != c or counts[c] >= 2:
                out += [more(less(less(counts, c), c2), d) for d in pool[:PAIR_POOL]]
    for c in used:                  # every copy of c replaced by as many copies of d as the freed devices hold
        rest = {k: v for k, v in counts.items() if k != c}
        for d in pool:
            if d != c:
                filled, _ = _fill_in_order(problem, rest, [d])
                if filled.get(d, 0) > rest.get(d, 0):
                    out.append(filled)
    return out


def cost_model_local_search(problem: CompositionProblem, judge: Callable[[dict], float], counts: dict[int, int],
                            obj: float, pool: Sequence[int], budget: Budget, *,
                            on_better: Callable[[dict, float], None] | None = None) -> tuple[dict[int, int], float, int]:
    """First-improvement local search over copy counts priced by ``judge`` (the cost model).

    Neighbours: one copy less of a used candidate; one more of a ``pool`` candidate; one copy of a used candidate
    replaced by one or two of the pool (two: of its first :data:`PAIR_POOL`), or two copies by one; every copy of a
    used candidate replaced by as many of a pool candidate as the freed devices hold. Those that fit
    the inventory and were not priced before are tried in the order of their search-model price
    (:func:`composition_objective_s`, cheapest first; ties in move order), each judged (spending
    :func:`eval_work` of ``budget``), the first better than ``obj`` (by more than 1e-12 relative) taken, until none
    is better or the budget ends. ``on_better(counts, obj)`` is called on each improvement.

    Returns
    -------
    (counts, objective_s, evaluations)
    """
    evals = 0
    cost = eval_work(problem)
    pool = list(dict.fromkeys([*counts, *pool]))
    seen: set[frozenset] = {frozenset(counts.items())}
    while not budget.exhausted():
        priced = []
        for i, t in enumerate(_moves(problem, counts, pool)):
            key = frozenset(t.items())
            if t and key not in seen and problem.fits(t):
                seen.add(key)
                priced.append((composition_objective_s(problem, t), i, t))
        priced.sort(key=lambda r: (r[0], r[1]))
        improved = False
        for _, _, t in priced:
            if budget.exhausted():
                break
            v = judge(t)
            evals += 1
            budget.spend(cost)
            if v < obj * (1 - 1e-12):
                counts, obj, improved = t, v, True
                if on_better is not None:
                    on_better(counts, obj)
                break
        if not improved:
            break
    return counts, obj, evals


def exact_model_candidates(bound_problem: CompositionProblem, keep: Sequence[int], must: Sequence[int] = (),
                           floors: np.ndarray | None = None) -> list[int]:
    """``keep`` without the candidates another one of ``keep`` dominates in the exact solvers' bound model; ``must``
    kept whatever (e.g. the hint's).

    The exact model (:mod:`.cpsat`, :mod:`.milp`) reads of a candidate only its micro-batch size, devices and TP
    groups, lower-bound bottleneck, fill and optimizer step, and its largest stage gradient W, whose sync floor
    ``SyncFloor.seconds(W, h)`` is W times a factor of h (:class:`~hpp.formulation.composition.sync_floor.SyncFloor`).
    So if c uses no more devices of a type and no more TP groups of a size than c' and is no larger in each of those
    times and in W, replacing every copy of c' by c keeps a solution feasible and its model objective no larger:
    the model's optimum over the reduced set is its optimum over all (the rule ``dominated``, exact on these
    features; :func:`hpp.pruning.rules.undominated_mask`). Its bound is therefore a bound of all. ``floors``:
    the model's per-candidate sync floors over h as well ((len(keep), H), :attr:`CompositionProblem.floor_table`),
    compared at every h.
    """
    keep = list(keep)
    if len(keep) < 2:
        return keep
    cands = [bound_problem.candidates[c] for c in keep]
    usage = DominanceKeys([(c.devices, c.tp_groups) for c in cands])
    tau = np.array([c.partition.bottleneck_s for c in cands])
    phi = np.array([c.partition.fill_s for c in cands])
    opt = np.array([c.partition.optimizer_s for c in cands])
    w = np.array([max(c.partition.stage_param_bytes, default=0.0) for c in cands])
    b = np.array([c.micro_batch_size for c in cands], dtype=np.int64)
    idx = np.arange(len(cands))
    order = dominance_order(tau, phi, usage.num_devices, idx, b, np.zeros(len(cands), dtype=np.int64))
    pos = np.empty(len(cands), dtype=np.int64)
    pos[order] = np.arange(len(cands))
    feat = np.column_stack([usage.counts, tau, phi, opt, w] + ([floors] if floors is not None else []))
    ok = undominated_mask(b, usage.keyset, usage.subsets, feat, pos)
    must = set(must)
    return [c for c, k in zip(keep, ok.tolist()) if k or c in must]
