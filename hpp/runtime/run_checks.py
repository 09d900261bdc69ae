"""Checks of ``hpp run`` before any rank starts that need the cost model or the host's state: memory for the
ranks of a CPU run, and an output PNG's folder (split from :mod:`hpp.runtime.run_setup`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hpp.errors import HppInputError
from hpp.fileio import folder_writable
from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.runtime.exec.layout import rank_roles
from hpp.validate import check_fits_memory

__all__ = ["mem_available_bytes", "check_host_memory", "check_device_memory", "check_png_path"]


def mem_available_bytes() -> float | None:
    """MemAvailable of ``/proc/meminfo`` [bytes] (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        return None
    return None


def check_host_memory(plan: Plan, cluster: Cluster, profile: ModelProfile | None, ranks: Sequence[int], *, device: str,
                      available_bytes: float | None = None) -> None:
    """Refuse a CPU run whose ranks cannot fit this host's memory, before any rank starts: the cost model's
    predicted peak of each rank's stage (:func:`~hpp.formulation.cost_model.estimate_plan`), summed over this
    host's ``ranks``, against ``available_bytes`` (default: MemAvailable). Without it a GPU plan of a real model
    runs on a CPU host until the OS kills a rank (OPT-350 on 16 ranks: 148 s).

    Raises
    ------
    HppInputError
        The ranks need more memory than the host has available.
    """
    avail = available_bytes if available_bytes is not None else mem_available_bytes()
    if device != "cpu" or not avail or profile is None:      # no profile (a user's model): nothing to predict with
        return
    try:
        est = estimate_plan(plan, cluster, profile)
    except HppInputError:                                     # a profile without this plan's entries: not checked
        return
    roles = rank_roles(plan)
    need = sum(est.pipelines[roles[r].pipeline].stages[roles[r].stage_index].memory_bytes for r in ranks)
    if need > avail:
        types = ", ".join(sorted({roles[r].device_type for r in ranks}))
        raise HppInputError(f"this host's {len(ranks)} ranks need about {need / 2**30:.1f} GiB of memory (the plan's "
                            f"predicted peaks on {types}) but the host has {avail / 2**30:.1f} GiB available",
                            field="pipelines", fix="plan a model and cluster this host can hold (e.g. hpp plan "
                            "--scenario cpu-hetero-4), or run the plan on its GPUs (--device cuda)")


def check_device_memory(plan: Plan, cluster: Cluster, profile: ModelProfile | None, *, source: str,
                        allow: bool = False) -> str | None:
    """Refuse a run of a plan that the cost model predicts not to fit its devices' memory (the plan's device types'
    capacities, as ``hpp estimate`` checks them: :func:`hpp.validate.check_fits_memory`), unless ``allow``
    (``--allow-over-memory``).

    Returns
    -------
    str or None
        The note to print when ``allow`` lets an over-full plan run; None when it fits or cannot be predicted (no
        profile, or a profile without the plan's entries).

    Raises
    ------
    HppInputError
        Some stage does not fit and ``allow`` is False (names the stage, its devices and the shortfall).
    """
    if profile is None:
        return None
    try:
        est = estimate_plan(plan, cluster, profile)
    except HppInputError:                                     # a profile without this plan's entries: not checked
        return None
    return check_fits_memory(est, plan, source=source, allow=allow)


def check_png_path(path: str | Path | None, *, flag: str = "--timeline") -> Path | None:
    """``--timeline PNG``: check, before the run, that its folder exists and can be written (HppInputError)."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir() or not folder_writable(p):
        raise HppInputError(f"{flag} {str(path)!r} cannot be written (no such folder, or not writable)",
                            field=flag.lstrip("-"), fix="give a file path in an existing, writable folder")
    return p
