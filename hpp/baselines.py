"""Baselines on the same cost model and input: uniform (Megatron), single-shape (Metis/AMP), exhaustive.

- ``uniform``: Megatron-style DP x PP x TP. TP groups are cut from the nodes in
  cluster order; pipeline r takes groups r*PP .. r*PP+PP-1; equal layers per stage
  (the first L mod PP stages get one more); an equal batch per replica (G mod DP
  replicas get one more sample); one micro-batch size; the same recomputation on
  every stage. Best over (TP, PP, b, recompute) by the cost model, memory checked.
- ``single-shape``: the Metis/AMP family. One pipeline shape, replicated DP times
  with an even batch split; each replica gets N_t / DP devices of every type t; its
  stages are device groups (TP groups of the profiled powers of two within a node)
  and its layers are balanced unequally across heterogeneous stages (the
  stage-balance DP). The search enumerates, outermost first: DP degrees; every order
  of the device types along the pipeline (Metis's node sequences); for each type, the
  splits of its N_t / DP devices into TP groups, and for each split the orders of its
  groups along the pipeline that Metis's device-group generator tries; micro-batch
  sizes. By default each split is tried in one canonical order (largest TP group
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
- ``exhaustive``: every composition of candidate pipelines (all shapes, counts and
  exact data splits, no pruning), small clusters only: the optimality oracle of the
  composition model.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from hpp.gcpause import gc_paused
from hpp.errors import HppInputError
from hpp.formulation.binding import bind_devices
from hpp.formulation.candidates import Candidate, SearchSpace, common_micro_batch_sizes, stage_kinds
from hpp.formulation.composition import CompositionProblem, composition_objective_s
from hpp.formulation.cost_model import CostModelConfig, estimate_plan
from hpp.formulation.stage_balance import StageBalancer, StageKind
from hpp.plan import Pipeline, Plan, Stage, default_schedule
from hpp.profiles.cluster import Cluster, cluster_to_dict
from hpp.profiles.model_profile import ModelProfile
from hpp.planner import pipeline_link
from hpp.pruning.memo import StageCostCache

__all__ = ["BaselineResult", "uniform_baseline", "single_shape_baseline", "exhaustive_composition",
           "run_baselines", "BASELINES"]

BASELINES = ("uniform", "single-shape")


@dataclass(frozen=True)
class BaselineResult:
    """Best plan of one baseline: its predicted iteration time [s], throughput [samples/s], search wall [s]."""

    name: str
    plan: Plan | None
    iteration_time_s: float
    throughput: float
    wall_s: float
    description: str
    candidates: int = 0

    @property
    def feasible(self) -> bool:
        return self.plan is not None


def _even_split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _make_plan(profile: ModelProfile, cluster: Cluster, gbs: int, pipelines: list[Pipeline]) -> Plan:
    return Plan(model=profile.model, num_layers=profile.num_layers, global_batch_size=gbs,
                pipelines=tuple(pipelines), sequence_length=profile.sequence_length,
                profile_ref={"name": profile.model}, cluster_ref=cluster_to_dict(cluster))


def _price(plan: Plan, cluster: Cluster, profile: ModelProfile, config: CostModelConfig) -> float:
    est = estimate_plan(plan, cluster, profile, config=config, estimate_missing=False)
    return est.iteration_time_s if est.fits_memory else math.inf


def uniform_baseline(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                     space: SearchSpace = SearchSpace(), config: CostModelConfig = CostModelConfig()) -> BaselineResult:
    """Megatron-style DP x PP x TP (see the module docstring)."""
    t0 = time.perf_counter()
    L = profile.num_layers
    types = sorted(cluster.count_by_type())
    common_tp = set.intersection(*(set(profile.tp_degrees(t)) for t in types))
    best: tuple[float, Plan | None, str] = (math.inf, None, "no feasible DP x PP x TP layout")
    n_cands = 0
    for tp in sorted(common_tp):
        if space.max_tp is not None and tp > space.max_tp:
            continue
        groups = []
        for node_idx, node in enumerate(cluster.nodes):
            ids = [d.device_id for d in cluster.devices if d.node == node_idx]
            groups += [(node.device_type, tuple(ids[i:i + tp])) for i in range(0, len(ids) - tp + 1, tp)]
        sizes = common_micro_batch_sizes(profile, tuple(StageKind(t, tp) for t in types), space)
        for pp in range(1, min(L, len(groups)) + 1):
            dp = len(groups) // pp
            layers = _even_split(L, pp)
            bounds = [0, *itertools.accumulate(layers)]
            for b in sizes:
                for rec in (("none", "full") if space.allow_recompute else ("none",)):
                    n_cands += 1
                    pipes = []
                    for r, n in enumerate(_even_split(global_batch_size, dp)):
                        stages = tuple(Stage(bounds[s], bounds[s + 1], groups[r * pp + s][0], tp,
                                             groups[r * pp + s][1], rec) for s in range(pp))
                        pipes.append(Pipeline(stages, b, n, default_schedule(-(-n // b), pp)))
                    pipes = [p for p in pipes if p.num_samples > 0]
                    plan = _make_plan(profile, cluster, global_batch_size, pipes)
                    t = _price(plan, cluster, profile, config)
                    if t < best[0]:
                        best = (t, plan, f"DP={len(pipes)} PP={pp} TP={tp} b={b} recompute={rec}")
    wall = time.perf_counter() - t0
    return BaselineResult("uniform", best[1], best[0], global_batch_size / best[0] if best[1] else 0.0, wall,
                          best[2], n_cands)


def _group_splits(n: int, sizes: list[int]) -> list[tuple[int, ...]]:
    """Ways to cut n devices into groups of the given sizes (non-increasing tuples)."""
    out = []

    def rec(left: int, maxsize: int, acc: tuple[int, ...]) -> None:
        if left == 0:
            out.append(acc)
            return
        for s in sizes:
            if s <= left and s <= maxsize:
                rec(left - s, s, acc + (s,))

    rec(n, max(sizes), ())
    return out


def _metis_merged_blocks(groups: tuple[int, ...], max_permute_len: int) -> list[tuple[int, ...]]:
    """Metis's "Key idea 2": merge the smallest equal groups pairwise to bound the permutation length.

    Parameters
    ----------
    groups : tuple of int
        Device-group sizes [devices] of one split, in any order.
    max_permute_len : int
        Upper bound on the number of blocks to permute (Metis's scripts use 4); >= 1.

    Returns
    -------
    list of tuple of int
        The blocks: each a run of group sizes [devices] that stays together along the pipeline.

    Notes
    -----
    The rule of SamsungLabs/Metis ``search_space/device_group.py`` (``permute``), restated: the
    groups start as one block each, in non-decreasing size. While there are more than
    ``max_permute_len`` blocks, one pass walks the blocks in pairs (0, 1), (2, 3), ... and merges a
    pair when both blocks sum to the smallest block's sum (the first block's), for at most
    ``max(excess, lead // 2)`` pairs, where ``excess`` is the number of blocks over the limit and
    ``lead`` is the number of leading blocks equal to the first one plus one (Metis counts up to and
    including the first differing block; all blocks when none differs). Blocks past the last pair
    tried stay as they are. The loop stops when a pass leaves the excess equal to the number of pairs
    it was allowed to merge (nothing more to merge) or the limit is met. Merged blocks keep their
    members' order (non-decreasing).
    """
    blocks = [(g,) for g in sorted(groups)]
    excess = len(blocks) - max_permute_len
    while excess > 0:
        smallest = sum(blocks[0])
        first_other = next((i for i, blk in enumerate(blocks) if blk != blocks[0]), None)
        lead = len(blocks) if first_other is None else first_other + 1
        pairs = max(excess, lead // 2)
        merged: list[tuple[int, ...]] = []
        for i in range(0, len(blocks), 2):
            if i // 2 >= pairs:
                merged.extend(blocks[i:])
                break
            if i + 1 < len(blocks) and sum(blocks[i]) == smallest == sum(blocks[i + 1]):
                merged.append(blocks[i] + blocks[i + 1])
            else:
                merged.extend(blocks[i:i + 2])
        blocks = merged
        if pairs == len(blocks) - max_permute_len:
            break
        excess = len(blocks) - max_permute_len
    return blocks


def _distinct_permutations(items: list[tuple[int, ...]]) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every distinct ordering of the multiset ``items``, in decreasing lexicographic order (iterative)."""
    seq = sorted(items, reverse=True)
    while True:
        yield tuple(seq)
        # step to the lexicographically previous arrangement; stop after the non-decreasing one
        i = len(seq) - 2
        while i >= 0 and seq[i] <= seq[i + 1]:
            i -= 1
        if i < 0:
            return
        j = len(seq) - 1
        while seq[j] >= seq[i]:
            j -= 1
        seq[i], seq[j] = seq[j], seq[i]
        seq[i + 1:] = reversed(seq[i + 1:])


def _group_orders(groups: tuple[int, ...], max_permute_len: int) -> Iterator[tuple[int, ...]]:
    """Orders of one split's device groups along the pipeline, as Metis's generator enumerates them.

    Parameters
    ----------
    groups : tuple of int
        Device-group (TP) sizes [devices] of one split.
    max_permute_len : int
        Metis's bound on the permutation length (see :func:`_metis_merged_blocks`).

    Yields
    ------
    tuple of int
        Stage sequences of group sizes [devices]: every distinct permutation of the merged blocks,
        flattened, the blocks in non-increasing (lexicographic) order first. A sequence that two block
        orders flatten to alike comes twice, as Metis evaluates both.
    """
    for perm in _distinct_permutations(_metis_merged_blocks(groups, max_permute_len)):
        yield tuple(s for blk in perm for s in blk)


def _type_orders(splits: list[tuple[int, ...]], max_permute_len: int | None) -> Iterator[tuple[int, ...]]:
    """Each split in turn, then each Metis order of its groups (lazily: the orders can be many);
    ``max_permute_len=None``: each split once, in its canonical (non-increasing) order."""
    for split in splits:
        if max_permute_len is None:
            yield split
        else:
            yield from _group_orders(split, max_permute_len)


def _lazy_product(splits: list[list[tuple[int, ...]]], max_permute_len: int | None
                  ) -> Iterator[tuple[tuple[int, ...], ...]]:
    """``itertools.product`` over the types' group orders, in its order, without materialising them.

    The inner types' orders are regenerated for each outer choice, so the time to the first shape
    stays small (the search's time budget is checked per shape) however many orders there are.
    """
    if not splits:
        yield ()
        return
    for head in _type_orders(splits[0], max_permute_len):
        for rest in _lazy_product(splits[1:], max_permute_len):
            yield (head, *rest)


def _single_shape_candidates(cluster: Cluster, profile: ModelProfile, space: SearchSpace,
                             max_permute_len: int | None = None) -> Iterator[tuple[int, tuple[StageKind, ...]]]:
    """Yield (DP degree, replica shape) in the order Metis/AMP enumerate them (shapes of any length).

    For each DP degree and each order of the device types, the product over types (first type
    outermost) of: each split of the type's devices into TP groups, then each Metis order of that
    split's groups (:func:`_group_orders`).
    """
    inv = cluster.count_by_type()
    kinds = stage_kinds(cluster, profile, space)
    for dp in range(1, min(inv.values()) + 1):
        if any(n % dp for n in inv.values()):
            continue
        per = {t: n // dp for t, n in inv.items()}
        splits = {t: _group_splits(per[t], [k.tp_degree for k in kinds[t]]) for t in per}
        for order in itertools.permutations(sorted(per)):
            for choice in _lazy_product([splits[t] for t in order], max_permute_len):
                yield dp, tuple(StageKind(t, s) for t, grp in zip(order, choice) for s in grp)


@gc_paused()
def single_shape_baseline(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                          space: SearchSpace = SearchSpace(), config: CostModelConfig = CostModelConfig(),
                          max_candidates: int | None = None, time_budget_s: float | None = None,
                          max_permute_len: int | None = None) -> BaselineResult:
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
    t0 = time.perf_counter()
    truncated = False
    best: tuple[float, Any, str] = (math.inf, None, "no feasible single shape")
    n_cands = 0
    caps = {t: d.memory_bytes for t, d in cluster.device_types.items()}
    link = pipeline_link(cluster)
    # profile tables are read once (as Metis/AMP load their profiles once); every candidate is then
    # stage-balanced anew (no DP memo) and priced with the composition model (its DP replicas, even split)
    cache = StageCostCache(profile, caps, link, config)
    for dp, shape in _single_shape_candidates(cluster, profile, space, max_permute_len):
        # the budget is checked for every shape enumerated, also the ones skipped (too many stages)
        if ((max_candidates is not None and n_cands >= max_candidates)
                or (time_budget_s is not None and time.perf_counter() - t0 > time_budget_s)):
            truncated = True
            break
        if len(shape) > profile.num_layers:
            continue
        for b in common_micro_batch_sizes(profile, shape, space):
            n_cands += 1
            part = StageBalancer(cache, allow_recompute=space.allow_recompute, memoise=False).balance(shape, b)
            if part is None:
                continue
            cand = Candidate(shape, b, part, {}, {})
            t = composition_objective_s(CompositionProblem([cand], cluster, global_batch_size, link), {0: dp})
            if t < best[0]:
                label = " | ".join(f"{k.device_type}x{k.tp_degree}" for k in shape)
                best = (t, (dp, shape, part, b), f"DP={dp} x [{label}] b={b}")
    plan, t_plan = None, math.inf
    if best[1] is not None:
        dp, shape, part, b = best[1]
        plan = _bind_replicas(cluster, profile, global_batch_size, shape, part, b, dp)
        t_plan = _price(plan, cluster, profile, config)     # the winner, priced by the full cost model
        if not math.isfinite(t_plan):
            plan = None
    wall = time.perf_counter() - t0
    desc = best[2] + (f" (search truncated after {n_cands} candidates, {wall:.0f} s)" if truncated else "")
    return BaselineResult("single-shape", plan, t_plan, global_batch_size / t_plan if plan else 0.0, wall,
                          desc, n_cands)


def _bind_replicas(cluster, profile, gbs, shape, part, b, dp) -> Plan:
    cand = Candidate(shape, b, part, {}, {})
    ids = bind_devices(cluster, [cand] * dp)
    pipes = []
    for r, n in enumerate(_even_split(gbs, dp)):
        if n == 0:
            continue
        stages = tuple(Stage(part.boundaries[i], part.boundaries[i + 1], k.device_type, k.tp_degree, ids[r][i],
                             "full" if part.recompute[i] else "none") for i, k in enumerate(shape))
        pipes.append(Pipeline(stages, b, n, default_schedule(-(-n // b), len(shape))))
    return _make_plan(profile, cluster, gbs, pipes)


def exhaustive_composition(problem: CompositionProblem, *, max_evaluations: int = 2_000_000
                           ) -> tuple[dict[int, int], float, int]:
    """Every multiset of candidate copies that fits the inventory, priced by the composition model.

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

    def rec(i: int, counts: dict[int, int]) -> None:
        nonlocal best, evals
        if i == n:
            if counts:
                evals += 1
                if evals > max_evaluations:
                    raise HppInputError(f"more than {max_evaluations} compositions", field="cluster",
                                        fix="the exhaustive oracle is for small clusters only")
                obj = composition_objective_s(problem, counts)
                if obj < best[1]:
                    best = (dict(counts), obj)
            return
        rec(i + 1, counts)
        x = 1
        while True:
            counts[i] = x
            if not problem.fits(counts):
                del counts[i]
                break
            rec(i + 1, counts)
            x += 1

    rec(0, {})
    return best[0], best[1], evals


def run_baselines(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                  space: SearchSpace = SearchSpace(), config: CostModelConfig = CostModelConfig(),
                  names: tuple[str, ...] = BASELINES,
                  time_budget_s: float | None = None) -> Mapping[str, BaselineResult]:
    """Run the named baselines on the same input; returns name -> :class:`BaselineResult`.

    ``time_budget_s`` caps the single-shape enumeration (its result then says it was truncated).
    """
    if global_batch_size < 1:
        raise HppInputError(f"global batch size {global_batch_size}", field="global_batch_size",
                            fix="give a positive integer")
    out: dict[str, Any] = {}
    if "uniform" in names:
        out["uniform"] = uniform_baseline(cluster, profile, global_batch_size, space=space, config=config)
    if "single-shape" in names:
        out["single-shape"] = single_shape_baseline(cluster, profile, global_batch_size, space=space, config=config,
                                                    time_budget_s=time_budget_s)
    return out
