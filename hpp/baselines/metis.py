"""Metis's search on HPP's cost model: an in-toolkit port of the public Metis planner's enumeration.

Metis (Um et al., "Metis: Fast Automatic Distributed Training on Heterogeneous GPUs", USENIX
ATC'24; code SamsungLabs/Metis: ``cost_het_cluster.py``, ``search_space/plan.py``,
``search_space/device_group.py``, ``model/load_balancer.py``) plans ONE pipeline over all devices,
each stage a device group with its own data- and tensor-parallel degrees. Its search, outermost
first, restated from that code (none of it copied):

1. node sequence: every order of the GPU types; the devices are laid out type after type;
2. number of stages S = 1 .. min(N, L);
3. device groups: every non-decreasing sequence of S power-of-two group sizes [devices] summing to
   N, with every size at least ``variance`` x max(N // S, S // N) ("Key idea 1"; ``variance`` is 1
   in Metis's README example, and its command line parses it as an integer), each in every order
   that Metis's ``permute`` gives for ``max_permute_len`` ("Key idea 2", 4 in its scripts;
   :func:`hpp.baselines.shapes.group_orders`, checked against a transcription of Metis's ``permute``);
4. number of micro-batches m: every divisor of the global batch size, largest first;
5. intra-stage strategies (dp_s, tp_s) with dp_s x tp_s = g_s: from pure data parallelism, one
   step at a time, the stage with the least memory headroom (1 / dp_s before any partition fitted)
   that still has dp_s > 1 turns half of it into tensor parallelism. A strategy is valid when every
   stage's per-replica micro-batch b_s = G / (m dp_s) is a whole, profiled size of its GPU type at
   TP tp_s. Each valid strategy is layer-partitioned; the walk stops after a partition that fits
   memory at the first attempt (Metis's ``num_repartition == 1``).

Costing is HPP's cost model, not Metis's estimator, and the layer partition is HPP's stage-balance DP
(:mod:`hpp.baselines.metis_pricing`); plans whose stages differ in dp_s are outside HPP's plan format
(every HPP pipeline is a full replica), so the result is a priced configuration, not a
:class:`~hpp.plan_data.Plan`.

Inputs as Metis takes them: one global cap on the TP degree and one on the micro-batch size
(``MAX_PROFILED_TP``, ``MAX_PROFILED_BATCH_SIZE``), by default the largest values that every GPU type
of the cluster has profiled (Metis looks its profile up by these keys for any type and stops with a
KeyError on a missing one); no activation recomputation (Metis has none; ``allow_recompute=True``
adds it, one mode for a whole stage). Where the port differs from Metis's code, on purpose:

- Metis cannot run a device count that is not a power of two (its generator reads the single-stage
  group list, which is then empty); the port starts at the first stage count with groups.
- For every node sequence after the first, Metis's generator skips one stage and visits S = 2 twice,
  the first time priced as one stage; the port visits S = 1, 2, ... for every node sequence (the same
  number of inter-stage plans, none mispriced).
- A strategy must split the micro-batch exactly (Metis floors G / (m dp_s) and drops the rest); the
  same for the power-of-two global batches of the benchmark.
- TP groups are not checked against node boundaries (as in Metis); a TP degree must fit a node.
- ``candidates`` counts partition attempts, including those where nothing fits.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Iterator

from hpp.baselines.metis_pricing import MetisPricer, price_metis_config
from hpp.baselines.shapes import group_orders
from hpp.errors import HppInputError
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.cost_config import CostModelConfig
from hpp.gcfreeze import gc_frozen
from hpp.planner import check_micro_batch_sizes
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile

__all__ = ["MetisConfig", "MetisResult", "metis_device_groups", "metis_search"]

#: Metis's settings in its README example (``SCALE_VARIANCE=1 MAX_PERMUTE_LEN=4``; ``arguments.py`` parses the
#: variance as an int, so the generator's own default of 0.5 is not reachable from its command line).
METIS_VARIANCE, METIS_MAX_PERMUTE_LEN = 1.0, 4


@dataclass(frozen=True)
class MetisConfig:
    """One priced Metis configuration.

    Attributes
    ----------
    node_sequence : tuple[str, ...]
        GPU types in pipeline order (the devices are laid out type after type).
    device_groups : tuple[int, ...]
        (S,) devices per stage, summing to the cluster's N.
    strategies : tuple[tuple[int, int], ...]
        (S,) (dp_s, tp_s) per stage, dp_s x tp_s = device_groups[s].
    num_micro_batches : int
        m; every stage runs m micro-batches of G / m samples, split over its dp_s replicas.
    boundaries : tuple[int, ...]
        (0, ..., L), length S + 1: stage s holds layers [boundaries[s], boundaries[s+1]).
    recompute : tuple[bool, ...]
        (S,) full activation recomputation per stage.
    iteration_time_s : float
        T_pipe + T_sync + T_opt [s].
    """

    node_sequence: tuple[str, ...]
    device_groups: tuple[int, ...]
    strategies: tuple[tuple[int, int], ...]
    num_micro_batches: int
    boundaries: tuple[int, ...]
    recompute: tuple[bool, ...]
    iteration_time_s: float

    def describe(self) -> str:
        """One line: the stages (types, dp x tp, layers) and m."""
        parts = [f"{g}:{dp}x{tp}[{lo},{hi})" for g, (dp, tp), lo, hi in
                 zip(self.device_groups, self.strategies, self.boundaries, self.boundaries[1:])]
        return f"{'>'.join(self.node_sequence)} | " + " | ".join(parts) + f" | m={self.num_micro_batches}"


@dataclass
class MetisResult:
    """Outcome of :func:`metis_search`.

    Attributes
    ----------
    best : MetisConfig or None
        The fastest configuration priced (None if nothing fitted).
    wall_s : float
        Search wall time [s].
    inter_stage_plans : int
        (node sequence, device groups, m) triples enumerated.
    candidates : int
        Strategies layer-partitioned (Metis's cost evaluations).
    truncated : bool
        The time budget or ``max_candidates`` stopped the search early.
    description : str
        The best configuration in one line (:meth:`MetisConfig.describe`), and the truncation if any.
    """

    best: MetisConfig | None
    wall_s: float
    inter_stage_plans: int
    candidates: int
    truncated: bool
    description: str = ""

    @property
    def iteration_time_s(self) -> float:
        return self.best.iteration_time_s if self.best else math.inf


def _group_sizes(n: int) -> list[int]:
    out, s = [], 1
    while s <= n:
        out.append(s)
        s *= 2
    return out


def _non_decreasing_sums(num_stages: int, total: int, sizes: list[int]) -> Iterator[tuple[int, ...]]:
    """Non-decreasing sequences of ``num_stages`` values from ``sizes`` (ascending) summing to ``total``."""
    def rec(left: int, stages: int, lo: int, acc: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if stages == 0:
            if left == 0:
                yield acc
            return
        if sizes[-1] * stages < left or sizes[lo] * stages > left:
            return
        for i in range(lo, len(sizes)):
            if sizes[i] * stages > left:
                break
            yield from rec(left - sizes[i], stages - 1, i, acc + (sizes[i],))

    if sizes:
        yield from rec(total, num_stages, 0, ())


def metis_device_groups(num_devices: int, num_stages: int, *, variance: float = METIS_VARIANCE,
                        max_permute_len: int = METIS_MAX_PERMUTE_LEN) -> list[tuple[int, ...]]:
    """Device-group sequences [devices per stage] that Metis tries for ``num_stages`` stages.

    Power-of-two sizes of at least ``variance`` x max(N // S, S // N) ("Key idea 1"), every
    non-decreasing sequence summing to N, each in Metis's permuted orders ("Key idea 2").

    Examples
    --------
    >>> metis_device_groups(8, 2)
    [(4, 4)]
    >>> metis_device_groups(8, 3)
    [(4, 2, 2), (2, 4, 2), (2, 2, 4)]
    """
    return list(_iter_device_groups(num_devices, num_stages, variance, max_permute_len))


def _iter_device_groups(num_devices: int, num_stages: int, variance: float, max_permute_len: int
                        ) -> Iterator[tuple[int, ...]]:
    floor = max(num_devices // num_stages, num_stages // num_devices) * variance
    sizes = [s for s in _group_sizes(num_devices) if s >= floor]
    for seq in _non_decreasing_sums(num_stages, num_devices, sizes):
        yield from group_orders(seq, max_permute_len)


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]



def _next_strategy(strategies: list[tuple[int, int]], memory_state: list[float] | None) -> list[tuple[int, int]] | None:
    """Metis's step: the stage with the least headroom (1 / dp_s without one) and dp_s > 1 halves dp_s."""
    state = memory_state if memory_state else [1.0 / dp for dp, _ in strategies]
    for s in sorted(range(len(strategies)), key=lambda i: state[i]):
        dp, tp = strategies[s]
        if dp != 1:
            out = list(strategies)
            out[s] = (dp // 2, tp * 2)
            return out
    return None


def _inter_stage_plans(inv: dict[str, int], num_layers: int, global_batch_size: int, variance: float,
                       max_permute_len: int) -> Iterator[tuple[tuple[str, ...], tuple[int, ...], list, int]]:
    """Metis's inter-stage plans in its order: (node sequence, device groups, GPU types per stage, m).

    Lazy (the device groups of a stage count are generated once, while the first node sequence
    walks them), so a time budget checked per plan holds however many groups there are.
    """
    N = sum(inv.values())
    ms = _divisors_desc(global_batch_size)
    groups_by_s: dict[int, list[tuple[int, ...]]] = {}

    def device_groups(S: int) -> Iterator[tuple[int, ...]]:
        if S in groups_by_s:
            yield from groups_by_s[S]
            return
        got = groups_by_s[S] = []
        for dg in _iter_device_groups(N, S, variance, max_permute_len):
            got.append(dg)
            yield dg

    for ns in itertools.permutations(sorted(inv)):
        layout = [t for t in ns for _ in range(inv[t])]
        for S in range(1, min(N, num_layers) + 1):
            for dg in device_groups(S):
                offs = [0, *itertools.accumulate(dg)]
                types_of_stage = [tuple(dict.fromkeys(layout[offs[s]:offs[s + 1]])) for s in range(S)]
                for m in ms:
                    yield ns, dg, types_of_stage, m


def _intra_stage_walk(pricer: MetisPricer, ns, dg, types_of_stage, m: int, global_batch_size: int,
                      attempts_left: int | None) -> tuple[MetisConfig | None, int, bool]:
    """Metis's intra-stage walk on one inter-stage plan: (best configuration, partition attempts, cut short).

    ``attempts_left``: stop before a partition attempt beyond this many (None: no limit).
    """
    S = len(dg)
    best: MetisConfig | None = None
    attempts = 0
    strategies: list[tuple[int, int]] | None = [(g, 1) for g in dg]
    memory_state: list[float] | None = None
    per_mb = global_batch_size // m
    while strategies is not None:
        bs = [per_mb // dp if per_mb % dp == 0 else 0 for dp, _ in strategies]
        if all(b >= 1 and pricer.valid(ts, tp, b) for b, ts, (_, tp) in zip(bs, types_of_stage, strategies)):
            if attempts_left is not None and attempts >= attempts_left:
                return best, attempts, True
            attempts += 1

            def stages_of(memory: bool) -> list:
                return [pricer.stage(ts, tp, b, min(m, S - s), memory=memory)
                        for s, (b, ts, (_, tp)) in enumerate(zip(bs, types_of_stage, strategies))]

            # Metis's first attempt ignores memory; a repartition respects it
            stages = stages_of(memory=False)
            part = pricer.partition(stages)
            fits_first = False
            if part is not None:
                t_it, rec, head = price_metis_config(pricer, strategies, m, part[0], stages)
                fits_first = min(head) >= 0
            if not fits_first:
                stages = stages_of(memory=True)
                part = pricer.partition(stages)
                if part is not None:
                    t_it, rec, head = price_metis_config(pricer, strategies, m, part[0], stages)
            memory_state = None if part is None else head
            if part is not None and (best is None or t_it < best.iteration_time_s):
                best = MetisConfig(ns, tuple(dg), tuple(strategies), m, tuple(part[0]), rec, t_it)
            if fits_first:
                break
        strategies = _next_strategy(strategies, memory_state)
    return best, attempts, False


@gc_frozen()
def metis_search(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                 space: SearchSpace = SearchSpace(allow_recompute=False),
                 config: CostModelConfig = CostModelConfig(), variance: float = METIS_VARIANCE,
                 max_permute_len: int = METIS_MAX_PERMUTE_LEN,
                 max_tp: int | None = None, max_micro_batch_size: int | None = None,
                 time_budget_s: float | None = None, max_candidates: int | None = None) -> MetisResult:
    """Run Metis's search (see the module docstring) on HPP's cost model; the fastest configuration found.

    Parameters
    ----------
    cluster, profile, global_batch_size
        The input [global_batch_size in samples].
    space : SearchSpace
        TP degrees and micro-batch sizes allowed; recomputation only if ``allow_recompute`` (default
        here: off, as in Metis).
    max_tp, max_micro_batch_size : int, optional
        Metis's ``MAX_PROFILED_TP`` and ``MAX_PROFILED_BATCH_SIZE``; default: the largest TP degree
        that every GPU type of the cluster has profiled, and the largest micro-batch size that every
        GPU type has profiled at every TP degree up to ``max_tp``.
    variance, max_permute_len : float, int
        Metis's "Key idea 1" and "Key idea 2" settings (1 and 4, as in its README example).
    time_budget_s : float, optional
        Stop once the search has run this long [s] (checked per inter-stage plan); the result is
        then marked truncated and is the best configuration priced so far.
    max_candidates : int, optional
        Stop after this many partition attempts.

    Returns
    -------
    MetisResult

    Raises
    ------
    HppInputError
        A global batch, ``max_permute_len``, ``max_tp``, ``max_micro_batch_size`` or
        ``max_candidates`` that is not a positive integer; ``variance`` not positive and finite; a
        negative time budget; micro-batch sizes that no GPU type has profiled; a GPU type without a
        profile (from :func:`~hpp.formulation.space_limits.stage_kinds`).
    """
    def positive_int(value, name: str, fix: str) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise HppInputError(f"{name}={value!r}", field=name, fix=fix)

    positive_int(global_batch_size, "global_batch_size", "give a positive integer number of samples")
    if not (isinstance(variance, (int, float)) and math.isfinite(variance) and variance > 0):
        raise HppInputError(f"variance={variance!r}", field="variance",
                            fix="give a positive finite value (Metis's README uses 1)")
    positive_int(max_permute_len, "max_permute_len", "give a positive integer (Metis uses 4)")
    positive_int(max_tp, "max_tp", "give a positive integer or leave it out (the profile decides)")
    positive_int(max_micro_batch_size, "max_micro_batch_size",
                 "give a positive integer or leave it out (the profile decides)")
    positive_int(max_candidates, "max_candidates", "give a positive integer or leave it out")
    if time_budget_s is not None and not (time_budget_s >= 0):
        raise HppInputError(f"time_budget_s={time_budget_s!r}", field="time_budget_s",
                            fix="give seconds >= 0 or leave it out (no limit)")
    check_micro_batch_sizes(cluster, profile, space)
    t0 = time.perf_counter()
    pricer = MetisPricer(cluster, profile, space, config, max_tp, max_micro_batch_size)
    best: MetisConfig | None = None
    n_inter = n_cands = 0
    truncated = False
    for ns, dg, types_of_stage, m in _inter_stage_plans(cluster.count_by_type(), profile.num_layers,
                                                        global_batch_size, variance, max_permute_len):
        if (time_budget_s is not None and time.perf_counter() - t0 > time_budget_s) or (
                max_candidates is not None and n_cands >= max_candidates):
            truncated = True
            break
        n_inter += 1
        left = None if max_candidates is None else max_candidates - n_cands
        found, attempts, truncated = _intra_stage_walk(pricer, ns, dg, types_of_stage, m, global_batch_size, left)
        n_cands += attempts
        if found is not None and (best is None or found.iteration_time_s < best.iteration_time_s):
            best = found
        if truncated:
            break
    wall = time.perf_counter() - t0
    desc = best.describe() if best else "no configuration fits"
    if truncated:
        desc += f" (search truncated after {n_cands} candidates, {wall:.1f} s)"
    return MetisResult(best, wall, n_inter, n_cands, truncated, desc)
