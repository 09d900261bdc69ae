"""Device types: a GPU model (or an emulated CPU "device") with its memory capacity.

The bundled table comes from Sailor's ``cluster-basic.json`` (MIT licence, ETH
Zurich; see ``hpp/profiles/data/NOTICE``): GPUs per node and memory per GPU in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from hpp.errors import HppInputError

__all__ = ["DeviceType", "BUNDLED_DEVICE_TYPES", "device_type_from_dict", "device_type_to_dict"]


@dataclass(frozen=True, slots=True)
class DeviceType:
    """A device model.

    Attributes
    ----------
    name : str
        E.g. ``"A100-40"``; the key used in profiles and clusters.
    memory_bytes : int
        Memory capacity of one device [bytes]; > 0.
    gpus_per_node : int
        Devices per node of this type in the usual configuration; > 0.
    slowdown : float
        Emulated devices only (CPU runs): each stage's compute is padded to
        ``slowdown`` x its measured time. 1.0 for real devices.
    """

    name: str
    memory_bytes: int
    gpus_per_node: int
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise HppInputError("device type has an empty name", field="name",
                                fix="give each device type a name such as 'A100-40'")
        if self.memory_bytes <= 0:
            raise HppInputError(f"device type {self.name!r} has memory_bytes={self.memory_bytes}",
                                field=f"device_types.{self.name}.memory_bytes",
                                fix="give the memory capacity in bytes, > 0")
        if self.gpus_per_node <= 0:
            raise HppInputError(f"device type {self.name!r} has gpus_per_node={self.gpus_per_node}",
                                field=f"device_types.{self.name}.gpus_per_node",
                                fix="give a positive number of devices per node")
        if not self.slowdown >= 1.0:
            raise HppInputError(f"device type {self.name!r} has slowdown={self.slowdown}",
                                field=f"device_types.{self.name}.slowdown",
                                fix="use a slowdown factor >= 1.0 (1.0 = full speed)")


#: Sailor's cluster-basic.json (bytes). Source: eth-easl/sailor cf2c8e3, MIT licence.
BUNDLED_DEVICE_TYPES: Mapping[str, DeviceType] = {
    d.name: d
    for d in (
        DeviceType("A100-40", 42_338_615_296, 4),
        DeviceType("V100-16", 17_179_869_184, 4),
        DeviceType("A100-80", 85_899_345_920, 4),
        DeviceType("GH-96", 102_625_181_696, 4),
        DeviceType("Titan-RTX", 25_769_803_776, 8),
        DeviceType("RTX-2080", 11_811_160_064, 8),
        DeviceType("RTX-3090", 25_769_803_776, 8),
    )
}


def device_type_from_dict(name: str, d: Mapping[str, Any], *, source: str = "<dict>") -> DeviceType:
    """Build a :class:`DeviceType` from its JSON object ``{"memory_bytes", "gpus_per_node", "slowdown"?}``.

    A bundled type (:data:`BUNDLED_DEVICE_TYPES`) takes the fields the object leaves out from the bundled
    values (``{"A100-40": {"memory_bytes": 4e10}}`` overrides the memory only).

    Raises
    ------
    HppInputError
        A field is missing (of a type that is not bundled) or has the wrong type or value.
    """
    bundled = BUNDLED_DEVICE_TYPES.get(name)
    if bundled is not None:
        d = {**device_type_to_dict(bundled), **d}
    try:
        return DeviceType(name=name, memory_bytes=int(d["memory_bytes"]),
                          gpus_per_node=int(d["gpus_per_node"]), slowdown=float(d.get("slowdown", 1.0)))
    except KeyError as exc:
        raise HppInputError(f"device type {name!r} lacks {exc.args[0]!r}", source=source,
                            field=f"device_types.{name}.{exc.args[0]}",
                            fix="add it (memory_bytes: bytes per device, gpus_per_node: int; bundled types "
                                f"{', '.join(BUNDLED_DEVICE_TYPES)} have both)") from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, HppInputError):
            raise exc.with_source(source) from None
        raise HppInputError(f"device type {name!r} has a non-numeric field ({exc})", source=source,
                            field=f"device_types.{name}", fix="use numbers") from None


def device_type_to_dict(d: DeviceType) -> dict[str, Any]:
    """JSON object of a device type (inverse of :func:`device_type_from_dict`)."""
    out: dict[str, Any] = {"memory_bytes": d.memory_bytes, "gpus_per_node": d.gpus_per_node}
    if d.slowdown != 1.0:
        out["slowdown"] = d.slowdown
    return out
