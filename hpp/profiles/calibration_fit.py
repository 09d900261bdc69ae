"""The fits of a calibration: per-layer times of one profile entry from measured stage times, a link's bandwidth
from measured all-reduce times (pure functions, no I/O; used by :mod:`hpp.runtime.calibrate`).

**Layer times.** A stage of the run is a known set of layers ``[lo, hi)`` of one entry (device type, TP
degree, micro-batch size); per micro-batch its forward + backward is ``sum_l A[s, l] a_l`` where
``A[s, l] = (1 + r_s) F_l + B_l`` (``r_s = 1`` when the stage recomputes its forward, else 0) for the profile's
``F_l``, ``B_l`` of the layers it holds, 0 for the others, and ``a_l`` is the correction of layer ``l``
(new / old). Over the stages of one entry:

- **least squares** (``method = "least-squares"``) when the columns of ``A`` of the layers the stages hold
  are linearly independent (different pipelines cut the layers at different places, so that each layer's
  time is determined): ``min ||A a - y||`` with ``a >= 1e-3`` (:func:`scipy.optimize.lsq_linear`); a
  layer no stage held gets the entry's overall factor ``sum y / sum A 1``;
- **one factor** (``method = "scale"``), ``k = sum_s y_s / sum_s (A 1)_s``, for every layer, otherwise:
  one pipeline's stages hold disjoint layer sets, and any split of a stage's time between its layers
  fits it equally well, so the data say nothing about the split and the profile's own proportions are kept.

The factors are fitted to the median over the steps of each stage's time; the same fit on every step
alone gives the spread ``(max - min) / median`` of the entry's total (forward + backward over its layers).

**A link.** The cost model's all-reduce time is ``T(g) = T_lat + T_bw / g`` when every bandwidth of
the links it crosses is ``g`` x the old one (ring and hierarchical all-reduce, :mod:`hpp.formulation.collectives`:
a latency term per message, a bytes / bandwidth term), so from ``T(1)`` and ``T(inf)`` (the latency
alone) a measured ``t`` gives ``g = T_bw / (t - T_lat)``: bandwidth = bytes / time. The time has a
floor, ``T_bw / MAX_LINK_FACTOR``, so that a measured time at or below the latency does not make the
bandwidth unbounded.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import lsq_linear

__all__ = ["LayerFit", "LinkFitResult", "fit_layers", "fit_link", "spread", "stage_layer_work_s", "MAX_LINK_FACTOR",
           "MIN_LAYER_FACTOR"]

#: the largest bandwidth factor a measured all-reduce time can give (its time floor, module docstring)
MAX_LINK_FACTOR = 10.0
#: the least-squares fit's lower bound of a layer's factor (a layer never costs nothing)
MIN_LAYER_FACTOR = 1e-3


def spread(values: Sequence[float]) -> float:
    """``(max - min) / median`` of ``values`` (0 for fewer than 2 values or a median of 0).

    >>> spread([1.0, 1.5, 0.5])
    1.0
    """
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return float((max(values) - min(values)) / med) if med > 0 else 0.0


@dataclass(frozen=True)
class LayerFit:
    """Per-layer corrections of one entry.

    Attributes
    ----------
    factors : (num_layers,) new / old of each layer's forward and backward time.
    method : ``"least-squares"`` or ``"scale"`` (module docstring).
    total_factor : float
        new / old of the entry's forward + backward summed over its layers.
    spread : float
        ``(max - min) / median`` of ``total_factor`` fitted step by step.
    steps : int
        Steps behind the fit.
    """

    factors: tuple[float, ...]
    method: str
    total_factor: float
    spread: float
    steps: int


def stage_layer_work_s(forward_s: Sequence[float], backward_s: Sequence[float], lo: int, hi: int,
                       recompute: bool) -> float:
    """A stage's row of ``A`` summed: ``sum_{l in [lo, hi)} (1 + r) F_l + B_l`` [s per micro-batch] (module docstring).

    >>> stage_layer_work_s((1.0, 2.0, 3.0), (2.0, 4.0, 6.0), 1, 3, recompute=True)     # (2 x 2 + 4) + (2 x 3 + 6)
    20.0
    """
    return float(sum((2.0 if recompute else 1.0) * f + b for f, b in zip(forward_s[lo:hi], backward_s[lo:hi])))


def _design(forward_s: Sequence[float], backward_s: Sequence[float],
            stages: Sequence[tuple[int, int, bool]]) -> np.ndarray:
    """``A`` (num_stages, num_layers) of the module docstring."""
    f, b = np.asarray(forward_s, float), np.asarray(backward_s, float)
    a = np.zeros((len(stages), len(f)))
    for s, (lo, hi, recompute) in enumerate(stages):
        a[s, lo:hi] = (2.0 if recompute else 1.0) * f[lo:hi] + b[lo:hi]      # a row of stage_layer_work_s
    return a


def _solve(a: np.ndarray, y: np.ndarray, *, separable: bool, held: np.ndarray) -> np.ndarray:
    k = float(y.sum() / a.sum())
    if not separable:
        return np.full(a.shape[1], k)
    out = np.full(a.shape[1], k)
    out[held] = lsq_linear(a[:, held], y, bounds=(MIN_LAYER_FACTOR, np.inf)).x
    return out


def fit_layers(forward_s: Sequence[float], backward_s: Sequence[float], stages: Sequence[tuple[int, int, bool]],
               measured_s: Sequence[Sequence[float]], *, force_scale: bool = False) -> LayerFit:
    """Fit the per-layer corrections of one entry from its stages' measured times (module docstring).

    Parameters
    ----------
    forward_s, backward_s : (num_layers,) the entry's per-layer times [s] per micro-batch.
    stages : per stage ``(layer_start, layer_stop, recomputes)``, layers ``[layer_start, layer_stop)``.
    measured_s : (steps, num_stages) each stage's forward + backward per micro-batch [s], step by step.
    force_scale : one factor for every layer even when the stages separate the layers (an emulated
        device type: its times are its base type's x one slowdown by construction).

    Raises
    ------
    ValueError
        No stage, no step, a step without one time per stage, an empty or out-of-range layer range, or a
        time that is not finite and > 0.

    Examples
    --------
    Layers of 1, 2, 3 ms (forward = backward / 2) whose real times are 2, 2, 6 ms; two pipelines cut them
    differently, so least squares recovers each layer:

    >>> f, b = [0.5e-3, 1e-3, 1.5e-3], [0.5e-3, 1e-3, 1.5e-3]
    >>> fit = fit_layers(f, b, [(0, 1, False), (1, 3, False), (0, 2, False), (2, 3, False)],
    ...                  [[2e-3, 8e-3, 4e-3, 6e-3]])
    >>> fit.method, [round(x, 6) for x in fit.factors]
    ('least-squares', [2.0, 1.0, 2.0])
    """
    if not stages or not measured_s:
        raise ValueError(f"{len(stages)} stages and {len(measured_s)} steps: nothing to fit")
    n = len(forward_s)
    for lo, hi, _r in stages:
        if not 0 <= lo < hi <= n:
            raise ValueError(f"layer range [{lo}, {hi}) of a {n}-layer entry")
    y_steps = np.asarray(measured_s, float)
    if y_steps.ndim != 2 or y_steps.shape[1] != len(stages):
        raise ValueError(f"measured_s has shape {y_steps.shape}, expected (steps, {len(stages)})")
    if not (np.isfinite(y_steps).all() and (y_steps > 0).all()):
        raise ValueError("every measured time must be finite and > 0")
    a = _design(forward_s, backward_s, stages)
    held = a.any(axis=0)
    separable = not force_scale and np.linalg.matrix_rank(a[:, held]) == int(held.sum())
    c = _design(forward_s, backward_s, [(0, n, False)])[0]          # each layer's old forward + backward
    factors = _solve(a, np.median(y_steps, axis=0), separable=separable, held=held)
    per_step = [float(_solve(a, y, separable=separable, held=held) @ c / c.sum()) for y in y_steps]
    return LayerFit(tuple(float(x) for x in factors), "least-squares" if separable else "scale",
                    float(factors @ c / c.sum()), spread(per_step), len(y_steps))


@dataclass(frozen=True)
class LinkFitResult:
    """``factor``: new / old bandwidth (median over the steps); ``spread``: ``(max - min) / median`` of the per-step
    factors; ``steps``; ``floored``: the floor of the module docstring bounded at least one step's factor."""

    factor: float
    spread: float
    steps: int
    floored: bool


def fit_link(measured_s: Sequence[float], predict_s: Callable[[float], float]) -> LinkFitResult | None:
    """The bandwidth factor ``g`` of the links an all-reduce crosses from its measured times (module docstring).

    Parameters
    ----------
    measured_s : (steps,) the measured all-reduce time of each step [s].
    predict_s : the cost model's all-reduce time [s] with every bandwidth of those links x ``g``.

    Returns
    -------
    LinkFitResult, or None when the predicted time has no bandwidth term, or the median measured time is not
    above the latency term (the all-reduces were hidden, e.g. launched during the backward pass and done
    by the time the schedule ended: the run did not measure the links).

    Raises
    ------
    ValueError
        No step, or a measured time that is not finite and >= 0.

    Examples
    --------
    A ring all-reduce over 2 ranks of 1e6 bytes, 10 us latency per message: 1 ms at 1e9 bytes/s (+ 20 us);
    measured 0.52 ms, so the link is 2x faster:

    >>> fit = fit_link([0.52e-3, 0.52e-3], lambda g: 2e-5 + 1e-3 / g)
    >>> round(fit.factor, 6), fit.steps, fit.floored
    (2.0, 2, False)
    """
    t = np.asarray(measured_s, float)
    if t.size == 0 or not (np.isfinite(t).all() and (t >= 0).all()):
        raise ValueError(f"measured all-reduce times {list(measured_s)}: need one finite time >= 0 per step")
    t_lat = predict_s(1e12)
    t_bw = predict_s(1.0) - t_lat
    if not t_bw > 0 or not float(np.median(t)) > t_lat:
        return None
    floor = t_bw / MAX_LINK_FACTOR
    per_step = [t_bw / max(x - t_lat, floor) for x in t]
    g = t_bw / max(float(np.median(t)) - t_lat, floor)
    return LinkFitResult(float(g), spread(per_step), len(per_step), any(x - t_lat < floor for x in t))
