"""What ``hpp plan`` plans: the cluster, profile and global batch its flags name, checked before any work.

:func:`plan_inputs` resolves ``--scenario`` / ``--cluster`` / ``--model`` / ``--profile`` /
``--previous`` and ``--exclude-devices`` / ``--exclude-nodes`` into one :class:`PlanInputs`, with
a line for every default it used (the CLI prints them: nothing is planned silently), and
:func:`left_out_types` says which device types the search cannot use and why, :func:`max_tp_note` what a
``--max-tp`` that is no measured TP degree leaves, and :func:`solver_settings` turns the solver flags into
the search's settings. Every refusal is an :class:`~hpp.errors.HppInputError` naming the flag (exit 2, one line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpp.errors import HppInputError
from hpp.fileio import folder_writable
from hpp.plan_data import plan_from_dict, read_plan_json
from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.cluster_format import load_cluster
from hpp.profiles.profile_format import load_profile
from hpp.resolve import load_plan
from hpp.scenarios import DEFAULT_SCENARIO, get_scenario

# hpp.replan and hpp.formulation.candidates load numpy and OR-Tools (about 1.4 s against 0.16 s for
# `import hpp.cli`, measured): imported where used ("lazy: numpy/OR-Tools"), so `hpp --help` stays fast.

__all__ = ["PlanInputs", "plan_inputs", "check_plan_args", "check_writable", "left_out_types", "max_tp_note",
           "estimate_inputs",
           "DEFAULT_GBS"]

#: Global batch [samples] of ``hpp plan --cluster FILE`` without ``--gbs``.
DEFAULT_GBS = 1024


@dataclass
class PlanInputs:
    """The inputs of one ``hpp plan``.

    Attributes
    ----------
    cluster, profile, global_batch_size, name
        What is planned (``cluster`` with every device: :func:`hpp.request.build_request` leaves the excluded out).
    said : list of str
        One line per default or derived input used (printed as progress lines).
    exclude_devices, exclude_nodes : tuple of int
        ``--exclude-devices`` / ``--exclude-nodes``, parsed.
    previous : Plan or None
        The ``--previous`` plan (of ``cluster``).
    """

    cluster: Any
    profile: Any
    global_batch_size: int
    name: str
    said: list[str] = field(default_factory=list)
    exclude_devices: tuple[int, ...] = ()
    exclude_nodes: tuple[int, ...] = ()
    previous: Any = None


def check_writable(out: Path | None) -> None:
    """Refuse an ``--out`` whose folder is missing or read-only before any work is done."""
    if out is None:
        return
    if not folder_writable(out):
        raise HppInputError(f"cannot write {out}: folder {Path(out).resolve().parent} does not exist or is not writable",
                            field="--out", fix="create the folder first or give a writable path")


def check_plan_args(args) -> None:
    """Refuse out-of-range numbers and clashing flags before anything is computed (exit 2, naming the flag)."""
    checks = (("--gbs", args.gbs, 1), ("--max-tp", args.max_tp, 1), ("--min-tp", args.min_tp, 1),
              ("--max-stages", args.max_stages, 1),
              ("--max-types-per-pipeline", args.max_types_per_pipeline, 1),
              ("--workers", args.workers, 0))
    for flag, value, minimum in checks:
        if value is not None and value < minimum:
            raise HppInputError(f"{flag} {value}", field=flag, fix=f"give an integer >= {minimum}")
    if getattr(args, "work_limit", None) is not None and args.time_limit is not None:
        raise HppInputError("--time-limit and --work-limit both given", field="--work-limit",
                            fix="give one: --time-limit S (wall clock) or --work-limit UNITS (deterministic)")
    if getattr(args, "work_limit", None) is not None and not (args.work_limit > 0 and math.isfinite(args.work_limit)):
        raise HppInputError(f"--work-limit {args.work_limit}", field="--work-limit", fix="give a positive number")
    if args.time_limit is not None and not args.time_limit > 0:
        raise HppInputError(f"--time-limit {args.time_limit}", field="--time-limit",
                            fix="give a positive number of seconds")
    if not args.baseline_time_limit > 0:
        raise HppInputError(f"--baseline-time-limit {args.baseline_time_limit}", field="--baseline-time-limit",
                            fix="give a positive number of seconds (--no-baselines skips the baselines)")
    if args.micro_batch_sizes is not None and (not args.micro_batch_sizes or min(args.micro_batch_sizes) < 1):
        raise HppInputError(f"--micro-batch-sizes {args.micro_batch_sizes}", field="--micro-batch-sizes",
                            fix="give positive integers, e.g. 1,2,4")
    check_writable(getattr(args, "out", None))
    if args.scenario is not None and not args.scenario.strip():
        raise HppInputError("--scenario ''", field="--scenario", fix="name a bundled scenario (see `hpp scenarios`)")
    if args.scenario and args.cluster:
        raise HppInputError("--scenario cannot be combined with --cluster", field="--scenario",
                            fix="use either a bundled scenario (its cluster; --model/--profile may replace its "
                                "model) or your own cluster file")
    if args.profile and args.model:
        raise HppInputError("give --profile or --model, not both", field="--model",
                            fix="--profile FILE for your own profile, --model NAME for a bundled one")


def load_user_cluster(path: Path, *, default_links: bool):
    """The cluster file ``path``; one that leaves out links its nodes use is refused unless ``default_links``
    (then Sailor's measured fits of one public cloud fill them in, and ``hpp plan`` notes which).

    Raises
    ------
    HppInputError
        A bad file (:func:`~hpp.profiles.cluster_format.load_cluster`), or links left out without ``default_links``.
    """
    cluster = load_cluster(path)
    missing = cluster.network.defaulted if cluster.network is not None else ()
    if missing and not default_links:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise HppInputError(f"no link given for {shown}: hpp would plan on Sailor's measured fits of one public "
                            "cloud (us-central1-a), not your network", source=str(path), field="links",
                            fix="give them under links (`hpp profile-network` measures them), or pass "
                                "--default-links to plan on those fits")
    return cluster


def _profile(args):
    """The profile --model / --profile name (None when neither is given)."""
    if args.profile:
        return load_profile(args.profile)
    if args.model:
        try:
            return load_bundled_profile(args.model)
        except HppInputError as exc:          # the library names its argument; here it is the flag
            raise HppInputError(exc.message, field="--model", fix=exc.fix) from None
    return None


def _base_inputs(args) -> PlanInputs:
    if args.previous and not (args.scenario or args.cluster or args.profile or args.model):
        prev, cluster, profile = load_plan(args.previous)       # the --previous plan, read once
        gbs = args.gbs if args.gbs is not None else prev.global_batch_size
        return PlanInputs(cluster, profile, gbs, cluster.name or Path(args.previous).stem,   # the cluster's own name
                          [f"the cluster, profile and global batch of {args.previous}"], previous=prev)
    profile = _profile(args)                  # first: an unknown --model is named as such, whatever the cluster
    if args.cluster:
        if profile is None:
            raise HppInputError("--cluster needs the model to plan", field="--model",
                                fix=f"add --model NAME (bundled: {', '.join(bundled_models())}) or --profile FILE")
        said = [] if args.gbs is not None else [f"global batch {DEFAULT_GBS} samples (the default; --gbs N)"]
        gbs = args.gbs if args.gbs is not None else DEFAULT_GBS
        cluster = load_user_cluster(args.cluster, default_links=args.default_links)
        return PlanInputs(cluster, profile, gbs, cluster.name, said)      # its "name", else the file's stem
    if profile is not None and not args.scenario:
        raise HppInputError("--model/--profile needs the cluster to plan on", field="--cluster",
                            fix="give a cluster JSON file (format: hpp plan --help), or --scenario NAME")
    sc = get_scenario(args.scenario or DEFAULT_SCENARIO)
    said = [] if args.scenario else [f"scenario {sc.name} (the default; --scenario NAME or --cluster FILE "
                                     f"--model NAME)"]
    if profile is not None:
        said.append(f"the scenario's cluster with {profile.model}'s profile instead of {sc.model}'s")
    if args.gbs is None:
        said.append(f"global batch {sc.global_batch_size} samples (the scenario's; --gbs N)")
    return PlanInputs(sc.cluster(), profile or load_bundled_profile(sc.model),
                      args.gbs if args.gbs is not None else sc.global_batch_size, sc.name, said)


def plan_inputs(args) -> PlanInputs:
    """The inputs the flags of ``hpp plan`` name (see the module docstring).

    Raises
    ------
    HppInputError
        Out-of-range numbers, clashing flags, a missing cluster or model, unknown names, bad files,
        excluded ids not in the cluster (naming the flag).
    """
    check_plan_args(args)
    inp = _base_inputs(args)
    if args.exclude_devices or args.exclude_nodes:
        from hpp.replan import parse_id_list    # lazy: numpy/OR-Tools
        if args.exclude_devices:
            inp.exclude_devices = parse_id_list(args.exclude_devices, field_name="--exclude-devices")
        if args.exclude_nodes:
            inp.exclude_nodes = parse_id_list(args.exclude_nodes, field_name="--exclude-nodes")
    if args.previous and inp.previous is None:
        inp.previous = plan_from_dict(read_plan_json(args.previous), source=str(args.previous))
    return inp


def left_out_types(cluster, profile, space) -> dict[str, str]:
    """Device types the search leaves out because none of their measured TP degrees is usable, with why
    (the other types are planned; the input is refused only when none is left)."""
    from hpp.formulation.space_limits import runnable_tp_degrees, stage_kinds  # lazy: numpy

    kinds = stage_kinds(cluster, profile, space)
    runnable = set(runnable_tp_degrees(profile))
    out = {}
    for t in sorted(set(cluster.count_by_type()) - set(kinds)):
        node = max(n.num_devices for n in cluster.nodes if n.device_type == t)
        why = []
        for tp in profile.tp_degrees(t):
            no = ([f"above --max-tp {space.max_tp}"] if space.max_tp is not None and tp > space.max_tp else []) + \
                 ([f"below --min-tp {space.min_tp}"] if tp < space.min_tp else []) + \
                 ([f"more than its nodes' {node} devices"] if tp > node else []) + \
                 ([f"does not divide {profile.model}'s heads"] if tp not in runnable else [])
            why.append(f"TP {tp}: {', '.join(no)}")
        out[t] = (f"{t} left out: {profile.model} on {t} is profiled only at TP {list(profile.tp_degrees(t))} "
                  f"({'; '.join(why)}); the other types are planned")
    return out


def max_tp_note(cluster, profile, space) -> str | None:
    """A note when ``--max-tp`` is not one of the profile's measured TP degrees on the cluster's types (None otherwise).

    ``max_tp`` is a cap on the measured degrees (:func:`hpp.formulation.space_limits.stage_kinds`), not a
    degree of its own: ``--max-tp 3`` means "at most 3", i.e. TP 1 and 2 when those are measured. It is
    accepted (a cap is meaningful at any value >= 1) and said, so that nobody reads it as "TP 3".
    """
    from hpp.formulation.space_limits import stage_kinds  # lazy: numpy

    types = sorted(t for t in cluster.count_by_type() if t in profile.device_types)
    measured = sorted({tp for t in types for tp in profile.tp_degrees(t)})
    if space.max_tp is None or space.max_tp in measured:
        return None
    used = sorted({k.tp_degree for ks in stage_kinds(cluster, profile, space).values() for k in ks})
    return (f"--max-tp {space.max_tp} is a cap, not a TP degree: {profile.model} is profiled at TP {measured} on "
            f"{', '.join(types)}; the search uses TP {used} (measured, at most {space.max_tp}, fitting a node and "
            f"dividing the heads)")


def estimate_inputs(args) -> tuple[Any, Any, Any]:
    """``hpp estimate``'s (plan, cluster, profile): the plan file read in its format (``--format``, ``--model``,
    ``--gbs``; :func:`hpp.interop.load_any_plan`), its pipelines bound onto ``--cluster FILE`` when given
    (:func:`hpp.formulation.binding.rebind_plan`: another planner's plan priced on your cluster, not the
    converter's).

    Raises
    ------
    HppInputError
        A bad plan or cluster file, or a cluster with fewer devices of a type than the plan uses (naming the file).
    """
    from hpp.formulation.binding import rebind_plan       # lazy: numpy
    from hpp.interop import load_any_plan
    from hpp.profiles.cluster_format import cluster_to_dict

    profile = load_bundled_profile(args.model) if args.model else None
    plan, cluster, profile = load_any_plan(args.plan, fmt=args.format, profile=profile, gbs=args.gbs)
    if args.cluster is not None:
        cluster = load_user_cluster(args.cluster, default_links=args.default_links)
        try:
            plan = rebind_plan(plan, cluster, cluster_ref=cluster_to_dict(cluster))
        except HppInputError as exc:
            raise exc.with_source(str(args.cluster)) from None
    return plan, cluster, profile
