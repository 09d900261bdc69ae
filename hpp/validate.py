"""Plan validation: the invariants of an HPP plan that need its cluster and its profile.

What needs nothing else is checked when the plan is built (:class:`hpp.plan_data.Plan`,
``Pipeline``, ``Stage``: each pipeline covers layers [0, L) exactly once with non-empty,
contiguous stages; a stage has one device id per TP rank; each device is used at most
once; samples add up to the global batch; the schedule can run the pipeline's
micro-batch count). Checked here (each failure is an :class:`~hpp.errors.HppInputError`
naming the field and the fix): devices exist in the cluster and are of the stage's
device type; a stage's devices sit on one node (so its TP degree fits the node); the
profile has the plan's layer count, knows the stage's device type and TP degree and
supports its recomputation mode.

Memory needs the cost model: :func:`hpp.formulation.cost_model.estimate_plan` predicts it per
device (``fits_memory``) and :func:`check_fits_memory` refuses a plan predicted not to fit, unless
the user allows it (``--allow-over-memory`` of ``hpp estimate`` and ``hpp run``: an over-full plan can
then still be inspected or tried).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpp.errors import HppInputError
from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.wording import count

if TYPE_CHECKING:                       # the cost model imports numpy; only its record's type is needed here
    from hpp.formulation.cost_model import PlanEstimate

__all__ = ["validate_plan", "check_samples_sum", "OVER_MEMORY_FLAG", "memory_shortfalls", "over_memory_text",
           "check_fits_memory"]

#: The flag of ``hpp estimate`` and ``hpp run`` that goes on with a plan predicted not to fit its devices' memory.
OVER_MEMORY_FLAG = "--allow-over-memory"


def validate_plan(plan: Plan, cluster: Cluster, profile: ModelProfile | None = None, *,
                  source: str = "<plan>") -> None:
    """Check the invariants of ``plan`` that need ``cluster`` and ``profile`` (see the module docstring;
    the rest were checked when ``plan`` was built).

    Raises
    ------
    HppInputError
        The first violated invariant, naming ``source``, the field and the fix.
    """
    L = plan.num_layers
    if profile is not None and profile.num_layers != L:
        raise HppInputError(f"the plan has num_layers={L} but the profile of {profile.model} has "
                            f"{profile.num_layers} layers", source=source, field="num_layers",
                            fix="use the profile of the plan's model")
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            f = f"pipelines[{p}].stages[{s}]"
            nodes = set()
            for d in st.device_ids:
                if not 0 <= d < cluster.num_devices:
                    raise HppInputError(f"device {d} does not exist (the cluster has "
                                        f"{count(cluster.num_devices, 'device')})",
                                        source=source, field=f"{f}.device_ids",
                                        fix=f"use ids in [0, {cluster.num_devices})")
                dev = cluster.devices[d]
                if dev.device_type != st.device_type:
                    raise HppInputError(f"device {d} is a {dev.device_type}, not a {st.device_type}", source=source,
                                        field=f"{f}.device_type", fix="bind the stage to devices of its type")
                nodes.add(dev.node)
            if len(nodes) > 1:
                raise HppInputError(f"the stage's TP group spans nodes {sorted(nodes)}", source=source,
                                    field=f"{f}.device_ids", fix="put a stage's devices on one node")
            if profile is not None:
                if st.device_type not in profile.device_types:
                    raise HppInputError(f"GPU type {st.device_type!r} has no profile for {profile.model}",
                                        source=source, field=f"{f}.device_type",
                                        fix=f"use one of {list(profile.device_types)}")
                if st.tp_degree not in profile.tp_degrees(st.device_type):
                    raise HppInputError(f"{profile.model} on {st.device_type} is not profiled at TP {st.tp_degree}",
                                        source=source, field=f"{f}.tp_degree",
                                        fix=f"use one of {list(profile.tp_degrees(st.device_type))}")
                if st.recompute == "selective":
                    e = profile.layer_profile(st.device_type, st.tp_degree, pipe.micro_batch_size)
                    if e.attention_activation_bytes is None:
                        raise HppInputError("selective recomputation needs the attention share of the activations, "
                                            "which the profile lacks", source=source, field=f"{f}.recompute",
                                            fix="use 'full' or 'none'")


def check_samples_sum(plan: Plan, *, source: str | None = None) -> None:
    """Refuse a plan whose pipelines' samples do not add up to its global batch size.

    Every :class:`~hpp.plan_data.Plan` passes since :class:`~hpp.plan_data.Plan` checks this when built
    (kept for callers that state the invariant they rely on).

    Raises
    ------
    HppInputError
        Naming ``pipelines[*].num_samples`` (and ``source``, the plan's file, when given).
    """
    total = sum(p.num_samples for p in plan.pipelines)
    if total != plan.global_batch_size:
        raise HppInputError(f"the pipelines' samples add up to {total}, not the global batch size "
                            f"{plan.global_batch_size}", source=source, field="pipelines[*].num_samples",
                            fix="make the samples sum to global_batch_size")


def memory_shortfalls(est: "PlanEstimate") -> list[tuple[int, int, int]]:
    """(pipeline, stage, shortfall [bytes]) of every stage whose predicted peak exceeds its usable memory
    (``StageEstimate.memory_bytes > capacity_bytes``), the largest shortfall first.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> st = lambda need, cap: NS(memory_bytes=need, capacity_bytes=cap)
    >>> est = NS(pipelines=[NS(stages=[st(5, 10), st(12, 10)]), NS(stages=[st(14, 10)])])
    >>> memory_shortfalls(est)
    [(1, 0, 4), (0, 1, 2)]
    """
    out = [(i, j, s.memory_bytes - s.capacity_bytes) for i, p in enumerate(est.pipelines)
           for j, s in enumerate(p.stages) if s.memory_bytes > s.capacity_bytes]
    return sorted(out, key=lambda t: (-t[2], t[0], t[1]))


def _size(num_bytes: float, like: float) -> str:
    """``num_bytes`` in GiB, or in MiB where ``like`` (the capacity) is under 1 GiB (emulated CPU devices)."""
    unit, name = (2**30, "GiB") if like >= 2**30 else (2**20, "MiB")
    return f"{num_bytes / unit:.2f} {name}"


def over_memory_text(est: "PlanEstimate", plan: Plan) -> tuple[str, str] | None:
    """(field, sentence) of the stage with the largest predicted memory shortfall: the field is
    ``pipelines[P].stages[S]``, the sentence names its layers, device type and ids, its need, usable memory and
    shortfall, and how many stages are over in all; None when every stage fits.

    Usable memory is the device's capacity less ``--memory-headroom`` and the framework reserve
    (:class:`hpp.formulation.cost_model.StageEstimate`'s ``capacity_bytes``).
    """
    over = memory_shortfalls(est)
    if not over:
        return None
    p, s, short = over[0]
    se, st = est.pipelines[p].stages[s], plan.pipelines[p].stages[s]
    more = f" ({len(over)} stages are over their memory in all)" if len(over) > 1 else ""
    ids = ",".join(str(d) for d in st.device_ids)
    return (f"pipelines[{p}].stages[{s}]",
            f"layers [{st.layer_start},{st.layer_stop}) on {st.device_type} device{'s' if len(st.device_ids) > 1 else ''}"
            f" {ids} are predicted to need {_size(se.memory_bytes, se.capacity_bytes)} per device but have "
            f"{_size(se.capacity_bytes, se.capacity_bytes)} usable: {_size(short, se.capacity_bytes)} short{more}")


def check_fits_memory(est: "PlanEstimate", plan: Plan, *, source: str | None = None,
                      allow: bool = False) -> str | None:
    """Refuse a plan that the cost model predicts not to fit its devices' memory, unless ``allow``.

    Parameters
    ----------
    est : PlanEstimate
        ``plan``'s estimate (:func:`hpp.formulation.cost_model.estimate_plan`).
    source : str, optional
        The plan's file, named in the error.
    allow : bool
        The user's ``--allow-over-memory``: go on with an over-full plan.

    Returns
    -------
    str or None
        With ``allow`` and a plan that does not fit: the note to print (the shortfall, and that the user
        allowed it); None when it fits.

    Raises
    ------
    HppInputError
        ``allow`` is False and some stage is predicted to exceed its usable memory: one line naming the stage,
        its devices and the shortfall (:func:`over_memory_text`), and the flag that goes on anyway.
    """
    over = over_memory_text(est, plan)
    if over is None:
        return None
    field, text = over
    if not allow:
        raise HppInputError(f"the plan does not fit its devices' memory: {text}", source=source, field=field,
                            fix=f"plan again for these devices (hpp plan), or give {OVER_MEMORY_FLAG} to go on with "
                                f"a plan predicted not to fit")
    return f"the plan is predicted not to fit its devices' memory (allowed by {OVER_MEMORY_FLAG}): {field}: {text}"
