"""The copy bound's level search (:mod:`hpp.formulation.composition.copy_bound`): the problem's arrays, shared by
every pipeline-count range, and per range its step-capacity LP, its penalties and F(level), the least T at which
the LP's capacity reaches G (Newton steps from above, certified by one LP solve just below). The relaxation and
why it is a bound: :mod:`hpp.formulation.composition.copy_bound`.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.step_lp import StepLP
from hpp.formulation.composition.sync_floor import cluster_links, stage_sync_rates

__all__ = ["Search", "Range", "few_copies_s", "floor_tables"]

_REL_TOL = 1e-9             # certification step below a found T


class Search:
    """Arrays of one problem shared by every range, one entry per *column*.

    A column is a candidate with the times and sync floor of one kind of binding of its copies: every candidate has
    one, and a candidate with :attr:`CompositionProblem.crossed` times (a copy that fits one node,
    :func:`~hpp.formulation.composition.bound_model.one_node_copy`) a second. Column ``c < n`` (the candidate's own):
    the copies on one node (the bound problem's times, which hold for every binding), their sync floor priced as if
    the stage's TP group were the copy's ``D`` devices: the node then holds at most ``node devices - D`` devices of
    other pipelines, so a ring through it has at most ``node devices - D + 1`` ranks there
    (:func:`~hpp.formulation.composition.sync_floor.stage_sync_rate`'s ``g_max`` with ``tp = D``: no hierarchical
    form with more ranks per node, no ring inside the node with more ranks). Column ``n + i``: the copies of
    candidate ``origin[n + i]`` that cross nodes at least once (the crossed times), with the stage's own sync floor.
    Every copy of a plan is one or the other, so each plan is a point of the relaxation over the columns (same
    devices, the copies split between its candidates' columns) and the bound holds. :attr:`origin` maps columns to
    candidate indices; the level search reports candidate indices.
    """

    def __init__(self, problem: CompositionProblem, links_of: Callable = cluster_links) -> None:
        """``links_of(cluster, device_type)``: the links a stage's sync floor is priced on
        (:func:`~hpp.formulation.composition.sync_floor.cluster_links`, or ``cross_type_links`` for plans whose
        rings all hold two types)."""
        self.problem = problem
        cands = problem.candidates
        self.G = G = problem.global_batch_size
        n0 = len(cands)
        crossed = problem.crossed
        split = [] if crossed is None else np.flatnonzero(np.isfinite(crossed[:, 0])).tolist()
        self.origin = np.r_[np.arange(n0), np.array(split, dtype=np.int64)].astype(np.int64)
        whole = set(split)             # candidates whose own column is the one-node binding
        cands = [cands[c] for c in self.origin.tolist()]
        n = len(cands)
        types = list(problem.inventory)
        row = {t: r for r, t in enumerate(types)}
        self.inventory = np.array([float(problem.inventory[t]) for t in types])
        parts = [c.partition for c in cands]
        self.b = np.array([c.micro_batch_size for c in cands], dtype=np.float64)
        self.phi = np.array([p.fill_s for p in parts])
        self.tau = np.array([p.bottleneck_s for p in parts])
        if split:
            self.tau[n0:], self.phi[n0:] = crossed[split, 0], crossed[split, 1]
        self.opt = np.array([p.optimizer_s for p in parts])
        self.kmax = np.ceil(G / self.b)
        self.fits = np.array([problem.max_copies(c) >= 1 for c in self.origin.tolist()])
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
            k = c.shape[s]
            if j < n0 and j in whole:      # the copy whole on one node: its floor as one TP group of all its devices
                k = k._replace(tp_degree=sum(x.tp_degree for x in c.shape))
            largest.append((s, spb[s] if spb else 0.0, k))
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
        self.hier = True      # the cost model may price any block's sync hierarchically
        type_links = {t: links_of(cl, t) for t in {k.device_type for _, _, k in largest}}
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
                             sum(problem.max_copies(c) for c in range(n0)) if n0 else 0))

    def candidate_copies(self, cols: np.ndarray, xs: np.ndarray) -> dict[int, float]:
        """Copies per candidate index of ``xs`` copies of columns ``cols`` (a candidate's columns summed)."""
        out: dict[int, float] = {}
        for c, x in zip(self.origin[cols].tolist(), np.asarray(xs, dtype=np.float64).tolist()):
            out[c] = out.get(c, 0.0) + x
        return out

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


def floor_tables(problem: CompositionProblem, most_pipelines: int) -> np.ndarray:
    """Per candidate of the bound problem ``problem`` and pipeline count h = 1 .. ``most_pipelines``: the copy
    bound's sync floor of its largest stage [s], (candidates, most_pipelines); 0 for h = 1 and where no copy fits.

    ``pen_c(h) - opt_c`` of :meth:`Search.penalty` on the single count [h, h]: a lower bound of the sync time of
    any device of c's largest stage in any plan of h pipelines of these candidates (the copy bound's precondition,
    :mod:`hpp.formulation.composition.copy_bound`), usually above the cluster-wide
    :class:`~hpp.formulation.composition.sync_floor.SyncFloor` (per-type links, the hierarchical form only where g
    divides h). For the exact solvers' model (:attr:`CompositionProblem.floor_table`).
    """
    s = Search(problem)
    cols = np.zeros((len(s.origin), max(1, most_pipelines)))
    for h in range(2, most_pipelines + 1):
        cols[:, h - 1] = s.penalty(h, h) - s.opt
    cols = np.where(np.isfinite(cols), np.maximum(cols, 0.0), 0.0)
    out = np.full((len(problem.candidates), cols.shape[1]), np.inf)
    np.minimum.at(out, s.origin, cols)         # a candidate's floor: the least of its columns' (any binding)
    return out


def few_copies_s(s: Search, b: int, allowed: np.ndarray) -> float:
    """A lower bound of T_pipe with at most b copies of ``allowed`` candidates [s]: b copies finish at most b times
    the most samples one copy finishes, so some copy must finish G / b samples."""
    k = np.ceil(np.ceil(s.G / b) / s.b)
    t = s.phi + (np.minimum(k, s.kmax) - 1.0) * s.tau
    return float(np.min(np.where(allowed, t, np.inf), initial=np.inf))


def _least_T_fixed(s: Search, cols: np.ndarray, xs: np.ndarray, T: float) -> float:
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


class Range:
    """One pipeline-count range: its LP, penalties and the level search."""

    def __init__(self, s: Search, a: int, b: int) -> None:
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
            sol = (T, allowed, s.candidate_copies(cols, x[used]), cap)
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
