"""Named constants of the cost model (:class:`CostModelConfig`), each with its source.

Split out of :mod:`hpp.formulation.cost_model` (which re-exports every name) so that the
link/collective pricing (:mod:`hpp.formulation.collectives`) and the memory formulas
(:mod:`hpp.formulation.memory_model`) can use it without importing the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpp.errors import HppInputError

__all__ = ["OPTIMIZER_STATES", "FRAMEWORK_BYTES", "CostModelConfig"]


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
        grad + wd x param (both measured by :mod:`hpp.runtime.profile.stage_memory`: 1.00 P).
    hierarchical_allreduce : bool
        Price a block's all-reduce hierarchically (reduce-scatter in node, ring across nodes,
        all-gather in node) where that is cheaper than the flat ring, as NCCL does
        (:func:`hpp.formulation.collectives.allreduce_s`). False: flat ring only (ablation).
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
    hierarchical_allreduce: bool = True

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
