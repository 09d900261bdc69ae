"""``hpp run --calibrate OUT.json``: the profile and the cluster links corrected by what the run measured.

From the run's report (:class:`hpp.runtime.run_report.RunReport`: per stage and step the forward/backward
time, per step the gradient sync) and the plan's cluster and profile, :func:`calibrate_run` writes

- a profile (``OUT.json``, the native format, :func:`hpp.runtime.profile.profiler.write_profile`) whose
  entries the run exercised carry the fitted forward/backward times, and whose ``calibration`` object
  (:mod:`hpp.profiles.calibration_record`) says per entry and link what was fitted, how, by what factor,
  with which spread over how many steps after the warm-up, and what was kept (and why);
- the cluster (``OUT.cluster.json``) with the bandwidths of the links the run's all-reduces crossed
  corrected.

**Stage times.** A stage is a known set of layers on a known device type, TP degree and micro-batch size;
its measured forward + backward per micro-batch, step by step, goes to :func:`hpp.profiles.calibration_fit.fit_layers`
(least squares per layer when the run's stages of that entry separate the layers, else one factor per entry;
the fit's module docstring says why). What a stage measures, in the profile's units:

- on a GPU, its forward/backward ops' wall time per micro-batch, less the cost model's fixed terms of
  the stage (loss, schedule overhead: :func:`hpp.formulation.cost_model.stage_compute_s`);
- on the emulated CPU cluster (``--emulate-speed``), each op lasts ``slowdown x D`` x the CPU time it used
  (:mod:`hpp.runtime.host.emulation`), so ``(wall / CPU time) / D`` is the emulated device's speed
  relative to the host's CPU, and the stage's time is that x its layers' times on the base type (the
  type measured on this host). The host's own speed is not the device's: it changes from run to run, and
  ``hpp run``'s speed probe (:mod:`hpp.runtime.profile.host_speed`) measures it each run. So on CPU the
  emulated types are calibrated (one slowdown per type, by construction of the emulation), and the base
  type's entries are kept. The profile holds an emulated type's speed twice: its entries (what the planner
  prices) and ``meta["emulated"][TYPE]["slowdown"]`` (what the run's prediction pads by,
  :func:`hpp.runtime.host.time_model.believed_slowdown`); both are written from the measured slowdown ``k``
  (entries = the base type's x ``k``, :func:`hpp.runtime.host.time_model.emulated_entry`; slowdown = ``k``),
  whatever the old pair was, so a profile whose two disagreed (logged as a warning) comes out consistent, and
  calibrating it again gives factor 1.

**Links.** The measured gradient sync per step (:mod:`hpp.runtime.step_terms`) against the cost model's
all-reduce time gives one bandwidth factor (:func:`hpp.profiles.calibration_fit.fit_link`) for the links
of the nodes the plan uses (each node's own link and, for a plan over several nodes, the inter-node
link); a factor whose spread over the steps is above :data:`MAX_LINK_SPREAD` is not written (the link is kept,
"too noisy"). The measured point-to-point waits are not fitted: they include the fill and drain of the
schedule, which depend on the other stages' times, and on one host the transfers are a small part of
them; the console shows them beside the prediction. A version-2 cluster's per-pair links are kept.

**Re-plan check.** :func:`replan_check` searches a new plan on the calibrated figures (with the search the
caller hands in: :func:`hpp.replan.search_calibrated`)
(:func:`hpp.planner.plan_hpp`) and prices it and the run's plan as the run predicts (:func:`run_predictor`: on
CPU the host model, at the run's time scale and host speed, on the calibrated profile); re-planning is predicted
to pay when the new plan is faster by
more than the largest spread of the figures that were written (at least :data:`PAYS_ABOVE`);
:func:`replan_command` is the ``hpp plan`` command of that search (the run's global batch size).

Refusals (:class:`HppInputError`, exit 2): before the run (:func:`check_before_run`) an ``OUT.json`` or
``OUT.cluster.json`` that exists without ``--force``, a run with no step after the warm-up, a plan
without a profile, a CPU run without ``--emulate-speed``; after it (:func:`calibrate_run`) a report with
0 measured steps after the warm-up or of another model than the profile.
"""

from __future__ import annotations

import logging
import shlex
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from hpp.errors import HppInputError
from hpp.formulation.cost_model import estimate_plan, stage_compute_s
from hpp.plan_data import Plan
from hpp.profiles.calibration_fit import MAX_LINK_FACTOR, fit_layers, fit_link, spread, stage_layer_work_s
from hpp.profiles.calibration_record import FigureCalibration, ProfileCalibration
from hpp.profiles.cluster import Cluster, Link
from hpp.profiles.cluster_format import save_cluster
from hpp.profiles.model_profile import Key, LayerProfile, ModelProfile
from hpp.runtime.host.time_model import (base_entry, emulated_entry, emulation_mismatches, scale_cpu_work,
                                        simulate_host_run)
from hpp.runtime.models.zoo import canonical_model_name

__all__ = ["Calibrated", "calibrate_run", "check_before_run", "cluster_path_of", "replan_check", "run_predictor",
           "write_calibrated", "calibration_lines", "replan_command",
           "PAYS_ABOVE", "MAX_LINK_SPREAD"]

logger = logging.getLogger(__name__)

#: the largest spread ((max - min) / median over the steps) of a link's fitted bandwidth factor that is written; a
#: noisier link is kept. The gradient sync is a few milliseconds on a shared host and a step's sync can end at
#: the latency (the all-reduce hidden behind the backward pass), so a step's factor swings by more than 2x while a
#: link's true bandwidth does not change between steps; above 50 % the median says more about the host's
#: scheduling than about the link, and written it would also set the bar of "re-planning pays" (replan_check).
MAX_LINK_SPREAD = 0.5
#: the least predicted gain of a re-plan that is called "predicted to pay" (the calibrated figures' own spread
#: raises it)
PAYS_ABOVE = 0.01


def cluster_path_of(out: str | Path) -> Path:
    """The corrected cluster written beside the profile ``OUT.json``: ``OUT.cluster.json``.

    >>> str(cluster_path_of("runs/cal.json"))
    'runs/cal.cluster.json'
    """
    p = Path(out)
    return p.with_name(p.stem + ".cluster.json")


def _refuse_existing(out: str | Path, *, force: bool) -> None:
    """``OUT.json`` or ``OUT.cluster.json`` already there, without ``force``: one HppInputError."""
    for path in (Path(out), cluster_path_of(out)):
        if path.exists() and not force:
            raise HppInputError(f"{path} exists", field="--calibrate",
                                fix="give another OUT.json, or --force to overwrite it")


def check_before_run(out: str | Path, *, force: bool, steps: int, warmup_steps: int, device: str,
                     emulate_speed: bool, has_profile: bool, plan_path: str) -> None:
    """The refusals of ``--calibrate`` that need no run (module docstring), before the run spends its time.

    Raises
    ------
    HppInputError
    """
    _refuse_existing(out, force=force)
    if Path(out).suffix != ".json":
        raise HppInputError(f"{out} does not end in .json", field="--calibrate", fix="name the profile OUT.json")
    if steps - warmup_steps < 1:
        raise HppInputError(f"--steps {steps} with --warmup-steps {warmup_steps} measures 0 steps to calibrate from",
                            field="--steps", fix=f"use --steps {warmup_steps + 3} or more")
    if not has_profile:
        raise HppInputError("the plan names no profile: nothing to calibrate", source=plan_path, field="profile",
                            fix="plan with a profile (hpp plan --profile)")
    if device == "cpu" and not emulate_speed:
        raise HppInputError("--calibrate on CPU measures the emulated devices' speed", field="--calibrate",
                            fix="add --emulate-speed")


@dataclass(frozen=True)
class Calibrated:
    """What :func:`calibrate_run` fitted: the corrected ``profile`` (with its ``calibration``) and ``cluster``."""

    profile: ModelProfile
    cluster: Cluster

    def __post_init__(self) -> None:
        if self.profile.calibration is None:
            raise ValueError("a calibrated profile carries its calibration record (ModelProfile.calibration)")

    @property
    def calibration(self) -> ProfileCalibration:
        assert self.profile.calibration is not None      # checked at construction
        return self.profile.calibration


def _kept_steps(values: list[float], warmup_steps: int) -> list[float]:
    return list(values[warmup_steps:])


def _entry_name(key: Key) -> str:
    return f"{key[0]}/tp{key[1]}/mb{key[2]}"


def _kept(what: str, note: str) -> FigureCalibration:
    return FigureCalibration(what, "kept", "", 1.0, 0.0, 0, note)


def _compute_s(e: LayerProfile) -> float:
    """An entry's forward + backward summed over its layers [s per micro-batch]."""
    return float(sum(e.forward_s) + sum(e.backward_s))


def _stage_rows(report: Mapping[str, Any], plan: Plan, profile: ModelProfile, *, warmup_steps: int
                ) -> dict[Key, list[tuple[int, int, bool, list[float]]]]:
    """Per entry key, its stages ``(lo, hi, recomputes, per kept step: forward + backward per micro-batch [s] in the
    profile's units)`` (module docstring)."""
    cpu = report.get("device", "cpu") == "cpu"
    scale = float((report.get("predicted") or {}).get("time_scale") or 1.0)
    measured = {(s["pipeline"], s["stage"]): s for s in report["measured"].get("stages") or []}
    rows: dict[Key, list[tuple[int, int, bool, list[float]]]] = {}
    for p, pipe in enumerate(plan.pipelines):
        m = pipe.num_micro_batches
        for s, st in enumerate(pipe.stages):
            got = measured.get((p, s))
            if got is None or m == 0:
                continue
            key = (st.device_type, st.tp_degree, pipe.micro_batch_size)
            lo, hi, rc = st.layer_start, st.layer_stop, st.recompute == "full"
            wall = _kept_steps(got["compute_steps_s"], warmup_steps)
            if cpu:
                base = base_entry(profile, *key)
                layers = stage_layer_work_s(base.forward_s, base.backward_s, lo, hi, rc)
                cpu_s = _kept_steps(got["cpu_steps_s"], warmup_steps)
                y = [w / (c * scale) * layers for w, c in zip(wall, cpu_s) if c > 0]
            else:
                e = profile.layer_profile(*key)
                f_s, b_s = stage_compute_s(e, lo, hi, st.recompute)
                layers = stage_layer_work_s(e.forward_s, e.backward_s, lo, hi, rc)
                fixed = f_s + b_s - layers
                y = [w / m / scale - fixed for w in wall]
            if len(y) == len(wall) and all(v > 0 for v in y):
                rows.setdefault(key, []).append((lo, hi, rc, y))
    return rows


def _fit_entries(report: Mapping[str, Any], plan: Plan, profile: ModelProfile, *, warmup_steps: int
                 ) -> tuple[ModelProfile, list[FigureCalibration]]:
    rows = _stage_rows(report, plan, profile, warmup_steps=warmup_steps)
    cpu = report.get("device", "cpu") == "cpu"
    emulated = dict(profile.meta.get("emulated", {}))
    entries = dict(profile.entries)
    figures: dict[Key, FigureCalibration] = {}
    for dtype in profile.device_types:
        keys = sorted(k for k in profile.entries if k[0] == dtype)
        ran = sorted(k for k in rows if k[0] == dtype)
        if not ran:
            for k in keys:
                figures[k] = _kept(_entry_name(k), f"the run used no device of type {dtype}")
            continue
        if cpu and dtype in emulated:
            # one slowdown for the whole type (the emulation pads every op of it by one factor): what was measured,
            # relative to the base type's entries, whatever the old entries and meta slowdown said
            num = [0.0] * len(rows[ran[0]][0][3])
            den = 0.0
            for k in ran:
                b = base_entry(profile, *k)
                for lo, hi, rc, y in rows[k]:
                    den += stage_layer_work_s(b.forward_s, b.backward_s, lo, hi, rc)
                    num = [a + v for a, v in zip(num, y)]
            per_step = [x / den for x in num]
            measured = statistics.median(per_step)
            slowdown = max(measured, 1.0)
            used = ", ".join(str(k[2]) for k in ran)
            old_slowdown = float(emulated[dtype].get("slowdown", 1.0))
            note = (f"emulated type: {emulated[dtype]['base']} x the measured slowdown {measured:.3f} "
                    f"(meta.emulated.{dtype}.slowdown was {old_slowdown:g}) for every entry, measured at micro-batch "
                    f"size {used}")
            if measured < 1.0:
                note += "; written 1, the least an emulation pads by"
            for k in keys:
                entries[k] = emulated_entry(base_entry(profile, *k), dtype, slowdown)
                figures[k] = FigureCalibration(_entry_name(k), "calibrated", "scale",
                                               _compute_s(entries[k]) / _compute_s(profile.entries[k]),
                                               spread(per_step), len(per_step), note)
            emulated[dtype] = {**emulated[dtype], "slowdown": slowdown}
            continue
        for k in keys:
            if k not in rows:
                figures[k] = _kept(_entry_name(k), f"the run did not use {dtype} at TP {k[1]} and micro-batch size "
                                                   f"{k[2]}")
            elif cpu:
                figures[k] = _kept(_entry_name(k), "the type the CPU emulation runs on: its speed is the host's, "
                                                   "which hpp run's speed probe measures each run")
        for k in ran:
            if cpu:
                continue
            e = profile.layer_profile(*k)
            st = rows[k]
            fit = fit_layers(e.forward_s, e.backward_s, [(lo, hi, rc) for lo, hi, rc, _y in st],
                             [list(t) for t in zip(*(y for *_r, y in st))])
            entries[k] = replace(e, forward_s=tuple(v * a for v, a in zip(e.forward_s, fit.factors)),
                                 backward_s=tuple(v * a for v, a in zip(e.backward_s, fit.factors)),
                                 estimated=False, note=f"calibrated by a run ({fit.method})")
            figures[k] = FigureCalibration(_entry_name(k), "calibrated", fit.method, fit.total_factor, fit.spread,
                                           fit.steps, f"{len(st)} stage{'s' if len(st) > 1 else ''}"
                                           + ("" if k in profile.entries else "; an estimated entry before"))
    meta = dict(profile.meta)
    if emulated:
        meta["emulated"] = emulated
    out = replace(profile, entries=entries, meta=meta)
    return out, [figures[k] for k in sorted(figures)]


def _scale_link(link: Link, g: float) -> Link:
    """``link`` with every bandwidth figure (peak, fit, aggregates) x ``g``; latency unchanged."""
    fit = tuple(c * g for c in link.fit_gb_per_s) if link.fit_gb_per_s is not None else None
    agg = tuple(replace(a, max_bytes_per_s=a.max_bytes_per_s * g,
                        fit_gb_per_s=tuple(c * g for c in a.fit_gb_per_s) if a.fit_gb_per_s is not None else None)
                for a in link.aggregate)
    return replace(link, max_bytes_per_s=link.max_bytes_per_s * g, fit_gb_per_s=fit, aggregate=agg)


def _used_nodes(plan: Plan, cluster: Cluster) -> list[int]:
    devices = cluster.devices
    return sorted({devices[d].node for pipe in plan.pipelines for st in pipe.stages for d in st.device_ids})


def _scaled_cluster(cluster: Cluster, nodes: list[int], g: float) -> Cluster:
    new_nodes = tuple(replace(n, intra_node=_scale_link(n.intra_node, g)) if i in nodes else n
                      for i, n in enumerate(cluster.nodes))
    inter = _scale_link(cluster.inter_node, g) if len(nodes) > 1 else cluster.inter_node
    return replace(cluster, nodes=new_nodes, inter_node=inter, _cache={})


def _fit_links(report: Mapping[str, Any], plan: Plan, cluster: Cluster, profile: ModelProfile, *,
               warmup_steps: int) -> tuple[Cluster, list[FigureCalibration]]:
    nodes = _used_nodes(plan, cluster)
    names = [f"link intra-node {i} ({cluster.nodes[i].device_type})" for i in range(len(cluster.nodes))]
    names.append("link inter-node")
    used = {names[i] for i in nodes} | ({names[-1]} if len(nodes) > 1 else set())
    kept_unused = [_kept(n, "the run used no device that it links") for n in names if n not in used]
    if cluster.network is not None:
        return cluster, [_kept(n, "a version-2 cluster's per-pair links are not calibrated") for n in names]
    sync = _kept_steps(report["measured"].get("grad_sync_steps_s") or [], warmup_steps)
    fit = fit_link(sync, lambda g: estimate_plan(plan, _scaled_cluster(cluster, nodes, g), profile).grad_sync_s) \
        if sync else None
    if fit is None:
        why = ("the run's plan has no gradient all-reduce to measure it by" if not sync or
               estimate_plan(plan, cluster, profile).grad_sync_s <= 0 else
               "the gradient all-reduces were hidden in the schedule (measured sync at or below the latency): the run "
               "did not measure the links")
        return cluster, [_kept(n, why) for n in sorted(used)] + kept_unused
    if fit.spread > MAX_LINK_SPREAD:
        why = (f"too noisy (spread {100 * fit.spread:.0f} % of the fitted factor x{fit.factor:.3f} over {fit.steps} "
               f"steps, above {100 * MAX_LINK_SPREAD:.0f} %)")
        return cluster, [_kept(n, why) for n in sorted(used)] + kept_unused
    note = "from the measured gradient sync" + (
        f" (a step's sync within a tenth of the bandwidth term of the latency counts as x{MAX_LINK_FACTOR:g}, the "
        "most a step can give)"
        if fit.floored else "")
    figs = [FigureCalibration(n, "calibrated", "bandwidth", fit.factor, fit.spread, fit.steps, note)
            for n in sorted(used)]
    return _scaled_cluster(cluster, nodes, fit.factor), figs + kept_unused


def calibrate_run(report: Mapping[str, Any], plan: Plan, cluster: Cluster, profile: ModelProfile, *,
                  source: str, plan_path: str) -> Calibrated:
    """The profile and cluster corrected by the run ``report`` of ``plan`` (module docstring).

    Parameters
    ----------
    report : :meth:`hpp.runtime.run_report.RunReport.to_dict` of the run (``model``, ``device``,
        ``warmup_steps``, ``measured.stages[*].compute_steps_s`` / ``cpu_steps_s``, ``measured.grad_sync_steps_s``,
        ``predicted.time_scale``).
    plan, cluster, profile : what the run ran and predicted with.
    source : the command the calibration came from (written into the profile).
    plan_path : the plan file (written into the profile).

    Raises
    ------
    HppInputError
        The report measured 0 steps after its warm-up, or is of another model than ``profile``.
    """
    warmup = int(report.get("warmup_steps", 0))
    stages = (report.get("measured") or {}).get("stages") or []
    steps = min((len(s.get("compute_steps_s") or []) for s in stages), default=0)
    if steps - warmup < 1:
        raise HppInputError(f"the run measured {max(0, steps - warmup)} steps after its {warmup} warm-up steps: "
                            "nothing to calibrate from", field="--steps", fix=f"run --steps {warmup + 3} or more")
    same = lambda n: canonical_model_name(n) or n.strip().lower()      # noqa: E731  (bundled aliases match)
    if same(str(report.get("model", ""))) != same(profile.model):
        raise HppInputError(f"the run is of model {report.get('model')!r} but the profile is of {profile.model!r}",
                            field="model", fix=f"calibrate a profile of {report.get('model')!r}")
    for line in emulation_mismatches(profile):
        logger.warning("the profile of %s: %s; the calibrated profile writes both from the run's measurement",
                       plan_path, line)
    new_profile, entry_figs = _fit_entries(report, plan, profile, warmup_steps=warmup)
    new_cluster, link_figs = _fit_links(report, plan, cluster, profile, warmup_steps=warmup)
    cal = ProfileCalibration(source, plan_path, steps - warmup, warmup, tuple(entry_figs + link_figs))
    desc = f"calibrated by {source}"
    return Calibrated(replace(new_profile, calibration=cal,
                              source=f"{profile.source} Calibrated by a run: {source}.".strip()),
                      replace(new_cluster, name=f"{cluster.name} ({desc})"[:200]))


def write_calibrated(cal: Calibrated, out: str | Path, *, force: bool) -> tuple[Path, Path]:
    """Write the profile to ``out`` (:func:`hpp.runtime.profile.profiler.write_profile`) and the cluster to
    :func:`cluster_path_of` ``(out)``; refuses existing files without ``force`` (HppInputError)."""
    from hpp.runtime.profile.profiler import write_profile
    _refuse_existing(out, force=force)
    out, cpath = Path(out), cluster_path_of(out)
    write_profile(cal.profile, out)
    save_cluster(cal.cluster, cpath)
    return out, cpath


def run_predictor(report: Mapping[str, Any], cal: Calibrated) -> Callable[[Plan], float]:
    """How the run predicted its iteration time, on the calibrated figures: a function of a plan [s].

    On CPU the host model (:func:`hpp.runtime.host.time_model.simulate_host_run`) at the run's time scale, host
    speed factor, cores and steal (``report["predicted"]``); on a GPU the cost model
    (:func:`hpp.formulation.cost_model.estimate_plan`).
    """
    pr = report.get("predicted") or {}
    hm = pr.get("host_model")
    if report.get("device", "cpu") != "cpu" or not hm:
        return lambda p: estimate_plan(p, cal.cluster, cal.profile).iteration_time_s
    factor = (pr.get("host_speed") or {}).get("factor")
    prof = scale_cpu_work(cal.profile, factor) if factor else cal.profile
    return lambda p: simulate_host_run(p, cal.cluster, prof, cores=int(hm["cores"]),
                                       emulate_speed=bool(report.get("emulate_speed")),
                                       time_scale=float(pr.get("time_scale") or 1.0),
                                       steal=float(hm.get("steal") or 0.0)).iteration_time_s


def replan_check(plan: Plan, cal: Calibrated, *, search: Callable[..., Any],
                 predict: Callable[[Plan], float] | None = None, time_limit_s: float = 10.0) -> dict[str, Any]:
    """The run's plan and a new plan searched on the calibrated figures, both priced by ``predict`` (default: the
    calibrated cost model; ``hpp run`` gives :func:`run_predictor`, what the run's own prediction is, so that the
    figures compare with the runs' measured times).

    ``search(cluster, profile, global_batch_size, *, time_limit_s)`` is the planner
    (:func:`hpp.replan.search_calibrated`), handed in by the caller: the runtime imports no search code
    (tests/test_layout.py), so ``hpp``'s command line, which may, gives it. It returns an object with ``plan``
    and ``estimate.iteration_time_s`` and raises :class:`HppInputError` when it finds no plan.

    Returns
    -------
    dict
        ``current_s`` (the run's plan), ``replan_s`` (the new plan's predicted iteration time [s], None
        when the search found none), ``gain`` (``1 - replan_s / current_s``), ``threshold`` (the gain above
        which it pays), ``pays`` (bool), ``plan`` (the new :class:`Plan` or None) and
        ``cost_model_current_s`` / ``cost_model_replan_s`` (both in the calibrated cost model), and how the new
        plan was searched, ``global_batch_size`` (the run's) and ``time_limit_s`` (:func:`replan_command`).
    """
    predict = predict or (lambda p: estimate_plan(p, cal.cluster, cal.profile).iteration_time_s)
    current = predict(plan)
    cm_current = estimate_plan(plan, cal.cluster, cal.profile).iteration_time_s
    threshold = max([PAYS_ABOVE] + [f.spread for f in cal.calibration.figures if f.status == "calibrated"])
    how = {"global_batch_size": plan.global_batch_size, "time_limit_s": time_limit_s}
    try:
        res = search(cal.cluster, cal.profile, plan.global_batch_size, time_limit_s=time_limit_s)
    except HppInputError as exc:
        logger.info("re-plan on the calibrated figures found no plan: %s", exc)
        return {"current_s": current, "replan_s": None, "gain": None, "threshold": threshold, "pays": False,
                "plan": None, "cost_model_current_s": cm_current, "cost_model_replan_s": None, **how}
    new = predict(res.plan)
    gain = 1.0 - new / current
    return {"current_s": current, "replan_s": new, "gain": gain, "threshold": threshold, "pays": gain > threshold,
            "plan": res.plan, "cost_model_current_s": cm_current,
            "cost_model_replan_s": res.estimate.iteration_time_s, **how}


def replan_command(paths: tuple[Path, Path], check: Mapping[str, Any]) -> str:
    """The ``hpp plan`` command of the plan :func:`replan_check` priced: on the calibrated profile and cluster
    ``paths``, at the run's global batch size, with its solver time limit and without the baselines (the check
    searches without them).

    >>> replan_command((Path("c.json"), Path("c.cluster.json")), {"global_batch_size": 32, "time_limit_s": 10.0})
    'hpp plan --profile c.json --cluster c.cluster.json --gbs 32 --time-limit 10 --no-baselines --out c.plan.json'
    """
    out = paths[0].with_name(paths[0].stem + ".plan.json")
    return shlex.join(["hpp", "plan", "--profile", str(paths[0]), "--cluster", str(paths[1]),
                       "--gbs", str(check["global_batch_size"]), "--time-limit", f"{check['time_limit_s']:g}",
                       "--no-baselines", "--out", str(out)])


def calibration_lines(cal: Calibrated, check: Mapping[str, Any] | None, paths: tuple[Path, Path],
                      predicted_before_s: float | None, measured_s: float | None = None) -> list[str]:
    """The console lines of ``--calibrate``: how far the run was from its prediction, what was fitted (factor,
    spread, steps) and kept, and the re-plan check (``check`` None: not made, said so). ``predicted_before_s``: the
    run's own prediction (before the calibration); ``measured_s``: its measured iteration time [s]."""
    c = cal.calibration
    lines = [(f"calibrate: wrote {paths[0]} (profile) and {paths[1]} (links), from {c.steps} step"
              f"{'s' if c.steps != 1 else ''} after {c.warmup_steps} warm-up")]
    if measured_s is not None and predicted_before_s:
        lines.append(f"  this run         measured {measured_s:.4f} s per iteration, predicted "
                     f"{predicted_before_s:.4f} s ({100 * (measured_s / predicted_before_s - 1):+.1f} %); term by "
                     "term: the stage terms above, and per figure below (x = measured / profile)")
    for f in c.figures:
        if f.status == "calibrated":
            lines.append(f"  {f.what:<32} x{f.factor:.3f} of the old figure ({f.method}; spread {100 * f.spread:.1f} "
                         f"% over {f.steps} steps){'; ' + f.note if f.note else ''}")
        else:
            lines.append(f"  {f.what:<32} kept: {f.note}")
    if check is None:
        lines.append("  re-plan: not checked (no planner was given to this entry point; `hpp run` checks it)")
        return lines
    cur, new = check["current_s"], check["replan_s"]
    before = ""
    if new is None:
        lines.append(f"  re-plan: this plan {before}{cur:.4f} s per iteration in the calibrated model; the search "
                     "found no plan on the calibrated figures")
        return lines
    verdict = (f"re-planning is predicted to pay: {replan_command(paths, check)}" if check["pays"]
               else f"re-planning is not predicted to pay (gain within {100 * check['threshold']:.1f} %, the "
                    "calibrated figures' spread)")
    lines.append(f"  re-plan: this plan {before}{cur:.4f} s per iteration as this run predicts on the calibrated "
                 f"figures, a new plan {new:.4f} s ({100 * check['gain']:+.1f} % faster; cost model "
                 f"{check['cost_model_current_s']:.4f} -> {check['cost_model_replan_s']:.4f} s): {verdict}")
    return lines
