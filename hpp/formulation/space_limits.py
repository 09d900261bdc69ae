"""Is a plan inside a search space? The limits every returned plan is checked against.

The planner returns the search's plan or a seeded one (a baseline's, the survivors of
``--previous``); both must respect the user's limits (``--max-stages``, ``--max-tp``,
``--micro-batch-sizes``, types per pipeline, one TP degree per pipeline, recomputation).
"""

from __future__ import annotations

from hpp.formulation.candidates import SearchSpace, stage_kinds
from hpp.plan import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile

__all__ = ["space_violations"]


def space_violations(plan: Plan, space: SearchSpace, *, cluster: Cluster, profile: ModelProfile) -> list[str]:
    """Every way ``plan`` leaves ``space`` (one line each; [] when it is inside).

    Checked per pipeline: stages <= ``max_stages``; device types <= ``max_types_per_pipeline``;
    one TP degree unless ``mixed_tp_pipelines``; micro-batch size in ``micro_batch_sizes`` (when
    set); every stage's (type, TP) a kind the search may use (:func:`stage_kinds`: measured, fits a
    node, <= ``max_tp``, divides the heads); no full recomputation unless ``allow_recompute``.
    """
    kinds = {(k.device_type, k.tp_degree) for ks in stage_kinds(cluster, profile, space).values() for k in ks}
    out = []
    for i, p in enumerate(plan.pipelines):
        where = f"pipeline {i}"
        if p.num_stages > space.max_stages:
            out.append(f"{where}: {p.num_stages} stages > max_stages {space.max_stages}")
        types = {s.device_type for s in p.stages}
        if len(types) > space.max_types_per_pipeline:
            out.append(f"{where}: {len(types)} device types > max_types_per_pipeline {space.max_types_per_pipeline}")
        if not space.mixed_tp_pipelines and len({s.tp_degree for s in p.stages}) > 1:
            out.append(f"{where}: several TP degrees in one pipeline (mixed_tp_pipelines is off)")
        if space.micro_batch_sizes is not None and p.micro_batch_size not in space.micro_batch_sizes:
            out.append(f"{where}: micro-batch size {p.micro_batch_size} not in {list(space.micro_batch_sizes)}")
        for s in p.stages:
            if (s.device_type, s.tp_degree) not in kinds:
                out.append(f"{where}: stage on {s.device_type} at TP {s.tp_degree} is not a kind of the space"
                           f" (max_tp {space.max_tp})")
            if s.recompute != "none" and not space.allow_recompute:
                out.append(f"{where}: stage recomputes ({s.recompute}) but recomputation is off")
    return out
