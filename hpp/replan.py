"""Re-plan after losing devices: the cluster without them, searched warm from the previous plan.

The loop a user runs after a failure: save -> re-plan without the lost devices ->
resume on the new plan (:mod:`hpp.runtime.checkpoint.dcp` loads under any plan).

- :func:`exclude_devices` / :func:`exclude_nodes`: the cluster without some devices
  (or whole nodes), renumbered node by node as every cluster is (a node left with no
  device is dropped; the others keep their type and links).
- :func:`seed_from_previous`: the previous plan's pipelines that use no excluded device,
  rebound onto the new device ids, with the global batch re-split over them by the exact
  data balance (:func:`hpp.formulation.data_balance.balance_data`) on their predicted
  bottleneck and fill. It is a valid plan of the smaller cluster (idle devices allowed),
  so the re-plan is never predicted slower than what survives of the old one.
- :func:`replan`: both, then :func:`hpp.planner.plan_hpp` with the seed among its
  ``seed_plans`` (returned instead of the searched plan when the cost model prices it
  lower); reports the time of each part.

And the re-plan on a run's calibrated figures (``hpp run --calibrate``): :func:`search_calibrated`,
which the command line hands to :func:`hpp.runtime.calibrate.replan_check` (the runtime imports no
search code).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from hpp.errors import HppInputError
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan
from hpp.formulation.data_balance import balance_data
from hpp.plan_data import Plan, default_schedule
from hpp.planner import PlannerResult, plan_hpp
from hpp.profiles.cluster import Cluster, Node
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.profiles.model_profile import ModelProfile

__all__ = ["ReplanResult", "excluded_ids", "shrink_cluster", "exclude_devices", "exclude_nodes",
           "seed_from_previous", "replan", "parse_id_list", "search_calibrated"]

#: The name :func:`replan` gives its seed in ``plan_hpp``'s ``seed_plans`` (``stats["seeded_from"]``).
SEED_NAME = "previous"


def parse_id_list(text: str, *, field_name: str) -> tuple[int, ...]:
    """``"3,7"`` -> ``(3, 7)`` (a CLI flag's value).

    Raises
    ------
    HppInputError
        Anything but comma-separated non-negative integers.
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise HppInputError(f"{text!r} is not a list of ids", field=field_name,
                            fix="give comma-separated non-negative integers, e.g. 3,7")
    return tuple(int(p) for p in parts)


def _ints(values: Iterable[Any], *, field_name: str, limit: int, what: str) -> set[int]:
    out = set()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < limit:
            raise HppInputError(f"{what} {v!r} is not in the cluster (valid: 0..{limit - 1})", field=field_name,
                                fix=f"give {what}s of the cluster, numbered from 0 node by node")
        out.add(v)
    return out


def excluded_ids(cluster: Cluster, *, devices: Iterable[int] = (), nodes: Iterable[int] = ()) -> frozenset[int]:
    """The device ids ``devices`` and the devices of nodes ``nodes``, checked.

    Raises
    ------
    HppInputError
        An unknown device id or node index (naming the valid range), or excluding every device.
    """
    ids = _ints(devices, field_name="--exclude-devices", limit=cluster.num_devices, what="device id")
    node_set = _ints(nodes, field_name="--exclude-nodes", limit=len(cluster.nodes), what="node index")
    ids |= {d.device_id for d in cluster.devices if d.node in node_set}
    if len(ids) == cluster.num_devices:
        raise HppInputError(f"excluding {len(ids)} devices leaves none of the cluster's {cluster.num_devices}",
                            field="--exclude-devices" if not node_set else "--exclude-nodes",
                            fix="exclude fewer devices")
    return frozenset(ids)


def shrink_cluster(cluster: Cluster, excluded: Iterable[int]) -> tuple[Cluster, dict[int, int]]:
    """The cluster without devices ``excluded`` (checked ids), and the map old device id -> new id.

    Nodes keep their order, type and links; a node left empty is dropped. Ids are renumbered
    node by node (the cluster convention), so a device keeps its node and its order in it.
    """
    gone = set(excluded)
    nodes: list[Node] = []
    id_map: dict[int, int] = {}
    for n, node in enumerate(cluster.nodes):
        kept = [d for d in cluster.devices if d.node == n and d.device_id not in gone]
        if not kept:
            continue
        for d in kept:
            id_map[d.device_id] = len(id_map)
        nodes.append(replace(node, num_devices=len(kept)))
    return Cluster(cluster.name, dict(cluster.device_types), tuple(nodes), cluster.inter_node, cluster.network), id_map


def exclude_devices(cluster: Cluster, device_ids: Iterable[int]) -> Cluster:
    """The cluster without devices ``device_ids``, renumbered (see :func:`shrink_cluster`).

    Raises
    ------
    HppInputError
        An unknown id (naming the valid range), or excluding every device.
    """
    return shrink_cluster(cluster, excluded_ids(cluster, devices=device_ids))[0]


def exclude_nodes(cluster: Cluster, node_indices: Iterable[int]) -> Cluster:
    """The cluster without nodes ``node_indices``, renumbered.

    Raises
    ------
    HppInputError
        An unknown node index (naming the valid range), or excluding every node.
    """
    return shrink_cluster(cluster, excluded_ids(cluster, nodes=node_indices))[0]


def _check_previous(previous: Plan, cluster: Cluster, profile: ModelProfile) -> None:
    if previous.num_layers != profile.num_layers or previous.model.lower() != profile.model.lower():
        raise HppInputError(f"the previous plan is of {previous.model} ({previous.num_layers} layers), the profile "
                            f"of {profile.model} ({profile.num_layers} layers)", field="--previous",
                            fix="give the plan this model was planned with, or leave --previous out")
    for p, pipe in enumerate(previous.pipelines):
        for s, st in enumerate(pipe.stages):
            for d in st.device_ids:
                if not 0 <= d < cluster.num_devices or cluster.devices[d].device_type != st.device_type:
                    have = cluster.devices[d].device_type if 0 <= d < cluster.num_devices else "no such device"
                    raise HppInputError(f"the previous plan puts a {st.device_type} stage on device {d} "
                                        f"({have} in this cluster)", field=f"--previous: pipelines[{p}].stages[{s}]",
                                        fix="give the cluster the previous plan was made for (before excluding)")


def seed_from_previous(previous: Plan, cluster: Cluster, new_cluster: Cluster, id_map: Mapping[int, int],
                       profile: ModelProfile, global_batch_size: int, *,
                       config: CostModelConfig = CostModelConfig()) -> Plan | None:
    """The previous plan's surviving pipelines on ``new_cluster``, data-balanced; None if none survives.

    Parameters
    ----------
    previous : Plan
        A plan of ``cluster`` (the cluster before excluding).
    cluster, new_cluster, id_map : the cluster before and after, and old id -> new id (:func:`shrink_cluster`).
    profile, global_batch_size, config : as for :func:`hpp.planner.plan_hpp`.

    Raises
    ------
    HppInputError
        ``previous`` is of another model, or does not fit ``cluster`` (device ids or types).
    """
    _check_previous(previous, cluster, profile)
    kept = []
    for pipe in previous.pipelines:
        if all(d in id_map for d in pipe.device_ids):
            stages = tuple(replace(st, device_ids=tuple(id_map[d] for d in st.device_ids)) for st in pipe.stages)
            kept.append(replace(pipe, stages=stages, num_samples=max(pipe.num_samples, pipe.micro_batch_size)))
    if not kept:
        return None
    draft = Plan(previous.model, previous.num_layers, sum(p.num_samples for p in kept), tuple(kept),  # their sum:
                 previous.sequence_length, dict(previous.profile_ref), cluster_to_dict(new_cluster))  # checked
    est = estimate_plan(draft, new_cluster, profile, config=config, estimate_missing=False)
    taus = [pe.bottleneck_s for pe in est.pipelines]
    fills = [pe.time_s - (pe.num_micro_batches - 1) * pe.bottleneck_s for pe in est.pipelines]
    split = balance_data(taus, fills, [p.micro_batch_size for p in kept], global_batch_size)
    pipes = tuple(replace(p, num_samples=n, schedule=default_schedule(-(-n // p.micro_batch_size), p.num_stages))
                  for p, n in zip(kept, split.num_samples) if n > 0)
    return replace(draft, global_batch_size=global_batch_size, pipelines=pipes)


@dataclass(frozen=True)
class ReplanResult:
    """Result of :func:`replan`.

    Attributes
    ----------
    result : PlannerResult
        The search's result on the smaller cluster (``result.plan`` is the new plan).
    cluster : Cluster
        The cluster without the excluded devices.
    device_map : dict
        Old device id -> new device id of every kept device.
    excluded : frozenset[int]
        The old ids of the excluded devices.
    seed : Plan or None
        The previous plan's surviving pipelines (None without ``previous`` or when none survives).
    seeded : bool
        True when the seed was returned (priced below the searched plan).
    seed_s, search_s, wall_s : float
        Time to build the seed, of the search, and in all [s].
    """

    result: PlannerResult
    cluster: Cluster
    device_map: Mapping[int, int]
    excluded: frozenset[int]
    seed: Plan | None
    seeded: bool
    seed_s: float
    search_s: float
    wall_s: float
    stats: Mapping[str, Any] = field(default_factory=dict)


def replan(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
           exclude_devices: Iterable[int] = (), exclude_nodes: Iterable[int] = (), previous: Plan | None = None,
           seed_plans: Mapping[str, Plan] | None = None, **planner_kwargs: Any) -> ReplanResult:
    """Plan ``cluster`` without some devices, warm-started from ``previous``.

    Parameters
    ----------
    cluster : Cluster
        The cluster before excluding (the one ``previous`` was planned for).
    profile, global_batch_size : as for :func:`hpp.planner.plan_hpp`.
    exclude_devices, exclude_nodes : device ids / node indices of ``cluster`` to leave out.
    previous : Plan, optional
        Its surviving pipelines seed the search (:func:`seed_from_previous`).
    seed_plans : further seeds (e.g. the baselines' plans on the smaller cluster).
    **planner_kwargs : passed to :func:`hpp.planner.plan_hpp` (space, settings, config, solver, progress, ...).

    Returns
    -------
    ReplanResult

    Raises
    ------
    HppInputError
        An unknown id or node, excluding everything, a previous plan of another model or cluster;
        :class:`hpp.errors.InfeasibleError` when the smaller cluster cannot hold the model.
    """
    t0 = time.perf_counter()
    gone = excluded_ids(cluster, devices=exclude_devices, nodes=exclude_nodes)
    small, id_map = shrink_cluster(cluster, gone)
    seed = None
    if previous is not None:
        seed = seed_from_previous(previous, cluster, small, id_map, profile, global_batch_size,
                                  config=planner_kwargs.get("config", CostModelConfig()))
    t1 = time.perf_counter()
    seeds = dict(seed_plans or {})
    if seed is not None:
        seeds[SEED_NAME] = seed
    res = plan_hpp(small, profile, global_batch_size, seed_plans=seeds or None, **planner_kwargs)
    t2 = time.perf_counter()
    seeded = res.stats.get("seeded_from") == SEED_NAME
    return ReplanResult(res, small, id_map, gone, seed, seeded, t1 - t0, t2 - t1, t2 - t0,
                        {"devices_before": cluster.num_devices, "devices_after": small.num_devices,
                         "seed_pipelines": len(seed.pipelines) if seed is not None else 0})


def search_calibrated(cluster: Cluster, profile: ModelProfile, global_batch_size: int, *,
                      time_limit_s: float = 10.0) -> PlannerResult:
    """The plan ``hpp plan --profile OUT.json --cluster OUT.cluster.json --gbs G --time-limit T --no-baselines``
    finds on a run's calibrated profile and cluster (:func:`hpp.runtime.calibrate.replan_command` prints that line).

    Raises
    ------
    HppInputError
        No plan (nothing fits memory, a bad input).
    """
    from hpp.formulation.composition.settings import SolverSettings
    return plan_hpp(cluster, profile, global_batch_size, settings=SolverSettings(max_time_in_seconds=time_limit_s))

