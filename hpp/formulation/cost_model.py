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
- Blocks: the union of all pipelines' stage boundaries cuts [0, L) into blocks; each
  block has one holder stage per pipeline. Block j's gradient is all-reduced among
  its h holders (ring): 2 (h-1)/h * bytes_j / bw_min + 2 (h-1) latency, with
  bw_min the slowest link among the holders. A device serialises the all-reduces of
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
- Memory from the runtime step's own terms (profiles measured by ``hpp profile``,
  :mod:`hpp.runtime.memory_profile`; :func:`stage_memory_breakdown`): with P the stage's
  parameter bytes (fp32 masters also under bf16 mixed precision), n the optimizer's
  states per parameter (AdamW 2, SGD 0; a tied pair held by one stage counted once), K = sum of ``step_activation_bytes[lo:hi]``
  (``first_stage_step_activation_bytes`` on a first stage where measured)
  (+ ``loss_activation_bytes`` on the last stage), buffers = m x input bytes (non-first
  stage) + m x output bytes (non-last): the pipelining library's receive buffers, one
  per micro-batch, for activations and gradients:

      backward phase:  P (2 + n) + buffers + k_i K + g + max_l (T_l - sum_{j > l} K_j)
      optimizer phase: P (2 + n) + buffers + o P

  g = one input gradient still held from the previous backward (non-first stage,
  m > k_i), T_l = ``backward_transient_bytes[l]``, K_j the per-layer terms of the
  layers after l in the stage (freed by the time l runs backward), o the optimizer
  step's temporaries per parameter byte. Peak = R_type + max of the two phases.
  Under full recomputation a layer keeps its output O_l only and its backward first
  rebuilds the rest of what it saved (T_l + K_l - O_l). Must stay <= capacity (1 - headroom) - reserve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from hpp.errors import HppInputError
from hpp.plan import Plan, Stage
from hpp.profiles.cluster import Cluster, Link
from hpp.profiles.model_profile import LayerProfile, ModelProfile

__all__ = [
    "FRAMEWORK_BYTES", "CostModelConfig", "StageEstimate", "PipelineEstimate", "BlockEstimate", "PlanEstimate",
    "pipeline_time_1f1b_s", "ring_allreduce_s", "in_flight_micro_batches", "stage_activation_bytes",
    "stage_compute_s", "stage_fixed_s", "stage_p2p_wait_s", "p2p_transfer_s", "p2p_waits_per_transfer",
    "stage_time_s", "stage_memory_bytes", "stage_memory_breakdown",
    "block_decomposition", "estimate_plan", "OPTIMIZER_STATES",
]


#: Optimizer state tensors per parameter (fp32, like the parameter): AdamW exp_avg + exp_avg_sq, SGD none.
OPTIMIZER_STATES: dict[str, int] = {"adamw": 2, "sgd": 0}

#: Memory a training process holds outside the model's tensors, per GPU type [bytes].
#: GH-96 (GH200): 4.76e9, Sailor's calibrated figure for "fused kernel loading, depends on GPU +
#: platform" on these nodes (eth-easl/sailor cf2c8e3, sailor/Planner/simulations/runtime_simulator.py,
#: ``get_memory_footprint_on_gpu``: ``megatron_mem = 4.76 * 1e9 + ...``). Other GPU types: 3.0e9,
#: Sailor's planner figure for "extra mem needed by megatron, shown in nvidia-smi, but not as part of
#: torch mem" (same file, ``check_config_fits``: 2.0e9 at TP 1, 3.0e9 at TP > 1; we take the larger).
#: Device types not listed (CPU emulation, user-defined types) get 0.
FRAMEWORK_BYTES: tuple[tuple[str, int], ...] = (
    ("GH-96", 4_760_000_000),
    ("A100-40", 3_000_000_000), ("A100-80", 3_000_000_000), ("V100-16", 3_000_000_000),
    ("Titan-RTX", 3_000_000_000), ("RTX-2080", 3_000_000_000), ("RTX-3090", 3_000_000_000),
)


@dataclass(frozen=True, slots=True)
class CostModelConfig:
    """Named constants of the cost model; one place, each with its source.

    Attributes
    ----------
    state_bytes_per_param_byte : float
        Memory for weights + gradients + optimizer states per byte of (fp32)
        parameters in the profile. 4.0 = fp32 weights (4 B) + fp32 grads (4 B) +
        Adam m and v (8 B) per 4-byte parameter; Megatron's mixed precision
        (2 + 2 + 4 + 4 + 4 = 16 B per parameter) gives the same 4.0. (Sailor's
        simulator uses 24 B per parameter, adding DeepSpeed's communication and
        start-up copies; on the 15 GH200 runs 16 B fits better: the intercepts of
        memory vs micro-batch size of the 1-, 2- and 4-stage plans then agree.)
    framework_bytes : tuple of (device type, bytes)
        Memory of the training process outside the model's tensors per GPU type
        (CUDA context, NCCL buffers, fused kernels); see :data:`FRAMEWORK_BYTES`.
    backward_workspace_layers : float
        Transient memory while a layer runs backward (the gradients of its saved
        tensors) in units of that layer's activation bytes; the largest layer of
        the stage sets it. 1.0: autograd materialises one gradient per saved
        activation of the layer being differentiated, so the workspace is of the
        order of the layer's own activations (Korthikanti et al. 2022 count kept
        activations only; the per-sample slope of the 15 GH200 runs exceeds the kept
        activations by 0.9-1.2 layer activations per stage, the head's included).
    p2p_waits_per_transfer : float
        k in P_s = k (c_in + c_out): how often, per micro-batch, a stage waits for each
        of its boundary transfers. 2.0: DeepSpeed's PipelineEngine (Sailor's runs)
        receives and sends blocking, so the activation (recv, send) and its gradient
        (recv, send) each occupy both neighbours once forward and once backward
        (deepspeed/runtime/pipe/engine.py ``_exec_send_activations`` /
        ``_exec_recv_grads``, p2p.send/recv). torch.distributed.pipelining batches a
        send with a receive and waits on both (1.0 on a full-duplex link); 2.0 is the
        conservative choice for it. 0.0 gives v1 (communication fully overlapped).
    p2p_waits_per_transfer_runtime : float
        k for stages whose profile entry carries the runtime step's time terms
        (``LayerProfile.step_time``, measured on hpp's own runtime). 1.0: torch's
        Schedule1F1B posts a stage's send together with the receive it waits for next
        (``fwd_send + bwd_recv``, then ``bwd_send + fwd_recv``; torch/distributed/pipelining/
        schedules.py, ``Schedule1F1B._step_microbatches``), so each boundary transfer is
        waited for once per micro-batch.
    reserve_bytes : int
        Memory kept free on every device (allocator fragmentation, safety margin)
        [bytes], subtracted from the capacity. Default 0: capacities are used as given.
    grad_sync : str
        ``"block"`` (block-wise aggregation, HPP) or ``"layer"`` (one all-reduce per
        layer, the naive alternative): which one enters the iteration time.
    memory_headroom : float
        Fraction of every device's memory kept free, in [0, 1): a stage must fit in
        ``capacity (1 - memory_headroom) - reserve_bytes``. Default 0.0 (``hpp plan
        --memory-headroom``).
    optimizer : str
        ``"adamw"`` or ``"sgd"``: the optimizer the run uses, whose states
        (:data:`OPTIMIZER_STATES`) the step-memory terms count. Used only for profiles with
        the runtime step's memory terms (:attr:`LayerProfile.has_step_memory`); the
        calibrated formula keeps ``state_bytes_per_param_byte``.
    optimizer_transient_params : float
        The optimizer step's temporaries in units of the stage's parameter bytes (step-memory
        terms only). 1.0: torch's multi-tensor (``foreach``) AdamW, the GPU default,
        materialises sqrt(v) for every parameter, and foreach SGD with weight decay
        grad + wd x param (both measured by :mod:`hpp.runtime.memory`: 1.00 P).
    """

    state_bytes_per_param_byte: float = 4.0
    framework_bytes: tuple[tuple[str, int], ...] = FRAMEWORK_BYTES
    backward_workspace_layers: float = 1.0
    p2p_waits_per_transfer: float = 2.0
    p2p_waits_per_transfer_runtime: float = 1.0
    reserve_bytes: int = 0
    grad_sync: str = "block"
    memory_headroom: float = 0.0
    optimizer: str = "adamw"
    optimizer_transient_params: float = 1.0

    def __post_init__(self) -> None:
        if self.grad_sync not in ("block", "layer"):
            raise HppInputError(f"grad_sync={self.grad_sync!r}", field="grad_sync", fix="use 'block' or 'layer'")
        for name in ("state_bytes_per_param_byte", "backward_workspace_layers", "p2p_waits_per_transfer",
                     "p2p_waits_per_transfer_runtime", "optimizer_transient_params"):
            if not getattr(self, name) >= 0:
                raise HppInputError(f"{name}={getattr(self, name)!r}", field=name, fix="use a value >= 0")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise HppInputError(f"memory headroom {self.memory_headroom!r}", field="memory_headroom",
                                fix="give the fraction of each device's memory to keep free, in [0, 1), e.g. 0.05")
        if self.optimizer not in OPTIMIZER_STATES:
            raise HppInputError(f"optimizer {self.optimizer!r}", field="optimizer",
                                fix=f"use one of {sorted(OPTIMIZER_STATES)}")

    def usable_memory_bytes(self, capacity_bytes: int) -> int:
        """What a stage may use of a device of ``capacity_bytes``: ``capacity (1 - headroom) - reserve``.

        >>> CostModelConfig(memory_headroom=0.05).usable_memory_bytes(1000)
        950
        """
        if self.memory_headroom == 0.0:
            return int(capacity_bytes - self.reserve_bytes)
        return int(capacity_bytes * (1.0 - self.memory_headroom)) - self.reserve_bytes

    def framework_bytes_of(self, device_type: str) -> int:
        """Framework memory [bytes] of one device of ``device_type`` (0 if not listed).

        >>> CostModelConfig().framework_bytes_of("GH-96")
        4760000000
        """
        return next((b for t, b in self.framework_bytes if t == device_type), 0)

    @classmethod
    def v1(cls) -> "CostModelConfig":
        """The uncalibrated v1 model: no framework memory, no backward workspace, p2p fully overlapped."""
        return cls(framework_bytes=(), backward_workspace_layers=0.0, p2p_waits_per_transfer=0.0)


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


def ring_allreduce_s(num_bytes: float, num_ranks: int, link: Link) -> float:
    """Ring all-reduce of ``num_bytes`` among ``num_ranks`` ranks over ``link`` [s].

    ``2 (n-1)/n * bytes / bw + 2 (n-1) * latency`` (Patarasuk & Yuan 2009; HPP.md).
    The bandwidth is the link's effective bandwidth for a message of ``bytes / n``
    (one ring chunk). 0 for one rank or no bytes.

    Examples
    --------
    >>> ring_allreduce_s(1e9, 2, Link(1e9, 0.0))
    1.0
    """
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    chunk = num_bytes / num_ranks
    bw = link.bandwidth_bytes_per_s(chunk)
    return 2.0 * (num_ranks - 1) / num_ranks * num_bytes / bw + 2.0 * (num_ranks - 1) * link.latency_s


def in_flight_micro_batches(position: int, num_stages: int, num_micro_batches: int, schedule: str = "1F1B") -> int:
    """Micro-batches whose activations stage ``position`` (0-based) holds at its peak.

    1F1B: ``min(m, S - position)`` (the first stage warms up with S micro-batches);
    GPipe: ``m`` (all forwards before any backward). Source: Narayanan et al. 2021 (PipeDream-Flush).
    """
    if schedule == "GPipe":
        return num_micro_batches
    return min(num_micro_batches, num_stages - position)


def stage_activation_bytes(e: LayerProfile, lo: int, hi: int, recompute: str, *,
                           config: CostModelConfig = CostModelConfig()) -> tuple[int, int]:
    """Activation bytes of layers [lo, hi) for one device: (kept per in-flight micro-batch, working set).

    The working set is held once, by the layer being differentiated: its backward
    workspace ``w * max(activation_bytes[lo:hi])`` (``w = backward_workspace_layers``),
    plus, under recomputation, that layer's recomputed activations.

    - ``none``: every layer's ``activation_bytes`` kept.
    - ``full``: only each layer's input (the previous layer's ``output_bytes``; the
      token ids of layer 0 are negligible) kept per micro-batch, plus ONE layer's full
      activations in the working set while it is recomputed (Megatron full recomputation).
    - ``selective``: ``activation_bytes - attention_activation_bytes`` kept (Megatron
      selective recomputation); needs the attention share in the profile.

    Examples
    --------
    >>> from hpp.profiles.model_profile import LayerProfile
    >>> e = LayerProfile("X", 1, 1, (1.0,) * 3, (2.0,) * 3, (0.1,) * 3, (100,) * 3, (10, 20, 30), (5, 6, 7))
    >>> stage_activation_bytes(e, 0, 3, "none")     # all kept; workspace of the largest layer
    (60, 30)
    >>> stage_activation_bytes(e, 0, 3, "full")     # inputs of layers 1, 2; recomputed layer + workspace
    (11, 60)

    Raises
    ------
    HppInputError
        ``selective`` on a profile without ``attention_activation_bytes``; an unknown mode.
    """
    workspace = config.backward_workspace_layers * max(e.activation_bytes[lo:hi])
    if recompute == "none":
        return sum(e.activation_bytes[lo:hi]), int(workspace)
    if recompute == "full":
        kept = sum(e.output_bytes[l - 1] for l in range(max(lo, 1), hi))
        return kept, int(max(e.activation_bytes[lo:hi]) + workspace)
    if recompute == "selective":
        if e.attention_activation_bytes is None:
            raise HppInputError(
                f"selective recomputation needs attention_activation_bytes, which the profile of {e.device_type} "
                f"(tp {e.tp_degree}, micro-batch {e.micro_batch_size}) lacks", field="recompute",
                fix="use recompute 'full' or 'none', or profile the attention share")
        kept = sum(a - s for a, s in zip(e.activation_bytes[lo:hi], e.attention_activation_bytes[lo:hi]))
        return kept, int(workspace)
    raise HppInputError(f"unknown recompute mode {recompute!r}", field="recompute",
                        fix="use 'none', 'full' or 'selective'")


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


def p2p_transfer_s(e: LayerProfile, link: Link, num_bytes: float) -> float:
    """One-way transfer of ``num_bytes`` from a stage of entry ``e`` over ``link`` [s].

    ``link.transfer_s(num_bytes)``; with the runtime step's time terms, at least the
    backend's measured send/recv time (``e.step_time.p2p_s``).
    """
    c = link.transfer_s(num_bytes)
    return max(c, e.step_time.p2p_s(num_bytes)) if e.step_time is not None else c


def p2p_waits_per_transfer(e: LayerProfile, config: CostModelConfig = CostModelConfig()) -> float:
    """k of :func:`stage_p2p_wait_s`: ``p2p_waits_per_transfer_runtime`` with ``e.step_time``, else the calibrated one."""
    return config.p2p_waits_per_transfer_runtime if e.step_time is not None else config.p2p_waits_per_transfer


def stage_p2p_wait_s(e: LayerProfile, lo: int, hi: int, *, link_in: Link | None, link_out: Link | None,
                     config: CostModelConfig = CostModelConfig()) -> float:
    """P_s: seconds per micro-batch a stage of layers [lo, hi) waits for its point-to-point transfers.

    ``k * (c_in + c_out)`` with ``c_in = link_in.transfer_s(output_bytes[lo-1])`` (0 for the
    first stage, ``lo == 0``), ``c_out = link_out.transfer_s(output_bytes[hi-1])`` (0 for the
    last, ``hi == L``) and ``k = config.p2p_waits_per_transfer``; with the runtime step's time
    terms :func:`p2p_transfer_s` and ``k = config.p2p_waits_per_transfer_runtime``.

    Examples
    --------
    >>> from hpp.profiles.cluster import Link
    >>> from hpp.profiles.model_profile import LayerProfile
    >>> e = LayerProfile("X", 1, 1, (1.0,) * 3, (2.0,) * 3, (0.1,) * 3, (100,) * 3, (10,) * 3, (5, 6, 7))
    >>> stage_p2p_wait_s(e, 1, 2, link_in=Link(1000.0, 0.0), link_out=Link(1000.0, 0.0))  # 2 x (5 + 6) / 1000
    0.022
    """
    c_in = p2p_transfer_s(e, link_in, e.output_bytes[lo - 1]) if lo > 0 and link_in is not None else 0.0
    c_out = (p2p_transfer_s(e, link_out, e.output_bytes[hi - 1]) if hi < e.num_layers and link_out is not None
             else 0.0)
    return p2p_waits_per_transfer(e, config) * (c_in + c_out)


def stage_time_s(e: LayerProfile, lo: int, hi: int, recompute: str, *, link_in: Link | None,
                 link_out: Link | None, config: CostModelConfig = CostModelConfig()) -> float:
    """D_s = F_s + B_s + P_s: a stage's time per micro-batch [s] (compute and point-to-point waits)."""
    f, b = stage_compute_s(e, lo, hi, recompute)
    return f + b + stage_p2p_wait_s(e, lo, hi, link_in=link_in, link_out=link_out, config=config)


def stage_memory_bytes(e: LayerProfile, lo: int, hi: int, *, position: int, num_stages: int,
                       num_micro_batches: int, recompute: str = "none", schedule: str = "1F1B",
                       config: CostModelConfig = CostModelConfig()) -> int:
    """Peak memory of one device of a stage [bytes] (see the module docstring for the formula).

    Profiles with the runtime step's memory terms (``e.has_step_memory``) are priced by
    :func:`stage_memory_breakdown`; the others by the calibrated formula.
    """
    if e.has_step_memory:
        return stage_memory_breakdown(e, lo, hi, position=position, num_stages=num_stages,
                                      num_micro_batches=num_micro_batches, recompute=recompute, schedule=schedule,
                                      config=config)["peak"]
    weights = config.state_bytes_per_param_byte * sum(e.param_bytes[lo:hi])
    kept, working = stage_activation_bytes(e, lo, hi, recompute, config=config)
    k = in_flight_micro_batches(position, num_stages, max(num_micro_batches, 1), schedule)
    buffers = 0
    if position > 0:
        buffers += 2 * e.output_bytes[lo - 1]   # received activation + its gradient
    if position < num_stages - 1:
        buffers += 2 * e.output_bytes[hi - 1]   # sent activation + received gradient
    return int(config.framework_bytes_of(e.device_type) + weights + k * kept + working + buffers)


def stage_memory_breakdown(e: LayerProfile, lo: int, hi: int, *, position: int, num_stages: int,
                           num_micro_batches: int, recompute: str = "none", schedule: str = "1F1B",
                           config: CostModelConfig = CostModelConfig()) -> dict[str, int]:
    """Peak memory of one device of a stage and its parts [bytes].

    With the runtime step's memory terms (``e.has_step_memory``; module docstring):

    ``parameters``, ``gradients``, ``optimizer_states`` (P, P, n P); ``pipeline_buffers``
    (receive buffers + a held input gradient); ``embedding`` (k x the embedding's term on
    the first stage), ``head_and_loss`` (k x the head's and the loss's terms on the last
    stage), ``activations`` (k x the other layers' terms); ``backward_transient``;
    ``optimizer_step`` (the optimizer's temporaries); ``framework``; ``peak`` = framework +
    states + buffers + the larger phase (``phase``: 0 = backward, 1 = optimizer step).

    Without them (calibrated formula): ``framework``, ``weights_and_states``,
    ``activations``, ``backward_workspace``, ``pipeline_buffers``, ``peak``.

    Examples
    --------
    >>> from hpp.profiles.model_profile import LayerProfile
    >>> e = LayerProfile("X", 1, 1, (1.0,) * 3, (2.0,) * 3, (0.1,) * 3, (10,) * 3, (10,) * 3, (5, 6, 7),
    ...                  step_activation_bytes=(5, 20, 30), backward_transient_bytes=(4, 8, 40),
    ...                  loss_activation_bytes=9)
    >>> d = stage_memory_breakdown(e, 0, 3, position=0, num_stages=1, num_micro_batches=2,
    ...                            config=CostModelConfig(optimizer="sgd", framework_bytes=()))
    >>> d["peak"], d["head_and_loss"], d["backward_transient"], d["phase"]   # 2 x 30 + (5 + 20 + 39) + 40
    (164, 39, 40, 0)
    """
    k = in_flight_micro_batches(position, num_stages, max(num_micro_batches, 1), schedule)
    framework = config.framework_bytes_of(e.device_type)
    if not e.has_step_memory:
        kept, working = stage_activation_bytes(e, lo, hi, recompute, config=config)
        weights = int(config.state_bytes_per_param_byte * sum(e.param_bytes[lo:hi]))
        buffers = (2 * e.output_bytes[lo - 1] if position > 0 else 0) + \
            (2 * e.output_bytes[hi - 1] if position < num_stages - 1 else 0)
        parts = {"framework": framework, "weights_and_states": weights, "activations": k * kept,
                 "backward_workspace": working, "pipeline_buffers": buffers}
        return parts | {"peak": stage_memory_bytes(e, lo, hi, position=position, num_stages=num_stages,
                                                   num_micro_batches=num_micro_batches, recompute=recompute,
                                                   schedule=schedule, config=config)}
    if recompute not in ("none", "full"):
        raise HppInputError(f"recompute {recompute!r} with the runtime step's memory terms", field="recompute",
                            fix="use 'none' or 'full' (the runtime executes no other mode)")
    L = e.num_layers
    m = max(num_micro_batches, 1)
    params = sum(e.param_bytes[lo:hi]) - (e.tied_param_bytes or 0 if lo == 0 and hi == L else 0)
    first_stage = lo == 0 and e.first_stage_step_activation_bytes is not None
    act = list((e.first_stage_step_activation_bytes if first_stage else e.step_activation_bytes)[lo:hi])  # type: ignore
    trans = list((e.first_stage_backward_transient_bytes if first_stage and e.first_stage_backward_transient_bytes
                  is not None else e.backward_transient_bytes)[lo:hi])  # type: ignore[index]
    if recompute == "full":         # a layer keeps its output; its backward first rebuilds what it saved
        out = e.output_bytes[lo:hi]
        trans = [t + max(0, a - o) for t, a, o in zip(trans, act, out)]
        act = list(out)
    if hi == L:
        act[-1] += e.loss_activation_bytes                     # type: ignore[operator]
    freed_after, transient = 0, 0
    for a, t in zip(reversed(act), reversed(trans)):           # backward runs the layers last to first
        transient = max(transient, t - freed_after)
        freed_after += a
    buffers = m * (e.output_bytes[lo - 1] if position > 0 else 0) + \
        m * (e.output_bytes[hi - 1] if position < num_stages - 1 else 0)
    held = e.output_bytes[lo - 1] if position > 0 and m > k else 0
    first = k * act[0] if lo == 0 and hi - lo > 1 else 0
    last = k * act[-1] if hi == L else 0
    parts = {"framework": framework, "parameters": params, "gradients": params,
             "optimizer_states": OPTIMIZER_STATES[config.optimizer] * params, "pipeline_buffers": buffers + held,
             "embedding": first, "head_and_loss": last, "activations": k * sum(act) - first - last,
             "backward_transient": transient, "optimizer_step": int(config.optimizer_transient_params * params)}
    backward = k * sum(act) + held + transient
    optimizer = parts["optimizer_step"]
    base = framework + params * (2 + OPTIMIZER_STATES[config.optimizer]) + buffers
    return parts | {"peak": int(base + max(backward, optimizer)), "phase": int(optimizer > backward)}


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
    """One gradient block: layers, holder stage per pipeline, bytes per holder device, all-reduce time."""

    layer_start: int
    layer_stop: int
    holders: tuple[int, ...]
    num_bytes: int
    allreduce_s: float


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


def _stage_link(cluster: Cluster, a: Stage, b: Stage) -> Link:
    return cluster.link(a.device_ids[-1], b.device_ids[0])


def estimate_plan(plan: Plan, cluster: Cluster, profile: ModelProfile, *,
                  config: CostModelConfig = CostModelConfig(), estimate_missing: bool = True) -> PlanEstimate:
    """Predict one iteration of ``plan`` on ``cluster`` with ``profile``.

    The plan must be structurally valid (:func:`hpp.validate.validate_plan`).

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

    # block-wise and per-layer gradient sync
    blocks = block_decomposition([p.boundaries for p in plan.pipelines])
    h = len(plan.pipelines)
    device_sync_block: dict[int, float] = {}
    device_sync_layer: dict[int, float] = {}
    block_records = []
    for lo, hi, holders in blocks:
        holder_stages = [plan.pipelines[p].stages[s] for p, s in enumerate(holders)]
        holder_entries = [stage_entries[p][s] for p, s in enumerate(holders)]
        nbytes = max(sum(e.param_bytes[lo:hi]) for e in holder_entries)
        # one group per TP shard index; the slowest link among the holders of that group
        link = cluster.slowest_link([d for st in holder_stages for d in st.device_ids])
        t_block = ring_allreduce_s(nbytes, h, link)
        t_layers = sum(ring_allreduce_s(max(e.param_bytes[l] for e in holder_entries), h, link)
                       for l in range(lo, hi))
        for st in holder_stages:
            for d in st.device_ids:
                device_sync_block[d] = device_sync_block.get(d, 0.0) + t_block
                device_sync_layer[d] = device_sync_layer.get(d, 0.0) + t_layers
        block_records.append(BlockEstimate(lo, hi, holders, int(nbytes), t_block))
    sync_block = max(device_sync_block.values(), default=0.0)
    sync_layer = max(device_sync_layer.values(), default=0.0)
    device_sync = device_sync_block if config.grad_sync == "block" else device_sync_layer

    pipes = []
    max_opt = 0.0
    for p, entries in zip(plan.pipelines, stage_entries):
        m = p.num_micro_batches
        S = p.num_stages
        fb = [stage_compute_s(e, s.layer_start, s.layer_stop, s.recompute) for s, e in zip(p.stages, entries)]
        links = [_stage_link(cluster, a, b) for a, b in zip(p.stages, p.stages[1:])]
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
