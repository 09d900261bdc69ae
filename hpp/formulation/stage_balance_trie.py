"""The suffix trie of :func:`hpp.formulation.stage_balance_batch.balance_pairs`: its nodes and their stage costs.

A node is (micro-batch size, suffix of a shape, link options into the suffix's first stage); each node
refers to a stage cost (kind, size, distance from the end, link options in and out) and to the common
table of its (kind, size). The costs of all nodes are priced in one numpy batch (:meth:`SuffixTrie.costs`)
with the same element-wise operations as the per-shape DP (:meth:`StageBalancer._stage_costs`), so the
values are equal bit for bit.
"""

from __future__ import annotations

import numpy as np

from hpp.formulation.stage_balance import StageBalancer, StageKind
from hpp.formulation.stage_costs import stacked_costs_on_links

__all__ = ["SuffixTrie"]


class SuffixTrie:
    """Nodes (micro-batch size, suffix) of the pairs' shapes, their cost and table indices."""

    def __init__(self, balancer: StageBalancer, shapes: list[tuple[StageKind, ...]],
                 pairs: list[tuple[int, int]]) -> None:
        self.balancer = balancer
        self.ids: dict = {}
        parent, level, cost_of, table_of = [0], [0], [-1], [-1]
        cost_ids: dict = {}
        table_ids: dict = {}
        mask_ids: dict = {}
        time_ids: dict = {}
        self.cost_mask: list = []          # per cost: index into masks (kind, b, d) ...
        self.cost_time: list = []          # ... and into times (kind, b, link_in, link_out)
        self.masks: list = []
        self.times: list = []              # (kind, b, link_in, link_out) of each stage time, priced by costs()
        self.tables: list = []

        link_out_of = balancer.link_out

        def node(b: int, suffix: tuple, link_in: tuple) -> int:
            # a node is a suffix AND the link options into its first stage (links per pair of
            # stage kinds); a whole shape's first stage receives nothing (StageBalancer.first_link_in)
            key = (b, suffix, link_in)
            got = self.ids.get(key)
            if got is not None:
                balancer.rows_reused += 2          # both objectives' rows of this suffix, shared
                return got
            kind, d = suffix[0], len(suffix)
            link_out = link_out_of(suffix)
            p = node(b, suffix[1:], link_out) if d > 1 else 0
            ck = (kind, b, d, link_in, link_out)
            if ck not in cost_ids:              # priced in one batch by costs()
                cost_ids[ck] = len(self.cost_mask)
                mk, tk = (kind, b, d), (kind, b, link_in, link_out)
                if mk not in mask_ids:
                    mask_ids[mk] = len(self.masks)
                    self.masks.append(balancer.stage_masks(kind, b, d))
                if tk not in time_ids:
                    time_ids[tk] = len(self.times)
                    self.times.append(tk)
                self.cost_mask.append(mask_ids[mk])
                self.cost_time.append(time_ids[tk])
            tk = (kind, b)               # all but the times (in costs) is the same on any link options
            if tk not in table_ids:
                table_ids[tk] = len(self.tables)
                self.tables.append(balancer.base_table(kind, b))
            n = self.ids[key] = len(parent)
            parent.append(p), level.append(d), cost_of.append(cost_ids[ck]), table_of.append(table_ids[tk])
            balancer.rows_computed += 2
            return n

        first = [balancer.first_link_in(s) for s in shapes]
        self.pair_node = np.array([node(b, shapes[i], first[i]) for i, b in pairs], dtype=np.int64)
        self.parent = np.array(parent, dtype=np.int64)
        self.level = np.array(level, dtype=np.int64)
        self.cost_of = np.array(cost_of, dtype=np.int64)
        self.table_of = np.array(table_of, dtype=np.int64)
        self._stacked: dict[str, np.ndarray] = {}

    def costs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(C, U, P2): per cost (stage kind, size, distance from the end, link options in and out) its
        compute per micro-batch (M, L+1, L+1) [s] with the cheapest recomputation mode that fits (inf if none),
        the full-recomputation mask (M, L+1, L+1) and both p2p sends 2 x p2p (M, L+1) [s]: the values of
        :meth:`StageBalancer._stage_costs` (the same element-wise selections), for all costs at once."""
        bal = self.balancer
        mi, ti = np.array(self.cost_mask, dtype=np.int64), np.array(self.cost_time, dtype=np.int64)
        upper = np.triu(np.ones(self.masks[0][0].shape, dtype=bool), k=1)
        full_m = np.stack([m[1] for m in self.masks])
        fits = np.stack([m[0] for m in self.masks]) & upper       # where the tables' times are finite: u < v
        use = full_m & upper if bal.allow_recompute else None
        base_of: dict = {}                 # the stage times of all (kind, b, link_in, link_out) in one batch ...
        p2p_of: dict = {}                  # ... and their transfers, once per (kind, b, link options)
        which, p_in, p_out = [], [], []
        for k, b, i, o in self.times:
            which.append(base_of.setdefault((k, b), len(base_of)))
            p_in.append(p2p_of.setdefault((k, b, i), len(p2p_of)))
            p_out.append(p2p_of.setdefault((k, b, o), len(p2p_of)))
        P = np.stack([bal.link_p2p(k, b, i) for k, b, i in p2p_of])
        which, p_in, p_out = (np.array(x, dtype=np.int64) for x in (which, p_in, p_out))
        C = stacked_costs_on_links([bal.base_table(k, b) for k, b in base_of], which, P[p_in], P[p_out], ti, fits,
                                   use if use is not None and use.any() else None, mi, config=bal.cache.config)
        return C, full_m[mi], 2.0 * P[p_out[ti]]

    def stacked(self, name: str) -> np.ndarray:
        """``(T, ...)`` field ``name`` of every table, stacked once (both assemblies read them)."""
        got = self._stacked.get(name)
        if got is None:
            got = self._stacked[name] = np.stack([np.asarray(getattr(tb, name)) for tb in self.tables])
        return got
