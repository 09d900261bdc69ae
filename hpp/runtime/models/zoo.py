"""The runtime's model zoo: a name or ``MODULE:FUNCTION`` -> a runtime model.

Bundled names (case-insensitive; the profiles' names ``OPT-350``, ``GPT-Neo-2.7`` and
``LLAMA-3-8`` are the same models):

- ``opt-350``, ``gpt-neo-2.7``, ``llama-3-8``: the real architectures, built with
  Hugging Face ``transformers`` from configs shipped in the package (random
  initialisation, no download; :mod:`hpp.runtime.models.hf`);
- ``opt-tiny``, ``gpt-neo-tiny``, ``llama-tiny``: small variants of the same
  classes for CPU tests and demos;
- ``gpt-tiny``, ``gpt-small``: the GPT decoders of :mod:`hpp.runtime.models.gpt`.

Anything else of the form ``MODULE:FUNCTION`` is a user's model: ``MODULE`` is an
importable module (``examples.user_model``; the current directory is searched
too) or a ``.py`` file path, and ``FUNCTION()`` must return an object that
follows :class:`hpp.runtime.models.api.RuntimeModel`.

``transformers`` is imported only when an ``hf_models`` name is loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

from hpp.errors import HppInputError
from hpp.runtime.models.hf import hf_model
from hpp.runtime.models.api import RuntimeModel, check_protocol
from hpp.runtime.models.gpt import MODEL_CONFIGS, GPT

__all__ = ["HF_MODEL_NAMES", "GPT_MODEL_NAMES", "runtime_model_names", "load_runtime_model",
           "canonical_model_name", "check_layers_match", "portable_model_spec"]

#: Models built with ``transformers`` (:mod:`hpp.runtime.models.hf`).
HF_MODEL_NAMES = ("opt-tiny", "gpt-neo-tiny", "llama-tiny", "opt-350", "gpt-neo-2.7", "llama-3-8")
#: The GPT decoders (:mod:`hpp.runtime.models.gpt`).
GPT_MODEL_NAMES = ("gpt-tiny", "gpt-small")


def runtime_model_names() -> tuple[str, ...]:
    """The bundled runtime models' names (``gpt-tiny`` ... ``llama-3-8``)."""
    return GPT_MODEL_NAMES + HF_MODEL_NAMES


def canonical_model_name(name: str) -> str | None:
    """The bundled name ``name`` refers to (``"LLAMA-3-8"`` -> ``"llama-3-8"``), or None."""
    key = name.strip().lower()
    return key if key in runtime_model_names() else None


def _is_path(module: str) -> bool:
    """Whether the MODULE of MODULE:FUNCTION is a file path (``path/to/file.py``), not a dotted module."""
    return module.endswith(".py") or os.sep in module or "/" in module


def portable_model_spec(name: str) -> str:
    """``name`` as a profile or plan should record it: a ``path/to/file.py:FUNCTION`` with the path made absolute
    (so that ``hpp run`` finds it from any folder; a relative path would be read from wherever the command runs);
    bundled names and dotted ``MODULE:FUNCTION`` unchanged (a dotted module is imported as Python imports it).

    >>> portable_model_spec("gpt-tiny"), portable_model_spec("examples.user_model:build")
    ('gpt-tiny', 'examples.user_model:build')
    >>> portable_model_spec("examples/user_model.py:build") == f"{Path('examples/user_model.py').resolve()}:build"
    True
    """
    module, sep, func = name.strip().rpartition(":")
    if not sep or not module or not _is_path(module) or canonical_model_name(name) is not None:
        return name
    return f"{Path(module).expanduser().resolve()}:{func}"


def _load_gpt(name: str) -> RuntimeModel:
    return GPT(MODEL_CONFIGS[name])


def _load_hf(name: str) -> RuntimeModel:
    return hf_model(name)


def _import_module(module: str, *, source: str):
    """Import ``module`` (a dotted name, searched in ``sys.path`` then the current directory, or a .py path)."""
    try:
        if _is_path(module):
            path = Path(module).expanduser().resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            mod_name = f"_hpp_user_model_{path.stem}"
            spec = importlib.util.spec_from_file_location(mod_name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path} as a Python module")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = mod
            spec.loader.exec_module(mod)
            return mod
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as exc:
            cwd = os.getcwd()
            top = module.split(".")[0]
            if exc.name != top or cwd in sys.path or "" in sys.path:
                raise
            sys.path.append(cwd)        # what `python -m` does; the console script `hpp` does not
            try:
                return importlib.import_module(module)
            finally:
                sys.path.remove(cwd)
    except Exception as exc:  # noqa: BLE001  (any import-time failure is the user's module's)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise HppInputError(f"{source}: cannot import {module!r} ({type(exc).__name__}: {first})", field="model",
                            fix="give MODULE:FUNCTION with MODULE importable from the current directory "
                                "(e.g. examples.user_model:build) or a .py file path") from None


def _load_user(spec: str) -> RuntimeModel:
    module, _, func = spec.rpartition(":")
    if not module or not func.isidentifier():
        raise HppInputError(f"model {spec!r} is not MODULE:FUNCTION", field="model",
                            fix="give MODULE:FUNCTION, e.g. examples.user_model:build")
    mod = _import_module(module, source=spec)
    fn = getattr(mod, func, None)
    if fn is None or not callable(fn):
        raise HppInputError(f"{spec}: module {module!r} has no function {func!r}", field="model",
                            fix=f"define {func}() in {module}, returning the runtime model")
    try:
        obj = fn()
    except HppInputError:
        raise
    except Exception as exc:  # noqa: BLE001
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise HppInputError(f"{spec}: {func}() raised {type(exc).__name__}: {first}", field="model",
                            fix=f"make {func}() return the runtime model without arguments") from None
    return check_protocol(obj, source=spec)


_LOADERS: dict[str, Callable[[str], RuntimeModel]] = {
    **{n: _load_gpt for n in GPT_MODEL_NAMES}, **{n: _load_hf for n in HF_MODEL_NAMES}}


def load_runtime_model(name: str) -> RuntimeModel:
    """The runtime model ``name``: a bundled name (case-insensitive) or ``MODULE:FUNCTION``.

    Parameters
    ----------
    name : str
        ``"llama-tiny"``, ``"LLAMA-3-8"`` (a profile's name), ``"examples.user_model:build"``
        or ``"path/to/model.py:build"``.

    Returns
    -------
    RuntimeModel

    Raises
    ------
    HppInputError
        Unknown name (the message lists the bundled names), a module that cannot be
        imported, a missing FUNCTION, or an object that does not follow the protocol
        (the message names the missing member).

    Examples
    --------
    >>> load_runtime_model("gpt-tiny").spec.num_layers
    6
    """
    if not isinstance(name, str) or not name.strip():
        raise HppInputError(f"model name {name!r}", field="model",
                            fix=f"use one of {', '.join(runtime_model_names())} or MODULE:FUNCTION")
    key = canonical_model_name(name)
    if key is not None:
        return _LOADERS[key](key)
    if ":" in name:
        return _load_user(name.strip())
    raise HppInputError(f"the runtime has no model {name!r}", field="model",
                        fix=f"use one of {', '.join(runtime_model_names())} or MODULE:FUNCTION for your own model")


def check_layers_match(model: RuntimeModel, num_layers: int, *, source: str) -> None:
    """Refuse a model whose layer count differs from ``num_layers`` (of a plan or profile).

    Raises
    ------
    HppInputError
        Naming both counts, e.g. ``model llama-tiny has 6 layers but plan p.json has 26``.
    """
    if model.spec.num_layers != num_layers:
        raise HppInputError(f"model {model.spec.name} has {model.spec.num_layers} layers but {source} has "
                            f"{num_layers}", field="num_layers",
                            fix=f"use a model with {num_layers} layers, or re-profile and re-plan for "
                                f"{model.spec.name}")
