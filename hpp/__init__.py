"""hpp: Heterogeneous Pipeline Parallelism for training large models on mixed GPUs.

Every data-parallel replica may be a different pipeline (device types, stage
count, layer boundaries); the global batch is split unevenly across pipelines so
that all finish together (data balance) while layers are balanced within each
pipeline under each device's memory (stage balance). See README.md.

The Python API (the ``hpp`` command line calls the same library):

- :func:`load_cluster` -- a cluster from a JSON file or object (format: ``hpp plan --help``);
- :func:`load_profile` -- a model profile: a bundled model name or a profile JSON file;
- :func:`plan` -- the best HPP plan for a cluster, a profile and a global batch size;
- :func:`write_plan` -- a plan as the JSON file ``hpp estimate`` and ``hpp run`` read;
- :func:`estimate` -- the cost model's prediction of a plan (iteration time, memory per stage).

Bad input raises :class:`HppInputError` (the message names the file, the field and the fix).

Examples
--------
>>> import hpp
>>> cluster = hpp.load_cluster({
...     "nodes": [{"device_type": "A100-40", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 2.4e11},
...               {"device_type": "V100-16", "num_devices": 4, "intra_node_bandwidth_bytes_per_s": 1.5e11}],
...     "inter_node_bandwidth_bytes_per_s": 2.5e10})
>>> result = hpp.plan(cluster, "OPT-350", global_batch_size=64, workers=1)
>>> sum(p.num_samples for p in result.plan.pipelines)
64
>>> result.search.status in ("OPTIMAL", "FEASIBLE")
True
>>> est = hpp.estimate(result.plan, cluster, "OPT-350")
>>> est.iteration_time_s == result.estimate.iteration_time_s and est.fits_memory
True
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from hpp.errors import HppInputError
from hpp.interop import load_any_plan
from hpp.plan_data import Plan, write_plan_json
from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.cluster import Cluster
from hpp.profiles.cluster_format import cluster_from_dict
from hpp.profiles.cluster_format import load_cluster as _load_cluster_file
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.profile_format import load_profile as _load_profile_file
from hpp.resolve import load_plan, resolve_plan
from hpp.scenarios import get_scenario

# The search and the cost model (hpp.planner, hpp.baselines, hpp.formulation) load numpy, SciPy and
# OR-Tools: about 1.4 s, against about 0.1 s for ``import hpp`` without them (measured with
# python -X importtime). :func:`plan` and :func:`estimate` import them on first use ("lazy" below).
if TYPE_CHECKING:
    from hpp.formulation.cost_model import PlanEstimate
    from hpp.planner import PlannerResult

__version__ = "0.1.0"
__all__ = ["__version__", "HppInputError", "load_cluster", "load_profile", "plan", "write_plan", "estimate"]


def load_cluster(source: "str | Path | Mapping[str, Any] | Cluster") -> "Cluster":
    """A cluster from a JSON file, a JSON object (dict) or a bundled scenario's name.

    Parameters
    ----------
    source : str, Path, Mapping or Cluster
        A path to an ``hpp-cluster`` JSON file (format: ``hpp plan --help`` or the README), the
        parsed object itself, the name of a bundled scenario (``hpp scenarios``), or a
        :class:`~hpp.profiles.cluster.Cluster` (returned as is).

    Returns
    -------
    Cluster

    Raises
    ------
    HppInputError
        A missing file, bad JSON, an unknown key (the closest valid one is named), a node without
        ``num_devices``, an unknown device type.

    Examples
    --------
    >>> load_cluster("opt350-a100x8-v100x8").count_by_type()
    {'A100-40': 8, 'V100-16': 8}
    """
    if isinstance(source, Cluster):
        return source
    if isinstance(source, Mapping):
        return cluster_from_dict(source, source="<cluster object>")
    if isinstance(source, str) and "/" not in source and not source.endswith(".json") and not Path(source).exists():
        # neither a file nor a JSON name: a bundled scenario's name, or a typo of one (the error lists them)
        return get_scenario(source, field="cluster").cluster()
    return _load_cluster_file(source)


def load_profile(source: "str | Path | ModelProfile") -> "ModelProfile":
    """A model's per-layer profile: a bundled model name or a native profile JSON file.

    Parameters
    ----------
    source : str, Path or ModelProfile
        ``"OPT-350"``, ``"GPT-Neo-2.7"``, ``"LLAMA-3-8"``, ``"gpt-tiny"``, ... (bundled), a path to
        a file written by ``hpp profile``, or a :class:`~hpp.profiles.model_profile.ModelProfile`.

    Returns
    -------
    ModelProfile

    Raises
    ------
    HppInputError
        Neither a bundled name (the message lists them) nor a readable profile file.

    Examples
    --------
    >>> load_profile("OPT-350").num_layers
    26
    """
    if isinstance(source, ModelProfile):
        return source
    path = Path(source)
    if path.suffix == ".json" or path.exists():
        return _load_profile_file(path)
    if str(source) not in bundled_models() and not any(str(source).lower() == m.lower() for m in bundled_models()):
        raise HppInputError(f"{str(source)!r} is neither a bundled model nor a profile file", field="profile",
                            fix=f"use one of {list(bundled_models())} or a JSON file written by `hpp profile`")
    return load_bundled_profile(str(source))


def plan(cluster: "str | Path | Mapping[str, Any] | Cluster", profile: "str | Path | ModelProfile",
         global_batch_size: int = 1024, *, baselines: bool = False, **options: Any) -> "PlannerResult":
    """The HPP plan with the shortest predicted iteration time (what ``hpp plan`` prints).

    The same request as ``hpp plan`` (:func:`hpp.request.build_request` builds it for both, with the same options and
    defaults, but for ``baselines``, off here: they take up to ``baseline_time_limit_s``).

    Parameters
    ----------
    cluster : as :func:`load_cluster` takes it.
    profile : as :func:`load_profile` takes it.
    global_batch_size : int
        Samples per iteration, any positive integer.
    baselines : bool
        Also run the uniform and single-shape baselines (together within ``baseline_time_limit_s``, default
        10 s) and return a baseline's plan where the cost model prices it lower (``stats["seeded_from"]``).
    **options
        The keywords of :func:`hpp.request.build_request`, by ``hpp plan``'s flag names: the search space
        (``micro_batch_sizes``, ``max_tp``, ``min_tp``, ``max_stages``, ``max_types_per_pipeline``,
        ``allow_recompute``, ``mixed_tp_pipelines``), the budget (``time_limit_s`` [s] or ``work_limit`` [work
        units]; neither: a small deterministic budget, so the same input gives the same plan), the solver
        (``solver``, ``workers`` (0 = one per core), ``seed``, ``cpsat_params``, ``cpsat_on_subset``,
        ``type_classes``), the cost model (``memory_headroom``, ``optimizer``), ``baseline_time_limit_s``, and a
        re-plan (``exclude_devices``, ``exclude_nodes``, ``previous``: a plan of ``cluster``).

    Returns
    -------
    PlannerResult
        ``.plan`` (write it with :func:`write_plan`), ``.estimate`` (the cost model's prediction), ``.search``
        (status, objective = the plan's predicted time, bound, gap, source), ``.wall_s``, ``.stats``.

    Raises
    ------
    HppInputError
        Bad input (see :func:`load_cluster`, :func:`load_profile`), an unknown option or a bad value.
    InfeasibleError
        No plan fits memory (the message says by how much the best shape falls short).
    """
    import inspect

    from hpp.request import build_request, run_request          # lazy: numpy/OR-Tools (see the top)

    known = set(inspect.signature(build_request).parameters) - {"cluster", "profile", "global_batch_size",
                                                                 "baselines", "profile_ref"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise HppInputError(f"unknown option {unknown[0]!r} of hpp.plan", field=unknown[0],
                            fix=f"use one of {', '.join(sorted(known))}")
    request = build_request(load_cluster(cluster), load_profile(profile), global_batch_size, baselines=baselines,
                            **options)
    return run_request(request).result


def write_plan(plan_: Plan, path: "str | Path") -> None:
    """Write ``plan_`` as an ``hpp-plan`` JSON file (what ``hpp estimate`` and ``hpp run`` read), atomically.

    Raises
    ------
    OSError
        The folder of ``path`` is missing or not writable.
    """
    write_plan_json(plan_, path)


def estimate(plan_or_path: "Plan | str | Path", cluster: "str | Path | Mapping[str, Any] | Cluster | None" = None,
             profile: "str | Path | ModelProfile | None" = None) -> "PlanEstimate":
    """The cost model's prediction of a plan (what ``hpp estimate`` prints).

    Parameters
    ----------
    plan_or_path : Plan, or a path to a plan file (hpp's; Sailor's and Metis's are converted)
    cluster, profile : optional
        Needed for a :class:`~hpp.plan_data.Plan` object unless it embeds its cluster / names its
        profile (plans from :func:`plan` and ``hpp plan --out`` do); given, they override the file's.

    Returns
    -------
    PlanEstimate
        ``iteration_time_s``, ``throughput_samples_per_s``, ``peak_memory_bytes``, ``fits_memory``,
        per pipeline and stage: compute, p2p, bubble, gradient sync, memory and capacity.

    Raises
    ------
    HppInputError
        A plan that is invalid on the cluster (the message names the field), a missing file.
    """
    from hpp.formulation.cost_model import estimate_plan                    # lazy: numpy (see the top)

    cl = load_cluster(cluster) if cluster is not None else None
    prof = load_profile(profile) if profile is not None else None
    if isinstance(plan_or_path, Plan):
        p, cl, prof = resolve_plan(plan_or_path, base=Path("."), source="<plan>", cluster=cl, profile=prof)
    elif cl is not None:                 # an hpp plan file on the given cluster
        p, cl, prof = load_plan(Path(plan_or_path), profile=prof, cluster=cl)
    else:
        p, cl, prof = load_any_plan(Path(plan_or_path), profile=prof)
    return estimate_plan(p, cl, prof)
