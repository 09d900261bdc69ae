"""Execute HPP plans with torch.distributed and profile runtime models.

Public entry points: :func:`hpp.runtime.run.run_plan` (``hpp run``),
:func:`hpp.runtime.profiler.profile_model` (``hpp profile``), the model
registry :mod:`hpp.runtime.models`, and the launchers in :mod:`hpp.runtime.launch`.
Submodules import torch; this package module does not import them eagerly.
"""

__all__ = ["models", "layout", "gradsync", "emulation", "worker", "launch", "run", "profiler", "timeline", "cli"]
