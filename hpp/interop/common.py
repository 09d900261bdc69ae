"""What the Sailor and Metis importers share: field checks, the cluster of a foreign plan, the final plan.

Every check raises :class:`~hpp.errors.HppInputError` naming the file (``source``), the field and the fix.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hpp.errors import HppInputError
from hpp.plan_data import Pipeline, Plan
from hpp.profiles.cluster import Cluster, Node
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.network import default_intra_node_link, default_network
from hpp.validate import validate_plan

__all__ = ["int_field", "list_field", "required", "check_gpu", "global_batch", "foreign_cluster", "finish_plan",
           "layer_ranges", "missing_layers"]


def int_field(v: Any, *, source: str, field: str, minimum: int = 1) -> int:
    """``v`` when it is an integer >= ``minimum`` (not a bool); else :class:`HppInputError` naming ``field``."""
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise HppInputError(f"{v!r} is not an integer >= {minimum}", source=source, field=field,
                            fix=f"give an integer >= {minimum}")
    return v


def list_field(v: Any, *, source: str, field: str, what: str) -> list:
    """``v`` when it is a list (of ``what``); else :class:`HppInputError` naming ``field``."""
    if not isinstance(v, list):
        raise HppInputError(f"expected a list of {what}, got {type(v).__name__}", source=source, field=field,
                            fix=f"give a list of {what}")
    return v


def required(d: Mapping[str, Any], key: str, *, source: str, where: str, fix: str) -> Any:
    """``d[key]``; :class:`HppInputError` naming ``{where}{key}`` when ``d`` is no object or lacks ``key``."""
    if not isinstance(d, Mapping) or key not in d:
        raise HppInputError(f"missing field {key!r}", source=source, field=f"{where}{key}", fix=fix)
    return d[key]


def check_gpu(gpu: Any, tp: int, profile: ModelProfile, *, source: str, field: str,
              tp_field: str | None = None) -> str:
    """The GPU type must have a profile at TP ``tp`` and a known capacity (``tp_field`` names the TP)."""
    if not isinstance(gpu, str) or gpu not in profile.device_types:
        raise HppInputError(f"GPU type {gpu!r} has no profile for {profile.model}", source=source, field=field,
                            fix=f"use one of {list(profile.device_types)}")
    if gpu not in BUNDLED_DEVICE_TYPES:
        raise HppInputError(f"GPU type {gpu!r} has no known memory capacity", source=source, field=field,
                            fix=f"use one of {sorted(BUNDLED_DEVICE_TYPES)}")
    if tp not in profile.tp_degrees(gpu):
        raise HppInputError(f"{profile.model} on {gpu} is not profiled at TP {tp}", source=source,
                            field=tp_field or field, fix=f"use a TP degree in {list(profile.tp_degrees(gpu))}")
    return gpu


def global_batch(data: Mapping[str, Any], key: str, gbs: int | None, *, source: str) -> int:
    """The global batch [samples]: the file's ``key``, else ``gbs`` (``--gbs``); refused when neither is given."""
    if key in data:
        return int_field(data[key], source=source, field=key)
    if gbs is None:
        raise HppInputError("the plan gives no global batch size", source=source, field=key,
                            fix="add it to the file or pass --gbs")
    return int_field(gbs, source=source, field="--gbs")


def foreign_cluster(name: str, nodes: Sequence[tuple[str, int]]) -> Cluster:
    """Nodes ``(gpu, devices)`` with Sailor's measured links per pair of GPU types (one zone, one device per
    flow; a version-2 cluster: each pair of nodes uses its types' link)."""
    built = tuple(Node(t, n, default_intra_node_link(t, n)) for t, n in nodes)
    network, slowest = default_network(built)
    return Cluster(name, dict(BUNDLED_DEVICE_TYPES), built, slowest, network)


def finish_plan(model: str, profile: ModelProfile, gbs: int, pipes: list[Pipeline], cluster: Cluster,
                *, source: str, fmt: str) -> tuple[Plan, Cluster]:
    """The imported plan (``gbs`` samples, embedding ``cluster``, noting ``fmt`` and ``source``), validated.

    Raises
    ------
    HppInputError
        The plan does not run on ``cluster`` with ``profile`` (:func:`~hpp.validate.validate_plan`).
    """
    plan = Plan(model=model, num_layers=profile.num_layers, global_batch_size=gbs, pipelines=tuple(pipes),
                sequence_length=profile.sequence_length, profile_ref={"name": profile.model},
                cluster_ref=cluster_to_dict(cluster), predicted={"imported_from": fmt, "file": source})
    validate_plan(plan, cluster, profile, source=source)
    return plan, cluster


def layer_ranges(layers: list[int]) -> str:
    """``layers 19-25`` / ``layer 25`` (runs of consecutive layers)."""
    runs: list[list[int]] = []
    for x in layers:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"layer{'s' if len(layers) > 1 else ''} {text}"


def missing_layers(covered: set[int], L: int) -> str:
    """What a partition leaves out, e.g. ``layers 19-25 are missing (no stage holds them)``; '' if none."""
    gone = [x for x in range(L) if x not in covered]
    if not gone:
        return ""
    verb = "are" if len(gone) > 1 else "is"
    return f"{layer_ranges(gone)} {verb} missing (no stage holds {'them' if len(gone) > 1 else 'it'})"

