"""The configuration of one ``hpp run``: built once (from the command line or the Python API), frozen, validated.

:class:`RunConfig` is what the user asked for, in sections (as torchtitan's ``JobConfig``): ``parallelism``
(the plan and how its gradients sync), ``training``, ``checkpoint``, ``verify``, ``emulation``, ``launch``,
``report`` and ``controls`` (the deliberate faults and sync variants that tests and experiments use as
controls). :func:`hpp.runtime.run.run_plan` takes it, and the launchers and every rank get the same object.
A value not given (``None``) is the checkpoint's on ``--resume``, else the default; what ``hpp run``
resolves from the plan and the checkpoint once, on the launching host, travels beside it as
:class:`RunFacts`. A rank adds only its own facts (rank, world size, local device).

Both are plain JSON data (:meth:`RunConfig.to_dict`, :meth:`RunConfig.from_dict`): the torchrun entry point
reads them back from ``worker_config.json``. This module imports nothing else of the runtime (every
subpackage may import it).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from hpp.errors import HppInputError

__all__ = ["ParallelismOptions", "TrainingOptions", "CheckpointOptions", "VerifyOptions", "EmulationOptions",
           "LaunchOptions", "ReportOptions", "Controls", "RunConfig", "RunFacts"]

_LAUNCHERS = ("torchrun", "fork")
_DEVICES = ("cpu", "cuda")
_FAIL_MODES = ("exit", "hang")


@dataclass(frozen=True)
class ParallelismOptions:
    """The plan to execute and how its gradients sync.

    Attributes
    ----------
    plan : str
        The plan JSON (``hpp plan --out``).
    world_size : int or None
        Refuse unless the plan has exactly this many devices (``--world-size``).
    allow_over_memory : bool
        Run a plan the cost model predicts not to fit its devices' memory (``--allow-over-memory``).
    naive_allreduce : bool
        One blocking all-reduce per layer instead of the block-bucketed sync (``--naive-allreduce``).
    """

    plan: str
    world_size: int | None = None
    allow_over_memory: bool = False
    naive_allreduce: bool = False

    def __post_init__(self) -> None:
        if self.world_size is not None and self.world_size < 1:
            raise HppInputError(f"--world-size {self.world_size}", field="world_size", fix="give N >= 1")


@dataclass(frozen=True)
class TrainingOptions:
    """The training run (each ``None``: the checkpoint's on ``--resume``, else the default of
    :class:`hpp.runtime.exec.training.TrainingConfig`).

    Attributes
    ----------
    steps : int
        Optimizer steps of this run (>= 1).
    warmup_steps : int
        First steps left out of the timing median (not the LR warm-up).
    model : str or None
        A runtime model name or ``MODULE:FUNCTION`` (default: the plan's model).
    seed : int or None
        Initialisation and data seed (default 0).
    dtype, optimizer, lr, lr_schedule, lr_warmup_steps, lr_total_steps, clip_grad_norm, weight_decay
        As the flags of the same names; ``lr_total_steps`` defaults to ``steps``.
    data : str or None
        ``--data FILE`` (default synthetic tokens).
    weights : str or None
        ``--weights DIR``: a local Hugging Face model folder to start from (default: the seed's random weights;
        refused together with ``--resume``).
    num_threads : int
        Each rank's torch compute threads (>= 1).
    """

    steps: int
    warmup_steps: int = 1
    model: str | None = None
    seed: int | None = None
    dtype: str | None = None
    optimizer: str | None = None
    lr: float | None = None
    lr_schedule: str | None = None
    lr_warmup_steps: int | None = None
    lr_total_steps: int | None = None
    clip_grad_norm: float | None = None
    weight_decay: float | None = None
    data: str | None = None
    weights: str | None = None
    num_threads: int = 1

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise HppInputError(f"--steps {self.steps}", field="steps", fix="run at least 1 step")
        if self.warmup_steps < 0:
            raise HppInputError(f"--warmup-steps {self.warmup_steps}", field="warmup_steps", fix="give N >= 0")
        if self.num_threads < 1:
            raise HppInputError(f"--threads {self.num_threads}", field="num_threads", fix="give N >= 1")


@dataclass(frozen=True)
class CheckpointOptions:
    """``save``: a directory for ``step-K`` checkpoints, every ``save_every`` steps (0: only after the last)
    and after the last; ``resume``: a ``save`` directory (its latest complete checkpoint) or one ``step-K``."""

    save: str | None = None
    save_every: int = 0
    resume: str | None = None

    def __post_init__(self) -> None:
        if self.save_every < 0:
            raise HppInputError(f"--save-every {self.save_every}", field="save_every",
                                fix="give K >= 1 (or 0: only at the end)")
        if self.save_every and self.save is None:
            raise HppInputError("--save-every without --save", field="save_every", fix="give --save DIR too")


@dataclass(frozen=True)
class VerifyOptions:
    """``enabled``: run in float64 and compare every step and the final parameters with single-device
    training (:mod:`hpp.runtime.exec.verify_steps`, :mod:`hpp.runtime.exec.reference`)."""

    enabled: bool = False


@dataclass(frozen=True)
class EmulationOptions:
    """CPU emulation of the plan's devices.

    Attributes
    ----------
    emulate_speed : bool
        Pad compute by the device types' slowdown (:mod:`hpp.runtime.host.emulation`).
    time_scale : float or None
        With ``emulate_speed``: a common dilation >= 1 (default :func:`hpp.runtime.run.default_time_scale`).
    emulate_node_type : str or None
        ``TYPE[:COUNT]``: this host plays a node of that type.
    host_calibration : bool
        CPU: predict at this host's measured speed (:mod:`hpp.runtime.profile.host_speed`).
    """

    emulate_speed: bool = False
    time_scale: float | None = None
    emulate_node_type: str | None = None
    host_calibration: bool = True

    def __post_init__(self) -> None:
        if self.time_scale is not None and not self.time_scale >= 1.0:
            raise HppInputError(f"--time-scale {self.time_scale}", field="time_scale",
                                fix="use a factor >= 1 (1 = no dilation)")


@dataclass(frozen=True)
class LaunchOptions:
    """Where and how the ranks start.

    Attributes
    ----------
    launcher : str
        ``torchrun`` or ``fork`` (one host, fast start; CPU only: refused with ``cuda``).
    device : str
        ``cpu`` or ``cuda``.
    nnodes, node_rank, rdzv_endpoint, node_map
        Several hosts (:func:`hpp.runtime.run_setup.host_share`); ``node_map``: ``"N0,N1,..."`` or a list.
    group_timeout_s, run_timeout_s : float
        Process-group timeout [s] (a dead peer fails a rank within it); whole-run timeout [s].
    out_dir : str or None
        Parent of the run's scratch directory (default the system's temporary directory).
    log_dir : str or None
        Keep torchrun's and each rank's output there.
    dry_run : str or None
        Check everything, write ``dry_run/worker_config.json`` and return this host's torchrun command.
    """

    launcher: str = "torchrun"
    device: str = "cpu"
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    node_map: str | tuple[int, ...] | None = None
    group_timeout_s: float = 120.0
    run_timeout_s: float = 1800.0
    out_dir: str | None = None
    log_dir: str | None = None
    dry_run: str | None = None

    def __post_init__(self) -> None:
        if self.launcher not in _LAUNCHERS:
            raise HppInputError(f"launcher {self.launcher!r}", field="launcher", fix=f"use one of {_LAUNCHERS}")
        if self.device not in _DEVICES:
            raise HppInputError(f"device {self.device!r}", field="device", fix=f"use one of {_DEVICES}")
        if self.launcher == "fork" and self.device == "cuda":
            # the launching process reads its GPUs before it forks, and torch cannot use CUDA again
            # in a forked child ("Cannot re-initialize CUDA in forked subprocess")
            raise HppInputError("--launcher fork with --device cuda: a forked rank cannot use CUDA once the launching "
                                "process has", field="launcher", fix="use --launcher torchrun (the default) on GPUs")
        if not (self.group_timeout_s > 0 and self.run_timeout_s > 0):
            raise HppInputError(f"--group-timeout {self.group_timeout_s} --run-timeout {self.run_timeout_s}",
                                field="group_timeout", fix="give timeouts > 0 seconds")
        if isinstance(self.node_map, list):            # JSON gives lists back: one frozen form
            object.__setattr__(self, "node_map", tuple(self.node_map))


@dataclass(frozen=True)
class ReportOptions:
    """``timeline``: a predicted-vs-measured Gantt PNG; ``metrics_jsonl``: one JSON line per step;
    ``progress``: one line per step on stderr."""

    timeline: str | None = None
    metrics_jsonl: str | None = None
    progress: bool = False


@dataclass(frozen=True)
class Controls:
    """Deliberate variants for tests and experiments (no command-line flag).

    Attributes
    ----------
    overlap : bool
        Launch the block all-reduces from backward hooks (False: after the schedule).
    bucket_bytes : int
        Gradient bucket size [bytes].
    skip_block_allreduce, naive_tp : bool
        The controls that must fail ``verify``: no block gradient sync; replicated parameters summed over
        every TP rank.
    skip_block_allreduce_step : int
        No gradient sync in that (global) step only (-1: never).
    fail_rank, fail_step, fail_mode
        Fault injection: that rank fails at that (global) step (-1: never), ``"exit"`` or ``"hang"``.
    save_params : bool
        Every rank writes its full parameters (``rank<r>.pt``) as under ``--verify``, without its per-step check.
    """

    overlap: bool = True
    bucket_bytes: int = 25 * 2**20
    skip_block_allreduce: bool = False
    skip_block_allreduce_step: int = -1
    naive_tp: bool = False
    fail_rank: int = -1
    fail_step: int = -1
    fail_mode: str = "exit"
    save_params: bool = False

    def __post_init__(self) -> None:
        if self.fail_mode not in _FAIL_MODES:
            raise HppInputError(f"fail_mode {self.fail_mode!r}", field="controls.fail_mode",
                                fix=f"use one of {_FAIL_MODES}")
        if self.bucket_bytes < 1:
            raise HppInputError(f"bucket_bytes {self.bucket_bytes}", field="controls.bucket_bytes", fix="give >= 1")


_SECTIONS: dict[str, type] = {"parallelism": ParallelismOptions, "training": TrainingOptions,
                              "checkpoint": CheckpointOptions, "verify": VerifyOptions,
                              "emulation": EmulationOptions, "launch": LaunchOptions, "report": ReportOptions,
                              "controls": Controls}

#: ``hpp run``'s flags (argparse destinations) -> (section, field)
_FLAGS: dict[str, tuple[str, str]] = {
    "plan": ("parallelism", "plan"), "world_size": ("parallelism", "world_size"),
    "allow_over_memory": ("parallelism", "allow_over_memory"), "naive_allreduce": ("parallelism", "naive_allreduce"),
    **{k: ("training", k) for k in ("steps", "warmup_steps", "model", "seed", "dtype", "optimizer", "lr",
                                    "lr_schedule", "lr_warmup_steps", "lr_total_steps", "clip_grad_norm",
                                    "weight_decay", "data", "weights")},
    "threads": ("training", "num_threads"),
    "save": ("checkpoint", "save"), "save_every": ("checkpoint", "save_every"), "resume": ("checkpoint", "resume"),
    "verify": ("verify", "enabled"),
    **{k: ("emulation", k) for k in ("emulate_speed", "time_scale", "emulate_node_type", "host_calibration")},
    **{k: ("launch", k) for k in ("launcher", "device", "nnodes", "node_rank", "rdzv_endpoint", "node_map",
                                  "log_dir", "dry_run")},
    "group_timeout": ("launch", "group_timeout_s"), "run_timeout": ("launch", "run_timeout_s"),
    "timeline": ("report", "timeline"), "metrics_jsonl": ("report", "metrics_jsonl"),
}


@dataclass(frozen=True)
class RunConfig:
    """One ``hpp run``, by section (see the module docstring); build it with :meth:`build` or
    :meth:`from_args`, or from the sections.

    >>> cfg = RunConfig.build("plan.json", steps=3, launcher="fork", save="ck", save_every=1)
    >>> cfg.training.steps, cfg.launch.launcher, cfg.checkpoint.save_every, cfg.verify.enabled
    (3, 'fork', 1, False)
    >>> RunConfig.from_dict(cfg.to_dict()) == cfg
    True
    """

    parallelism: ParallelismOptions
    training: TrainingOptions
    checkpoint: CheckpointOptions = field(default_factory=CheckpointOptions)
    verify: VerifyOptions = field(default_factory=VerifyOptions)
    emulation: EmulationOptions = field(default_factory=EmulationOptions)
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    report: ReportOptions = field(default_factory=ReportOptions)
    controls: Controls = field(default_factory=Controls)

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise HppInputError(f"section {name!r} is a {type(getattr(self, name)).__name__}",
                                    field=name, fix=f"give a {cls.__name__}")

    @classmethod
    def build(cls, plan: Any, *, steps: int, verify: bool = False, progress: bool = False,
              num_threads: int | None = None, group_timeout_s: float | None = None,
              run_timeout_s: float | None = None, out_dir: Any = None,
              controls: Mapping[str, Any] | None = None, **options: Any) -> "RunConfig":
        """The Python API: ``hpp run``'s options by their flag names (``save="ck"``, ``launcher="fork"``, ...).

        ``controls``: :class:`Controls` fields. Paths may be ``Path`` objects (kept as strings).

        Raises
        ------
        HppInputError
            An unknown option, or a section's invariant (one line naming the flag and the fix).
        """
        given: dict[str, Any] = {"plan": plan, "steps": steps, "verify": verify}
        for k, v in options.items():
            if k not in _FLAGS:
                raise HppInputError(f"unknown run option {k!r}", field=k,
                                    fix=f"use one of {sorted({*_FLAGS, 'num_threads', 'group_timeout_s'})}")
            given[k] = v
        if num_threads is not None:
            given["threads"] = num_threads
        if group_timeout_s is not None:
            given["group_timeout"] = group_timeout_s
        if run_timeout_s is not None:
            given["run_timeout"] = run_timeout_s
        sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        for k, v in given.items():
            sec, name = _FLAGS[k]
            sections[sec][name] = str(v) if v is not None and name in _PATHS else v
        sections["report"]["progress"] = progress
        if out_dir is not None:
            sections["launch"]["out_dir"] = str(out_dir)
        sections["controls"] = dict(controls or {})
        return cls.from_dict(sections)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RunConfig":
        """From ``hpp run``'s parsed flags (:func:`hpp.runtime.cli.run_main`)."""
        sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        for dest, (sec, name) in _FLAGS.items():
            sections[sec][name] = getattr(args, dest)
        sections["report"]["progress"] = not args.quiet
        return cls.from_dict(sections)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunConfig":
        """Inverse of :meth:`to_dict`; unknown sections or keys are errors."""
        unknown = sorted(set(data) - set(_SECTIONS))
        if unknown:
            raise HppInputError(f"unknown run configuration section {unknown[0]!r}", field=unknown[0],
                                fix=f"use {sorted(_SECTIONS)}")
        out = {}
        for name, sec_cls in _SECTIONS.items():
            values = dict(data.get(name) or {})
            bad = sorted(set(values) - {f.name for f in fields(sec_cls)})
            if bad:
                raise HppInputError(f"unknown key {bad[0]!r} in the run configuration's {name} section",
                                    field=f"{name}.{bad[0]}", fix=f"use {[f.name for f in fields(sec_cls)]}")
            out[name] = sec_cls(**values)
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data, section by section."""
        return asdict(self)


#: options that are paths (given as ``Path`` or ``str``, kept as ``str``)
_PATHS = {"plan", "data", "weights", "save", "resume", "log_dir", "dry_run", "timeline", "metrics_jsonl"}


@dataclass(frozen=True)
class RunFacts:
    """What ``hpp run`` resolved once, on the launching host, for every rank: plain JSON data.

    Attributes
    ----------
    plan : dict
        The plan's JSON object (:func:`hpp.plan_data.plan_to_dict`, with its cluster embedded), validated.
    model : str
        A name or ``MODULE:FUNCTION`` for :func:`hpp.runtime.models.zoo.load_runtime_model`.
    training : dict
        :class:`hpp.runtime.exec.training.TrainingConfig` fields (the flags, the checkpoint's, the defaults).
    seed : int
    data : dict or None
        For :func:`hpp.runtime.exec.data.make_batch_source` (None: synthetic tokens).
    slowdown : dict[str, float]
        Per device type, the emulated slowdown (empty: no emulation).
    time_scale : float
        Common dilation of every emulated device (>= 1).
    save_dir, resume : str or None
        Absolute checkpoint root and the checkpoint to continue from.
    weights : str or None
        The absolute Hugging Face model folder every rank loads its slices from (checked).
    node_map : list[int] or None
        The plan node of each node rank (several hosts).
    """

    plan: dict
    model: str
    training: dict = field(default_factory=dict)
    seed: int = 0
    data: dict | None = None
    slowdown: dict = field(default_factory=dict)
    time_scale: float = 1.0
    save_dir: str | None = None
    resume: str | None = None
    weights: str | None = None
    node_map: list[int] | None = None

    def __post_init__(self) -> None:
        if not self.time_scale >= 1.0:
            raise HppInputError(f"time scale {self.time_scale}", field="time_scale", fix="use a factor >= 1")
        if not self.model:
            raise HppInputError("no model", field="model", fix="give a runtime model name or MODULE:FUNCTION")
