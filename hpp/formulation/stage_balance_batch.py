"""The stage-balance DP of many (shape, micro-batch size) pairs at once, as numpy batches.

Same DP, same results as :meth:`hpp.formulation.stage_balance.StageBalancer.balance_both`
(bit for bit: the same float64 operations in the same order, the same first-index tie
rule; tests/test_stage_balance_batch.py checks every pair of the benchmark's inputs),
but organised for the candidate search, where one call covers thousands of shapes:

1. The suffixes of all shapes form a trie (node = (micro-batch size, suffix)); every
   node's DP rows (the least-bottleneck row and the least-fill row, over the first
   layer u) are computed once, level by level (suffix length d = 1, 2, ...), each
   level as one batch of (nodes, L+1, L+1) arrays. This is the memoisation of the
   per-shape DP (rows per suffix), done for all shapes together
   (:class:`~hpp.formulation.stage_balance_trie.SuffixTrie`; on per-pair links a node also carries
   the link options into its first stage, and all stage costs are priced in one batch).
2. The least-fill partition of each pair is read back from its chain of suffix rows.
3. The threshold DP (least fill among stages <= the pair's bottleneck) runs for all
   pairs that need it, batched over pairs, step d from the last stage.
4. The partitions are assembled from the stage costs and the stacked (kind, size) tables by fancy indexing.

Results stay arrays (:class:`PartitionBatch`) so that dominance can be decided before
any :class:`~hpp.formulation.stage_balance.Partition` object is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpp.formulation.stage_balance import _REL_TIE, Partition, StageBalancer, StageKind
from hpp.formulation.stage_balance_trie import SuffixTrie as _Trie
from hpp.pruning.rules import dead_suffix_mask

__all__ = ["PartitionBatch", "balance_pairs"]

_CHUNK = 1024          # rows per numpy batch (bounds the (rows, L+1, L+1) temporaries to ~6 MB each)


@dataclass(frozen=True)
class PartitionBatch:
    """Partitions as arrays, one row per partition (R rows, S_max stages, L layers).

    Attributes
    ----------
    shape_index, micro_batch_size, variant, num_stages : (R,) int
        Which shape (index into the caller's list), at which size; variant 0 is the
        least-bottleneck partition, 1 the least-fill one (only when it differs).
    boundaries : (R, S_max+1) int
        (0, hi_0, ..., L), padded with L after stage S-1.
    recompute : (R, S_max) bool
    bottleneck_s, fill_s, optimizer_s : (R,) float [s]
    stage_param_bytes, stage_memory_bytes : (R, S_max) float [bytes] (0 past the last stage)
    layer_param_bytes : (R, L) float [bytes]
    """

    shape_index: np.ndarray
    micro_batch_size: np.ndarray
    variant: np.ndarray
    num_stages: np.ndarray
    boundaries: np.ndarray
    recompute: np.ndarray
    bottleneck_s: np.ndarray
    fill_s: np.ndarray
    optimizer_s: np.ndarray
    stage_param_bytes: np.ndarray
    stage_memory_bytes: np.ndarray
    layer_param_bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.shape_index)

    def take(self, rows: np.ndarray) -> "PartitionBatch":
        """The rows ``rows`` (indices or a boolean mask), in that order."""
        return PartitionBatch(*(getattr(self, f)[rows] for f in _FIELDS))

    @staticmethod
    def concat(batches: list["PartitionBatch"], num_layers: int) -> "PartitionBatch":
        """Rows of all ``batches`` in turn (stage columns padded to the widest)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            return empty_batch(num_layers)
        width = max(b.recompute.shape[1] for b in batches)
        out = []
        for f in _FIELDS:
            parts = []
            for b in batches:
                a = getattr(b, f)
                if a.ndim == 2 and f in _STAGE_FIELDS:
                    pad = width + (f == "boundaries") - a.shape[1]
                    if pad:
                        fill = num_layers if f == "boundaries" else 0
                        a = np.concatenate([a, np.full((a.shape[0], pad), fill, dtype=a.dtype)], axis=1)
                parts.append(a)
            out.append(np.concatenate(parts))
        return PartitionBatch(*out)

    @staticmethod
    def from_partitions(rows: list[tuple[int, int, int, Partition]], num_layers: int) -> "PartitionBatch":
        """A batch of (shape index, micro-batch size, variant, partition) rows."""
        if not rows:
            return empty_batch(num_layers)
        S_max = max(len(p.recompute) for *_, p in rows)

        def padded(values, width, fill, dtype):
            return np.array([list(v) + [fill] * (width - len(v)) for v in values], dtype=dtype)

        parts = [p for *_, p in rows]
        return PartitionBatch(
            np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows], dtype=np.int64),
            np.array([r[2] for r in rows], dtype=np.int64), np.array([len(p.recompute) for p in parts], dtype=np.int64),
            padded([p.boundaries for p in parts], S_max + 1, num_layers, np.int64),
            padded([p.recompute for p in parts], S_max, False, bool),
            np.array([p.bottleneck_s for p in parts]), np.array([p.fill_s for p in parts]),
            np.array([p.optimizer_s for p in parts]), padded([p.stage_param_bytes for p in parts], S_max, 0.0, float),
            padded([p.stage_memory_bytes for p in parts], S_max, 0.0, float),
            np.array([p.layer_param_bytes for p in parts], dtype=float).reshape(len(parts), num_layers))

    def partitions(self) -> list[Partition]:
        """One :class:`Partition` per row (Python floats, ints and bools, as the per-shape DP gives)."""
        S = self.num_stages.tolist()
        bnd, rec = self.boundaries.tolist(), self.recompute.tolist()
        par, mem, lp = self.stage_param_bytes.tolist(), self.stage_memory_bytes.tolist(), self.layer_param_bytes.tolist()
        bott, fill, opt = self.bottleneck_s.tolist(), self.fill_s.tolist(), self.optimizer_s.tolist()
        return [Partition(tuple(bnd[r][:s + 1]), tuple(rec[r][:s]), bott[r], fill[r], opt[r], tuple(par[r][:s]),
                          tuple(mem[r][:s]), tuple(lp[r])) for r, s in enumerate(S)]


_FIELDS = tuple(PartitionBatch.__dataclass_fields__)
_STAGE_FIELDS = ("boundaries", "recompute", "stage_param_bytes", "stage_memory_bytes")


def empty_batch(num_layers: int) -> PartitionBatch:
    """A batch without rows."""
    i = np.zeros(0, dtype=np.int64)
    f = np.zeros(0)
    return PartitionBatch(i, i, i, i, np.zeros((0, 1), dtype=np.int64), np.zeros((0, 0), dtype=bool), f, f, f,
                          np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, num_layers)))


def _chunks(ids: np.ndarray):
    for lo in range(0, len(ids), _CHUNK):
        yield ids[lo:lo + _CHUNK]


def _take_last(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """a[k, u, v[k, u]] for a (K, L+1, L+1) and v (K, L+1)."""
    return np.take_along_axis(a, v[:, :, None], axis=2)[:, :, 0]


def balance_pairs(balancer: StageBalancer, shapes: list[tuple[StageKind, ...]], pairs: list[tuple[int, int]],
                  *, prune_dead_suffixes: bool = True) -> tuple[PartitionBatch, dict[str, int]]:
    """Stage-balance every (shape index, micro-batch size) of ``pairs``, batched (see the module docstring).

    Parameters
    ----------
    balancer : StageBalancer
        Supplies the memoised stage costs and tables (and counts DP rows).
    shapes : list of shapes (tuples of :class:`StageKind`, first stage first, 1 <= S <= L).
    pairs : list of (shape index, micro-batch size), each at most once.
    prune_dead_suffixes : bool
        Rule ``memory_infeasible``: a suffix whose rows are all inf (it cannot hold [u, L) for
        any u) is not extended; pairs ending with it are counted in ``shapes_pruned_memory``.

    Returns
    -------
    (batch, stats)
        For each feasible pair, in the order of ``pairs``: its least-bottleneck partition
        (variant 0), then its least-fill partition (variant 1) when that has a larger
        bottleneck and other boundaries or recomputation; stats: balanced, infeasible,
        shapes_pruned_memory, fill_variants.

    Raises
    ------
    HppInputError
        The profile lacks (device type, TP, micro-batch size) of a stage.
    """
    L = balancer.num_layers
    stats = {"shapes_pruned_memory": 0, "balanced": 0, "infeasible": 0, "fill_variants": 0}
    if not pairs:
        return empty_batch(L), stats
    trie = _Trie(balancer, shapes, pairs)
    C, U, P2 = trie.costs()           # (M, L+1, L+1) compute per micro-batch [s], recomputation; (M, L+1) 2 p2p [s]
    N = len(trie.parent)
    empty = np.full(L + 1, np.inf)
    empty[L] = 0.0
    RB = np.full((N, L + 1), np.inf)                          # least bottleneck of [u, L) on the suffix
    FB, FS = RB.copy(), RB.copy()                             # least fill's (bottleneck, fill)
    FV = np.full((N, L + 1), L, dtype=np.int64)               # least fill's end of the first stage
    FF = np.zeros((N, L + 1), dtype=bool)                     # ... and its recomputation
    RB[0] = FB[0] = FS[0] = empty
    dead = np.zeros(N, dtype=bool)
    for d in range(1, int(trie.level.max()) + 1):
        ids = np.flatnonzero(trie.level == d)
        if prune_dead_suffixes and d > 1:
            dead[ids] = dead_suffix_mask(dead[trie.parent[ids]], RB[trie.parent[ids]])
            ids = ids[~dead[ids]]
        # the band: a suffix of d stages starts at u <= L - d, its first stage ends at 1 <= v <= L - d + 1
        # (rows outside stay inf; the first-index argmin of a row with a finite entry lies inside)
        w = L - d + 1
        Cb, Ub, P2b = C[:, :w, 1:w + 1], U[:, :w, 1:w + 1], P2[:, 1:w + 1]
        for chunk in _chunks(ids):
            par, m = trie.parent[chunk], trie.cost_of[chunk]
            Cm = Cb[m]
            RB[chunk, :w] = np.maximum(Cm, RB[par, 1:w + 1][:, None, :]).min(axis=2)
            bott = np.maximum(Cm, FB[par, 1:w + 1][:, None, :])
            total = Cm + P2b[m][:, None, :] + FS[par, 1:w + 1][:, None, :]
            best = total.min(axis=2)
            tie = total <= best[:, :, None] * (1.0 + _REL_TIE)
            v = np.where(tie, bott, np.inf).argmin(axis=2)
            FB[chunk, :w], FS[chunk, :w], FV[chunk, :w], FF[chunk, :w] = _take_last(bott, v), \
                _take_last(total, v), v + 1, _take_last(Ub[m], v)

    node = trie.pair_node
    S = trie.level[node]
    pruned = dead[node]
    tau = RB[node, 0]
    feasible = ~pruned & np.isfinite(tau)
    stats["shapes_pruned_memory"] = int(pruned.sum())
    stats["balanced"] = int((~pruned).sum())
    stats["infeasible"] = int((~pruned & ~np.isfinite(tau)).sum())
    k_all = np.flatnonzero(feasible)
    if not len(k_all):
        return empty_batch(L), stats
    S_max = int(S[k_all].max())
    chain = np.zeros((len(k_all), S_max), dtype=np.int64)     # chain[k, i] = node of suffix shape[i:]
    chain[:, 0] = node[k_all]
    for i in range(1, S_max):
        chain[:, i] = trie.parent[chain[:, i - 1]]
    Sk = S[k_all]
    # least-fill partitions: read back along the chain of suffix rows
    few_bnd, few_rec = _walk(len(k_all), Sk, S_max, L, lambda i, u: (FV[chain[:, i], u], FF[chain[:, i], u]))
    few = _assemble(trie, chain, Sk, few_bnd, few_rec, L, C)
    few_fill = FS[node[k_all], 0]
    lim = tau[k_all] * (1.0 + _REL_TIE)
    need = np.flatnonzero(few[0] > lim)                       # the least fill has a larger bottleneck
    part_bnd, part_rec, part_fill = few_bnd.copy(), few_rec.copy(), few_fill.copy()
    part = [a.copy() for a in few]
    if len(need):
        t_bnd, t_rec, t_fill = _threshold_fill(trie, chain[need], Sk[need], lim[need], C, U, P2, L)
        part_bnd[need], part_rec[need], part_fill[need] = t_bnd, t_rec, t_fill
        t = _assemble(trie, chain[need], Sk[need], t_bnd, t_rec, L, C)
        for a, b in zip(part, t):
            a[need] = b
    differs = np.zeros(len(k_all), dtype=bool)
    differs[need] = (np.any(few_bnd[need] != part_bnd[need], axis=1)
                     | np.any(few_rec[need] != part_rec[need], axis=1))
    stats["fill_variants"] = int(differs.sum())
    # rows: variant 0 of every feasible pair, each followed by its variant 1 where it differs
    rows0 = np.arange(len(k_all))
    order = np.argsort(np.concatenate([2 * rows0, 2 * rows0[differs] + 1]), kind="stable")
    pick = lambda a, b: np.concatenate([a, b[differs]])[order]          # noqa: E731
    shape_idx = np.array([pairs[k][0] for k in k_all.tolist()], dtype=np.int64)
    sizes = np.array([pairs[k][1] for k in k_all.tolist()], dtype=np.int64)
    batch = PartitionBatch(
        shape_index=pick(shape_idx, shape_idx), micro_batch_size=pick(sizes, sizes),
        variant=pick(np.zeros(len(k_all), dtype=np.int64), np.ones(len(k_all), dtype=np.int64)),
        num_stages=pick(Sk, Sk), boundaries=pick(part_bnd, few_bnd), recompute=pick(part_rec, few_rec),
        bottleneck_s=pick(part[0], few[0]), fill_s=pick(part_fill, few_fill), optimizer_s=pick(part[1], few[1]),
        stage_param_bytes=pick(part[2], few[2]), stage_memory_bytes=pick(part[3], few[3]),
        layer_param_bytes=pick(part[4], few[4]))
    return batch, stats


def _walk(n: int, Sk: np.ndarray, S_max: int, L: int, step) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries (n, S_max+1) and recomputation (n, S_max) from u = 0 through ``step(i, u) -> (v, full)``."""
    bnd = np.full((n, S_max + 1), L, dtype=np.int64)
    rec = np.zeros((n, S_max), dtype=bool)
    bnd[:, 0] = 0
    u = np.zeros(n, dtype=np.int64)
    for i in range(S_max):
        active = i < Sk
        v, full = step(i, u)
        u = np.where(active, v, L)
        bnd[:, i + 1] = u
        rec[:, i] = active & full
    return bnd, rec


def _threshold_fill(trie: _Trie, chain: np.ndarray, Sk: np.ndarray, lim: np.ndarray, C: np.ndarray, U: np.ndarray,
                    P2: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least fill with every stage <= ``lim`` (:func:`~hpp.formulation.stage_balance.least_fill_within`), batched.

    Pairs are grouped by stage count S and only the reachable band is computed: the stage at
    distance d from the end starts at u in [S-d, L-d] and ends at v in [S-d+1, L-d+1] (every
    stage holds a layer); the last stage ends at L, the first starts at 0. Every entry outside
    the band is inf in the full DP and is never on the backtracked path, and inside it the
    values and the first-index argmin are those of the full DP.

    Returns (boundaries (n, S_max+1), recompute (n, S_max), fill (n,)).
    """
    n, S_max = chain.shape
    rows = np.arange(n)
    ends = np.full((S_max + 1, n, L + 1), L, dtype=np.int64)  # ends[d, k, u]: end of the stage at distance d
    fill = np.empty(n)
    for S in np.unique(Sk).tolist():
        for k in _chunks(np.flatnonzero(Sk == S)):
            lim_k = lim[k][:, None]
            m = trie.cost_of[chain[k, S - 1]]                      # d = 1: the last stage ends at L
            c = C[m, :, L]
            best = np.where(c <= lim_k, c, np.inf) + P2[m, L][:, None] + 0.0
            for d in range(2, S):
                m = trie.cost_of[chain[k, S - d]]
                u0, v0, w = S - d, S - d + 1, L - S + 1
                Cm = C[:, u0:u0 + w, v0:v0 + w][m]
                total = (np.where(Cm <= lim_k[:, :, None], Cm, np.inf) + P2[m, v0:v0 + w][:, None, :]
                         + best[:, None, v0:v0 + w])
                v = total.argmin(axis=2)
                best = np.full((len(k), L + 1), np.inf)
                best[:, u0:u0 + w] = _take_last(total, v)
                ends[d, k[:, None], np.arange(u0, u0 + w)[None, :]] = v + v0
            if S == 1:
                fill[k] = best[:, 0]
                continue
            m = trie.cost_of[chain[k, 0]]                          # d = S: the first stage starts at 0
            c = C[m, 0, :]
            total = np.where(c <= lim_k, c, np.inf) + P2[m] + best
            v = total.argmin(axis=1)
            fill[k] = total[np.arange(len(k)), v]
            ends[S, k, 0] = v

    def step(i: int, u: np.ndarray):
        d = np.maximum(Sk - i, 0)
        v = ends[d, rows, u]
        return v, U[trie.cost_of[chain[:, i]], u, v]

    bnd, rec = _walk(n, Sk, S_max, L, step)
    return bnd, rec, fill


def _assemble(trie: _Trie, chain: np.ndarray, Sk: np.ndarray, bnd: np.ndarray, rec: np.ndarray, L: int,
              C: np.ndarray):
    """(bottleneck (n,), optimizer (n,), stage params (n, S_max), stage memory (n, S_max), layer params (n, L))
    of partitions ``bnd``/``rec``, as :meth:`StageBalancer.balance` assembles them (same float operations).

    A stage's time is read from its DP cost ``C`` (M, L+1, L+1): at a feasible partition's range that is
    the time of the recomputation mode ``rec`` chose (the full-recomputation time where it is used, else
    the stage fits without it), i.e. the table's ``compute_full_s`` / ``compute_none_s`` there."""
    n, S_max = chain.shape
    t = trie.table_of[chain]                                   # (n, S_max) table of each stage
    lo, hi = bnd[:, :-1], bnd[:, 1:]
    active = np.arange(S_max)[None, :] < Sk[:, None]
    t = np.where(active, t, 0)

    def at(name: str) -> np.ndarray:
        return trie.stacked(name)[t, lo, hi]

    comp = C[np.where(active, trie.cost_of[chain], 0), lo, hi]
    bott = np.maximum(0.0, np.where(active, comp, -np.inf).max(axis=1))
    opt = np.maximum(0.0, np.where(active, at("optimizer_s"), -np.inf).max(axis=1))
    params = np.where(active, at("param_bytes"), 0.0)
    in_flight = (Sk[:, None] - np.arange(S_max)[None, :]).astype(np.int64)
    act = np.where(rec, at("act_full_bytes"), at("act_none_bytes"))
    work = np.where(rec, at("work_full_bytes"), at("work_none_bytes"))
    fw = trie.stacked("framework_bytes")[t]
    with np.errstate(invalid="ignore"):            # 0 x inf past the last stage, masked below
        mem = at("weights_bytes") + in_flight * act + work + at("buffer_bytes")
    mem = np.where(active, mem + fw, 0.0)
    layers = np.arange(L)
    stage_of = (hi[:, :, None] <= layers[None, None, :]).sum(axis=1)       # (n, L) stage holding layer l
    pb = trie.stacked("param_bytes")
    layer_params = pb[np.take_along_axis(t, stage_of, axis=1), layers[None, :], layers[None, :] + 1]
    return bott, opt, params, mem, layer_params
