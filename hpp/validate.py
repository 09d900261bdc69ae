"""Plan validation: the invariants of an HPP plan that need its cluster and its profile.

What needs nothing else is checked when the plan is built (:class:`hpp.plan.Plan`,
``Pipeline``, ``Stage``: each pipeline covers layers [0, L) exactly once with non-empty,
contiguous stages; a stage has one device id per TP rank; each device is used at most
once; samples add up to the global batch; the schedule can run the pipeline's
micro-batch count). Checked here (each failure is an :class:`~hpp.errors.HppInputError`
naming the field and the fix): devices exist in the cluster and are of the stage's
device type; a stage's devices sit on one node (so its TP degree fits the node); the
profile has the plan's layer count, knows the stage's device type and TP degree and
supports its recomputation mode.

Memory is not checked here: :func:`hpp.formulation.cost_model.estimate_plan` reports
it per device (``fits_memory``), so that an over-full plan can still be inspected.
"""

from __future__ import annotations

from hpp.errors import HppInputError
from hpp.plan import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile

__all__ = ["validate_plan", "check_samples_sum"]


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
                    raise HppInputError(f"device {d} does not exist (the cluster has {cluster.num_devices} devices)",
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

    Every :class:`~hpp.plan.Plan` passes since :class:`~hpp.plan.Plan` checks this when built
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
