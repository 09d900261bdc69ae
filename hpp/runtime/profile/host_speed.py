"""This host's CPU speed relative to the host a CPU profile was measured on.

A CPU profile of ``hpp profile`` (:func:`hpp.runtime.profile.profiler.profile_model`) records CPU
seconds of one compute thread on the host and the day it ran. Virtual hosts change speed
between days: the host that measured the bundled ``profile-gpt-tiny.json`` ran a gpt-tiny block 2.4-2.6 x
faster than the same VM two days later (forward 0.89 ms there, 2.36 ms here). A prediction of ``hpp run`` on CPU from the profile as is is then off by
that factor, whatever the host model (:mod:`hpp.runtime.host.time_model`) gets right.

:func:`calibrate_host_speed` measures, on this host and now, the same quantity the profile
recorded for one reference entry: the forward + backward seconds of the middle layer
(``num_layers // 2``, a transformer block) at micro-batch 1, TP 1, on the profile's base
device type (the one measured, not emulated), with the profiler's own
:func:`hpp.runtime.profile.profiler.measure_layer`: the same layer build (``build_layer(l, seed=0)``),
input shape, clock (the compute thread's CPU time, ``time.thread_time``, when the profile
used it), thread count, dtype / autocast, warm-up and repeat counts (``meta["warmup"]``,
``meta["repeats"]``) and statistic (median of the repeats per direction, summed). The
probe measures that ``rounds`` times (3) and takes the median: on gpt-tiny 0.6 s wall on
this project's 2-core VM (Dec 1 2026), plus, in a process that has not trained yet (``hpp
run``'s), 1.5-2 s of torch's first use (AdamW imports ``torch._dynamo``, the first backward),
paid by one untimed iteration first. ``hpp run`` probes before the run and after it and takes the
median of both probes' rounds (:func:`bracket`). The host's factor is

    ``factor = here_s / profile_s``  (> 1: this host is slower than the profile's)

and :func:`hpp.runtime.run_report.predict_run` multiplies every CPU term of the profile by
it (:func:`hpp.runtime.host.time_model.scale_cpu_work`: layers, optimizer, loss, schedule
overheads, the op probe's seconds; not transfers, not contention ratios) before the host
model replays the step. The factor is a property of the host, so it applies once: the
emulation's time scale and slowdowns pad the CPU time the ranks really use, which the
factor already made this host's.

Calibration is skipped (:attr:`HostSpeed.reason` says why) when the run is not on CPU, the
profile is not one of the runtime's own CPU measurements (``meta`` without ``device: cpu``,
``clock``, ``warmup`` and ``repeats``: e.g. GPU profiles from published artifacts), it has no
entry (base type, TP 1, micro-batch 1), or the runtime cannot build the profiled layer (an
unknown model, or a layer whose parameter bytes differ from the profile's).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hpp.errors import HppInputError
from hpp.profiles.model_profile import ModelProfile
from hpp.runtime.models.api import RuntimeModel
from hpp.runtime.profile.profiler import measure_layer
from hpp.runtime.models.zoo import load_runtime_model
from hpp.wording import count

__all__ = ["HostSpeed", "calibrate_host_speed", "bracket", "reference_of", "probe_reference_s", "PROBE_BUDGET_S"]

logger = logging.getLogger(__name__)

#: Wall seconds the probe aims to stay under (all rounds, without building the layer): the
#: profile's warm-up + repeats are cut when the profile's own times say they would not fit.
PROBE_BUDGET_S = 1.5
#: A slower host than the profile's by up to this factor still fits :data:`PROBE_BUDGET_S`.
_SLOWER_HOST_ALLOWANCE = 3.0


@dataclass(frozen=True)
class HostSpeed:
    """This host's speed relative to the profile's host, or why it was not measured.

    Attributes
    ----------
    factor : float or None
        ``here_s / profile_s`` (> 1: this host is slower); None when not calibrated.
    reason : str or None
        Why there is no factor (None when there is one).
    reference : str
        The quantity compared, e.g. ``"gpt-tiny layer 3 (cpu, tp 1, mb 1) forward+backward, CPU time"``.
    profile_s : float or None
        That quantity in the profile [s] (median of its repeats, forward + backward).
    here_s : float or None
        The same measured on this host now [s] (median over ``samples_s``).
    samples_s : tuple of float
        Each round's forward + backward [s].
    probe_wall_s : float
        Wall seconds the probe took (building the layer included).
    """

    factor: float | None
    reason: str | None = None
    reference: str = ""
    profile_s: float | None = None
    here_s: float | None = None
    samples_s: tuple[float, ...] = ()
    probe_wall_s: float = 0.0

    @classmethod
    def skipped(cls, reason: str, reference: str = "", profile_s: float | None = None) -> "HostSpeed":
        """No factor, with the reason."""
        return cls(None, reason=reason, reference=reference, profile_s=profile_s)

    def to_dict(self) -> dict[str, Any]:
        """The report's ``predicted.host_speed``."""
        d = asdict(self)
        d["samples_s"] = list(self.samples_s)
        return d


def _measured_base_type(profile: ModelProfile) -> str:
    """The profile's one measured (not emulated) device type; raises ValueError with a reason otherwise."""
    emulated = set(profile.meta.get("emulated", {}))
    measured = sorted({e.device_type for e in profile.entries.values()} - emulated)
    if len(measured) != 1:
        raise ValueError(f"the profile has {len(measured)} measured device types {measured}, not one")
    return measured[0]


def reference_of(profile: ModelProfile) -> tuple[str, int, float]:
    """``(base device type, layer index, profile seconds)`` of the reference entry.

    Raises
    ------
    ValueError
        The profile is not a runtime CPU measurement or has no reference entry; the message is the reason.
    """
    meta = profile.meta
    if meta.get("device") != "cpu" or not all(k in meta for k in ("clock", "warmup", "repeats")):
        raise ValueError("the profile is not one of hpp profile's CPU measurements (no meta device 'cpu', "
                         "clock, warmup, repeats)")
    base = _measured_base_type(profile)
    key = (base, 1, 1)
    if key not in profile.entries:
        raise ValueError(f"the profile has no entry ({base}, tp 1, micro-batch 1) to compare with")
    layer = profile.num_layers // 2
    e = profile.entries[key]
    ref = e.forward_s[layer] + e.backward_s[layer]
    if not ref > 0:
        raise ValueError(f"the profile's layer {layer} ({base}, tp 1, micro-batch 1) has no time")
    return base, layer, ref


def _dtype_of(meta: dict[str, Any]) -> tuple[torch.dtype, bool]:
    """``(layer dtype, autocast bf16)`` as the profile was measured (``meta["dtype"]``)."""
    name = str(meta.get("dtype", "float32"))
    if name.startswith("bfloat16 autocast"):
        return torch.float32, True
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"the profile's dtype {name!r} is not one the probe builds")
    return dt, False


def probe_reference_s(rmodel: RuntimeModel, layer: int, *, warmup: int, repeats: int, cpu_time: bool,
                      dtype: torch.dtype, mixed_precision: bool, rounds: int, budget_s: float,
                      param_bytes: int | None = None) -> list[float]:
    """Forward + backward seconds of ``rmodel``'s layer ``layer`` at micro-batch 1 on this CPU, per round.

    Each round is one :func:`hpp.runtime.profile.profiler.measure_layer` call (``warmup`` untimed,
    ``repeats`` timed iterations; median forward + median backward), on the layer and input
    :func:`hpp.runtime.profile.profiler.profile_model` builds (seed 0), after one untimed iteration (the
    process's first-use costs). Rounds stop early once ``budget_s`` wall seconds have passed
    (at least one round).

    Raises
    ------
    ValueError
        The built layer's parameter bytes differ from ``param_bytes`` (not the profiled layer).
    """
    spec = rmodel.spec
    gen = torch.Generator().manual_seed(0)
    dev = torch.device("cpu")
    mod = rmodel.build_layer(layer, seed=0, dtype=dtype).to(dev)

    def make_input() -> torch.Tensor:
        if layer == 0:
            return torch.randint(0, spec.vocab_size, (1, spec.seq_len), generator=gen)
        return torch.randn(1, spec.seq_len, spec.hidden_size, generator=gen, dtype=dtype).requires_grad_(True)

    # one untimed iteration first: in a fresh process the first AdamW imports torch._dynamo and the first
    # backward starts autograd (1.5-2.2 s on a 2-core VM, once per process); the profiler had paid both by
    # its middle layer
    measure_layer(mod, make_input, device=dev, warmup=0, repeats=1, cpu_time=cpu_time,
                  mixed_precision=mixed_precision)
    out: list[float] = []
    t0 = time.perf_counter()
    for _ in range(rounds):
        r = measure_layer(mod, make_input, device=dev, warmup=warmup, repeats=repeats, cpu_time=cpu_time,
                          mixed_precision=mixed_precision)
        if param_bytes is not None and int(r["param_bytes"]) != param_bytes:
            raise ValueError(f"the runtime's layer {layer} has {int(r['param_bytes'])} parameter bytes, the "
                             f"profile's {param_bytes}: not the profiled layer")
        out.append(statistics.median(r["forward_s"]) + statistics.median(r["backward_s"]))
        if time.perf_counter() - t0 > budget_s:
            break
    return out


def _counts(profile: ModelProfile, base: str, layer: int, rounds: int, budget_s: float) -> tuple[int, int]:
    """The profile's warm-up and repeats, cut so that ``rounds`` rounds fit ``budget_s`` on a host up to
    :data:`_SLOWER_HOST_ALLOWANCE` x slower than the profile's (at least 1 warm-up and 3 repeats)."""
    warmup, repeats = int(profile.meta["warmup"]), int(profile.meta["repeats"])
    e = profile.entries[(base, 1, 1)]
    per_iter = e.forward_s[layer] + e.backward_s[layer] + e.optimizer_s[layer]
    fit = int(budget_s / (rounds * _SLOWER_HOST_ALLOWANCE * per_iter)) if per_iter > 0 else warmup + repeats
    if warmup + repeats <= fit:
        return warmup, repeats
    w = max(1, min(warmup, fit // 4))
    return w, max(3, fit - w)


def calibrate_host_speed(profile: ModelProfile | None, *, device: str = "cpu", model: RuntimeModel | None = None,
                         rounds: int = 3, budget_s: float = PROBE_BUDGET_S) -> HostSpeed:
    """This host's speed factor for ``profile`` (see the module docstring), or a :class:`HostSpeed` saying why not.

    Parameters
    ----------
    profile : ModelProfile or None
    device : str
        The run's device; only ``"cpu"`` is calibrated.
    model : RuntimeModel, optional
        The run's runtime model (default: loaded from ``meta["runtime_model"]`` or the profile's model name).
    rounds : int
        Measurements of the reference (median taken), >= 1.
    budget_s : float
        Wall seconds the probe aims to stay under.
    """
    if device != "cpu":
        return HostSpeed.skipped(f"the run is on {device}, not cpu: the profile's times are used as measured")
    if profile is None:
        return HostSpeed.skipped("the plan names no profile")
    try:
        base, layer, ref = reference_of(profile)
        dtype, mixed = _dtype_of(profile.meta)
    except ValueError as exc:
        return HostSpeed.skipped(str(exc))
    threads = int(profile.meta.get("num_threads", 1))
    cpu_time = str(profile.meta["clock"]).startswith("thread_time")
    warmup, repeats = _counts(profile, base, layer, max(1, rounds), budget_s)
    reference = (f"{profile.model} layer {layer} ({base}, tp 1, mb 1) forward+backward, "
                 f"{'CPU time of the compute thread' if cpu_time else 'wall time'}, {count(threads, 'thread')}, "
                 f"median of {repeats} after {warmup} warm-up")
    if (warmup, repeats) != (int(profile.meta["warmup"]), int(profile.meta["repeats"])):
        reference += f" (the profile's {profile.meta['warmup']} + {profile.meta['repeats']} cut to fit the probe)"
    t0 = time.perf_counter()
    try:
        rmodel = model if model is not None else load_runtime_model(
            str(profile.meta.get("runtime_model") or profile.model))
    except HppInputError as exc:
        return HostSpeed.skipped(f"the runtime cannot build {profile.model}: {exc}", reference, ref)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        samples = probe_reference_s(rmodel, layer, warmup=warmup, repeats=repeats, cpu_time=cpu_time, dtype=dtype,
                                    mixed_precision=mixed, rounds=max(1, rounds), budget_s=budget_s,
                                    param_bytes=profile.entries[(base, 1, 1)].param_bytes[layer])
    except ValueError as exc:
        return HostSpeed.skipped(str(exc), reference, ref)
    finally:
        torch.set_num_threads(old)
    here = statistics.median(samples)
    wall = time.perf_counter() - t0
    logger.info("host speed: %s %.3f ms here vs %.3f ms in the profile (x %.2f, probe %.2f s)", reference,
                1e3 * here, 1e3 * ref, here / ref, wall)
    return HostSpeed(here / ref, reference=reference, profile_s=ref, here_s=here, samples_s=tuple(samples),
                     probe_wall_s=wall)


def bracket(before: HostSpeed, after: HostSpeed) -> HostSpeed:
    """One factor from a probe before the run and one after it: the median of both probes' rounds.

    A virtual host's speed moves within minutes (Dec 2 2026, this project's VM: the probe after a
    run gave x 1.89-2.71 for six runs within 25 minutes, and the ranks' own CPU seconds said the host
    had run 0.70-1.06 x that during the steps), so probing on both sides of the run brackets the
    speed the run had. If only one of the two has a factor, that one is returned.
    """
    if before.factor is None:
        return after
    if after.factor is None:
        return before
    samples = before.samples_s + after.samples_s
    here = statistics.median(samples)
    return HostSpeed(here / after.profile_s, reference=f"{after.reference}; {len(before.samples_s)} rounds before "
                     f"the run, {len(after.samples_s)} after", profile_s=after.profile_s, here_s=here,
                     samples_s=samples, probe_wall_s=before.probe_wall_s + after.probe_wall_s)
