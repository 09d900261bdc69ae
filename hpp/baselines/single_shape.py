"""Baselines on the same cost model and input: uniform (Megatron), single-shape (Metis/AMP), exhaustive.

- ``uniform``: Megatron-style DP x PP x TP. TP groups are cut from the nodes in
  cluster order; pipeline r takes groups r*PP .. r*PP+PP-1; equal layers per stage
  (the first L mod PP stages get one more); an equal batch per replica (G mod DP
  replicas get one more sample); one micro-batch size; the same recomputation on
  every stage. Best over (TP, PP, b, recompute) by the cost model, memory checked
  (:mod:`hpp.baselines.uniform`; TP degrees measured for every type that divide the heads).
- ``single-shape``: the Metis/AMP family. One pipeline shape, replicated DP times
  with an even batch split; each replica gets N_t / DP devices of every type t; its
  stages are device groups (TP groups of the profiled powers of two within a node)
  and its layers are balanced unequally across heterogeneous stages (the
  stage-balance DP). The search enumerates, outermost first: DP degrees; every order
  of the device types along the pipeline (Metis's node sequences); for each type, the
  splits of its N_t / DP devices into TP groups, and for each split the orders of its
  groups along the pipeline that Metis's device-group generator tries; micro-batch
  sizes. Within HPP's default space (``SearchSpace.mixed_tp_pipelines`` off) a shape has one TP
  degree, as HPP's pipelines; Metis itself mixes them (pass a space with it on). By default each
  split is tried in one canonical order (largest TP group
  first); with ``max_permute_len`` set, the group orders follow Metis (SamsungLabs/Metis, ATC'24,
  ``search_space/device_group.py``, ``permute(s, max_permute_len)`` with
  ``max_permute_len=4`` as in its scripts): where unequal groups sit matters (the
  first stage keeps the most micro-batches in flight, so the position of a large TP
  group changes memory and balance), so Metis permutes the groups, but first bounds
  the permutation length ("Key idea 2"): starting from the groups in non-decreasing
  size, it merges pairs of the smallest equal-sized blocks into one block until at
  most ``max_permute_len`` blocks remain (or nothing more merges), then tries every
  distinct permutation of the blocks, each flattened back into a stage sequence (a
  merged block keeps its non-decreasing inner order; two block orders that flatten to
  the same sequence are both tried, as Metis tries them). Metis permutes one group
  sequence per pipeline; permuted per type here, the orders multiply across types and
  the search overshoots Metis's own times by 8-100x (measured; see
  :func:`single_shape_baseline`), so the default is the canonical order, whose times
  sit below Metis's and keep every ratio against it conservative. Every candidate is
  stage-balanced anew (no DP memoisation, as those planners do) and priced with the
  composition model; the winner is re-priced with the full cost model.
Both searches check a deadline before every layout / shape and report progress (see
:func:`run_baselines`); their enumerations are iterative, so no count of GPUs overflows a stack.
- ``exhaustive``: every composition of candidate pipelines (all shapes, counts and
  exact data splits, no pruning), small clusters only: the optimality oracle of the
  composition model.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from typing import Any, Callable, Iterator, Mapping

from hpp.baselines.shapes import group_splits, lazy_product, min_groups
from hpp.baselines.uniform import BaselineResult, _Clock, _even_split, _fmt_s, _make_plan, _price, uniform_baseline
from hpp.errors import HppInputError
from hpp.gcfreeze import gc_frozen
from hpp.formulation.binding import bind_devices
from hpp.formulation.candidates import Candidate
from hpp.formulation.space_limits import SearchSpace, common_micro_batch_sizes, stage_kinds
from hpp.formulation.space_limits import space_violations
from hpp.formulation.composition.problem import CompositionProblem
from hpp.formulation.composition.objective import composition_objective_s
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.stage_balance import StageBalancer, StageKind
from hpp.plan_data import Plan, make_pipeline
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.formulation.stage_costs import StageCostCache

__all__ = ["single_shape_baseline", "exhaustive_composition", "run_baselines", "BASELINES"]

log = logging.getLogger(__name__)

BASELINES = ("uniform", "single-shape")


def _single_shape_candidates(cluster: Cluster, profile: ModelProfile, space: SearchSpace,
                             max_permute_len: int | None = None) -> Iterator[tuple[int, tuple[StageKind, ...]]]:
    """Yield (DP degree, replica shape) in the order Metis/AMP enumerate them (shapes of any length).

    For each DP degree and each order of the device types, the product over types (first type
    outermost) of: each split of the type's devices into TP groups, then each Metis order of that
    split's groups (:func:`~hpp.baselines.shapes.group_orders`). Without ``space.mixed_tp_pipelines`` only shapes of one TP
    degree are yielded (the others are skipped, in that order). Only shapes of at most ``profile.num_layers`` stages are
    built (a stage needs a layer; longer ones were skipped anyway): a DP degree whose replica needs
    more stages than that yields nothing, and each type's splits are bounded by the stages the other
    types leave, so 4,096 GPUs of a type enumerate no faster-growing set than 16 do.
    """
    kinds = stage_kinds(cluster, profile, space)
    inv = {t: n for t, n in cluster.count_by_type().items() if t in kinds}     # types left out have no kinds
    if not inv or len(inv) > space.max_types_per_pipeline:
        return              # every replica holds every type: more than HPP's space allows per pipeline
    L = min(profile.num_layers, space.max_stages)           # a stage needs a layer; HPP's --max-stages
    for dp in range(1, min(inv.values()) + 1):
        if any(n % dp for n in inv.values()):
            continue
        per = {t: n // dp for t, n in inv.items()}
        tps = {t: [k.tp_degree for k in kinds[t]] for t in per}
        least = {t: min_groups(per[t], tps[t]) for t in per}
        if sum(least.values()) > L:
            continue
        room = {t: L - sum(least.values()) + least[t] for t in per}
        if space.mixed_tp_pipelines:
            splits = {t: group_splits(per[t], tps[t], max_groups=room[t]) for t in per}
        else:       # the splits of one TP degree only (those in lexicographic order: ascending degree)
            splits = {t: [(g,) * (per[t] // g) for g in sorted(tps[t]) if per[t] % g == 0 and per[t] // g <= room[t]]
                      for t in per}
        for order in itertools.permutations(sorted(per)):
            for choice in lazy_product([splits[t] for t in order], max_permute_len, max_total=L):
                if not space.mixed_tp_pipelines and len({g for grp in choice for g in grp}) > 1:
                    continue                      # one TP degree per pipeline, as HPP's space (SearchSpace)
                yield dp, tuple(StageKind(t, s) for t, grp in zip(order, choice) for s in grp)


def shape_label(shape: tuple[StageKind, ...]) -> str:
    """Short name of a pipeline shape: runs of equal stages counted, e.g. ``4xA100-40+2xV100-16(tp2)``.

    Examples
    --------
    >>> shape_label((StageKind("cpu-2x", 1), StageKind("cpu-2x", 1), StageKind("cpu", 2)))
    '2xcpu-2x+1xcpu(tp2)'
    """
    runs = [(k, len(list(g))) for k, g in itertools.groupby(shape)]
    return "+".join(f"{n}x{k.device_type}" + (f"(tp{k.tp_degree})" if k.tp_degree > 1 else "") for k, n in runs)


@gc_frozen()
def single_shape_baseline(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                          space: SearchSpace = SearchSpace(), config: CostModelConfig = CostModelConfig(),
                          max_candidates: int | None = None, time_budget_s: float | None = None,
                          max_permute_len: int | None = None,
                          progress: Callable[[str], None] | None = None) -> BaselineResult:
    """Metis/AMP-style single pipeline shape, replicated, even batch split (see the module docstring).

    Enumerates DP degrees, orders of the device types, per type the splits of its devices into TP
    groups and, per split, the orders of the groups along the pipeline that Metis's device-group
    generator tries (smallest equal groups merged pairwise until at most ``max_permute_len`` blocks
    remain, then every distinct permutation of the blocks), and micro-batch sizes; every
    (shape, micro-batch size) is stage-balanced anew and priced with the composition model.

    Parameters
    ----------
    cluster, profile, global_batch_size
        The input [global_batch_size in samples].
    space : SearchSpace
        TP degrees, micro-batch sizes and recomputation allowed.
    config : CostModelConfig
        Cost-model settings.
    max_candidates : int, optional
        Stop after this many (shape, micro-batch size) candidates priced.
    time_budget_s : float, optional
        Stop once the search has run this long [s]. Both limits are checked for every shape
        enumerated (also the ones skipped); the result then says "truncated" and is the best
        plan among those priced.
    max_permute_len : int or None
        None (default): each split of a type into TP groups is tried in one canonical order
        (largest group first). An int (>= 1) adds Metis's group-order permutations per device type
        (``--max_permute_len``, 4 in Metis's scripts; 1 still permutes blocks that cannot merge).
        Measured on 2 cores (OPT-350): permuting per type multiplies the orders across types and
        overshoots the public Metis planner's search time by 8-16x at 32 GPUs of 2 types (160 s vs
        its 10-20 s) and ~100x at 32 GPUs of 3 types, without finding a better plan on any input
        it finished; the default stays below Metis's times (2.9 s / 28 s there), which makes every
        ratio against it conservative.

    Returns
    -------
    BaselineResult
        The winner re-priced with the full cost model [s], the search wall time [s] and the number
        of candidates priced.

    Raises
    ------
    HppInputError
        ``max_permute_len`` < 1.
    """
    if max_permute_len is not None and max_permute_len < 1:
        raise HppInputError(f"max_permute_len={max_permute_len}", field="max_permute_len",
                            fix="give a positive integer (Metis uses 4)")
    clock = _Clock(time_budget_s, progress)
    truncated = False
    best: tuple[float, Any, str] = (math.inf, None, "no feasible single shape")
    n_cands = 0
    # profile tables are read once (as Metis/AMP load their profiles once); every candidate is then
    # stage-balanced anew (no DP memo) and priced with the composition model (its DP replicas, even split)
    cache = StageCostCache.for_cluster(cluster, profile, config, per_pair=False)
    link = cache.link
    for dp, shape in _single_shape_candidates(cluster, profile, space, max_permute_len):
        # the budget is checked for every shape enumerated, also the ones skipped (too many stages)
        if (max_candidates is not None and n_cands >= max_candidates) or clock.over():
            truncated = True
            break
        if len(shape) > profile.num_layers:
            continue
        clock.tick(lambda: f"single-shape: {n_cands} candidates priced, best {_fmt_s(best[0])} "
                           f"({clock.elapsed():.0f} s)")
        for b in common_micro_batch_sizes(profile, shape, space):
            n_cands += 1
            part = StageBalancer(cache, allow_recompute=space.allow_recompute, memoise=False).balance(shape, b)
            if part is None:
                continue
            cand = Candidate(shape, b, part, {}, {})
            t = composition_objective_s(CompositionProblem([cand], cluster, global_batch_size, link), {0: dp})
            if t < best[0]:
                best = (t, (dp, shape, part, b), f"DP={dp} x {shape_label(shape)} b={b}")
    plan, t_plan = None, math.inf
    if best[1] is not None:
        dp, shape, part, b = best[1]
        plan = _bind_replicas(cluster, profile, global_batch_size, shape, part, b, dp)
        t_plan = _price(plan, cluster, profile, config)     # the winner, priced by the full cost model
        if not math.isfinite(t_plan):
            plan = None
    wall = clock.elapsed()
    if truncated:
        why = "the candidate cap" if max_candidates is not None and n_cands >= max_candidates else "the time limit"
        desc = best[2] + f"; search truncated after {n_cands} candidates at {why}, {wall:.1f} s"
    else:
        desc = best[2]
    return BaselineResult("single-shape", plan, t_plan, global_batch_size / t_plan if plan else 0.0, wall,
                          desc, n_cands)


def _bind_replicas(cluster, profile, gbs, shape, part, b, dp) -> Plan:
    cand = Candidate(shape, b, part, {}, {})
    ids = bind_devices(cluster, [cand] * dp)
    pipes = []
    for r, n in enumerate(_even_split(gbs, dp)):
        if n == 0:
            continue
        pipes.append(make_pipeline(part.boundaries, [k.device_type for k in shape], [k.tp_degree for k in shape],
                                   ids[r], part.recompute, b, n))
    return _make_plan(profile, cluster, gbs, pipes)


def exhaustive_composition(problem: CompositionProblem, *, max_evaluations: int = 2_000_000,
                           price: Callable[[dict[int, int]], float] | None = None) -> tuple[dict[int, int], float, int]:
    """Every multiset of candidate copies that fits the inventory, priced by the composition model
    (``price``: another price of the copies, e.g. the cost model of their bound plan, ``problem.estimator``).

    Returns
    -------
    (counts, objective_s, evaluations)

    Raises
    ------
    HppInputError
        The instance needs more than ``max_evaluations`` compositions (too large for the oracle).
    """
    n = len(problem.candidates)
    best: tuple[dict[int, int], float] = ({}, math.inf)
    evals = 0
    inv = problem.inventory
    # without TP groups of 2+ devices the inventory rows are the device counts: track them incrementally
    simple = all(k[1] == 1 for c in problem.candidates for k in c.tp_groups)
    used = {t: 0 for t in inv}

    def fits(i: int, counts: dict[int, int]) -> bool:
        if not simple:
            return problem.fits(counts)
        return all(used[t] + k <= inv.get(t, 0) for t, k in problem.candidates[i].devices.items())

    def rec(i: int, counts: dict[int, int]) -> None:
        nonlocal best, evals
        if i == n:
            if counts:
                evals += 1
                if evals > max_evaluations:
                    raise HppInputError(f"more than {max_evaluations} compositions", field="cluster",
                                        fix="the exhaustive oracle is for small clusters only")
                obj = composition_objective_s(problem, counts) if price is None else price(dict(counts))
                if obj < best[1]:
                    best = (dict(counts), obj)
            return
        rec(i + 1, counts)
        x = 1
        devices = problem.candidates[i].devices
        while True:
            counts[i] = x
            if not fits(i, counts):
                del counts[i]
                break
            for t, k in devices.items():
                used[t] += k
            rec(i + 1, counts)
            x += 1
        for t, k in devices.items():
            used[t] -= k * (x - 1)

    rec(0, {})
    return best[0], best[1], evals


def run_baselines(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                  space: SearchSpace = SearchSpace(), config: CostModelConfig = CostModelConfig(),
                  names: tuple[str, ...] = BASELINES, time_budget_s: float | None = None,
                  progress: Callable[[str], None] | None = None) -> Mapping[str, BaselineResult]:
    """Run the named baselines on the same input; returns name -> :class:`BaselineResult`.

    Parameters
    ----------
    time_budget_s : float, optional
        Bound on the whole phase [s]: the uniform baseline may use half of it (it rarely needs
        that), the single-shape search what is left. Each search checks its deadline before every
        layout / shape and then prices its winner once more with the full cost model (a fraction of
        a second even at 4,096 GPUs), so the phase ends within about ``time_budget_s`` + 1 s.
        A stopped search says "truncated" in its description.
    progress : callable, optional
        Receives one-line progress messages (a start and an end line per baseline, and one every
        2 s or so while a search runs).

    Raises
    ------
    HppInputError
        A non-positive global batch size.
    """
    if global_batch_size < 1:
        raise HppInputError(f"global batch size {global_batch_size}", field="global_batch_size",
                            fix="give a positive integer")
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    for name in names:
        left = None if time_budget_s is None else max(0.0, time_budget_s - (time.perf_counter() - t0))
        if name == "uniform":
            share = None if left is None else (left / 2 if "single-shape" in names else left)
            say("baseline uniform (Megatron DP x PP x TP)"
                + (f", up to {share:.1f} s" if share is not None else ""))
            out[name] = uniform_baseline(cluster, profile, global_batch_size, space=space, config=config,
                                         time_budget_s=share, progress=progress)
        elif name == "single-shape":
            say("baseline single-shape (Metis/AMP: one shape replicated)"
                + (f", up to {left:.1f} s" if left is not None else ""))
            out[name] = single_shape_baseline(cluster, profile, global_batch_size, space=space, config=config,
                                              time_budget_s=left, progress=progress)
        else:
            raise HppInputError(f"unknown baseline {name!r}", field="names", fix=f"use names from {list(BASELINES)}")
        r = out[name]
        bad = space_violations(r.plan, space, cluster=cluster, profile=profile) if r.plan is not None else []
        if bad:         # an invariant of the searches above; never return a plan outside the user's limits
            log.warning("baseline %s left the search space (%s): dropped", name, "; ".join(bad))
            r = out[name] = BaselineResult(name, None, math.inf, 0.0, r.wall_s,
                                           f"{r.description}; dropped: {bad[0]}", r.candidates)
        say(f"baseline {name}: {_fmt_s(r.iteration_time_s) if r.feasible else 'no feasible plan'} "
            f"({r.candidates} priced, {r.wall_s:.1f} s)")
    return out
