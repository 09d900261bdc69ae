"""The HPP cost model (v2, calibrated): pure functions, no solver, no I/O.

Turns a plan, a cluster and a profile into a predicted iteration time and
per-device peak memory, with the breakdown. Source: the standard pipeline-parallel
cost model of Metis (ATC'24), AMP (NeurIPS'22) and Sailor (SOSP'25) as written
down in ``shared/design/HPP.md``, plus block-wise gradient aggregation (ETH/HPP,
arXiv 2610.22035) and activation recomputation (Megatron-LM, Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models"). Every
constant is a field of :class:`CostModelConfig`, with its source. v2 is checked
against 15 real runs (``experiments/cost_model_validation.py``); v1 is
``CostModelConfig.v1()``.

Notation: stage s of pipeline p holds layers [lo, hi) on t devices; its profile
entry E = profile[(type, t, b_p)] gives per-layer seconds and bytes of ONE device.

- Stage compute per micro-batch: F_s = sum f[lo:hi]; B_s = sum g[lo:hi], plus F_s
  under full recomputation (one extra forward).
- Point-to-point: c_s = latency + x[hi-1] / bw(link s -> s+1), once forward
  (activation) and once backward (its gradient).
- Point-to-point waits (v2): the runtime waits for its transfers before the next
  compute (DeepSpeed's PipelineEngine sends and receives blocking; torch's
  Schedule1F1B waits on its batched isend/irecv), so a stage is busy per
  micro-batch for ``P_s = k (c_in + c_out)`` besides compute: c_in = c_{s-1} (its
  input activation arrives, its gradient leaves), c_out = c_s, k =
  ``p2p_waits_per_transfer``. Stage time D_s = F_s + B_s + P_s.
- Runtime step time terms (profiles measured by ``hpp profile`` on hpp's own runtime,
  ``e.step_time``, :mod:`hpp.profiles.step_time`; public profiles have none and are priced
  as above): the last stage adds the loss's forward and backward to F_s and B_s; every
  stage adds the schedule's fixed cost per micro-batch, o + n_s q (n_s its 0-2 neighbour
  stages, q per neighbour), half to F_s and half to B_s; a transfer costs the larger of the
  link's time and the backend's measured send/recv ``latency + bytes / bandwidth``; k =
  ``p2p_waits_per_transfer_runtime``; each pipeline adds the schedule's fixed cost per
  step (its stages' largest) to T_p.
- 1F1B pipeline time: T_p = sum_s D_s + 2 sum_s c_s + (m_p - 1) max_s D_s.
  The bottleneck term includes the p2p waits (v1: compute only, comm overlapped);
  the fill counts each stage's micro-batch once (as Sailor's simulator does,
  ``t_pp = tot_comp + tot_comm + (m - 1) straggler``) plus the boundary transfers of
  the first micro-batch. A partial last micro-batch costs a full one. m_p = 0 => 0.
- Point-to-point links: the link between the last device of stage s and the first of
  stage s+1 (:meth:`~hpp.profiles.cluster.Cluster.link`: intra-node on one node, else the
  link of the two nodes' pair of device types / zones).
- Blocks: the union of all pipelines' stage boundaries cuts [0, L) into blocks; each
  block has one holder stage per pipeline. Block j's gradient is all-reduced among
  its h holders on the ring they form (:func:`hpp.formulation.collectives.allreduce_s`):
  2 (h-1)/h * bytes_j / bw + 2 (h-1) latency on the slowest adjacent pair of the best
  ring order, or hierarchically (reduce-scatter in node, ring across nodes, all-gather)
  where cheaper, as NCCL does. A device serialises the all-reduces of
  the blocks it holds; devices run in parallel: T_sync = max over devices.
  The naive alternative (one all-reduce per layer) is computed beside it.
- Optimizer: per stage sum over its layers of the profile's optimizer seconds; the
  step waits for the slowest stage.
- Iteration: T = max_p T_p + T_sync + max_stage T_opt (sync is not overlapped with
  backward). Throughput = G / T samples/s, x sequence length tokens/s.
- Memory of a device of stage s at position i (0-based) of S stages:
  R_type + state_factor * W_s + k_i * A_s + w * A_max + buffers, with R_type the
  framework's own memory on that GPU type (CUDA context, NCCL, fused kernels; v2),
  k_i = min(m_p, S - i) micro-batches in flight under 1F1B (m_p under GPipe), A_s
  the activation bytes kept per micro-batch (layer inputs only under full
  recompute, which also holds one layer's activations while recomputing it),
  w * A_max the backward workspace of the stage's largest layer (v2), buffers the
  point-to-point send/receive tensors. Must stay <= capacity - reserve.
- Memory from the runtime step's own terms (profiles measured by ``hpp profile``): the formula
  is in :mod:`hpp.formulation.memory_model`'s docstring.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from hpp.formulation.collectives import (allreduce_s, concurrent_allreduces, edge_link, p2p_transfer_s,
                                         stage_p2p_wait_s)
from hpp.formulation.collectives import p2p_flows as count_p2p_flows
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.memory_model import (in_flight_micro_batches, stage_activation_bytes, stage_memory_breakdown)
from hpp.plan_data import Plan, Stage
from hpp.profiles.cluster import Cluster, Link
from hpp.profiles.model_profile import LayerProfile, ModelProfile

__all__ = ["StageEstimate", "PipelineEstimate", "BlockEstimate", "PlanEstimate", "pipeline_time_1f1b_s",
           "stage_compute_s", "stage_fixed_s", "stage_time_s", "block_decomposition", "estimate_plan"]


# ------------------------------------------------------------------ small formulas


def pipeline_time_1f1b_s(stage_compute_s: Sequence[float], p2p_s: Sequence[float], num_micro_batches: int) -> float:
    """1F1B time of one pipeline for one iteration [s].

    Parameters
    ----------
    stage_compute_s : (S,) float
        Stage time per micro-batch D_s = F_s + B_s + P_s [s] (:func:`stage_time_s`).
    p2p_s : (S-1,) float
        One-way point-to-point time between stage s and s+1 [s].
    num_micro_batches : int
        m >= 0; 0 gives 0.0.

    Returns
    -------
    float
        ``sum(stage) + 2 sum(p2p) + (m - 1) max(stage)``; source: HPP.md (Metis/AMP form).

    Examples
    --------
    >>> pipeline_time_1f1b_s([3.0, 2.0], [0.5], 3)
    12.0
    """
    if num_micro_batches < 0:
        raise ValueError(f"num_micro_batches must be >= 0, got {num_micro_batches}")
    if num_micro_batches == 0:
        return 0.0
    return sum(stage_compute_s) + 2.0 * sum(p2p_s) + (num_micro_batches - 1) * max(stage_compute_s)


def stage_compute_s(e: LayerProfile, lo: int, hi: int, recompute: str) -> tuple[float, float]:
    """(F_s, B_s) per micro-batch [s] for layers [lo, hi); recomputation adds to B_s.

    ``full`` adds the stage's forward (one extra forward pass); ``selective`` adds the
    forward share of the attention activations, estimated as F_s * att/act bytes.
    With the runtime step's time terms (``e.step_time``) the stage's fixed time per
    micro-batch (:func:`stage_fixed_s`: loss on the last stage, schedule overhead) is
    added, half to F_s and half to B_s, the loss's own forward and backward to each.

    Examples
    --------
    >>> from hpp.profiles.model_profile import LayerProfile
    >>> from dataclasses import replace
    >>> from hpp.profiles.step_time import StepTimeTerms
    >>> e = LayerProfile("X", 1, 1, (1.0,) * 3, (2.0,) * 3, (0.1,) * 3, (100,) * 3, (10,) * 3, (5, 6, 7))
    >>> stage_compute_s(e, 1, 3, "none")
    (2.0, 4.0)
    >>> t = StepTimeTerms(0.25, 0.5, 0.2, 0.0, 0.0, 0.0, 1e9, p2p_overhead_s=0.1)
    >>> stage_compute_s(replace(e, step_time=t), 1, 3, "none")    # + loss, + (0.2 + 1 x 0.1) / 2 each
    (2.4, 4.65)
    """
    fwd = sum(e.forward_s[lo:hi])
    bwd = sum(e.backward_s[lo:hi])
    if recompute == "full":
        bwd += fwd
    elif recompute == "selective":
        stage_activation_bytes(e, lo, hi, recompute)  # raises if unsupported
        act = sum(e.activation_bytes[lo:hi])
        att = sum(e.attention_activation_bytes[lo:hi])  # type: ignore[index]
        bwd += fwd * (att / act if act else 0.0)
    t = e.step_time
    if t is not None:
        half = t.stage_overhead_s(int(lo > 0) + int(hi < e.num_layers)) / 2.0
        last = hi == e.num_layers
        fwd += half + (t.loss_forward_s if last else 0.0)
        bwd += half + (t.loss_backward_s if last else 0.0)
    return fwd, bwd


def stage_fixed_s(e: LayerProfile, lo: int, hi: int) -> float:
    """A stage's time per micro-batch besides its layers and transfer waits [s] (0 without ``e.step_time``).

    The loss's forward and backward on the last stage (``hi == L``) plus the schedule's
    fixed cost per micro-batch for the stage's 0-2 neighbours
    (:meth:`hpp.profiles.step_time.StepTimeTerms.stage_overhead_s`); what
    :func:`stage_compute_s` adds to the layers' F_s + B_s.
    """
    t = e.step_time
    if t is None:
        return 0.0
    loss = t.loss_forward_s + t.loss_backward_s if hi == e.num_layers else 0.0
    return loss + t.stage_overhead_s(int(lo > 0) + int(hi < e.num_layers))


def stage_time_s(e: LayerProfile, lo: int, hi: int, recompute: str, *, link_in: Link | None,
                 link_out: Link | None, config: CostModelConfig = CostModelConfig()) -> float:
    """D_s = F_s + B_s + P_s: a stage's time per micro-batch [s] (compute and point-to-point waits)."""
    f, b = stage_compute_s(e, lo, hi, recompute)
    return f + b + stage_p2p_wait_s(e, lo, hi, link_in=link_in, link_out=link_out, config=config)


def block_decomposition(boundaries: Sequence[Sequence[int]]) -> list[tuple[int, int, tuple[int, ...]]]:
    """Blocks of a multi-pipeline plan.

    Parameters
    ----------
    boundaries : per pipeline, its stage boundaries ``(0, hi_0, ..., L)``.

    Returns
    -------
    list of (layer_start, layer_stop, holder_stage_per_pipeline)
        Maximal layer ranges that no pipeline's boundary cuts, and for each pipeline
        the index of the stage that holds the block.

    Examples
    --------
    >>> block_decomposition([(0, 2, 3), (0, 1, 3)])
    [(0, 1, (0, 0)), (1, 2, (0, 1)), (2, 3, (1, 1))]
    """
    cuts = sorted({b for bs in boundaries for b in bs})
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        holders = []
        for bs in boundaries:
            s = next(i for i in range(len(bs) - 1) if bs[i] <= lo < bs[i + 1])
            holders.append(s)
        out.append((lo, hi, tuple(holders)))
    return out


# ------------------------------------------------------------------ records


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """Predicted figures of one stage (per device of the stage)."""

    layer_start: int
    layer_stop: int
    device_type: str
    tp_degree: int
    recompute: str
    forward_s: float            # per micro-batch
    backward_s: float           # per micro-batch, recomputation included
    p2p_s: float                # one-way send to the next stage (0 for the last)
    busy_s: float               # m * (forward + backward + p2p waits)
    bubble_s: float             # pipeline time - busy
    optimizer_s: float
    grad_sync_s: float          # this device's serialised block all-reduces
    in_flight_micro_batches: int
    memory_bytes: int
    capacity_bytes: int                 # usable: device memory (1 - headroom) - reserve
    memory_breakdown: dict = field(default_factory=dict)   # stage_memory_breakdown's parts [bytes]

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.memory_bytes


@dataclass(frozen=True, slots=True)
class PipelineEstimate:
    """Predicted figures of one pipeline."""

    time_s: float
    num_micro_batches: int
    micro_batch_size: int
    num_samples: int
    bottleneck_s: float
    stages: tuple[StageEstimate, ...]


@dataclass(frozen=True, slots=True)
class BlockEstimate:
    """One gradient block: layers, holder stage per pipeline, bytes per holder device, all-reduce time [s], its
    form (``none``, ``ring``, ``hierarchical``), the peak [bytes/s] one flow gets on the link it is priced on
    (0: none; a shared link's share) and the most flows leaving one of its ring's nodes at once (1: unshared)."""

    layer_start: int
    layer_stop: int
    holders: tuple[int, ...]
    num_bytes: int
    allreduce_s: float
    allreduce_method: str = "none"
    link_bytes_per_s: float = 0.0
    concurrent_flows: int = 1


@dataclass(frozen=True)
class PlanEstimate:
    """Predicted iteration of a plan, with the breakdown.

    Attributes
    ----------
    iteration_time_s : float
        max pipeline time + gradient sync (block or layer, per config) + optimizer step.
    grad_sync_block_s, grad_sync_layer_s : float
        Exposed gradient-sync time with block-wise and per-layer all-reduce.
    peak_memory_bytes : int
        Largest predicted memory over devices.
    uses_estimated_profile : bool
        Some stage used an estimated (not measured) profile entry.
    """

    iteration_time_s: float
    pipeline_time_s: float
    grad_sync_s: float
    grad_sync_block_s: float
    grad_sync_layer_s: float
    optimizer_s: float
    throughput_samples_per_s: float
    throughput_tokens_per_s: float
    peak_memory_bytes: int
    pipelines: tuple[PipelineEstimate, ...]
    blocks: tuple[BlockEstimate, ...]
    uses_estimated_profile: bool = False
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fits_memory(self) -> bool:
        return all(s.memory_bytes <= s.capacity_bytes for p in self.pipelines for s in p.stages)


# ------------------------------------------------------------------ the estimate


def _stage_nodes(cluster: Cluster, a: Stage, b: Stage) -> tuple[int, int]:
    """The nodes of the transfer from stage ``a`` to the next stage ``b`` (a's last device, b's first)."""
    return cluster.devices[a.device_ids[-1]].node, cluster.devices[b.device_ids[0]].node


def _stage_link(cluster: Cluster, a: Stage, b: Stage, flows: dict[int, int]) -> Link:
    """The link of the transfer from stage ``a`` to ``b``: intra-node on one node, else one flow's share
    (:func:`~hpp.formulation.collectives.edge_link`) with ``flows`` leaving each node at once."""
    na, nb = _stage_nodes(cluster, a, b)
    return cluster.nodes[na].intra_node if na == nb else edge_link(cluster, na, nb, flows)


def estimate_plan(plan: Plan, cluster: Cluster, profile: ModelProfile, *,
                  config: CostModelConfig = CostModelConfig(), estimate_missing: bool = True,
                  p2p_flows: Mapping[int, int] | None = None) -> PlanEstimate:
    """Predict one iteration of ``plan`` on ``cluster`` with ``profile``.

    The plan must be structurally valid (:func:`hpp.validate.validate_plan`). ``p2p_flows``: the
    point-to-point flows leaving each node at once (:func:`~hpp.formulation.collectives.p2p_flows`) when
    ``plan`` holds only some pipelines of a larger plan that runs beside them; None: the plan's own.

    Returns
    -------
    PlanEstimate

    Raises
    ------
    HppInputError
        A stage's (device type, TP, micro-batch) is not in the profile (and cannot
        be estimated), or a recomputation mode the profile cannot support.
    """
    uses_estimate = False
    stage_entries: list[list[LayerProfile]] = []
    for p in plan.pipelines:
        row = []
        for s in p.stages:
            e = profile.layer_profile(s.device_type, s.tp_degree, p.micro_batch_size, estimate=estimate_missing)
            uses_estimate |= e.estimated
            row.append(e)
        stage_entries.append(row)

    # block-wise and per-layer gradient sync: one ring per TP shard index, on the holders' actual links (best
    # order or hierarchical), the flows that leave a node at once sharing its network
    blocks = block_decomposition([p.boundaries for p in plan.pipelines])
    device_sync_block: dict[int, float] = {}
    device_sync_layer: dict[int, float] = {}
    block_records = []
    block_rings = []
    for lo, hi, holders in blocks:
        holder_entries = [stage_entries[p][s] for p, s in enumerate(holders)]
        block_rings.append((max(sum(e.param_bytes[lo:hi]) for e in holder_entries),
                            [plan.pipelines[p].stages[s].device_ids for p, s in enumerate(holders)]))
    rings: dict = {}                    # the blocks' ring shapes: a block's per-layer pieces keep its ring order
    costs, sync_flows = concurrent_allreduces(block_rings, cluster, hierarchical=config.hierarchical_allreduce,
                                              memo=rings)
    for (lo, hi, holders), (nbytes, groups), ar in zip(blocks, block_rings, costs):
        holder_entries = [stage_entries[p][s] for p, s in enumerate(holders)]
        t_block = ar.seconds
        t_layers = sum(allreduce_s(max(e.param_bytes[l] for e in holder_entries), groups, cluster,
                                   hierarchical=config.hierarchical_allreduce, memo=rings,
                                   flows=sync_flows if len(groups) > 1 else None).seconds for l in range(lo, hi))
        for g in groups:
            for d in g:
                device_sync_block[d] = device_sync_block.get(d, 0.0) + t_block
                device_sync_layer[d] = device_sync_layer.get(d, 0.0) + t_layers
        block_records.append(BlockEstimate(lo, hi, holders, int(nbytes), t_block, ar.method,
                                           ar.link.peak_bytes_per_s if ar.link is not None else 0.0, ar.flows))
    sync_block = max(device_sync_block.values(), default=0.0)
    sync_layer = max(device_sync_layer.values(), default=0.0)
    device_sync = device_sync_block if config.grad_sync == "block" else device_sync_layer

    pipes = []
    max_opt = 0.0
    # point-to-point: every pipeline's stage boundaries that cross nodes share those nodes' networks
    crossing_flows = dict(p2p_flows) if p2p_flows is not None else count_p2p_flows(
        [_stage_nodes(cluster, a, b) for p in plan.pipelines if p.num_micro_batches > 0
         for a, b in zip(p.stages, p.stages[1:])])
    for p, entries in zip(plan.pipelines, stage_entries):
        m = p.num_micro_batches
        S = p.num_stages
        fb = [stage_compute_s(e, s.layer_start, s.layer_stop, s.recompute) for s, e in zip(p.stages, entries)]
        links = [_stage_link(cluster, a, b, crossing_flows) for a, b in zip(p.stages, p.stages[1:])]
        p2p = [p2p_transfer_s(e, link, e.output_bytes[a.layer_stop - 1]) for a, link, e in zip(p.stages, links, entries)]
        comp = [f + b + stage_p2p_wait_s(e, s.layer_start, s.layer_stop, link_in=links[i - 1] if i > 0 else None,
                                         link_out=links[i] if i < S - 1 else None, config=config)
                for i, ((f, b), s, e) in enumerate(zip(fb, p.stages, entries))]
        t_p = pipeline_time_1f1b_s(comp, p2p, m)
        if m > 0:                       # the schedule's fixed cost per step (runtime time terms only)
            t_p += max((e.step_time.step_overhead_s for e in entries if e.step_time is not None), default=0.0)
        stages = []
        for i, (s, e) in enumerate(zip(p.stages, entries)):
            opt = sum(e.optimizer_s[s.layer_start:s.layer_stop])
            max_opt = max(max_opt, opt)
            parts = stage_memory_breakdown(e, s.layer_start, s.layer_stop, position=i, num_stages=S,
                                           num_micro_batches=m, recompute=s.recompute, schedule=p.schedule,
                                           config=config)
            mem = parts["peak"]
            cap = config.usable_memory_bytes(cluster.device_types[s.device_type].memory_bytes)
            stages.append(StageEstimate(
                s.layer_start, s.layer_stop, s.device_type, s.tp_degree, s.recompute, fb[i][0], fb[i][1],
                p2p[i] if i < S - 1 else 0.0, m * comp[i], t_p - m * comp[i], opt,
                max(device_sync.get(d, 0.0) for d in s.device_ids),
                in_flight_micro_batches(i, S, max(m, 1), p.schedule), mem, cap, parts))
        pipes.append(PipelineEstimate(t_p, m, p.micro_batch_size, p.num_samples, max(comp), tuple(stages)))

    t_pipe = max(pe.time_s for pe in pipes)
    t_sync = sync_block if config.grad_sync == "block" else sync_layer
    t_iter = t_pipe + t_sync + max_opt
    thr = plan.global_batch_size / t_iter if t_iter > 0 else 0.0
    peak = max(s.memory_bytes for pe in pipes for s in pe.stages)
    warnings = ("some stages use estimated profile entries (micro-batch size not measured)",) if uses_estimate else ()
    return PlanEstimate(t_iter, t_pipe, t_sync, sync_block, sync_layer, max_opt, thr,
                        thr * plan.sequence_length, peak, tuple(pipes), tuple(block_records), uses_estimate, warnings)
