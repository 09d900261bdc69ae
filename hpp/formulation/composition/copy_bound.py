"""Branch and bound over pipeline counts and penalty levels: a lower bound of the composition
objective over every candidate, and a better incumbent from the same LPs.

Relaxation. A plan of h pipelines (copies) built from candidates U costs

    T = T_pipe + T_sync + T_opt >= T_pipe + max_{c in U} pen_c(h),   pen_c(h) = floor_c(h) + opt_c

because max_c s_c + max_c o_c >= max_c (s_c + o_c), with ``floor_c(h)`` a lower bound of the sync
time of any device of c's largest stage (:mod:`hpp.formulation.composition.sync_floor`; 0 for h = 1). The counts h are
split into ranges [a, b] (pen taken at its least over the range). For a range and a level P (one
of the pen values), the plans whose largest penalty is P use only candidates with pen <= P, and
their T_pipe is at least F(P): the least T at which the exact-step capacity LP

    max sum_c x_c min(b_c (floor((T - phi_c) / tau_c) + 1), G)
    s.t. sum_c x_c d_c <= inventory (per device type),  sum_c x_c <= b,  x >= 0

reaches G samples (copies fractional; micro-batches per copy integer, which is what the older
LP of :mod:`hpp.formulation.composition.lp_bound` relaxed away: at scale a copy gets 4-16 micro-batches and
that relaxation alone lost up to a micro-batch per copy). The bound is the least P + F(P) over
ranges and levels; the levels are searched by bisection, best first over the intervals of all
ranges (an interval [P_i, P_j] is worth at least P_i + F(P_j), F being non-increasing): the interval of
least worth is split until it is a single level, or worth at least the incumbent (then the bound is
its worth, at most the incumbent), so no interval worth more than the bound is ever split. Each F is
found by Newton steps from above on the LP's step capacity and certified by one LP solve just below it
(capacity < G).

Incumbent: each LP solution at a level is rounded (floor of the copies, the best-capacity candidate of each
device-count column), filled up and priced exactly (:func:`~hpp.formulation.composition.objective.composition_objective_s`);
the best is improved by a local search over copy counts (one copy more, less, or swapped).

Why the bound holds even where parts are dropped: a dropped interval or range records its own lower
value (not the cut), and the result is the least of the recorded values and the cut, so a cut that is
not a true plan's objective can only lower the bound, never make it invalid. A pipeline-count range
whose b copies cannot finish G in time (one copy must finish G/b samples) is dropped without an LP.

Preconditions: the candidates' fill, bottleneck and optimizer times are lower bounds of their cost-model prices
(:meth:`CompositionProblem.bound_problem`); the sync floor covers :mod:`hpp.formulation.collectives`' all-reduce forms
(flat ring on its slowest link, hierarchical) with any fit; a new form needs its own floor in :mod:`.sync_floor`.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.heuristics import _fill_in_order, local_search
from hpp.formulation.composition.copy_bound_levels import Range, Search, few_copies_s
from hpp.formulation.composition.step_lp import h_ranges
from hpp.formulation.composition.sync_floor import cluster_links

__all__ = ["CopyBound", "copy_bound", "round_plans"]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class CopyBound:
    """Result of :func:`copy_bound`: ``bound_s`` a lower bound of the composition objective over every plan
    of the candidates [s]; ``counts``/``objective_s`` the best plan found (the incumbent given or a better one)
    and its objective [s]; ``nodes``/``lp_solves`` level evaluations and LP solves; ``wall_s``; ``ranges``
    per pipeline-count range (a, b, a lower bound of the range [s]). With a ``search_price``: ``found`` the
    rounded plan it prices least (None if none below ``search_cutoff_s``), ``found_s`` that price (else the
    cutoff) [s], ``pool`` the candidates by the LPs' total copies, most first. ``known_plan``: the LP's copies
    (fractional, per candidate) at the level of least exact value met, ``known_s`` that value [s] (the
    relaxation's own best plan: where the bound comes from)."""

    bound_s: float
    counts: dict
    objective_s: float
    nodes: int
    lp_solves: int
    wall_s: float
    ranges: list = field(default_factory=list)
    found: dict | None = None
    found_s: float = math.inf
    pool: list = field(default_factory=list)
    known_plan: dict = field(default_factory=dict)
    known_s: float = math.inf


def round_plans(problem: CompositionProblem, sol: tuple, extra_order: list[int]) -> list[dict[int, int]]:
    """Integer plans near an LP solution: its copies rounded down, then filled up with its own candidates
    (most fractional first) and ``extra_order``; only the plans that fit. ``sol``: (T, allowed, copies per
    candidate, caps) as the level search records it; only the copies are read."""
    _, _, xs, _ = sol
    base = {c: int(math.floor(x + 1e-9)) for c, x in xs.items()}
    base = {c: x for c, x in base.items() if x > 0}
    out = [base] if base else []
    order = sorted(xs, key=lambda c: -(xs[c] - math.floor(xs[c] + 1e-9)))
    filled, _ = _fill_in_order(problem, base, order + extra_order)
    if filled and filled != base:
        out.append(filled)
    return [p for p in out if p and problem.fits(p)]


def copy_bound(problem: CompositionProblem, *, bound_problem: CompositionProblem | None = None,
               incumbent: tuple[dict[int, int], float] | None = None, cutoff_s: float | None = None,
               rel_tol: float = 1e-4, max_evals: int = 400, pool_size: int = 8,
               search_price: Callable[[dict, float], float] | None = None,
               search_cutoff_s: float = math.inf, links_of: Callable = cluster_links) -> CopyBound:
    """Lower bound of the objective over all plans of the candidates, and the best plan met on the way.

    Parameters
    ----------
    problem : CompositionProblem
        The search problem: what plans fit, and the price of the plans tried
        (:func:`~hpp.formulation.composition.objective.composition_objective_s`).
    bound_problem : CompositionProblem, optional
        The same candidates (same indices) with lower-bound times (:meth:`CompositionProblem.bound_problem`);
        the bound is computed on its times, with the sync floor of
        :func:`~hpp.formulation.composition.sync_floor.stage_sync_rate`. Default:
        ``problem`` itself, whose prices then count as exact (they also cut the search).
    incumbent : (counts, objective_s), optional
        A plan of ``problem`` and its price: the start of the incumbent search.
    cutoff_s : float, optional
        The objective (as the bound bounds it) of a feasible plan: every part of the search worth
        at least it is dropped with that value, so the bound is at most ``cutoff_s``.
    rel_tol : float
        Level intervals within this fraction of the cut are not split further (their lower value
        still enters the bound).
    max_evals : int
        Plans the final local search may price (0: none; a count, so the result is deterministic).
    pool_size : int
        Candidates (the LP solutions' best) the local search may add.
    search_price : callable, optional
        ``(counts, cutoff_s) -> s``: another price of a plan (the search problem's objective, where
        ``problem`` is the bound problem; inf when it is at least ``cutoff_s``). Every rounded plan is priced
        by it as well, without changing the search (which cuts on ``problem``'s prices only), and the
        least is returned as ``found``: the LPs' plans as incumbents of the search.
    search_cutoff_s : float
        Only plans ``search_price`` prices below it count (the caller's incumbent, in the same prices): the
        others are cut off before their sync is priced, and ``found`` stays None when none is below it.
    links_of : callable
        ``(cluster, device_type) -> (node devices, in-node links, inter-node links)``: the links each candidate's
        sync floor is priced on (default :func:`~hpp.formulation.composition.sync_floor.cluster_links`; the
        type classes' class B: ``cross_type_links``). Only valid for plans whose rings use those links.

    Returns
    -------
    CopyBound
        ``bound_s`` (at most ``cutoff_s``), ``counts``/``objective_s`` the best plan found and its price.
    """
    t0 = time.perf_counter()
    if not problem.candidates:
        return CopyBound(math.inf, {}, math.inf, 0, 0, 0.0)
    s = Search(bound_problem if bound_problem is not None else problem, links_of)
    exact_prices = bound_problem is None or bound_problem is problem
    best_counts, best_obj = incumbent if incumbent is not None and incumbent[0] else ({}, math.inf)
    cut_s = math.inf if cutoff_s is None or not math.isfinite(cutoff_s) else float(cutoff_s)
    if exact_prices:
        cut_s = min(cut_s, best_obj)
    bound = math.inf
    nodes = solves = 0
    seen_plans: set = set()
    pool_score: dict[int, float] = {}
    out_ranges = []
    found: dict | None = None
    found_s = search_cutoff_s

    def consider(sol: tuple | None) -> None:
        nonlocal best_counts, best_obj, cut_s, found, found_s
        if sol is None:
            return
        for c, x in sol[2].items():
            pool_score[c] = pool_score.get(c, 0.0) + x
        for plan in round_plans(problem, sol, []):
            key = tuple(sorted(plan.items()))
            if key in seen_plans:
                continue
            seen_plans.add(key)
            if search_price is not None:
                w = search_price(plan, found_s)
                if w < found_s:
                    found, found_s = plan, w
            v = composition_objective_s(problem, plan, cutoff_s=best_obj)
            if v < best_obj:
                best_counts, best_obj = plan, v
                if exact_prices:
                    cut_s = min(cut_s, v)

    # best first over all ranges' intervals (lower, range, i, j, F(L[j])): the first level popped is the bound
    ranges: list[tuple[int, int, Range | None]] = []
    heap: list[tuple[float, int, int, int, float]] = []
    known = math.inf                    # least exact value L[k] + F(L[k]) met (a level's own value)
    known_plan: dict = {}
    least_opt = float(np.min(np.where(s.fits, s.opt, np.inf), initial=np.inf))
    for a, b in h_ranges(s.h_max, s.node_max):
        r = len(ranges)
        # b copies cannot finish G in time: no penalties, no LP needed (the least optimizer step is a floor)
        quick = least_opt + few_copies_s(s, b, s.fits)
        if quick >= cut_s * (1 - rel_tol):
            ranges.append((a, b, None))
            heapq.heappush(heap, (quick, r, 0, 0, math.inf))
            continue
        rg = Range(s, a, b)
        ranges.append((a, b, rg))
        if len(rg.levels):              # the range's root, priced when it comes first: L[0] + few copies' time
            heapq.heappush(heap, (float(rg.levels[0]) + few_copies_s(s, b, np.isfinite(rg.pen)), r, 0, -1, math.inf))
    while heap:
        lower, r, i, j, fj = heap[0]
        rg = ranges[r][2]
        if rg is None or i == j or lower >= min(cut_s, known) * (1 - rel_tol):
            bound = lower                 # every other entry's lower value is at least this
            break
        heapq.heappop(heap)
        L = rg.levels
        k = len(L) - 1 if j < 0 else (i + j) // 2
        t_k, exact, sol = rg.least_T(L[k], min(cut_s, known) - L[i])
        nodes += 1
        consider(sol)
        if exact:
            if L[k] + t_k < known and sol is not None:
                known_plan = dict(sol[2])
            known = min(known, L[k] + t_k)
        if j >= 0:
            heapq.heappush(heap, (L[k + 1] + fj, r, k + 1, j, fj))
        heapq.heappush(heap, (max(lower, L[i] + t_k), r, i, k, t_k))
    for r, (a, b, rg) in enumerate(ranges):
        solves += rg.lp.solves if rg is not None else 0
        out_ranges.append((a, b, min((e[0] for e in heap if e[1] == r), default=math.inf)))
    pool = sorted(pool_score, key=lambda c: -pool_score[c])[:pool_size]
    if best_counts and max_evals > 0:
        best_counts, best_obj, _ = local_search(problem, dict(best_counts), best_obj, pool, max_evals=max_evals)
        if exact_prices:
            cut_s = min(cut_s, best_obj)
    bound = min(bound, cut_s)
    log.debug("copy bound %.6g, incumbent %.6g, %d nodes, %d LP solves", bound, best_obj, nodes, solves)
    return CopyBound(bound, dict(best_counts), best_obj, nodes, solves, time.perf_counter() - t0, out_ranges,
                     found, found_s, sorted(pool_score, key=lambda c: (-pool_score[c], c)), known_plan, known)
