"""Branch and bound over pipeline counts and penalty levels: a lower bound of the composition
objective over every candidate, and a better incumbent from the same LPs.

Relaxation (issue 21, item 6). A plan of h pipelines (copies) built from candidates U costs

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

import numpy as np

from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.heuristics import _fill_in_order, local_search
from hpp.formulation.composition.step_lp import StepLP, h_ranges
from hpp.formulation.composition.sync_floor import cluster_links, has_hierarchical, stage_sync_rates

__all__ = ["CopyBound", "copy_bound"]

log = logging.getLogger(__name__)

_REL_TOL = 1e-9             # certification step below a found T


@dataclass(frozen=True)
class CopyBound:
    """Result of :func:`copy_bound`: ``bound_s`` a lower bound of the composition objective over every plan
    of the candidates [s]; ``counts``/``objective_s`` the best plan found (the incumbent given or a better one)
    and its objective [s]; ``nodes``/``lp_solves`` level evaluations and LP solves; ``wall_s``; ``ranges``
    per pipeline-count range (a, b, a lower bound of the range [s])."""

    bound_s: float
    counts: dict
    objective_s: float
    nodes: int
    lp_solves: int
    wall_s: float
    ranges: list = field(default_factory=list)


class _Search:
    """Arrays of one problem shared by every range."""

    def __init__(self, problem: CompositionProblem) -> None:
        self.problem = problem
        cands = problem.candidates
        self.G = G = problem.global_batch_size
        n = len(cands)
        types = list(problem.inventory)
        row = {t: r for r, t in enumerate(types)}
        self.inventory = np.array([float(problem.inventory[t]) for t in types])
        parts = [c.partition for c in cands]
        self.b = np.array([c.micro_batch_size for c in cands], dtype=np.float64)
        self.phi = np.array([p.fill_s for p in parts])
        self.tau = np.array([p.bottleneck_s for p in parts])
        self.opt = np.array([p.optimizer_s for p in parts])
        self.kmax = np.ceil(G / self.b)
        self.fits = np.array([problem.max_copies(c) >= 1 for c in range(n)])
        keys: dict[tuple, int] = {}          # device counts (in the candidate's dict order) -> group
        canon: dict[tuple, int] = {}         # device counts, sorted -> group
        group = np.empty(n, dtype=np.int64)
        vecs = []
        # per candidate: its largest stage (index), that stage's bytes, and (device type, TP degree)
        largest = []
        for j, c in enumerate(cands):
            key = tuple(c.devices.items())
            g = keys.get(key)
            if g is None:
                g = canon.get(tuple(sorted(key)))
                if g is None:
                    g = canon[tuple(sorted(key))] = len(vecs)
                    v = np.zeros(len(types))
                    for t, k in key:
                        v[row[t]] = k
                    vecs.append(v)
                keys[key] = g
            group[j] = g
            spb = parts[j].stage_param_bytes
            s = max(range(len(spb)), key=spb.__getitem__) if spb else 0
            largest.append((s, spb[s] if spb else 0.0, c.shape[s]))
        self.group = group
        self.group_devices = np.array(vecs).T if vecs else np.zeros((len(types), 0))
        self.order = np.argsort(group, kind="stable")
        self.starts = np.flatnonzero(np.r_[True, np.diff(group[self.order]) != 0])
        # the largest stage gradient of each candidate and the most bytes any candidate holds for its layers
        self.w_stage = np.array([w for _, w, _ in largest], dtype=np.float64)
        L = len(parts[0].layer_param_bytes) if parts else 0
        if L and all(len(p.layer_param_bytes) == L for p in parts):
            layer_max = np.max(np.array([p.layer_param_bytes for p in parts]), axis=0)
            prefix = np.r_[0.0, np.cumsum(layer_max)].tolist()
            self.beta_max = np.maximum(
                np.array([prefix[p.boundaries[s + 1]] - prefix[p.boundaries[s]] for p, (s, _, _) in zip(parts, largest)]),
                self.w_stage)
        else:           # no per-layer bytes: blocks can be as large as the largest stage of any candidate
            self.beta_max = np.full(n, self.w_stage.max(initial=0.0))
        cl = problem.cluster
        self.hier = has_hierarchical()
        type_links = {t: cluster_links(cl, t) for t in {k.device_type for _, _, k in largest}}
        # candidates whose largest stage has the same TP degree and node links share a sync rate table
        kind_id: dict[tuple, int] = {}
        self.kinds: dict[int, tuple[int, tuple, tuple]] = {}
        kind = []
        lids: dict[tuple, int] = {}          # per type: its links' key and an id (not hashing links per candidate)
        link_key = {t: (lk, lids.setdefault(lk, len(lids))) for t, (g, intra, inter) in type_links.items()
                    for lk in [(g, tuple(intra), tuple(inter))]}
        for _, _, k in largest:
            lk, lid = link_key[k.device_type]
            i = kind_id.get((k.tp_degree, lid))
            if i is None:
                i = kind_id[(k.tp_degree, lid)] = len(kind_id)
                self.kinds[i] = (k.tp_degree, type_links[k.device_type], (k.tp_degree, *lk))
            kind.append(i)
        self.kind = np.array(kind, dtype=np.int64)
        self.kind_rows = {k: np.flatnonzero(self.kind == k) for k in self.kinds}     # candidates of each kind
        self.kind_keys = sorted(self.kinds)   # memo key below: one token per kind list, shared by restrictions
        self.kinds_token = problem.caches.ring.setdefault(
            ("sync_kinds", tuple(self.kinds[k][2] for k in self.kind_keys)), object())
        self.bmax = float(self.beta_max.max(initial=1.0))
        self.node_max = max((nd.num_devices for nd in cl.nodes), default=1)
        self.h_max = int(min(sum(problem.inventory.values()),
                             sum(problem.max_copies(c) for c in range(n)) if n else 0))

    def penalty(self, a: int, b: int) -> np.ndarray:
        """pen_c over the range [a, b]: sync floor + optimizer step [s] (inf where no copy fits)."""
        pen = self.opt.copy()
        if a >= 2:
            keys = self.kind_keys
            memo = ("sync_rates", self.kinds_token, a, b, self.bmax, self.hier)   # (hashing links per range: slow)
            rates = self.problem.caches.ring.get(memo)
            if rates is None:
                rates = self.problem.caches.ring[memo] = stage_sync_rates(
                    self.problem.cluster, a, b, [self.kinds[k][:2] for k in keys], self.bmax, hierarchical=self.hier)
            for key, (tops, rate, beta0) in zip(keys, rates):
                sel = self.kind_rows[key]
                w = self.w_stage[sel]
                cap = np.minimum(np.maximum(w, beta0), self.beta_max[sel])
                idx = np.minimum(np.searchsorted(tops, cap), len(tops) - 1)
                pen[sel] += w * rate[idx] * (1.0 - 1e-12)
        return np.where(self.fits, pen, np.inf)

    def caps(self, T: float, allowed: np.ndarray) -> np.ndarray:
        """Samples one copy of each candidate finishes by T (0 where not allowed)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            k = np.floor((T - self.phi) / self.tau + 1e-12) + 1.0
        cap = np.where((T >= self.phi) & allowed, np.minimum(k, self.kmax) * self.b, 0.0)
        return np.minimum(cap, self.G)

    def group_best(self, cap: np.ndarray) -> np.ndarray:
        if not len(cap):
            return cap
        return np.maximum.reduceat(cap[self.order], self.starts)


def _few_copies_s(s: _Search, b: int, allowed: np.ndarray) -> float:
    """A lower bound of T_pipe with at most b copies of ``allowed`` candidates [s]: b copies finish at most b times
    the most samples one copy finishes, so some copy must finish G / b samples."""
    k = np.ceil(np.ceil(s.G / b) / s.b)
    t = s.phi + (np.minimum(k, s.kmax) - 1.0) * s.tau
    return float(np.min(np.where(allowed, t, np.inf), initial=np.inf))


def _least_T_fixed(s: _Search, cols: np.ndarray, xs: np.ndarray, T: float) -> float:
    """Least T' <= T at which ``xs`` fractional copies of candidates ``cols`` finish G samples [s]."""
    pts = []
    for c in cols.tolist():
        k = min(int(math.floor((T - s.phi[c]) / s.tau[c] + 1e-12)) + 1, int(s.kmax[c]))
        if k >= 1:
            pts.append(s.phi[c] + s.tau[c] * np.arange(k))
    if not pts:
        return T
    bp = np.unique(np.concatenate(pts))
    bp = bp[bp <= T]
    with np.errstate(invalid="ignore", divide="ignore"):
        k = np.floor((bp[:, None] - s.phi[cols][None, :]) / s.tau[cols][None, :] + 1e-12) + 1.0
    cap = np.where(bp[:, None] >= s.phi[cols][None, :], np.minimum(np.minimum(k, s.kmax[cols]) * s.b[cols], s.G), 0.0)
    ok = np.flatnonzero(cap @ xs >= s.G * (1 - 1e-12))
    return float(bp[ok[0]]) if len(ok) else T


class _Range:
    """One pipeline-count range: its LP, penalties and the level search."""

    def __init__(self, s: _Search, a: int, b: int) -> None:
        self.s, self.a, self.b = s, a, b
        self.lp = StepLP(s.group_devices, s.inventory, b)
        self.pen = s.penalty(a, b)
        self.levels = np.unique(self.pen[np.isfinite(self.pen)])

    def capacity(self, T: float, allowed: np.ndarray) -> tuple[float, np.ndarray | None, np.ndarray]:
        cap = self.s.caps(T, allowed)
        val, x = self.lp.solve(self.s.group_best(cap))
        return val, x, cap

    def least_T(self, level: float, T_cap: float) -> tuple[float, bool, tuple | None]:
        """(t, exact, solution): capacity(t) < G certified; exact when F(level) is within _REL_TOL above t,
        else F(level) > t = T_cap. ``solution``: (T, allowed, group copies, caps) of the last feasible LP."""
        s = self.s
        allowed = self.pen <= level
        if not np.isfinite(T_cap):
            T_cap = float(np.max(np.where(allowed, s.phi + (s.kmax - 1) * s.tau, 0.0)))
        val, x, cap = self.capacity(T_cap, allowed)
        if val < s.G * (1 - 1e-12) or x is None:
            return T_cap, False, None
        T, lo = T_cap, 0.0
        sol = None
        for _ in range(30):
            used = np.flatnonzero(x > 1e-12)
            cols = np.array([self._best_in_group(g, cap) for g in used.tolist()], dtype=np.int64)
            # copies on a group adding nothing at T (no member allowed, or none started) are dropped: else a member
            # not allowed would count below T (F too low: a weaker bound that depended on the LP's warm start)
            live = cap[cols] > 0
            used, cols = used[live], cols[live]
            sol = (T, allowed, dict(zip(cols.tolist(), x[used].tolist())), cap)
            T2 = _least_T_fixed(s, cols, x[used], T)
            below = T2 * (1 - _REL_TOL) - 1e-12
            val, x2, cap2 = self.capacity(below, allowed)
            if val < s.G * (1 - 1e-12) or x2 is None:
                return below, True, sol
            T, x, cap = below, x2, cap2
        hi = T                          # bisection fallback: capacity(lo) < G holds
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            val, _, _ = self.capacity(mid, allowed)
            if val >= s.G * (1 - 1e-12):
                hi = mid
            else:
                lo = mid
        return lo, True, sol

    def _best_in_group(self, g: int, cap: np.ndarray) -> int:
        s = self.s
        lo = s.starts[g]
        hi = s.starts[g + 1] if g + 1 < len(s.starts) else len(s.order)
        members = s.order[lo:hi]
        return int(members[np.argmax(cap[members])])


def _round(problem: CompositionProblem, sol: tuple, extra_order: list[int]) -> list[dict[int, int]]:
    """Integer plans near an LP solution: its copies rounded down, then filled up with its own candidates
    (most fractional first) and ``extra_order``."""
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
               rel_tol: float = 1e-4, max_evals: int = 400, pool_size: int = 8) -> CopyBound:
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

    Returns
    -------
    CopyBound
        ``bound_s`` (at most ``cutoff_s``), ``counts``/``objective_s`` the best plan found and its price.
    """
    t0 = time.perf_counter()
    if not problem.candidates:
        return CopyBound(math.inf, {}, math.inf, 0, 0, 0.0)
    s = _Search(bound_problem if bound_problem is not None else problem)
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

    def consider(sol: tuple | None) -> None:
        nonlocal best_counts, best_obj, cut_s
        if sol is None:
            return
        for c, x in sol[2].items():
            pool_score[c] = pool_score.get(c, 0.0) + x
        for plan in _round(problem, sol, []):
            key = tuple(sorted(plan.items()))
            if key in seen_plans:
                continue
            seen_plans.add(key)
            v = composition_objective_s(problem, plan, cutoff_s=best_obj)
            if v < best_obj:
                best_counts, best_obj = plan, v
                if exact_prices:
                    cut_s = min(cut_s, v)

    # best first over all ranges' intervals (lower, range, i, j, F(L[j])): the first level popped is the bound
    ranges: list[tuple[int, int, _Range | None]] = []
    heap: list[tuple[float, int, int, int, float]] = []
    known = math.inf                    # least exact value L[k] + F(L[k]) met (a level's own value)
    least_opt = float(np.min(np.where(s.fits, s.opt, np.inf), initial=np.inf))
    for a, b in h_ranges(s.h_max, s.node_max):
        r = len(ranges)
        # b copies cannot finish G in time: no penalties, no LP needed (the least optimizer step is a floor)
        quick = least_opt + _few_copies_s(s, b, s.fits)
        if quick >= cut_s * (1 - rel_tol):
            ranges.append((a, b, None))
            heapq.heappush(heap, (quick, r, 0, 0, math.inf))
            continue
        rg = _Range(s, a, b)
        ranges.append((a, b, rg))
        if len(rg.levels):              # the range's root, priced when it comes first: L[0] + few copies' time
            heapq.heappush(heap, (float(rg.levels[0]) + _few_copies_s(s, b, np.isfinite(rg.pen)), r, 0, -1, math.inf))
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
    return CopyBound(bound, dict(best_counts), best_obj, nodes, solves, time.perf_counter() - t0, out_ranges)
