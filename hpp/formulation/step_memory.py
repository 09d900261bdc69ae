"""The step-memory formula of :func:`hpp.formulation.cost_model.stage_memory_breakdown` as dense tables.

For a profile entry with the runtime step's memory terms (``e.has_step_memory``), the
planner prices every layer range [u, v) at once. :func:`step_memory_tables` returns
(L+1, L+1) arrays (entries with u >= v are inf) such that, for a stage [u, v) at a
position with ``k`` micro-batches in flight out of ``m``::

    peak = framework + states + m (in_buffer[u] + out_buffer[v])
           + max(k kept + [m > k] in_buffer[u] + transient, optimizer_step)

(``kept`` with the stage-entry and stage-exit terms of recompute ``none``),

with ``in_buffer[u] = 0`` for u = 0 (a first stage receives nothing) and
``out_buffer[v] = 0`` for v = L (a last stage sends nothing); :func:`step_memory_peak`
evaluates it. Equal to :func:`~hpp.formulation.cost_model.stage_memory_breakdown`'s
``peak`` for every range (``tests/test_memory.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpp.profiles.model_profile import LayerProfile

__all__ = ["StepMemoryTables", "step_memory_tables", "step_memory_peak"]


@dataclass(frozen=True)
class StepMemoryTables:
    """Dense step-memory terms of one profile entry [bytes] (see the module docstring).

    Attributes
    ----------
    states : (L+1, L+1)
        P (2 + n): fp32 parameters, gradients, n optimizer states (a tied pair counted once in [0, L)).
    kept_none, kept_full : (L+1, L+1)
        Bytes per in-flight micro-batch without / with full recomputation (loss included at v = L).
    transient_none, transient_full : (L+1, L+1)
        The rise above the in-flight level, without / with full recomputation (without: the
        larger of the backward's and the forward's).
    optimizer_step : (L+1, L+1)
        The optimizer step's temporaries.
    in_buffer, out_buffer : (L+1,)
        One receive buffer of the stage's input (index u) and of its output gradient (index v).
    framework : int
    """

    states: np.ndarray
    kept_none: np.ndarray
    kept_full: np.ndarray
    transient_none: np.ndarray
    transient_full: np.ndarray
    optimizer_step: np.ndarray
    in_buffer: np.ndarray
    out_buffer: np.ndarray
    framework: int


def _rows(act: np.ndarray, trans: np.ndarray, loss: int, L: int, us: range, entry: np.ndarray | None = None,
          release: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """kept[u, v] and transient[u, v] for the rows ``us`` (the backward runs layers v-1 down to u).

    ``entry[u]`` is added to the first layer of a stage starting at u > 0, ``release[v-1]``
    taken off the last layer of a stage ending at v < L (floored at 0).
    """
    kept = np.full((L + 1, L + 1), np.inf)
    tr = np.full((L + 1, L + 1), np.inf)
    for v in range(1, L + 1):
        a = act[:v].astype(np.float64).copy()
        if v == L:
            a[-1] += loss
        elif release is not None:
            a[-1] = max(0.0, a[-1] - release[v - 1])
        freed_after = np.concatenate([np.cumsum(a[::-1])[::-1][1:], [0.0]])   # sum of a[l+1:v]
        gain = trans[:v] - freed_after
        best = np.maximum.accumulate(gain[::-1])[::-1]                        # max over l in [u, v)
        suffix = np.cumsum(a[::-1])[::-1]                                       # sum of a[u:v]
        for u in us:
            if u < v:
                kept[u, v] = suffix[u] + (entry[u] if entry is not None and u > 0 else 0.0)
                tr[u, v] = max(0.0, best[u])
    return kept, tr


def _forward_rows(raw: np.ndarray, fwd: np.ndarray, out: np.ndarray, loss: int, L: int, us: range,
                  entry: np.ndarray | None, release: np.ndarray | None) -> np.ndarray:
    """The forward's rise above the kept level, [u, v) for the rows ``us`` (``memory_model._forward_transient``)."""
    ft = np.full((L + 1, L + 1), np.inf)
    for v in range(1, L + 1):
        a = raw[:v].astype(np.float64).copy()
        released = 0.0
        if v == L:
            a[-1] += loss
        elif release is not None:
            released = min(a[-1], release[v - 1])
            a[-1] -= released
        after = np.concatenate([np.cumsum(a[::-1])[::-1][1:], [0.0]])          # sum of a[j+1:v]
        g = fwd[:v] + raw[:v] - a - after
        best_after = np.concatenate([np.maximum.accumulate(g[::-1])[::-1][1:], [-np.inf]])   # max over j > u
        cast = released + out[v - 1] if released > 0 else 0.0
        for u in us:
            if u < v:
                e = entry[u] if entry is not None and u > 0 else 0.0
                ft[u, v] = max(0.0, g[u] - e, best_after[u], cast)
    return ft


def step_memory_tables(e: LayerProfile, *, optimizer_states: int, optimizer_transient_params: float,
                       framework_bytes: int = 0) -> StepMemoryTables:
    """The tables of ``e`` (which must have the step-memory terms).

    Raises
    ------
    ValueError
        ``e`` has no step-memory terms.
    """
    if not e.has_step_memory:
        raise ValueError(f"profile entry {e.key} has no step-memory terms")
    L = e.num_layers
    out = np.asarray(e.output_bytes, dtype=np.float64)
    params = np.concatenate([[0.0], np.cumsum(np.asarray(e.param_bytes, dtype=np.float64))])
    P = params[None, :] - params[:, None]
    P[0, L] -= e.tied_param_bytes or 0
    upper = np.triu(np.ones((L + 1, L + 1), dtype=bool), k=1)
    loss = int(e.loss_activation_bytes or 0)
    act = np.asarray(e.step_activation_bytes, dtype=np.float64)
    trans = np.asarray(e.backward_transient_bytes, dtype=np.float64)
    full_trans = trans + np.maximum(0.0, act - out)
    entry = None if e.stage_entry_bytes is None else np.asarray(e.stage_entry_bytes, dtype=np.float64)
    release = None if e.stage_exit_release_bytes is None else np.asarray(e.stage_exit_release_bytes, dtype=np.float64)
    kept_none, tr_none = _rows(act, trans, loss, L, range(1, L), entry, release)
    kept_full, tr_full = _rows(out, full_trans, loss, L, range(1, L))
    first_act = np.asarray(e.first_stage_step_activation_bytes or e.step_activation_bytes, dtype=np.float64)
    first_trans = np.asarray(e.first_stage_backward_transient_bytes or e.backward_transient_bytes, dtype=np.float64)
    first_release = (release if e.first_stage_step_activation_bytes is None or e.first_stage_exit_release_bytes is None
                     else np.asarray(e.first_stage_exit_release_bytes, dtype=np.float64))
    k0, t0 = _rows(first_act, first_trans, loss, L, range(0, 1), None, first_release)
    kf0, tf0 = _rows(out, first_trans + np.maximum(0.0, first_act - out), loss, L, range(0, 1))
    for table, row in ((kept_none, k0), (tr_none, t0), (kept_full, kf0), (tr_full, tf0)):
        table[0] = row[0]
    if e.forward_transient_bytes is not None:        # the in-flight phase peaks at the larger transient
        fwd = np.asarray(e.forward_transient_bytes, dtype=np.float64)
        ft = _forward_rows(act, fwd, out, loss, L, range(1, L), entry, release)
        first_fwd = (fwd if e.first_stage_step_activation_bytes is None or e.first_stage_forward_transient_bytes is None
                     else np.asarray(e.first_stage_forward_transient_bytes, dtype=np.float64))
        ft[0] = _forward_rows(first_act, first_fwd, out, loss, L, range(0, 1), None, first_release)[0]
        tr_none = np.maximum(tr_none, ft)
    inf = np.inf
    return StepMemoryTables(
        states=np.where(upper, P * (2 + optimizer_states), inf), kept_none=kept_none, kept_full=kept_full,
        transient_none=tr_none, transient_full=tr_full,
        optimizer_step=np.where(upper, np.floor(optimizer_transient_params * P), inf),
        in_buffer=np.concatenate([[0.0], out]), out_buffer=np.concatenate([[0.0], out[:-1], [0.0]]),
        framework=int(framework_bytes))


def step_memory_peak(t: StepMemoryTables, *, in_flight: int, num_micro_batches: int, recompute: bool) -> np.ndarray:
    """(L+1, L+1) peak bytes of every stage [u, v) with ``in_flight`` of ``num_micro_batches`` micro-batches."""
    m, k = max(num_micro_batches, 1), in_flight
    kept, tr = (t.kept_full, t.transient_full) if recompute else (t.kept_none, t.transient_none)
    held = t.in_buffer[:, None] if m > k else 0.0
    buffers = m * (t.in_buffer[:, None] + t.out_buffer[None, :])
    with np.errstate(invalid="ignore"):
        return t.framework + t.states + buffers + np.maximum(k * kept + held + tr, t.optimizer_step)
