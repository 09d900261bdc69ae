"""Memory of one device of a stage: the calibrated formula and the runtime step's terms (pure functions).

Split out of :mod:`hpp.formulation.cost_model` (which re-exports every name; its module docstring
gives the calibrated formula and its sources).

Memory from the runtime step's own terms (profiles measured by ``hpp profile``,
:mod:`hpp.runtime.profile.memory_terms`; :func:`stage_memory_breakdown`): with P the stage's
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

from hpp.errors import HppInputError
from hpp.formulation.cost_config import OPTIMIZER_STATES, CostModelConfig
from hpp.profiles.model_profile import LayerProfile

__all__ = ["in_flight_micro_batches", "stage_activation_bytes", "stage_memory_bytes", "stage_memory_breakdown"]


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


def _forward_transient(e: LayerProfile, lo: int, hi: int, raw: list[int], act: list[int], first_stage: bool,
                       released: int) -> int:
    """How far a stage's forward rises above its kept level (0 without ``forward_transient_bytes``).

    Layer j runs with the layers before it kept: its peak is sum(act[:j]) + R_j, R_j = F_j + raw_j
    (its rise: forward transient + what it keeps, ``raw`` its term before the stage's entry,
    exit and loss adjustments); the stage ends at sum(act). The output's cast to the send
    dtype briefly holds both (``released`` + the sent bytes above the end level).
    """
    f = e.first_stage_forward_transient_bytes if first_stage and e.first_stage_forward_transient_bytes is not None \
        else e.forward_transient_bytes
    if f is None:
        return 0
    best, after = 0, 0
    for j in range(hi - lo - 1, -1, -1):
        best = max(best, f[lo + j] + raw[j] - act[j] - after)
        after += act[j]
    if released > 0:
        best = max(best, released + e.output_bytes[hi - 1])
    return int(best)


def stage_memory_breakdown(e: LayerProfile, lo: int, hi: int, *, position: int, num_stages: int,
                           num_micro_batches: int, recompute: str = "none", schedule: str = "1F1B",
                           config: CostModelConfig = CostModelConfig()) -> dict[str, int]:
    """Peak memory of one device of a stage and its parts [bytes].

    With the runtime step's memory terms (``e.has_step_memory``; module docstring):

    Per layer, ``step_activation_bytes`` (inside a stage), plus ``stage_entry_bytes`` on the
    first layer of a non-first stage and less ``stage_exit_release_bytes`` on the last layer
    of a sending stage (the ``first_stage_*`` variants on a first stage; recompute ``none``).
    The in-flight phase peaks at k x kept + held + the larger of the backward's and the
    forward's transient (``forward_transient``: the last micro-batch's forward, the others
    kept; 0 without ``forward_transient_bytes``).

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
    raw, released = list(act), 0
    if hi == L:
        act[-1] += e.loss_activation_bytes                     # type: ignore[operator]
    elif recompute == "none":                                  # the last layer's output cast to the send dtype
        release = e.first_stage_exit_release_bytes if first_stage and e.first_stage_exit_release_bytes is not None \
            else e.stage_exit_release_bytes
        released = min(act[-1], release[hi - 1] if release is not None else 0)
        act[-1] -= released
    if recompute == "none" and lo > 0 and e.stage_entry_bytes is not None:   # its input: the receive buffer
        act[0] += e.stage_entry_bytes[lo]
    freed_after, transient = 0, 0
    for a, t in zip(reversed(act), reversed(trans)):           # backward runs the layers last to first
        transient = max(transient, t - freed_after)
        freed_after += a
    forward = _forward_transient(e, lo, hi, raw, act, first_stage, released) if recompute == "none" else 0
    buffers = m * (e.output_bytes[lo - 1] if position > 0 else 0) + \
        m * (e.output_bytes[hi - 1] if position < num_stages - 1 else 0)
    held = e.output_bytes[lo - 1] if position > 0 and m > k else 0
    first = k * act[0] if lo == 0 and hi - lo > 1 else 0
    last = k * act[-1] if hi == L else 0
    parts = {"framework": framework, "parameters": params, "gradients": params,
             "optimizer_states": OPTIMIZER_STATES[config.optimizer] * params, "pipeline_buffers": buffers + held,
             "embedding": first, "head_and_loss": last, "activations": k * sum(act) - first - last,
             "backward_transient": transient, "forward_transient": forward,
             "optimizer_step": int(config.optimizer_transient_params * params)}
    backward = k * sum(act) + held + max(transient, forward)
    optimizer = parts["optimizer_step"]
    base = framework + params * (2 + OPTIMIZER_STATES[config.optimizer]) + buffers
    return parts | {"peak": int(base + max(backward, optimizer)), "phase": int(optimizer > backward)}
