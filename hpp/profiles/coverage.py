"""What a model profile covers: its GPU types, and per type the TP degrees and micro-batch sizes it has entries
for, its dtype and sequence length (``hpp profiles`` lists it for every bundled profile).

A plan can only use what its profile covers (other micro-batch sizes of a covered (type, TP) pair are
estimated, :func:`hpp.profiles.model_profile.estimate_micro_batch`); so before planning a cluster of, say,
A100-80s for LLAMA-3-8, this says that the bundled profile has none (nor a V100-32 entry: that type is in no
bundled profile). The bundled GPU profiles are converted
from the Sailor artifact (:mod:`hpp.profiles.bundled`): a GPU type of the bundled catalogue
(:data:`~hpp.profiles.devices.BUNDLED_DEVICE_TYPES`) without entries in them is one that the artifact has no
measurement of for that model (checked against the public files in ``tests/test_profile_coverage.py``);
nothing is made up to fill the gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
from hpp.profiles.model_profile import ModelProfile

__all__ = ["TypeCoverage", "ProfileCoverage", "profile_coverage", "coverage_to_dict", "coverage_lines"]

#: What the listing says of a profile that does not record its dtype (the Sailor artifact's: its
#: ``llm_info.json`` counts 4 bytes per element, but the times do not say in which dtype they were measured).
DTYPE_NOT_RECORDED = "not recorded by its source"


@dataclass(frozen=True, slots=True)
class TypeCoverage:
    """One device type of a profile: ``micro_batch_sizes[i]`` are the measured sizes at ``tp_degrees[i]``."""

    device_type: str
    tp_degrees: tuple[int, ...]
    micro_batch_sizes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.tp_degrees) != len(self.micro_batch_sizes):
            raise ValueError(f"{len(self.tp_degrees)} TP degrees but {len(self.micro_batch_sizes)} size lists")


@dataclass(frozen=True, slots=True)
class ProfileCoverage:
    """What one profile covers.

    Attributes
    ----------
    model : str
    num_layers : int
    sequence_length : int
        Tokens per sample.
    dtype : str
        The profile's ``meta["dtype"]``, or :data:`DTYPE_NOT_RECORDED`.
    origin : str
        Where its figures come from (the start of its ``source``).
    types : tuple of TypeCoverage
        Its device types, sorted by name.
    catalogue_types_missing : tuple of str
        Bundled GPU types (:data:`~hpp.profiles.devices.BUNDLED_DEVICE_TYPES`) without entries; empty for a
        profile of emulated CPU devices only (GPU types are not its business).
    skipped : tuple of str
        Entries its converter left out, with the reason (``meta["skipped_entries"]``).
    """

    model: str
    num_layers: int
    sequence_length: int
    dtype: str
    origin: str
    types: tuple[TypeCoverage, ...]
    catalogue_types_missing: tuple[str, ...]
    skipped: tuple[str, ...]


def _origin(profile: ModelProfile) -> str:
    """The first clause of the profile's ``source`` (up to its first ':' or '('), or ``unknown``."""
    text = profile.source.strip()
    cut = min((i for i in (text.find(":"), text.find(" (")) if i > 0), default=len(text))
    return text[:cut].strip() or "unknown"


def profile_coverage(profile: ModelProfile) -> ProfileCoverage:
    """The coverage of ``profile`` (see :class:`ProfileCoverage`).

    Examples
    --------
    >>> from hpp.profiles.bundled import load_bundled_profile
    >>> c = profile_coverage(load_bundled_profile("LLAMA-3-8"))
    >>> [(t.device_type, t.tp_degrees) for t in c.types]
    [('A100-40', (2, 4)), ('GH-96', (1, 2, 4)), ('V100-16', (4,))]
    >>> "A100-80" in c.catalogue_types_missing, c.dtype
    (True, 'not recorded by its source')
    """
    types = tuple(TypeCoverage(t, profile.tp_degrees(t),
                               tuple(profile.micro_batch_sizes(t, tp) for tp in profile.tp_degrees(t)))
                  for t in profile.device_types)
    gpu = any(t in BUNDLED_DEVICE_TYPES for t in profile.device_types)
    missing = tuple(sorted(set(BUNDLED_DEVICE_TYPES) - set(profile.device_types))) if gpu else ()
    return ProfileCoverage(model=profile.model, num_layers=profile.num_layers,
                           sequence_length=profile.sequence_length,
                           dtype=str(profile.meta.get("dtype") or DTYPE_NOT_RECORDED), origin=_origin(profile),
                           types=types, catalogue_types_missing=missing,
                           skipped=tuple(str(s) for s in profile.meta.get("skipped_entries") or ()))


def coverage_to_dict(c: ProfileCoverage) -> dict[str, Any]:
    """The JSON form of ``hpp profiles --json`` (one object per profile)."""
    return {"model": c.model, "num_layers": c.num_layers, "sequence_length": c.sequence_length, "dtype": c.dtype,
            "origin": c.origin,
            "device_types": {t.device_type: {"tp_degrees": list(t.tp_degrees),
                                             "micro_batch_sizes": {str(tp): list(mbs) for tp, mbs
                                                                   in zip(t.tp_degrees, t.micro_batch_sizes)}}
                             for t in c.types},
            "catalogue_types_missing": list(c.catalogue_types_missing), "skipped_entries": list(c.skipped)}


def coverage_lines(c: ProfileCoverage) -> list[str]:
    """The human listing of one profile: a header line, one line per device type, then what it lacks.

    Examples
    --------
    >>> c = ProfileCoverage("m", 3, 128, "float32", "measured", (TypeCoverage("cpu", (1, 2), ((1, 2), (1,))),),
    ...                     (), ())
    >>> print("\\n".join(coverage_lines(c)))
    m: 3 layers, sequence length 128, dtype float32; measured
      cpu          TP 1: micro-batch 1,2   TP 2: micro-batch 1
    """
    out = [f"{c.model}: {c.num_layers} layers, sequence length {c.sequence_length}, dtype {c.dtype}; {c.origin}"]
    for t in c.types:
        per_tp = "   ".join(f"TP {tp}: micro-batch {','.join(map(str, mbs))}"
                            for tp, mbs in zip(t.tp_degrees, t.micro_batch_sizes))
        out.append(f"  {t.device_type:<12} {per_tp}")
    for s in c.skipped:
        out.append(f"  left out: {s}")
    if c.catalogue_types_missing:
        out.append(f"  no entries for {', '.join(c.catalogue_types_missing)}: the source has no measurement of "
                   f"{c.model} on them")
    return out
