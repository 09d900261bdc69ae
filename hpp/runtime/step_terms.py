"""The communication terms of a step, measured by the ranks and predicted by the cost model, side by side.

The cost model prices one iteration as ``T = max_p T_p + T_sync + T_opt``
(:func:`hpp.formulation.cost_model.estimate_plan`): each pipeline's schedule ``T_p``, in which a
stage computes ``m (F_s + B_s)`` and otherwise waits (for its point-to-point transfers, ``m P_s``,
and for its neighbours: the fill and drain); then the gradient all-reduces ``T_sync``, not overlapped;
then the optimizer step. A run measures the same decomposition from each rank's step phases
(:func:`hpp.runtime.exec.step.phase_record`: ``batch_s``, ``schedule_s``, ``sync_wait_s``,
``compute_s``, ``padding_s``, all relative to the barrier that starts the step on every rank) and
its collectives (``joined_count``):

- **gradient sync** of a step = ``max_r sync_end_r - max_r schedule_end_r`` (never below 0), with
  ``schedule_end_r = batch_s + schedule_s`` and ``sync_end_r = schedule_end_r + sync_wait_s`` for a rank
  that joined an all-reduce in that step (a rank that joined none ends its sync where its schedule ends):
  how long after the last schedule ended the gradients were summed, i.e. what the step paid for the
  sync beyond the pipelines. The all-reduces launched during backward (``overlap``) are hidden in the
  schedule and not counted; a rank whose schedule ended early waits for its peers in ``sync_wait_s``,
  which the difference to the last schedule's end leaves out. A plan whose ranks join no all-reduce
  (one pipeline without TP) measures exactly 0.
- **p2p wait** of a stage in a step = its ``schedule_s - compute_s - padding_s``: the time inside its
  schedule outside its own forward and backward passes (the largest over the stage's TP ranks): waiting
  on its sends and receives, for its neighbour stages too (fill and drain), plus the schedule's own work
  (the loss's forward on the last stage). Its prediction is the same quantity in the cost model,
  ``T_p - m (F_s + B_s)``, of which ``m P_s`` are the transfer waits.

The report gives each term's median over the steps after the warm-up, and the gradient sync per step.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from hpp.formulation.cost_model import PlanEstimate

__all__ = ["measured_terms", "predicted_terms", "summary_lines"]


def _kept(values: Sequence[Any], warmup_steps: int) -> Sequence[Any]:
    """The values after the warm-up steps (all of them when there are no more steps than that)."""
    return values[warmup_steps:] if len(values) > warmup_steps else values


def _sync_per_step(results: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per step, the gradient sync [s] beyond the last schedule's end (module docstring)."""
    steps = min(len(r["phases"]) for r in results)
    out = []
    for i in range(steps):
        sched_end, sync_end = [], []
        for r in results:
            ph = r["phases"][i]
            end = ph["batch_s"] + ph["schedule_s"]
            joined = (r.get("collectives") or [{}] * steps)[i].get("joined_count", 0) > 0
            sched_end.append(end)
            sync_end.append(end + ph["sync_wait_s"] if joined else end)
        out.append(max(0.0, max(sync_end) - max(sched_end)))
    return out


def measured_terms(results: Sequence[Mapping[str, Any]], *, warmup_steps: int) -> dict[str, Any]:
    """The measured gradient sync and each stage's p2p wait of a run (module docstring).

    Parameters
    ----------
    results : sequence of dict
        The ranks' ``rank<r>.json`` (:func:`hpp.runtime.exec.worker.run_worker`): ``pipeline``, ``stage``,
        ``phases`` (per step) and ``collectives`` (per step) of every rank this host ran.
    warmup_steps : int
        Steps left out of the medians.

    Returns
    -------
    dict
        ``grad_sync_s`` (median over the kept steps [s]), ``grad_sync_steps_s`` (every step [s]) and
        ``stages``: per stage of these ranks, by (pipeline, stage), ``{"pipeline", "stage", "compute_s",
        "p2p_wait_s"}`` (medians over the kept steps [s]; ``compute_s`` with the emulation's padding) and, per
        step (all of them), ``compute_steps_s`` (with the padding) and ``cpu_steps_s`` (the CPU seconds of the
        stage's forward/backward ops; both the largest over the stage's TP ranks).

    Examples
    --------
    Two one-stage pipelines, one step: rank 1's schedule ends last (0.5 s), its all-reduce 0.25 s later.

    >>> ph = lambda sched, wait, comp: {"batch_s": 0.0, "schedule_s": sched, "sync_wait_s": wait,
    ...                                 "compute_s": comp, "padding_s": 0.0}
    >>> rs = [{"pipeline": 0, "stage": 0, "phases": [ph(0.25, 0.5, 0.125)], "collectives": [{"joined_count": 1}]},
    ...       {"pipeline": 1, "stage": 0, "phases": [ph(0.5, 0.25, 0.5)], "collectives": [{"joined_count": 1}]}]
    >>> t = measured_terms(rs, warmup_steps=0)
    >>> t["grad_sync_s"], [s["p2p_wait_s"] for s in t["stages"]]
    (0.25, [0.125, 0.0])
    """
    results = [r for r in results if r is not None]
    if not results:
        return {"grad_sync_s": None, "grad_sync_steps_s": [], "stages": []}
    sync = _sync_per_step(results)
    by_stage: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for r in results:
        by_stage.setdefault((int(r["pipeline"]), int(r["stage"])), []).append(r)
    stages = []
    for (p, s), ranks in sorted(by_stage.items()):
        steps = min(len(r["phases"]) for r in ranks)
        waits = [max(max(0.0, ph["schedule_s"] - ph["compute_s"] - ph["padding_s"])
                     for ph in (r["phases"][i] for r in ranks)) for i in range(steps)]
        compute = [max(ph["compute_s"] + ph["padding_s"] for ph in (r["phases"][i] for r in ranks))
                   for i in range(steps)]
        cpu = [max(ph.get("cpu_s", 0.0) for ph in (r["phases"][i] for r in ranks)) for i in range(steps)]
        stages.append({"pipeline": p, "stage": s, "compute_s": statistics.median(_kept(compute, warmup_steps)),
                       "p2p_wait_s": statistics.median(_kept(waits, warmup_steps)),
                       "compute_steps_s": compute, "cpu_steps_s": cpu})
    return {"grad_sync_s": statistics.median(_kept(sync, warmup_steps)), "grad_sync_steps_s": sync,
            "stages": stages}


def predicted_terms(est: PlanEstimate) -> dict[str, Any]:
    """The cost model's figures beside :func:`measured_terms` (module docstring).

    Returns
    -------
    dict
        ``grad_sync_s`` (:attr:`PlanEstimate.grad_sync_s`) and ``stages``: per stage, by (pipeline, stage),
        ``{"pipeline", "stage", "compute_s": m (F_s + B_s), "p2p_wait_s": T_p - m (F_s + B_s),
        "p2p_transfer_wait_s": m P_s, "p2p_s": one transfer to the next stage}`` [s].
    """
    stages = []
    for p, pe in enumerate(est.pipelines):
        m = pe.num_micro_batches
        for s, st in enumerate(pe.stages):
            compute = m * (st.forward_s + st.backward_s)
            stages.append({"pipeline": p, "stage": s, "compute_s": compute,
                           "p2p_wait_s": max(0.0, pe.time_s - compute),
                           "p2p_transfer_wait_s": max(0.0, st.busy_s - compute), "p2p_s": st.p2p_s})
    return {"grad_sync_s": est.grad_sync_s if math.isfinite(est.grad_sync_s) else None, "stages": stages}


def _fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def summary_lines(measured: Mapping[str, Any], predicted: Mapping[str, Any]) -> list[str]:
    """``hpp run``'s summary lines of these terms: the measured gradient sync and each stage's compute and p2p wait
    beside the cost model's (``measured``/``predicted``: the report's dicts); none for a report without them."""
    if measured.get("grad_sync_s") is None:
        return []
    pred = {(s["pipeline"], s["stage"]): s for s in predicted.get("stages") or []}
    lines = [f"  grad sync        measured {measured['grad_sync_s']:.4f} s per step (median after warm-up; the "
             f"all-reduces after the last schedule ended)   predicted "
             f"{_fmt(predicted.get('grad_sync_s'), '.4f', ' s')} (cost model)",
             "  stage terms      pipe stage  compute_s  predicted  p2p_wait_s  predicted  (of it transfers)  "
             "[p2p wait: in the schedule, outside forward/backward]"]
    for s in measured.get("stages") or []:
        p = pred.get((s["pipeline"], s["stage"]), {})
        lines.append(f"  {'':<16} {s['pipeline']:>4} {s['stage']:>5} {s['compute_s']:>10.4f} "
                     f"{_fmt(p.get('compute_s'), '>10.4f')} {s['p2p_wait_s']:>11.4f} "
                     f"{_fmt(p.get('p2p_wait_s'), '>10.4f')}  ({_fmt(p.get('p2p_transfer_wait_s'), '.4f')})")
    return lines
