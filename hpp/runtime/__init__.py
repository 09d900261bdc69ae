"""Execute HPP plans with torch.distributed and profile runtime models.

Top level: ``hpp run`` as a library call (:func:`hpp.runtime.run.run_plan`), its configuration
(:class:`hpp.runtime.config.RunConfig`), its checks, failure lines and report. Subpackages by
responsibility, lowest first: ``models`` (what a model is), ``host`` (CPU emulation and time truth),
``checkpoint``, ``exec`` (one rank's step), ``launch`` (starting ranks), ``profile`` (``hpp profile``),
``network`` (``hpp profile-network``). A package imports only packages before it in this list and
:mod:`hpp.runtime.config` (the top level imports them all). Submodules import torch; this package module
does not.
"""
