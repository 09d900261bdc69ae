"""Bundled model profiles: OPT-350, GPT-Neo-2.7 and LLAMA-3-8 converted from the Sailor artifact
(see ``hpp/profiles/data/NOTICE``), and the CPU profiles hpp measured itself (provenance in each
file): ``gpt-tiny`` (``hpp profile``), and ``opt-tiny``, ``gpt-neo-tiny``, ``llama-tiny``
(``experiments/profile_tiny_models.py``: device types ``cpu`` and ``cpu-2x``, TP 1 measured and
TP 2 derived). A profile's model name is the runtime model's name (:mod:`hpp.runtime.models.zoo`).

Each ``data/profile-<MODEL>.json`` is a native hpp profile (:mod:`hpp.profiles.model_profile`)
written by ``experiments/convert_public_profiles.py`` from eth-easl/sailor commit cf2c8e3
(MIT licence, Copyright ETH Zurich); its ``source`` field gives the files and the rules.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from hpp.errors import HppInputError
from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.profile_format import profile_from_dict

__all__ = ["bundled_models", "load_bundled_profile", "bundled_profile_filename"]

_PREFIX, _SUFFIX = "profile-", ".json"


def bundled_profile_filename(model: str) -> str:
    """File name of ``model``'s bundled profile inside ``hpp/profiles/data``."""
    return f"{_PREFIX}{model}{_SUFFIX}"


def bundled_models() -> tuple[str, ...]:
    """Names of the models with a bundled profile, sorted (e.g. ``"OPT-350"``).

    >>> "OPT-350" in bundled_models()
    True
    """
    data = resources.files("hpp.profiles").joinpath("data")
    names = (p.name for p in data.iterdir())
    return tuple(sorted(n[len(_PREFIX):-len(_SUFFIX)] for n in names
                        if n.startswith(_PREFIX) and n.endswith(_SUFFIX)))


@functools.lru_cache(maxsize=8)
def load_bundled_profile(model: str) -> ModelProfile:
    """The bundled profile of ``model`` (parsed once per process; the result is frozen).

    >>> load_bundled_profile("OPT-350").num_layers
    26
    >>> load_bundled_profile("opt-350").model            # names are matched case-insensitively
    'OPT-350'

    Raises
    ------
    HppInputError
        ``model`` has no bundled profile (the message lists the available ones).
    """
    available = bundled_models()
    if model not in available:              # the runtime's names (opt-350, llama-3-8, ...) differ in case only
        model = {m.lower(): m for m in available}.get(model.strip().lower(), model)
    if model not in available:
        raise HppInputError(f"no bundled profile for model {model!r}", field="model",
                            fix=f"use one of {list(available)}, or give a profile file (hpp plan --profile FILE; "
                                f"hpp profile writes one)")
    res = resources.files("hpp.profiles").joinpath("data").joinpath(bundled_profile_filename(model))
    source = f"hpp/profiles/data/{bundled_profile_filename(model)}"
    return profile_from_dict(json.loads(res.read_text()), source=source)
