"""The composition objective and its parts [s]: T = T_pipe + T_sync + T_opt of a multiset of candidate copies.

pipeline_time_for_counts   T_pipe, the exact data balance (least time by which the copies finish G samples)
block_sync_s               T_sync, block-wise gradient sync as the cost model prices it
composition_objective_s    the sum, the objective every heuristic and the exhaustive oracle minimise

The solvers' own model of it (integer microseconds, one sync table per candidate) is in
:mod:`hpp.formulation.composition.cpsat` and :mod:`hpp.formulation.composition.milp`;
:func:`hpp.formulation.composition.solve.model_objective_s` evaluates that model's objective of counts.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from hpp.formulation.candidates import Candidate
from hpp.formulation.collectives import ring_allreduce_s
from hpp.formulation.data_balance import least_time_s
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.sync_pricing import block_rings_s

__all__ = ["pipeline_time_for_counts", "block_sync_s", "composition_objective_s", "judge_of"]


def pipeline_time_for_counts(cands: Sequence[Candidate], counts: dict[int, int], global_batch_size: int) -> float:
    """T_pipe: least time by which ``counts`` copies finish ``global_batch_size`` samples [s] (exact data balance)."""
    groups = [(cands[c].partition.bottleneck_s, cands[c].partition.fill_s, cands[c].micro_batch_size, x)
              for c, x in counts.items() if x > 0]
    if not groups:
        return math.inf
    return least_time_s(groups, global_batch_size)


def block_sync_s(problem: CompositionProblem, used: Sequence[int], h: int,
                 counts: dict[int, int] | None = None) -> float:
    """Block-wise gradient sync of ``h`` pipelines built from candidates ``used`` [s].

    As :func:`hpp.formulation.cost_model.estimate_plan` prices it: blocks from the union of the
    used candidates' boundaries; block j is ring-all-reduced among the h holders with the largest
    holder's bytes; a device serialises the blocks of its stage; T_sync = the slowest stage.
    On a per-pair cluster (:attr:`CompositionProblem.per_type_sync`) block j is priced on its holders'
    links: :func:`~hpp.formulation.composition.sync_pricing.mixed_ring_s` of the (type, holders per node, copies)
    of the stages holding it (``counts``: copies per used candidate; None: h for one candidate, else
    h // len(used) each).
    """
    if h <= 1:
        return 0.0
    cands = [problem.candidates[c] for c in used]
    cuts = sorted({b for c in cands for b in c.partition.boundaries})
    blocks = list(zip(cuts, cuts[1:]))
    if problem.per_type_sync:
        ring = block_rings_s(problem, list(used), h, counts, blocks)
    else:
        ring = [ring_allreduce_s(max(sum(c.partition.layer_param_bytes[lo:hi]) for c in cands), h, problem.sync_link)
                for lo, hi in blocks]
    worst = 0.0
    for c in cands:
        bnd = c.partition.boundaries
        for lo, hi in zip(bnd, bnd[1:]):
            worst = max(worst, sum(r for (blo, _), r in zip(blocks, ring) if lo <= blo < hi))
    return worst


def composition_objective_s(problem: CompositionProblem, counts: dict[int, int], *,
                            cutoff_s: float = math.inf) -> float:
    """T_pipe + T_sync + T_opt of ``counts`` copies (see the module docstring) [s]; inf if empty.

    ``cutoff_s``: inf is returned, without pricing the sync, when T_pipe + T_opt >= ``cutoff_s``: the
    objective is then >= ``cutoff_s`` as well (T_sync >= 0, and float addition is monotone), so a caller
    that only asks "is it below cutoff_s?" gets the same answer.
    """
    counts = {c: x for c, x in counts.items() if x > 0}
    if not counts:
        return math.inf
    h = sum(counts.values())
    t_pipe = pipeline_time_for_counts(problem.candidates, counts, problem.global_batch_size)
    t_opt = max(problem.candidates[c].partition.optimizer_s for c in counts)
    if t_pipe + t_opt >= cutoff_s:
        return math.inf
    t_sync = block_sync_s(problem, list(counts), h, counts)
    return t_pipe + t_sync + t_opt


def judge_of(problem: CompositionProblem) -> Callable[[dict], float]:
    """counts -> the judged objective of a plan [s], memoised on the counts: the cost model's predicted iteration
    time of its bound plan (``problem.estimator``) where the problem has one, else :func:`composition_objective_s`."""
    memo: dict[frozenset, float] = {}

    def judge(counts: dict) -> float:
        counts = {c: x for c, x in counts.items() if x > 0}
        if not counts:
            return math.inf
        key = frozenset(counts.items())
        got = memo.get(key)
        if got is None:
            if problem.estimator is not None:
                got = problem.estimator(counts)[1].iteration_time_s
            else:
                got = composition_objective_s(problem, counts)
            memo[key] = got
        return got
    return judge
