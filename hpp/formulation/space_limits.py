"""The search space: what the planner may build, and whether a plan is inside it.

:class:`SearchSpace` holds the user's limits; :func:`stage_kinds` and
:func:`common_micro_batch_sizes` say which (device type, TP degree) stage kinds and which
micro-batch sizes the search may use (measured, fitting a node, dividing the heads).

The planner returns the search's plan or a seeded one (a baseline's, the survivors of
``--previous``); both must respect the user's limits (``--max-stages``, ``--max-tp``,
``--micro-batch-sizes``, types per pipeline, one TP degree per pipeline, recomputation).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from hpp.errors import HppInputError
from hpp.formulation.stage_balance import StageKind
from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile

__all__ = ["SearchSpace", "space_violations", "stage_kinds", "common_micro_batch_sizes", "tp_capacity",
           "model_head_counts", "runnable_tp_degrees"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """What the planner may build.

    Attributes
    ----------
    micro_batch_sizes : tuple[int, ...] or None
        Micro-batch sizes to consider; None = every size the profile measured.
    max_tp : int or None
        Largest TP degree; None = the largest measured that fits a node.
    min_tp : int
        Smallest TP degree (default 1): ``min_tp = max_tp = k`` asks for TP k wherever it is measured and fits.
    max_stages : int
        Most stages in one pipeline.
    max_types_per_pipeline : int
        Most device types in one pipeline.
    max_stages_mixed : int
        Most stages of a pipeline of 3 or more device types (2-type pipelines keep ``max_stages``).
        Such shapes multiply with the stage count (at 4 types x 8 stages: 9.6k shapes, 11 s of stage
        balance at 64 GPUs; at 4 stages: 624 shapes, 0.36 s, measured); short ones are where they pay
        (one stage per type, e.g. the 4-type single-shape plan of opt350-1024-4types).
    allow_recompute : bool
        Stages may use full activation recomputation (``--no-recompute`` forbids it).
    mixed_tp_pipelines : bool
        A pipeline's stages may have different TP degrees (e.g. A100 TP 2 then V100 TP 4).
        Off by default: ``hpp run`` runs a pipeline as TP lanes (lane k = the k-th TP rank of
        every stage, one ``torch.distributed.pipelining`` stage group per lane), which needs one
        TP degree per pipeline; different pipelines may still have different TP degrees.
        ``--mixed-tp-pipelines`` searches the wider space (plans that the runtime refuses).
    """

    micro_batch_sizes: tuple[int, ...] | None = None
    max_tp: int | None = None
    max_stages: int = 8
    max_types_per_pipeline: int = 2
    max_stages_mixed: int = 4
    allow_recompute: bool = True
    mixed_tp_pipelines: bool = False
    min_tp: int = 1

    def __post_init__(self) -> None:
        if self.max_stages < 1 or self.max_types_per_pipeline < 1:
            raise HppInputError(f"max_stages={self.max_stages}, max_types_per_pipeline={self.max_types_per_pipeline}",
                                field="search space", fix="both must be >= 1")
        if self.min_tp < 1 or (self.max_tp is not None and self.min_tp > self.max_tp):
            raise HppInputError(f"--min-tp {self.min_tp} with --max-tp {self.max_tp}", field="--min-tp",
                                fix="give 1 <= --min-tp <= --max-tp")

    def allows_tp(self, tp: int) -> bool:
        """``min_tp <= tp <= max_tp`` (no upper limit when ``max_tp`` is None)."""
        return tp >= self.min_tp and (self.max_tp is None or tp <= self.max_tp)

    @property
    def tp_range(self) -> str:
        """The TP degrees allowed, for messages: ``"max_tp 4"``, ``"TP 2..4"``, ``"min_tp 2"``."""
        if self.min_tp == 1:
            return f"max_tp {self.max_tp}"
        return f"TP {self.min_tp}..{self.max_tp}" if self.max_tp is not None else f"min_tp {self.min_tp}"


def tp_capacity(cluster: Cluster, device_type: str, tp_degree: int) -> int:
    """How many TP groups of ``tp_degree`` devices of ``device_type`` the nodes can hold."""
    return sum(n.num_devices // tp_degree for n in cluster.nodes if n.device_type == device_type)


def model_head_counts(profile: ModelProfile) -> tuple[int, ...]:
    """The model's attention-head counts that a TP degree must divide, from the profile's meta.

    Reads ``hyper_parameters.num_heads`` / ``num_kv_heads`` (profiles written by ``hpp
    profile``) or ``heads`` (the converted public profiles); empty when the profile says none.

    >>> from hpp.profiles.bundled import load_bundled_profile
    >>> model_head_counts(load_bundled_profile("OPT-350"))
    (16,)
    """
    hp = profile.meta.get("hyper_parameters") or {}
    counts = [hp.get("num_heads", profile.meta.get("heads")), hp.get("num_kv_heads")]
    return tuple(int(c) for c in counts if isinstance(c, int) and c > 0)


def runnable_tp_degrees(profile: ModelProfile) -> tuple[int, ...]:
    """The profile's TP degrees that divide every head count of the model (:func:`model_head_counts`).

    A TP degree that does not divide the heads cannot be run (each TP rank holds whole heads), so
    the planner never emits it.
    """
    heads = model_head_counts(profile)
    return tuple(t for t in sorted({k[1] for k in profile.entries}) if all(h % t == 0 for h in heads))


def _no_profile_fix(dtype: str, profile) -> str:
    """The fix for a cluster type the profile lacks; an emulated CPU type (``cpu-2x``) names ``--emulate``."""
    fix = f"profile {dtype} or use types in {list(profile.device_types)}"
    m = re.fullmatch(r"cpu-(\d+(?:\.\d+)?)x", dtype)
    if m:
        fix += (f"; {dtype} is an emulated CPU type: rerun hpp profile ... --device cpu with "
                f"--emulate {dtype}={m.group(1)} to add it")
    return fix


def stage_kinds(cluster: Cluster, profile: ModelProfile, space: SearchSpace) -> dict[str, tuple[StageKind, ...]]:
    """Stage kinds per device type of the cluster: every measured TP degree that fits a node and ``min_tp`` ..
    ``max_tp``.

    A device type with no such TP degree is left out (not a key of the result; logged, and the
    CLI says so); the input is refused only when every type is left out.

    Raises
    ------
    HppInputError
        A device type of the cluster has no profile (named), or no type has a usable TP degree.
    """
    out: dict[str, tuple[StageKind, ...]] = {}
    unusable: list[str] = []
    runnable = set(runnable_tp_degrees(profile))
    for dtype in sorted(cluster.count_by_type()):
        if dtype not in profile.device_types:
            raise HppInputError(f"GPU type {dtype!r} of the cluster has no profile for {profile.model}",
                                field="nodes[*].device_type",
                                fix=_no_profile_fix(dtype, profile))
        largest_node = max(n.num_devices for n in cluster.nodes if n.device_type == dtype)
        tps = [t for t in profile.tp_degrees(dtype) if t <= largest_node and space.allows_tp(t) and t in runnable]
        if not tps:
            unusable.append(f"{dtype} is profiled only at TP {list(profile.tp_degrees(dtype))}, nodes of {largest_node}")
            log.info("%s left out: no measured TP degree fits its nodes and max_tp", dtype)
            continue
        out[dtype] = tuple(StageKind(dtype, t) for t in tps)
    if not out:
        flags, field, fix = (("--max-tp", "max_tp", "raise --max-tp or use larger nodes") if space.min_tp == 1 else
                             ("--min-tp and --max-tp", "--min-tp", "lower --min-tp, raise --max-tp or use larger nodes"))
        raise HppInputError(f"no GPU type of the cluster has a TP degree of {profile.model} that fits its nodes "
                            f"and {flags} ({'; '.join(unusable)})", field=field, fix=fix)
    return out


def common_micro_batch_sizes(profile: ModelProfile, shape: tuple[StageKind, ...], space: SearchSpace) -> list[int]:
    """Micro-batch sizes measured for every stage kind of ``shape`` (and allowed by ``space``), ascending."""
    common = None
    for k in set(shape):
        sizes = set(profile.micro_batch_sizes(k.device_type, k.tp_degree))
        common = sizes if common is None else common & sizes
    sizes = sorted(common or ())
    if space.micro_batch_sizes is not None:
        sizes = [b for b in sizes if b in space.micro_batch_sizes]
    return sizes


def space_violations(plan: Plan, space: SearchSpace, *, cluster: Cluster, profile: ModelProfile) -> list[str]:
    """Every way ``plan`` leaves ``space`` (one line each; [] when it is inside).

    Checked per pipeline: stages <= ``max_stages``; device types <= ``max_types_per_pipeline``;
    one TP degree unless ``mixed_tp_pipelines``; micro-batch size in ``micro_batch_sizes`` (when
    set); every stage's (type, TP) a kind the search may use (:func:`stage_kinds`: measured, fits a
    node, within ``min_tp`` .. ``max_tp``, divides the heads); no full recomputation unless ``allow_recompute``.
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
                           f" ({space.tp_range})")
            if s.recompute != "none" and not space.allow_recompute:
                out.append(f"{where}: stage recomputes ({s.recompute}) but recomputation is off")
    return out
