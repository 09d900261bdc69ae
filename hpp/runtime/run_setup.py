"""``hpp run``'s inputs and up-front checks, and the cleanup after a failed run.

Everything here runs in the launcher before any rank starts (or after they ended), so
bad input is one :class:`hpp.errors.HppInputError` line (exit 2) instead of a failure
deep inside the ranks:

- :func:`load_run_inputs`, :func:`resolve_run_model`: the plan (validated against its
  cluster and profile) and the runtime model (checked against both);
- :func:`check_host_capacity`, :func:`training_config`, :func:`open_metrics`;

- :func:`host_share`: this host's share of the plan (``--nnodes``, ``--node-rank``,
  ``--rdzv-endpoint``, ``--node-map``; :func:`hpp.runtime.launch.binding.host_ranks`) after
  checking its devices (CUDA: the GPUs' types and count; CPU: ``--emulate-node-type``
  or ``$HPP_EMULATE_NODE_TYPE`` plays a node of a type, else nothing to check);
- :func:`check_resume`: ``--resume DIR`` names a complete checkpoint of this model
  (name and layer count) and optimizer (:func:`hpp.runtime.checkpoint.store.read_checkpoint_meta`);
- :func:`check_weights`: ``--weights DIR`` is a complete Hugging Face folder of the run's model
  (:mod:`hpp.runtime.models.hf_folder`), and not given with ``--resume``;
- :func:`prepare_save_dir`: ``--save DIR`` can be created and written;
- :func:`clean_partial_checkpoints`: after a failed or interrupted run, the host of plan
  rank 0 (the only rank that renames checkpoints into place) removes what an unfinished
  save left (``.tmp-step-K``, a ``step-K`` without its ``complete`` marker) and puts
  back a complete checkpoint a replacing save had moved aside, so that only complete
  checkpoints remain and the latest of them resumes.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from hpp.errors import HppInputError
from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import ModelProfile
from hpp.resolve import load_plan
from hpp.runtime.launch.binding import (EMULATE_ENV, check_host, detect_node_devices, host_nodes, parse_endpoint,
                                        parse_node_map)
from hpp.runtime.checkpoint.store import (COMPLETE_MARKER, META_FILE, complete_checkpoints, other_model_error,
                                          read_checkpoint_meta, stored_entries)
from hpp.runtime.models.api import RuntimeModel, check_tp_degree
from hpp.runtime.exec.training import TrainingConfig
from hpp.runtime.models.zoo import canonical_model_name, check_layers_match, load_runtime_model, portable_model_spec
from hpp.wording import count

__all__ = ["MAX_RANKS_PER_CORE", "load_run_inputs", "check_host_capacity", "model_source", "resolve_run_model",
           "training_config", "open_metrics", "HostShare", "host_share", "check_resume", "check_weights", "weights_note",
           "resume_notes", "prepare_save_dir", "clean_partial_checkpoints"]

logger = logging.getLogger(__name__)


#: CPU ranks allowed per core (each rank is one process with one compute thread).
MAX_RANKS_PER_CORE = 8


def load_run_inputs(path: str | Path) -> tuple[Plan, Cluster, ModelProfile | None]:
    """Read and validate a plan (:func:`hpp.resolve.load_plan`); a plan without a profile is allowed
    (no prediction then).

    Raises
    ------
    HppInputError
    """
    return load_plan(path, require_profile=False)


def check_host_capacity(world_size: int, *, device: str, cpu_count: int | None = None,
                        per_core: int = MAX_RANKS_PER_CORE) -> None:
    """Refuse a run that needs more ranks (``world_size``: this host's) than this host can hold.

    Raises
    ------
    HppInputError
    """
    if device == "cuda":
        n = torch.cuda.device_count()
        if world_size > n:
            raise HppInputError(f"the plan needs {count(world_size, 'device')} but this host has "
                                f"{count(n, 'CUDA device')}",
                                field="pipelines", fix="run on a host with enough GPUs or plan for fewer devices")
        return
    cores = cpu_count or os.cpu_count() or 1
    limit = per_core * cores
    if world_size > limit:
        raise HppInputError(f"the plan needs {count(world_size, 'device')} but this host can run at most "
                            f"{count(limit, 'CPU rank')} "
                            f"({per_core} per core x {cores} cores)", field="pipelines",
                            fix="plan for fewer devices or run on a larger host")


def _names_match(plan_model: str, model_arg: str | None, spec_name: str) -> bool:
    """Whether the plan's model name is the runtime model's (bundled aliases and MODULE:FUNCTION allowed)."""
    key = lambda n: canonical_model_name(n) or n.strip().lower()   # noqa: E731
    return key(plan_model) in {key(spec_name), *([key(model_arg)] if model_arg else [])}


def model_source(plan: Plan, profile: ModelProfile | None, model: str | None) -> str:
    """What to load the run's model from (see :func:`resolve_run_model`); a ``path/file.py:FUNCTION`` given here
    is made absolute (:func:`hpp.runtime.models.zoo.portable_model_spec`: the ranks load it, whatever their folder)."""
    if model:
        return portable_model_spec(model)
    if canonical_model_name(plan.model) is None and profile is not None and profile.meta.get("runtime_model"):
        return str(profile.meta["runtime_model"])
    return plan.model


def resolve_run_model(plan: Plan, profile: ModelProfile | None, model: str | None, *, source: str) -> RuntimeModel:
    """The runtime model of a run: ``model`` (a name or MODULE:FUNCTION) or the plan's, checked against both.

    Without ``model``: the plan's model name, or, if that is no bundled name, what the
    plan's profile says the model was loaded from (``meta["runtime_model"]``, written by
    ``hpp profile --model MODULE:FUNCTION``), so ``hpp run PLAN.json`` needs no ``--model``.

    Raises
    ------
    HppInputError
        Unknown name (lists the names), MODULE:FUNCTION that cannot be imported or returns
        the wrong object (names the missing member), a layer count that differs from the
        plan's or the profile's, a model name that differs from the plan's or the profile's
        (naming both), or a plan TP degree the model's heads or MLP width cannot be split by.
    """
    model = model_source(plan, profile, model)
    rt = load_runtime_model(model)
    spec = rt.spec
    check_layers_match(rt, plan.num_layers, source=f"the plan {source}")
    if profile is not None:
        check_layers_match(rt, profile.num_layers, source=f"the profile of {profile.model}")
    if not _names_match(plan.model, model, spec.name):
        raise HppInputError(f"the plan is for model {plan.model!r} but the runtime model is {spec.name!r}",
                            source=source, field="model",
                            fix=f"run it with --model for {plan.model!r}, or plan for {spec.name!r}")
    if profile is not None and not _names_match(profile.model, model, spec.name):
        raise HppInputError(f"the plan's profile is of model {profile.model!r} but the runtime model is "
                            f"{spec.name!r}", source=source, field="profile",
                            fix=f"profile {spec.name!r} (hpp profile --model) and plan with that profile")
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            if st.tp_degree > 1:
                check_tp_degree(spec, st.tp_degree, field=f"pipelines[{p}].stages[{s}].tp_degree")
    return rt


def training_config(*, optimizer: str | None, lr: float | None, lr_schedule: str | None,
                    lr_warmup_steps: int | None, clip_grad_norm: float | None, weight_decay: float | None, dtype: str,
                    steps: int, lr_total_steps: int | None = None, saved: Mapping[str, Any] | None = None) -> Any:
    """The run's :class:`hpp.runtime.exec.training.TrainingConfig` (validated there: bad values are HppInputError).

    Each setting left ``None`` is the checkpoint's (``saved``: its ``extra.training``, on
    ``--resume``), else the default (AdamW, lr 1e-3, constant schedule, no warm-up, no
    clipping). The schedule's length is ``lr_total_steps``, else the checkpoint's, else ``steps``.
    """
    keys = ("optimizer", "lr", "weight_decay", "lr_schedule", "warmup_steps", "min_lr_ratio", "total_steps",
            "clip_grad_norm")
    base: dict[str, Any] = {"optimizer": "adamw", "lr": 1e-3, "lr_schedule": "constant", "warmup_steps": 0,
                            "total_steps": steps}
    base.update({k: saved[k] for k in keys if saved and k in saved})
    given = {"optimizer": optimizer, "lr": lr, "lr_schedule": lr_schedule, "warmup_steps": lr_warmup_steps,
             "clip_grad_norm": clip_grad_norm, "weight_decay": weight_decay, "total_steps": lr_total_steps}
    return TrainingConfig(**{**base, **{k: v for k, v in given.items() if v is not None}, "dtype": dtype})


def open_metrics(path: str | Path | None) -> Path | None:
    """``--metrics-jsonl``: check it can be written (HppInputError) and return it."""
    if path is None:
        return None
    p = Path(path)
    try:
        p.open("a").close()
    except OSError as exc:
        raise HppInputError(f"--metrics-jsonl {str(path)!r} cannot be written ({exc.strerror})",
                            field="metrics_jsonl", fix="give a writable file path") from None
    return p


def resume_notes(meta: Mapping[str, Any], training: Mapping[str, Any], plan: Plan) -> list[str]:
    """What differs between the checkpoint's run and this one (the resumed run is then not one long run); the
    report's ``checkpoint`` (``resumed_from``, ``first_step``) says what was resumed."""
    extra = meta.get("extra", {})
    notes: list[str] = []
    if extra.get("global_batch_size") not in (None, plan.global_batch_size):
        notes.append(f"the checkpoint was trained with global batch {extra['global_batch_size']}, this plan uses "
                     f"{plan.global_batch_size}")
    before = extra.get("training") or {}
    changed = sorted(k for k in before if k != "total_steps" and before.get(k) != training.get(k))
    if changed:
        notes.append("training settings differ from the checkpoint's run: " +
                     ", ".join(f"{k} {before[k]} -> {training.get(k)}" for k in changed))
    return notes


@dataclass(frozen=True)
class HostShare:
    """This host's part of a run.

    Attributes
    ----------
    nnodes, node_rank : int
        Hosts of the run and this host's node rank (1 and 0: one host runs the whole plan).
    rdzv_endpoint : str or None
        ``HOST:PORT`` of node rank 0's static rendezvous (None: ``torchrun --standalone``).
    node_map : tuple[int, ...] or None
        ``--node-map``: the plan node of each node rank.
    ranks : tuple[int, ...]
        The plan ranks this host starts, in local-rank order.
    nodes : tuple[int, ...]
        The plan nodes this host plays.
    """

    nnodes: int
    node_rank: int
    rdzv_endpoint: str | None
    node_map: tuple[int, ...] | None
    ranks: tuple[int, ...]
    nodes: tuple[int, ...]

    @property
    def whole(self) -> bool:
        """This host runs every rank of the plan."""
        return self.nnodes == 1


def host_share(plan: Plan, cluster: Cluster, *, nnodes: int = 1, node_rank: int = 0,
               rdzv_endpoint: str | None = None, node_map: str | Sequence[int] | None = None,
               emulate_node_type: str | None = None, device: str = "cpu", launcher: str = "torchrun"
               ) -> HostShare:
    """Check this host for its share of the plan and return that share.

    Parameters
    ----------
    nnodes, node_rank, rdzv_endpoint
        As torchrun's flags; ``nnodes > 1`` needs ``rdzv_endpoint`` and the torchrun launcher.
    node_map : "2,0,1" or a sequence, optional
        The plan node of each node rank (default: the plan's used nodes in order).
    emulate_node_type : str, optional
        ``TYPE`` or ``TYPE:COUNT``: this CPU host plays a node of that type (default
        ``$HPP_EMULATE_NODE_TYPE``).
    device : "cpu" or "cuda"
        CUDA hosts are checked against the plan (GPU types and count); CPU hosts only when emulating.

    Raises
    ------
    HppInputError
        A bad flag, a host that is not the plan's node type or has too few devices
        (:func:`hpp.runtime.launch.binding.check_host`), ``--node-map`` without several hosts.
    """
    if nnodes < 1:
        raise HppInputError(f"--nnodes {nnodes}", field="--nnodes", fix="give the number of hosts (>= 1)")
    if rdzv_endpoint is not None:
        parse_endpoint(rdzv_endpoint)
    if nnodes > 1 and rdzv_endpoint is None:
        raise HppInputError(f"--nnodes {nnodes} without --rdzv-endpoint", field="--rdzv-endpoint",
                            fix="give HOST:PORT of the host with node rank 0 (the same on every host)")
    if launcher != "torchrun" and (nnodes > 1 or rdzv_endpoint is not None):
        raise HppInputError("several hosts need the torchrun launcher", field="--launcher",
                            fix="drop --launcher fork")
    if nnodes == 1 and node_rank != 0:
        raise HppInputError(f"--node-rank {node_rank} with one host", field="--node-rank",
                            fix="give --nnodes (the number of hosts) too")
    nmap = parse_node_map(node_map) if isinstance(node_map, str) else (tuple(node_map) if node_map else None)
    if nmap is not None and nnodes == 1:
        raise HppInputError("--node-map needs several hosts", field="--node-map",
                            fix="give --nnodes N --node-rank R --rdzv-endpoint HOST:PORT too, or drop --node-map")
    emulate = emulate_node_type or os.environ.get(EMULATE_ENV) or None
    found = detect_node_devices(emulate=emulate) if (device == "cuda" or emulate) else None
    if device == "cuda" and found is None:
        raise HppInputError("--device cuda but this host has no CUDA device", field="--device",
                            fix="run on a GPU host, or use --device cpu")
    mine = check_host(plan, found, nnodes=nnodes, node_rank=node_rank, node_map=nmap, cluster=cluster)
    nodes = tuple(sorted({b.node for b in mine})) if nnodes == 1 else \
        (host_nodes(plan, cluster, nmap)[node_rank],)
    return HostShare(nnodes, node_rank, rdzv_endpoint, nmap, tuple(b.rank for b in mine), nodes)


def check_resume(path: str | Path, *, model_name: str, num_layers: int, optimizer: str | None = None
                 ) -> dict[str, Any]:
    """The metadata of the complete checkpoint ``path`` names, checked against this run.

    Parameters
    ----------
    model_name, num_layers : the runtime model's (``ModelSpec.name``, layer count).
    optimizer : ``"adamw"`` or ``"sgd"`` (None: not checked).

    Also read, before any rank starts: every file against the sizes and SHA-256 saved with it
    (:func:`hpp.runtime.checkpoint.reader.check_files`; a checkpoint saved without that list is not checked),
    and DCP's ``.metadata`` with only DCP's metadata classes admitted
    (:func:`~hpp.runtime.checkpoint.reader.read_dcp_metadata`).

    Raises
    ------
    HppInputError
        Missing or incomplete checkpoint (naming the last complete one), another model
        (name or layer count), another optimizer, a damaged file (naming it), or DCP metadata that names
        anything but DCP's metadata classes.
    """
    from hpp.runtime.checkpoint.reader import check_files   # lazy: torch DCP, 2-3.5 s
    meta = read_checkpoint_meta(path)
    if meta.get("files"):
        check_files(meta["path"], meta["files"])
    stored_entries(Path(meta["path"]))
    if (str(meta.get("model", "")).strip().lower() != model_name.strip().lower()
            or meta.get("num_layers") != num_layers):
        raise other_model_error(meta, meta["path"], model_name, num_layers)
    saved = meta.get("optimizer")
    want = {"adamw": "AdamW", "sgd": "SGD"}.get(optimizer or "", optimizer)
    if optimizer is not None and saved is not None and saved != want:
        raise HppInputError(f"checkpoint has {saved} optimizer state, this run uses {want}", source=meta["path"],
                            field="--optimizer", fix=f"resume with --optimizer {saved.lower()}")
    return meta


def check_weights(path: str | Path, model: RuntimeModel, *, resume: str | Path | None = None):
    """The checked Hugging Face folder ``path`` for ``hpp run --weights`` of ``model``.

    Decisions: ``--weights`` with ``--resume`` is refused (a resumed run continues from its checkpoint's
    weights; silently ignoring the folder would hide which weights the run has); a model that is not one of
    the shipped OPT, GPT-Neo or Llama models (``MODULE:FUNCTION``, hpp's own GPT) is refused, as the protocol
    has no mapping from its parameters to a Hugging Face folder's names.

    Returns
    -------
    hpp.runtime.models.hf_folder.WeightsFolder

    Raises
    ------
    HppInputError
        With ``--resume``; a model without Hugging Face names; the folder refusals of
        :func:`~hpp.runtime.models.hf_folder.open_weights_folder` and
        :func:`~hpp.runtime.models.hf_folder.check_weights_match` (another model naming the differing field,
        a missing, truncated or damaged shard naming the file, an index naming a tensor no shard has).
    """
    from hpp.runtime.models.hf import HFModel
    from hpp.runtime.models.hf_folder import check_weights_match, open_weights_folder
    if resume is not None:
        raise HppInputError("--weights with --resume: a resumed run continues from its checkpoint's weights",
                            field="--weights", fix="drop --weights (or --resume to start a new run from the folder)")
    if not isinstance(model, HFModel):
        raise HppInputError(f"--weights loads Hugging Face folders into the shipped OPT, GPT-Neo and Llama models, "
                            f"not {model.spec.name!r}", field="--weights",
                            fix="run a plan of opt-*, gpt-neo-* or llama-* (or drop --weights)")
    folder = open_weights_folder(path)
    check_weights_match(folder, model)
    return folder


#: safetensors dtype codes -> torch's names.
_STORED_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def weights_note(folder, run_dtype: str) -> str:
    """The report's note on ``--weights``: the folder and what its tensors' dtype becomes in the run.

    >>> from types import SimpleNamespace as NS
    >>> weights_note(NS(path="opt", dtypes={"a": "BF16"}), "float64")
    "--weights opt: its bfloat16 tensors are cast to the run's float64"
    >>> weights_note(NS(path="opt", dtypes={"a": "F32"}), "bfloat16")
    '--weights opt: its float32 tensors are the float32 master weights (as stored)'
    """
    stored = sorted({_STORED_DTYPES.get(d, d) for d in folder.dtypes.values()})
    into = "float32" if run_dtype == "bfloat16" else run_dtype
    what = "the float32 master weights" if run_dtype == "bfloat16" else f"the run's {run_dtype}"
    verb = "are" if stored == [into] else "are cast to"
    tail = " (as stored)" if stored == [into] else ""
    return f"--weights {folder.path}: its {'/'.join(stored)} tensors {verb} {what}{tail}"


def prepare_save_dir(path: str | Path, resumed_from: str | Path | None = None) -> Path:
    """Create ``--save DIR`` (parents too) and check that it can be written.

    A DIR that already holds complete checkpoints is refused unless the run resumes from one of them
    (``resumed_from``, a ``DIR/step-K`` folder) and none is later than it: another run's steps, or a later
    step of an abandoned branch, would be taken for this run's (``--resume DIR`` loads the highest step).

    Raises
    ------
    HppInputError
    """
    p = Path(path)
    done = complete_checkpoints(p)
    mine = [k for k, c in done if resumed_from is not None and c.resolve() == Path(resumed_from).resolve()]
    if done and not mine:
        names = ", ".join(c.name for _, c in done[:3]) + (f" and {len(done) - 3} more" if len(done) > 3 else "")
        raise HppInputError(f"holds the checkpoints of another run ({names})", source=str(p), field="--save",
                            fix=f"give a new folder, or --resume {p} --save {p} to continue that run there")
    later = [c.name for k, c in done if mine and k > mine[0]]
    if later:                    # a branch from an earlier step: --resume DIR would take the old branch's latest
        raise HppInputError(f"holds later steps ({', '.join(later[:3])}) than the {Path(resumed_from).name} this run "
                            f"resumes from", source=str(p), field="--save",
                            fix=f"save this branch in a new folder, or --resume {p} (its latest step)")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".hpp-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise HppInputError(f"cannot write checkpoints there ({exc.strerror or exc})", source=str(p), field="--save",
                            fix="give a writable directory on a file system every host sees") from None
    return p


def _complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file() and (path / META_FILE).is_file()


def clean_partial_checkpoints(root: str | Path) -> list[str]:
    """Remove what unfinished saves left under ``root``; return the removed names.

    ``.tmp-step-K`` (a save in progress) and ``step-K`` without its marker go; a complete
    ``.old-step-K-*`` (the previous checkpoint of the same step, moved aside by a save that
    replaced it) goes back to ``step-K`` when that is missing or incomplete, else it goes.
    Complete ``step-K`` directories are never touched. Call only when no rank can still write.
    """
    root = Path(root)
    removed: list[str] = []
    if not root.is_dir():
        return removed
    entries = sorted(root.iterdir())
    for child in entries:
        if child.is_dir() and child.name.startswith("step-") and not _complete(child):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child.name)
    for child in entries:
        if child.name.startswith(".old-step-") and child.is_dir():
            step = child.name[len(".old-step-"):].split("-")[0]
            final = root / f"step-{step}"
            if _complete(child) and not final.exists():
                child.rename(final)
                logger.warning("restored the complete checkpoint %s from %s", final, child.name)
            else:
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child.name)
        elif child.name.startswith(".tmp-step-"):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child.name)
    return removed
