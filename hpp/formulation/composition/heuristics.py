"""Composition heuristics: the incumbent of the search (no bound).

:func:`greedy_composition` fills the inventory with the most sample-efficient candidates;
:func:`fill_heuristic` combines per-device-type fills, tops them up with mixed pipelines and
trims. Both price with :func:`hpp.formulation.composition.objective.composition_objective_s`; their fast
paths (running inventory totals, the closed-form objective of one candidate's copies) give the
same copies and the same floats as the plain definitions (tests/test_composition_fast_paths.py).
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.composition.problem import CompositionProblem

__all__ = ["greedy_composition", "fill_heuristic", "solo_objective_s", "best_incumbent", "heuristic_incumbent",
           "local_search",
           "rounded_lp_incumbent", "ROUNDED_MAX_EVALS", "ROUNDED_POOL"]


def _fill_in_order(problem: CompositionProblem, counts: dict[int, int], order: Sequence[int]
                   ) -> tuple[dict[int, int], list[int]]:
    """Add copies of each candidate of ``order`` in turn while they fit; (counts, copies added in order).

    The copies are those of adding one at a time while :meth:`CompositionProblem.fits` holds, found
    with running totals per inventory row: ``fits`` is monotone in the copies and checks the device
    rows of the types used and the TP rows of the group sizes used, so each candidate takes at once
    the most copies every row it is checked against still holds.
    """
    counts = dict(counts)
    added: list[int] = []
    rows_of = problem._copy_rows
    if any(x <= 0 for x in counts.values()) or any(rows_of(c) is None for c in counts):
        return _fill_by_fits(problem, counts, order, added)
    inv, cands = problem.inventory, problem.candidates
    used: dict[str, int] = {}          # devices per type
    need: dict[tuple[str, int], int] = {}   # per TP row fits checks: devices in groups of that size or larger

    def row_need(row: tuple[str, int]) -> int:
        return sum(x * rows_of(k)[1].get(row, 0) for k, x in counts.items())

    for c, x in counts.items():
        for t, n in rows_of(c)[0]:
            used[t] = used.get(t, 0) + n * x
    for c in counts:
        for row in rows_of(c)[2]:
            if row not in need:
                need[row] = row_need(row)
    if (any(n > inv.get(t, 0) for t, n in used.items())
            or any(n > problem.tp_capacity(*row) * row[1] for row, n in need.items())):
        return counts, added           # counts do not fit, so neither do more copies (fits is monotone)
    for i, c in enumerate(order):
        for t, n in cands[c].devices.items():
            if used.get(t, 0) + n > inv.get(t, 0):
                break                  # not one more copy fits this type (any candidate)
        else:
            rows = rows_of(c)
            if rows is None:
                return _fill_by_fits(problem, counts, order[i:], added)
            devices, coefs, sizes = rows
            a = min((inv.get(t, 0) - used.get(t, 0)) // n for t, n in devices)
            new: dict[tuple[str, int], int] = {}
            for row, coef in coefs.items():
                got = need.get(row)
                if got is None:
                    if row not in sizes:
                        continue       # fits checks the row only once a used candidate has groups of its size
                    got = new[row] = row_need(row)
                a = min(a, (problem.tp_capacity(*row) * row[1] - got) // coef)
            if a > 0:
                counts[c] = counts.get(c, 0) + a
                added.extend([c] * a)
                for t, n in devices:
                    used[t] = used.get(t, 0) + n * a
                need.update(new)
                for row, coef in coefs.items():
                    if row in need:
                        need[row] += coef * a
    return counts, added


def _fill_by_fits(problem: CompositionProblem, counts: dict[int, int], order: Sequence[int], added: list[int]
                  ) -> tuple[dict[int, int], list[int]]:
    """:func:`_fill_in_order` one copy at a time with :meth:`CompositionProblem.fits` (updates the arguments)."""
    for c in order:
        while True:
            counts[c] = counts.get(c, 0) + 1
            if not problem.fits(counts):
                counts[c] -= 1
                if counts[c] == 0:
                    del counts[c]
                break
            added.append(c)
    return counts, added


def greedy_composition(problem: CompositionProblem) -> tuple[dict[int, int], float]:
    """Fast heuristic (no bound): fill the inventory with the most sample-efficient candidates.

    Orders candidates by samples/s per device (b / tau / devices), adds copies while
    they fit, records the copies in the order added, and returns the best prefix of
    that sequence (fewer pipelines cost less gradient sync and fill), evaluated with
    :func:`composition_objective_s`. Several orders are tried (per micro-batch size
    and overall); the best wins.

    Returns
    -------
    (counts, objective_s)
    """
    cands = problem.candidates
    if not cands:
        return {}, math.inf
    best: tuple[dict[int, int], float] = ({}, math.inf)
    sizes = sorted({c.micro_batch_size for c in cands})
    per_copy = [-c.micro_batch_size / c.partition.bottleneck_s for c in cands]     # sort keys
    per_device = [v / c.num_devices for v, c in zip(per_copy, cands)]
    for restrict in [None, *sizes]:
        idx = [i for i, c in enumerate(cands) if restrict is None or c.micro_batch_size == restrict]
        for key in (per_device, per_copy):
            order = sorted(idx, key=key.__getitem__)
            _, sequence = _fill_in_order(problem, {}, order)
            if not sequence:
                continue
            n = len(sequence)
            checks = sorted({max(1, int(round(n * f))) for f in (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)}
                            | set(range(1, min(n, 8) + 1)))
            for k in checks:
                pref: dict[int, int] = {}
                for i in sequence[:k]:
                    pref[i] = pref.get(i, 0) + 1
                obj = composition_objective_s(problem, pref, cutoff_s=best[1])
                if obj < best[1]:
                    best = (pref, obj)
    return best


def solo_objective_s(problem: CompositionProblem, c: int) -> float:
    """Objective of filling the inventory with copies of candidate ``c`` alone [s] (inf if none fit)."""
    cand = problem.candidates[c]
    got = problem.caches.solo.get(id(cand))
    if got is None:
        x = problem.max_copies(c)
        got = problem.caches.solo[id(cand)] = _copies_objective_s(problem, c, x) if x > 0 else math.inf
    return got


def _copies_objective_s(problem: CompositionProblem, c: int, x: int) -> float:
    """``composition_objective_s(problem, {c: x})`` for x >= 1 copies of one candidate [s].

    The same floating-point operations without the general bookkeeping: the closed-form data balance
    of identical pipelines, and a block-wise sync whose blocks are the candidate's own stages (each
    stage all-reduces its layers' bytes, summed in layer order, among the x holders).
    """
    p = problem.candidates[c].partition
    t_pipe = p.fill_s + (-(-problem.global_batch_size // (x * problem.candidates[c].micro_batch_size)) - 1) \
        * p.bottleneck_s
    t_sync = 0.0
    if x > 1:
        bnd, layer_bytes = p.boundaries, p.layer_param_bytes
        specs = problem.stage_sync_specs(c) if problem.per_type_sync else None   # per-pair: type links
        for s, (lo, hi) in enumerate(zip(bnd, bnd[1:])):
            if lo >= hi:                       # empty stages: the general blocks
                return composition_objective_s(problem, {c: x})
            t_sync = max(t_sync, problem.ring_s(sum(layer_bytes[lo:hi]), x) if specs is None
                         else problem.type_ring_s(specs[s][0], specs[s][1], sum(layer_bytes[lo:hi]), x))
    return t_pipe + t_sync + p.optimizer_s


def _solo_floors_s(problem: CompositionProblem) -> list[float]:
    """Per candidate, a lower bound on :func:`solo_objective_s` [s]: its copies' T_pipe + T_opt
    (sync left out, so at most the objective), shrunk by 1e-9 against rounding; inf where no copy fits."""
    out = []
    G = problem.global_batch_size
    for c, cand in enumerate(problem.candidates):
        x = problem.max_copies(c)
        if x <= 0:
            out.append(math.inf)
            continue
        p = cand.partition
        out.append((p.fill_s + (-(-G // (x * cand.micro_batch_size)) - 1) * p.bottleneck_s + p.optimizer_s)
                   * (1.0 - 1e-9))
    return out


def _least_solo(problem: CompositionProblem, members: Sequence[int], floor: Sequence[float], k: int) -> list[int]:
    """``sorted(members, key=solo_objective_s)[:k]`` (stable), evaluating only the candidates whose
    floor (:func:`_solo_floors_s`) is at most the k-th least solo objective: any other has a larger
    solo objective than k members already, so it is not among the first k."""
    by_floor = sorted(members, key=floor.__getitem__)
    solo: dict[int, float] = {}
    kth = math.inf
    for c in by_floor:
        if floor[c] > kth:
            break
        solo[c] = solo_objective_s(problem, c)
        if len(solo) >= k:
            kth = sorted(solo.values())[k - 1]
    return sorted((c for c in members if c in solo), key=solo.__getitem__)[:k]


def fill_heuristic(problem: CompositionProblem, *, top_k: int = 4,
                   floor: Sequence[float] | None = None) -> tuple[dict[int, int], float]:
    """Heuristic (no bound): combine per-device-type fills, top up with mixed pipelines, then trim.

    1. Rank the candidates by :func:`solo_objective_s` (its copies alone, as many as fit); only the
       first ``top_k`` are used, so only candidates that can be among them are priced (:func:`_least_solo`).
    2. For each device type, keep the ``top_k`` single-type candidates; try every combination
       (one candidate per type, or none) with as many copies as fit.
    3. Top the best combination up with copies of multi-type candidates that use leftover devices.
    4. Trim: fewer copies of a candidate when that is faster (less gradient sync / fill).

    ``floor``: :func:`_solo_floors_s` of ``problem`` if already computed.

    Returns
    -------
    (counts, objective_s)
    """
    cands = problem.candidates
    if not cands:
        return {}, math.inf
    if floor is None:
        floor = _solo_floors_s(problem)
    by_type: dict[str, list[int]] = {}
    mixed: list[int] = []
    for c, cand in enumerate(cands):
        if not math.isfinite(floor[c]):            # no copy fits: its solo objective is inf
            continue
        if len(cand.devices) == 1:
            by_type.setdefault(next(iter(cand.devices)), []).append(c)
        else:
            mixed.append(c)
    options = [[None, *_least_solo(problem, cs, floor, top_k)] for cs in by_type.values()]
    mixed = _least_solo(problem, mixed, floor, top_k)

    best: tuple[dict[int, int], float] = ({}, math.inf)
    for combo in itertools.product(*options):
        chosen = [c for c in combo if c is not None]
        counts = {c: problem.max_copies(c) for c in chosen}
        counts, _ = _fill_in_order(problem, counts, mixed[:top_k])
        obj = composition_objective_s(problem, counts, cutoff_s=best[1])
        if obj < best[1]:
            best = (counts, obj)
    counts, obj = best
    improved = True
    while improved and counts:
        improved = False
        for c in list(counts):
            for f in (0.5, 0.75, 0.9):
                trial = dict(counts)
                trial[c] = int(counts[c] * f)
                if trial[c] == counts[c]:
                    continue
                if trial[c] == 0:
                    del trial[c]
                t = composition_objective_s(problem, trial, cutoff_s=obj * (1 - 1e-12))
                if t < obj * (1 - 1e-12):
                    counts, obj, improved = trial, t, True
                    break
    return counts, obj


def best_incumbent(problem: CompositionProblem, *, pool_size: int = 8, max_evals: int = 300
                   ) -> tuple[dict[int, int], float]:
    """The search's incumbent: the better of :func:`greedy_composition` and :func:`fill_heuristic`, then a
    local search over copy counts (:func:`local_search`: one copy less, one
    more or one swapped, among the plan's candidates and the ``pool_size`` best by solo objective),
    at most ``max_evals`` plans priced (a count, so the answer is deterministic).

    Returns
    -------
    (counts, objective_s)
    """
    g_counts, g_obj = greedy_composition(problem)
    floor = _solo_floors_s(problem)
    f_counts, f_obj = fill_heuristic(problem, floor=floor)
    counts, obj = (f_counts, f_obj) if f_obj < g_obj else (g_counts, g_obj)
    if not counts or max_evals <= 0:
        return counts, obj
    members = [c for c in range(len(problem.candidates)) if math.isfinite(floor[c])]
    pool = _least_solo(problem, members, floor, pool_size)
    counts, obj, _ = local_search(problem, dict(counts), obj, pool, max_evals=max_evals)
    return counts, obj


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
            v = composition_objective_s(problem, t, cutoff_s=obj * (1 - 1e-12))
            if v < obj * (1 - 1e-12):
                counts, obj, improved = t, v, True
                break
            if evals >= max_evals:
                break
        if not improved:
            break
    return counts, obj, evals


#: The local search from the copy bound's best rounded plan: plans it may price, and the pool (candidates the
#: copy bound's LPs used most) it may add (llama8-3types-40: 327.96 -> 303.22 s; 3types-64 needs a pool of 40).
ROUNDED_MAX_EVALS, ROUNDED_POOL = 400, 40


def rounded_lp_incumbent(problem: CompositionProblem, keep: Sequence[int], cb, inc_model: float) -> dict[int, int]:
    """The copy bound's best rounded LP plan, improved by a local search over copy counts, when the search model
    prices it below the incumbent's ``inc_model`` [s]; {} otherwise (or without ``cb``).

    ``cb``: a :class:`~hpp.formulation.composition.copy_bound.CopyBound` run with a ``search_price`` on the
    candidates ``keep`` of ``problem`` (its indices are positions in ``keep``); returns counts per index of
    ``problem``. The local search may add the :data:`ROUNDED_POOL` candidates the LPs used most.
    """
    if cb is None or cb.found is None or not cb.found_s < inc_model:
        return {}
    start = {keep[c]: x for c, x in cb.found.items()}
    pool = [keep[c] for c in cb.pool[:ROUNDED_POOL]]
    counts, _, _ = local_search(problem, start, cb.found_s, pool, max_evals=ROUNDED_MAX_EVALS)
    return counts


def heuristic_incumbent(problem: CompositionProblem) -> tuple[dict[int, int], float]:
    """The incumbent (counts, objective [s]): :func:`~hpp.formulation.composition.heuristics.best_incumbent` on the
    candidates the heuristics use (:attr:`CompositionProblem.heuristic_indices`), as counts of ``problem``."""
    idx = problem.heuristic_indices
    if len(idx) == len(problem.candidates):
        return best_incumbent(problem)
    counts, obj = best_incumbent(problem.restricted(idx))
    return {idx[c]: x for c, x in counts.items()}, obj
