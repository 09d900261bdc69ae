"""A cluster file's ``device_types`` entry for a bundled GPU type may give some fields only: the others are the
bundled ones (``{"A100-40": {}}`` was refused for lacking ``memory_bytes`` although the docs
call ``device_types`` optional for bundled types). A type that is not bundled still needs both."""

from __future__ import annotations

import pytest

from hpp.errors import HppInputError
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES, device_type_from_dict


def test_bundled_type_takes_the_fields_left_out_from_the_bundled_values():
    a100 = BUNDLED_DEVICE_TYPES["A100-40"]
    assert device_type_from_dict("A100-40", {}) == a100
    got = device_type_from_dict("A100-40", {"memory_bytes": 20_000_000_000})
    assert (got.memory_bytes, got.gpus_per_node, got.slowdown) == (20_000_000_000, a100.gpus_per_node, 1.0)


def test_control_an_unknown_type_still_needs_its_memory():
    with pytest.raises(HppInputError) as e:
        device_type_from_dict("Foo", {"gpus_per_node": 4}, source="c.json")
    assert str(e.value).startswith("c.json: field 'device_types.Foo.memory_bytes': device type 'Foo' lacks "
                                   "'memory_bytes'. Fix: add it (memory_bytes: bytes per device, gpus_per_node: int; "
                                   "bundled types A100-40, V100-16")
