"""Per-stage Gantt charts of one iteration: predicted (cost model) beside measured (the run).

The predicted side replays each pipeline's schedule with the cost model's
per-micro-batch stage times: under 1F1B stage ``s`` of ``S`` runs
``min(S - s, m)`` warm-up forwards, then alternates backward/forward, then
drains backwards (GPipe: all forwards, then all backwards); an op starts when its
stage is free and its input is ready (forward: the previous stage's forward of
that micro-batch; backward: the next stage's backward and its own forward).
Point-to-point transfer time is left out of the replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hpp.fileio import write_atomic
from hpp.plan_data import Plan
from hpp.runtime.host.time_model import schedule_order

__all__ = ["simulate_pipeline", "write_timeline_png"]


def simulate_pipeline(forward_s: Sequence[float], backward_s: Sequence[float], num_micro_batches: int,
                      schedule: str) -> list[list[tuple[str, int, float, float]]]:
    """Replay one pipeline; per stage the ops ``(kind, micro_batch, start_s, stop_s)``.

    forward_s, backward_s : (num_stages,) seconds per micro-batch.

    >>> ops = simulate_pipeline([1.0, 1.0], [2.0, 2.0], 2, "1F1B")
    >>> max(op[3] for stage in ops for op in stage)
    9.0
    """
    n = len(forward_s)
    done: dict[tuple[str, int, int], float] = {}
    orders = [schedule_order(s, n, num_micro_batches, schedule) for s in range(n)]
    pos = [0] * n
    free = [0.0] * n
    out: list[list[tuple[str, int, float, float]]] = [[] for _ in range(n)]
    progress = True
    while progress:
        progress = False
        for s in range(n):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]]
                deps = [("F", s - 1, i)] if kind == "F" and s > 0 else []
                if kind == "B":
                    deps = [("F", s, i)] + ([("B", s + 1, i)] if s < n - 1 else [])
                if any(d not in done for d in deps):
                    break
                start = max([free[s]] + [done[d] for d in deps])
                stop = start + (forward_s[s] if kind == "F" else backward_s[s])
                done[(kind, s, i)] = stop
                free[s] = stop
                out[s].append((kind, i, start, stop))
                pos[s] += 1
                progress = True
    return out


def _draw(ax: Any, rows: list[tuple[str, list[tuple[str, int, float, float]]]], title: str) -> None:
    for y, (_label, ops) in enumerate(rows):
        for kind, i, start, stop in ops:
            ax.barh(y, stop - start, left=start, color="tab:blue" if kind == "F" else "tab:orange",
                    edgecolor="black", linewidth=0.3)
            if stop - start > 0:
                ax.text((start + stop) / 2, y, str(i), ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from iteration start")
    ax.set_title(title, fontsize=9)
    _legend(ax)


def _legend(ax: Any) -> None:
    """The colour key, in every panel (a panel read alone still says what it shows)."""
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(facecolor="tab:blue", edgecolor="black", label="forward (label: micro-batch)"),
                       Patch(facecolor="tab:orange", edgecolor="black", label="backward (label: micro-batch)")],
              fontsize=6, loc="lower right", framealpha=0.8)


def write_timeline_png(path: Path, *, plan: Plan, results: list[dict[str, Any] | None],
                       predicted: dict[str, Any]) -> Any:
    """Write the predicted and the measured timeline of the last step side by side (PNG, tmp + rename).

    ``results`` are the ranks' result dicts (their ``events``; one row per rank, a TP
    rank labelled ``tp<k>``); ``predicted`` the run report's predicted section (its
    ``pipelines`` give per-stage times). Every panel carries the colour legend.

    Returns
    -------
    matplotlib.figure.Figure
        The figure written (closed), for inspection.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured_rows = []
    for r in (r for r in results if r is not None):
        ops = [(e["kind"], e["micro_batch"], e["start_s"], e["stop_s"]) for e in r["events"]]
        tp = f" tp{r['tp_rank']}" if (r.get("tp_degree") or 1) > 1 else ""
        measured_rows.append((f"p{r['pipeline']} s{r['stage']}{tp} ({r['device_type']})", ops))
    predicted_rows = []
    for p, pipe in enumerate(plan.pipelines):
        stages = (predicted.get("pipelines") or [None] * plan.num_pipelines)[p]
        if stages is None:
            continue
        sim = simulate_pipeline([s["forward_s"] for s in stages["stages"]], [s["backward_s"] for s in stages["stages"]],
                                pipe.num_micro_batches, pipe.schedule)
        predicted_rows += [(f"p{p} s{s} ({st.device_type})", sim[s]) for s, st in enumerate(pipe.stages)]
    ncols = 2 if predicted_rows else 1
    fig, axes = plt.subplots(1, ncols, figsize=(7 * ncols, 0.45 * len(measured_rows) + 1.5), squeeze=False,
                             sharex=True)
    if predicted_rows:
        host = predicted.get("iteration_time_s")
        _draw(axes[0][0], predicted_rows, "predicted by the cost model (dedicated cores, 1 iteration)" + (
            f"; on this host's shared cores: {host:.3f} s" if host is not None and "host_model" in predicted else ""))
    _draw(axes[0][-1], measured_rows, "measured (last step)")
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return fig
