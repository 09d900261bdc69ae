"""Branch and bound over pipeline counts and penalty levels: a lower bound of the composition
objective over every candidate, and a better incumbent from the same LPs.

Relaxation (issue 21, item 6). A plan of h pipelines (copies) built from candidates U costs

    T = T_pipe + T_sync + T_opt >= T_pipe + max_{c in U} pen_c(h),   pen_c(h) = floor_c(h) + opt_c

because max_c s_c + max_c o_c >= max_c (s_c + o_c), with ``floor_c(h)`` a lower bound of the sync
time of any device of c's largest stage (:func:`sync_rate_table`; 0 for h = 1). The counts h are
split into ranges [a, b] (pen taken at its least over the range). For a range and a level P (one
of the pen values), the plans whose largest penalty is P use only candidates with pen <= P, and
their T_pipe is at least F(P): the least T at which the exact-step capacity LP

    max sum_c x_c min(b_c (floor((T - phi_c) / tau_c) + 1), G)
    s.t. sum_c x_c d_c <= inventory (per device type),  sum_c x_c <= b,  x >= 0

reaches G samples (copies fractional; micro-batches per copy integer, which is what the older
LP of :mod:`hpp.formulation.lp_bound` relaxed away: at scale a copy gets 4-16 micro-batches and
that relaxation alone lost up to a micro-batch per copy). The bound is the least P + F(P) over
ranges and levels; the levels are searched by bisection with pruning (an interval [P_i, P_j] is
worth at least P_i + F(P_j), F being non-increasing), and every interval worth at least the
incumbent is dropped with that value. Each F is found by Newton steps from above on the LP's
step capacity and certified by one LP solve just below it (capacity < G).

Incumbent: each LP solution at a level is rounded (floor of the copies, the best-capacity
candidate of each device-count column) and filled up, then priced exactly
(:func:`~hpp.formulation.composition.composition_objective_s`); the best is improved by a local
search over copy counts (one copy more, less, or swapped).

Preconditions: the candidates' fill, bottleneck and optimizer times are lower bounds of what the
cost model can price them at; the sync floor is valid for the flat-ring pricing of the cost model
(holders that span nodes use the inter-node link; see :func:`sync_rate_table`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from hpp.errors import HppInputError
from hpp.formulation.composition import CompositionProblem, composition_objective_s
from hpp.profiles.cluster import Link

__all__ = ["CopyBound", "copy_bound", "sync_rate_table", "stage_sync_rate", "h_ranges", "local_search", "ring_cost_increasing_from"]

log = logging.getLogger(__name__)

_GRID_RATIO = 1.03          # block-size grid of the sync floor (each cell priced at its least) ...
_GRID_FROM = 1e4            # ... from (0, 10 kB], priced at the peak with one latency at 10 kB
_REL_TOL = 1e-9             # certification step below a found T


@dataclass(frozen=True)
class CopyBound:
    """Result of :func:`copy_bound`.

    Attributes
    ----------
    bound_s : float
        A lower bound of the composition objective over every plan of the candidates [s].
    counts : dict[int, int]
        The best plan found (the incumbent given or a better one).
    objective_s : float
        Its objective [s].
    nodes, lp_solves : int
        Level evaluations and LP solves.
    wall_s : float
    ranges : list of tuple
        Per pipeline-count range (a, b, bound of the range [s]).
    """

    bound_s: float
    counts: dict
    objective_s: float
    nodes: int
    lp_solves: int
    wall_s: float
    ranges: list = field(default_factory=list)


def h_ranges(h_max: int, split_at: int) -> list[tuple[int, int]]:
    """Pipeline-count ranges [a, b] covering 1 .. h_max: single counts up to 8, then growing by half;
    no range straddles ``split_at`` (the largest node's devices: the sync link changes there).

    >>> h_ranges(14, 4)
    [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7), (8, 8), (9, 13), (14, 14)]
    """
    out, a = [], 1
    while a <= h_max:
        b = a if a <= 8 else max(a, int(a * 1.5))
        if a <= split_at < b:
            b = split_at
        b = min(b, h_max)
        out.append((a, b))
        a = b + 1
    return out


def _max_bw(link: Link, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """Most bandwidth [bytes/s] ``link`` gives to any message in [c0, c1] bytes (elementwise), as
    :meth:`Link.bandwidth_bytes_per_s` prices it (peak where the fit is not positive, capped at peak)."""
    peak = link.max_bytes_per_s
    if link.fit_gb_per_s is None:
        return np.full(c0.shape, peak)
    a, b, c = link.fit_gb_per_s
    x0 = np.log2(np.maximum(c0, 1.0) / 1e6)
    x1 = np.log2(np.maximum(c1, 1.0) / 1e6)
    q0, q1 = a * x0 * x0 + b * x0 + c, a * x1 * x1 + b * x1 + c
    qmax, qmin = np.maximum(q0, q1), np.minimum(q0, q1)
    if a != 0.0:
        xv = -b / (2.0 * a)
        inside = (x0 <= xv) & (xv <= x1)
        qv = a * xv * xv + b * xv + c
        qmax = np.where(inside, np.maximum(qmax, qv), qmax)
        qmin = np.where(inside, np.minimum(qmin, qv), qmin)
    bw = np.minimum(qmax * 1e9, peak)
    return np.where(qmin <= 0.0, peak, bw)


def sync_rate_table(links: list[Link], a: int, b: int, beta_max: float, *, factor: float | None = None,
                    latency_steps: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Least sync seconds per byte of a gradient split into blocks of at most ``beta`` bytes [s/byte].

    A device's blocks of one stage (bytes beta_j, summing to at least its W) cost, on a flat ring
    of h ranks, sum_j ring(beta_j, h) = sum_j beta_j r_h(beta_j) with
    r_h(beta) = 2 (h-1)/h / bw(beta/h) + 2 (h-1) lat / beta
    (:func:`~hpp.formulation.cost_model.ring_allreduce_s`), so at least W * min r over the block
    sizes possible, for ANY bandwidth fit (non-monotone ones included): the cheapest way W could
    be split. The sizes are cut into a geometric grid; each cell [beta_i, beta_i+1] gets r's least
    over the cell and over h in [a, b], term by term: ``factor`` (default 2 (a-1)/a) over the
    most bandwidth of any chunk in [beta_i / b, beta_i+1 / a] on any of ``links``, plus
    ``latency_steps`` (default 2 (a-1)) latencies over beta_i+1. Returns (grid tops (M,), running
    least rate (M,)): the rate for blocks of at most beta bytes is the running least at the first
    grid top >= beta.
    """
    factor = 2.0 * (a - 1) / a if factor is None else factor
    steps = 2.0 * (a - 1) if latency_steps is None else latency_steps
    n = max(2, int(math.ceil(math.log(max(beta_max, 2.0) / _GRID_FROM) / math.log(_GRID_RATIO))) + 2)
    tops = _GRID_FROM * _GRID_RATIO ** np.arange(n, dtype=np.float64)
    bots = np.r_[0.0, tops[:-1]]
    if a < 2 or factor <= 0 or not links:
        return tops, np.zeros(n)
    rate = np.full(n, math.inf)
    for link in links:
        bw = _max_bw(link, bots / b, tops / a)
        rate = np.minimum(rate, factor / bw + steps * link.latency_s / tops)
    return tops, np.minimum.accumulate(rate)


def _roots(a: float, b: float, c: float) -> list[float]:
    """Real roots of a x^2 + b x + c (a or b may be 0)."""
    if a == 0.0:
        return [] if b == 0.0 else [-c / b]
    d = b * b - 4.0 * a * c
    if d < 0:
        return []
    r = math.sqrt(d)
    return sorted(((-b - r) / (2.0 * a), (-b + r) / (2.0 * a)))


def ring_cost_increasing_from(link: Link, max_chunk_bytes: float) -> float:
    """The least chunk [bytes] from which a ring's cost 2 (h-1)/h * B / bw(B/h) + latency grows with B, for
    chunks up to ``max_chunk_bytes``, as :meth:`Link.bandwidth_bytes_per_s` prices it (exact, from the fit).

    The cost grows where B / bw(B/h) never falls: in x = log2(chunk / 1 MB) the bandwidth's log-slope
    is at most 1 where the fit prices it (ln 2 fit(x) - fit'(x) >= 0, a quadratic), and the fit does not
    drop from positive to non-positive (below 0 the peak applies, a fall in price). Returns 0 when it
    grows everywhere, ``max_chunk_bytes`` when it still falls at the top.
    """
    if link.fit_gb_per_s is None:
        return 0.0
    a, b, c = link.fit_gb_per_s
    lo, hi = math.log2(1.0 / 1e6), math.log2(max(max_chunk_bytes, 1.0) / 1e6)
    if hi <= lo:
        return 0.0
    bad = -math.inf                      # the largest x where the cost can fall
    for r in _roots(a, b, c):
        if lo < r <= hi and 2.0 * a * r + b < 0:
            bad = max(bad, r)            # the fit falls through 0: the price drops to the peak's
    peak = link.max_bytes_per_s / 1e9
    ga, gb, gc = math.log(2) * a, math.log(2) * b - 2.0 * a, math.log(2) * c - b
    cuts = sorted({lo, hi, *[r for r in _roots(a, b, c) + _roots(a, b, c - peak) + _roots(ga, gb, gc) if lo < r < hi]})
    for x0, x1 in zip(cuts, cuts[1:]):
        xm = 0.5 * (x0 + x1)
        fm = a * xm * xm + b * xm + c
        if 0.0 < fm < peak and ga * xm * xm + gb * xm + gc < 0:
            bad = max(bad, x1)           # g keeps its sign between consecutive cuts (its roots are cuts)
    if bad == -math.inf:
        return 0.0
    return min(max_chunk_bytes, 2.0 ** bad * 1e6)


def _inter_links(cluster, device_type: str | None = None) -> list[Link]:
    """The inter-node links a ring through a node of ``device_type`` can have (None: every inter-node link).

    A ring across nodes has an edge at each of its nodes, so it is no faster than the fastest link
    that touches a node of that type: v2 clusters' type-pair links with that type, and every zone link.
    """
    net = getattr(cluster, "network", None)
    if net is None:
        return [cluster.inter_node]
    links = []
    types = sorted(cluster.count_by_type())
    if device_type is not None and hasattr(cluster, "type_link"):
        for u in types:
            try:
                links.append(cluster.type_link(device_type, u))
            except HppInputError:          # no such pair: no ring uses it
                pass
        if not links:
            links.append(cluster.inter_node)
    else:
        links.append(cluster.inter_node)
        links.extend((getattr(net, "inter", None) or {}).values())
    links.extend((getattr(net, "zone_links", None) or {}).values())
    return list(dict.fromkeys(links))


def _has_hierarchical() -> bool:
    """Whether the cost model may price a gradient sync hierarchically (:mod:`hpp.formulation.collectives`)."""
    import importlib.util

    return importlib.util.find_spec("hpp.formulation.collectives") is not None


def cluster_links(cluster, device_type: str | None = None) -> tuple[int, list[Link], list[Link]]:
    """(most devices of a node, its distinct intra-node links, the distinct inter-node links ([] on one node)),
    over the nodes of ``device_type`` (None: all nodes)."""
    nodes = [nd for nd in cluster.nodes if device_type is None or nd.device_type == device_type] or cluster.nodes
    node_max = max(nd.num_devices for nd in nodes)
    intra = list(dict.fromkeys(nd.intra_node for nd in nodes))
    inter = _inter_links(cluster, device_type) if len(cluster.nodes) > 1 else []
    return node_max, intra, inter


def stage_sync_rate(cluster, a: int, b: int, tp: int, beta_max: float, *, hierarchical: bool = True,
                    links: tuple[int, list[Link], list[Link]] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, float]:
    """:func:`sync_rate_table` of a stage with TP degree ``tp`` synced among h in [a, b] holders, over
    the all-reduce forms the cost model prices (:mod:`hpp.formulation.collectives`).

    Ring j of a block has one rank per holder stage; a node of n devices holding this stage's TP
    group (tp devices) holds at most g_max = n - tp + 1 ranks of it (``links``: the nodes of the
    stage's device type, :func:`cluster_links`). So: a flat ring on one node
    (h <= g_max: any link), a flat ring across nodes (no faster than the fastest inter-node link at
    the chunk size), or hierarchical with g <= min(g_max, h / 2) ranks per node, whose inter-node
    ring moves 2 (h-g)/h * W/g bytes per rank at chunk W/h with 2 (h/g - 1) latencies (its
    in-node parts are left out). The least of the forms possible is taken; each is at its least
    over h in [a, b] (2/g - 2/h >= 2/g' - 2/a). ``hierarchical=False``: flat rings only (a cost model
    without the hierarchical form). The third value, beta_0 [bytes]: from it up the cost of a block
    grows with its bytes on every link used (:func:`ring_cost_increasing_from`), so a block of own
    bytes w >= beta_0 costs at least a block of exactly w: a stage of W own bytes then costs at least
    W times the least rate up to max(W, beta_0) (the blocks below beta_0 at the least rate up to
    beta_0), not up to the most bytes any candidate holds there.
    """
    node_max, intra, inter = links or cluster_links(cluster)
    g_max = max(1, node_max - tp + 1)
    flat_links = intra + inter if a <= g_max else (inter or intra)
    tops, rate = sync_rate_table(flat_links, a, b, beta_max)
    used = list(flat_links)
    g = min(g_max, b // 2)
    if hierarchical and inter and g >= 2:
        _, hier = sync_rate_table(inter, a, b, beta_max, factor=max(0.0, 2.0 / g - 2.0 / a),
                                  latency_steps=max(0.0, 2.0 * (a / g - 1.0)))
        rate = np.minimum(rate, hier)
        used += inter
    chunk0 = max(ring_cost_increasing_from(link, beta_max / max(a, 1)) for link in dict.fromkeys(used))
    return tops, rate, min(beta_max, chunk0 * b)


class _StepLP:
    """The exact-step capacity LP of one pipeline-count range: max obj.x s.t. A x <= u, x >= 0.

    A is (device types + 1) x (device-count vectors): devices per copy, and 1 per copy for the row
    ``sum x <= b``. A dense revised primal simplex (Dantzig pricing, Bland's rule after 50
    pivots): with 3-7 rows a solve is a few small dense solves, and the basis of the previous
    solve (the same A and u, only the objective changes as T moves) is kept as the start, so
    most solves take 0-2 pivots. GLOP took 1-2 ms a solve through the model builder.
    """

    def __init__(self, group_devices: np.ndarray, inventory: np.ndarray, h_hi: int) -> None:
        K, ng = group_devices.shape
        self.A = np.vstack([group_devices, np.ones((1, ng))])
        self.m, self.n = self.A.shape
        self.u = np.r_[inventory, float(h_hi)]
        self.full = np.hstack([self.A, np.eye(self.m)])        # structural columns, then slacks
        self.basis = list(range(ng, ng + self.m))              # the slack basis (x = 0) is feasible
        self.solves = 0

    def solve(self, obj: np.ndarray) -> tuple[float, np.ndarray | None]:
        self.solves += 1
        if not np.any(obj > 0):
            return 0.0, None
        m, n = self.m, self.n
        cfull = np.r_[obj, np.zeros(m)]
        scale = float(obj.max())
        B = list(self.basis)
        for it in range(200):
            try:
                Binv = np.linalg.inv(self.full[:, B])
            except np.linalg.LinAlgError:
                B = list(range(n, n + m))          # restart from the slack basis
                continue
            xB = Binv @ self.u
            y = cfull[B] @ Binv
            red = cfull - y @ self.full
            red[B] = 0.0
            if it < 50:
                e = int(np.argmax(red))
                if red[e] <= 1e-12 * scale:
                    break
            else:                                  # Bland: the first improving column
                cand = np.flatnonzero(red > 1e-12 * scale)
                if not len(cand):
                    break
                e = int(cand[0])
            d = Binv @ self.full[:, e]
            pos = d > 1e-12
            if not pos.any():
                return math.inf, None              # unbounded (no device row limits the column)
            ratios = np.where(pos, np.maximum(xB, 0.0) / np.where(pos, d, 1.0), np.inf)
            r = float(ratios.min())
            leave = int(np.flatnonzero(ratios <= r + 1e-15)[0]) if it < 50 else \
                min(np.flatnonzero(ratios <= r + 1e-15).tolist(), key=lambda i: B[i])
            B[leave] = e
        else:
            log.debug("step LP: no optimum after 200 pivots")
        self.basis = B
        x = np.zeros(n + m)
        x[B] = np.maximum(np.linalg.solve(self.full[:, B], self.u), 0.0)
        return float(obj @ x[:n]), x[:n]


class _Search:
    """Arrays of one problem shared by every range."""

    def __init__(self, problem: CompositionProblem) -> None:
        self.problem = problem
        cands = problem.candidates
        self.G = G = problem.global_batch_size
        n = len(cands)
        types = list(problem.inventory)
        self.inventory = np.array([float(problem.inventory[t]) for t in types])
        self.b = np.array([c.micro_batch_size for c in cands], dtype=np.float64)
        self.phi = np.array([c.partition.fill_s for c in cands])
        self.tau = np.array([c.partition.bottleneck_s for c in cands])
        self.opt = np.array([c.partition.optimizer_s for c in cands])
        self.kmax = np.ceil(G / self.b)
        self.fits = np.array([problem.max_copies(c) >= 1 for c in range(n)])
        row = {t: r for r, t in enumerate(types)}
        keys: dict[tuple, int] = {}
        group = np.empty(n, dtype=np.int64)
        vecs = []
        for j, c in enumerate(cands):
            key = tuple(sorted(c.devices.items()))
            g = keys.get(key)
            if g is None:
                g = keys[key] = len(vecs)
                v = np.zeros(len(types))
                for t, k in c.devices.items():
                    v[row[t]] = k
                vecs.append(v)
            group[j] = g
        self.group = group
        self.group_devices = np.array(vecs).T if vecs else np.zeros((len(types), 0))
        self.order = np.argsort(group, kind="stable")
        self.starts = np.flatnonzero(np.r_[True, np.diff(group[self.order]) != 0])
        self.num_devices = np.array([c.num_devices for c in cands], dtype=np.float64)
        # the largest stage gradient of each candidate and the most bytes any candidate holds for its layers
        self.w_stage = np.zeros(n)
        self.beta_max = np.zeros(n)
        stage_kind = [max(c.shape, key=lambda k: k.tp_degree) for c in cands]
        L = max((len(c.partition.layer_param_bytes) for c in cands), default=0)
        if L and all(len(c.partition.layer_param_bytes) == L for c in cands):
            layer_max = np.max(np.array([c.partition.layer_param_bytes for c in cands]), axis=0)
            prefix = np.r_[0.0, np.cumsum(layer_max)]
            for j, c in enumerate(cands):
                spb = c.partition.stage_param_bytes
                s = max(range(len(spb)), key=spb.__getitem__)
                bnd = c.partition.boundaries
                self.w_stage[j] = spb[s]
                stage_kind[j] = c.shape[s]
                self.beta_max[j] = max(prefix[bnd[s + 1]] - prefix[bnd[s]], spb[s])
        else:           # no per-layer bytes: blocks can be as large as the largest stage of any candidate
            for j, c in enumerate(cands):
                self.w_stage[j] = max(c.partition.stage_param_bytes, default=0.0)
            self.beta_max[:] = self.w_stage.max(initial=0.0)
        # the device type and TP degree of each candidate's largest stage, numbered
        kind_id: dict[tuple[str, int], int] = {}
        self.kind = np.array([kind_id.setdefault((k.device_type, k.tp_degree), len(kind_id)) for k in stage_kind],
                             dtype=np.int64)
        self.kinds = {i: k for k, i in kind_id.items()}
        cl = problem.cluster
        self.hier = _has_hierarchical()
        self.links = {t: cluster_links(cl, t) for t in {k for _, (k, _) in self.kinds.items()}}
        self.node_max = max((nd.num_devices for nd in cl.nodes), default=1)
        self.h_max = int(min(sum(problem.inventory.values()),
                             sum(problem.max_copies(c) for c in range(n)) if n else 0))

    def penalty(self, a: int, b: int) -> np.ndarray:
        """pen_c over the range [a, b]: sync floor + optimizer step [s] (inf where no copy fits)."""
        if a < 2:
            pen = self.opt.copy()
        else:
            pen = self.opt.copy()
            bmax = float(self.beta_max.max(initial=1.0))
            for key in np.unique(self.kind).tolist():
                dtype, tp = self.kinds[key]
                tops, rate, beta0 = stage_sync_rate(self.problem.cluster, a, b, tp, bmax, hierarchical=self.hier,
                                                   links=self.links[dtype])
                sel = self.kind == key
                cap = np.minimum(np.maximum(self.w_stage[sel], beta0), self.beta_max[sel])
                idx = np.minimum(np.searchsorted(tops, cap), len(tops) - 1)
                pen[sel] += self.w_stage[sel] * rate[idx] * (1.0 - 1e-12)
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
        self.lp = _StepLP(s.group_devices, s.inventory, b)
        self.pen = s.penalty(a, b)
        self.levels = np.unique(self.pen[np.isfinite(self.pen)])

    def few_copies_s(self, allowed: np.ndarray) -> float:
        """A lower bound of T_pipe with at most b copies of ``allowed`` candidates [s]: b copies finish at most
        b times the most samples one copy finishes, so one copy must finish G / b samples."""
        s = self.s
        k = np.ceil(np.ceil(s.G / self.b) / s.b)
        t = s.phi + (np.minimum(k, s.kmax) - 1.0) * s.tau
        return float(np.min(np.where(allowed, t, np.inf), initial=np.inf))

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
    from hpp.formulation.heuristics import _fill_in_order

    _, _, xs, _ = sol
    base = {c: int(math.floor(x + 1e-9)) for c, x in xs.items()}
    base = {c: x for c, x in base.items() if x > 0}
    out = [base] if base else []
    order = sorted(xs, key=lambda c: -(xs[c] - math.floor(xs[c] + 1e-9)))
    filled, _ = _fill_in_order(problem, base, order + extra_order)
    if filled and filled != base:
        out.append(filled)
    return [p for p in out if p and problem.fits(p)]


def local_search(problem: CompositionProblem, counts: dict[int, int], obj: float, pool: list[int], *,
                 max_evals: int = 400,
                 max_rounds: int = 50) -> tuple[dict[int, int], float, int]:
    """First-improvement search over copy counts: one copy less, one more (of ``pool``), or one swapped.

    Returns (counts, objective, evaluations). Stops at a local optimum or after ``max_evals`` prices
    (a count, not a clock: the same input gives the same plan).
    """
    evals = 0
    pool = list(dict.fromkeys([*counts, *pool]))
    for _ in range(max_rounds):
        if evals >= max_evals:
            break
        improved = False
        moves: list[dict[int, int]] = []
        for c in list(counts):
            t = dict(counts)
            t[c] -= 1
            if not t[c]:
                del t[c]
            moves.append(t)
        for c in pool:
            t = dict(counts)
            t[c] = t.get(c, 0) + 1
            moves.append(t)
        for c in list(counts):
            for d in pool:
                if d == c:
                    continue
                t = dict(counts)
                t[c] -= 1
                if not t[c]:
                    del t[c]
                t[d] = t.get(d, 0) + 1
                moves.append(t)
        for t in moves:
            if not t or not problem.fits(t):
                continue
            evals += 1
            v = composition_objective_s(problem, t)
            if v < obj * (1 - 1e-12):
                counts, obj, improved = t, v, True
                break
            if evals >= max_evals:
                break
        if not improved:
            break
    return counts, obj, evals


def copy_bound(problem: CompositionProblem, *, bound_problem: CompositionProblem | None = None,
               incumbent: tuple[dict[int, int], float] | None = None, cutoff_s: float | None = None,
               rel_tol: float = 1e-4, max_evals: int = 400, pool_size: int = 8) -> CopyBound:
    """Lower bound of the objective over all plans of the candidates, and the best plan met on the way.

    Parameters
    ----------
    problem : CompositionProblem
        The search problem: what plans fit, and the price of the plans tried
        (:func:`~hpp.formulation.composition.composition_objective_s`).
    bound_problem : CompositionProblem, optional
        The same candidates (same indices) with lower-bound times (:meth:`CompositionProblem.bound_problem`);
        the bound is computed on its times, with the sync floor of :func:`stage_sync_rate`. Default:
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
            v = composition_objective_s(problem, plan)
            if v < best_obj:
                best_counts, best_obj = plan, v
                if exact_prices:
                    cut_s = min(cut_s, v)

    for a, b in h_ranges(s.h_max, s.node_max):
        rg = _Range(s, a, b)
        L = rg.levels
        if not len(L):
            continue
        cut = min(cut_s, bound)
        quick = L[0] + rg.few_copies_s(np.isfinite(rg.pen))
        if quick >= cut * (1 - rel_tol):        # b copies cannot finish G in time: no LP needed
            bound = min(bound, quick)
            out_ranges.append((a, b, quick))
            continue
        r_bound = math.inf
        t_top, exact, sol = rg.least_T(L[-1], cut - L[0])
        nodes += 1
        consider(sol)
        if exact:
            r_bound = L[-1] + t_top
        stack = [(0, len(L) - 1, t_top)]
        while stack:
            i, j, fj = stack.pop()
            lower = L[i] + fj
            cut = min(cut_s, r_bound, bound)
            if lower >= cut * (1 - rel_tol) or i == j:
                r_bound = min(r_bound, lower)
                continue
            k = (i + j) // 2
            t_k, exact, sol = rg.least_T(L[k], cut - L[i])
            nodes += 1
            consider(sol)
            if exact:
                r_bound = min(r_bound, L[k] + t_k)
            stack.append((k + 1, j, fj))
            stack.append((i, k, t_k))
        solves += rg.lp.solves
        bound = min(bound, r_bound)
        out_ranges.append((a, b, r_bound))
    pool = sorted(pool_score, key=lambda c: -pool_score[c])[:pool_size]
    if best_counts and max_evals > 0:
        best_counts, best_obj, _ = local_search(problem, dict(best_counts), best_obj, pool, max_evals=max_evals)
        if exact_prices:
            cut_s = min(cut_s, best_obj)
    bound = min(bound, cut_s)
    log.debug("copy bound %.6g, incumbent %.6g, %d nodes, %d LP solves", bound, best_obj, nodes, solves)
    return CopyBound(bound, dict(best_counts), best_obj, nodes, solves, time.perf_counter() - t0, out_ranges)
