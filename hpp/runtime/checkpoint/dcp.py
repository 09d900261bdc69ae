"""Checkpoints keyed by global parameter name, so that one plan's checkpoint resumes under any other.

A checkpoint is a ``torch.distributed.checkpoint`` (DCP) directory whose keys are the
runtime's global names (:mod:`hpp.runtime.models.stage`: ``layers.<l>.<path>``), not ranks:

- ``model.<name>``: every entry of the stage modules' ``state_dict()`` (DTensor shards
  under TP are written as shards of the one global tensor);
- ``optim.<name>.<state>``: the optimizer's per-parameter state (AdamW ``step``,
  ``exp_avg``, ``exp_avg_sq``), under every name of the parameter (a tied pair's two
  names); SGD without momentum has none;
- ``hpp_checkpoint.json``: model name and layer count, the step (the data position:
  batches are a function of the step), the optimizer's class, the LR scheduler's state
  (per-group lists stored once, so any number of parameter groups can load them),
  rank 0's torch RNG state (restored on every rank) and the caller's ``extra``.

Loading under another plan (other pipelines, stage boundaries, TP degrees, number of
ranks or hosts) is DCP's resharding: each rank asks for the names it holds, as
plain tensors or DTensor shards, and DCP reads the overlapping stored pieces.

Replicas: several pipelines hold the same parameter. On save, for each name exactly
one holder writes it: the holder (a plain rank, or a DTensor's whole TP group) with
the lowest rank, chosen from an ``all_gather_object`` of every rank's names, so
copies are never mixed (a TP-2 shard and a TP-1 full copy of one name would make
overlapping DCP chunks). On load every holder reads it.

Directory layout, metadata and durable writes: :mod:`hpp.runtime.checkpoint.store` (its
public names are this module's too): ``DIR/step-K`` with a ``complete`` marker written
last, so a checkpoint without it is never loaded.

Export (:func:`export_checkpoint`, in :mod:`hpp.runtime.checkpoint.export`; one process,
no process group): the model alone, full float32 tensors by global name, as a
``torch.save`` file or a safetensors file (the names are hpp's global names,
``layers.<l>.<path>``, NOT Hugging Face's).
``python -m hpp.runtime.checkpoint.export DIR OUT [--format safetensors]`` runs it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

from hpp.errors import HppInputError
from hpp.runtime.checkpoint.store import (CHECKPOINT_FORMAT, CHECKPOINT_VERSION, COMPLETE_MARKER, META_FILE,
                                          MODEL_PREFIX, OPTIM_PREFIX, dcp_io, fsync_dir, is_distributed,
                                          other_model_error, read_checkpoint_meta, resolve_checkpoint,
                                          step_dir,
                                          stored_entries, tmp_step_dir, write_synced)

__all__ = ["save_checkpoint", "load_checkpoint"]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- state dicts


def _param_names(module: nn.Module) -> dict[int, list[str]]:
    """``id(param)`` -> its global names (two for a tied pair held as one parameter)."""
    out: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), []).append(name)
    return out


def _optim_entries(module: nn.Module, optimizer: torch.optim.Optimizer | None
                   ) -> Iterator[tuple[str, torch.Tensor, dict[str, Any]]]:
    """``(name, param, state)`` for every name of every optimizer parameter (``state`` may be empty)."""
    if optimizer is None:
        return
    names = _param_names(module)
    for group in optimizer.param_groups:
        for p in group["params"]:
            for name in names.get(id(p), ()):
                yield name, p, optimizer.state.get(p, {})


def _global_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()``, whose names must be global (``layers.<l>.<path>``): plan-independent keys."""
    sd = dict(module.state_dict())
    bad = next((k for k in sd if not k.startswith("layers.")), None)
    if bad is not None:
        raise ValueError(f"checkpoint: parameter name {bad!r} is not global ('layers.<l>.<path>'); pass the "
                         "StageModule of hpp.runtime.models.stage, not a wrapper around it")
    return sd


def _holder(t: torch.Tensor, rank: int) -> tuple[int, ...]:
    """The ranks that jointly hold tensor ``t``: a DTensor's mesh, else this rank alone."""
    mesh = getattr(t, "device_mesh", None)
    return tuple(int(r) for r in mesh.mesh.flatten().tolist()) if mesh is not None else (rank,)


def _chosen_names(model_sd: Mapping[str, torch.Tensor], distributed: bool) -> set[str]:
    """Names this rank writes: for each name, the holder with the lowest rank among all ranks'."""
    if not distributed:
        return set(model_sd)
    rank = dist.get_rank()
    mine = {k: _holder(v, rank) for k, v in model_sd.items()}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    best: dict[str, tuple[int, ...]] = {}
    for holders in gathered:
        for k, h in holders.items():
            if k not in best or (min(h), h) < (min(best[k]), best[k]):
                best[k] = h
    return {k for k, h in mine.items() if best[k] == h}


def _rng_state() -> dict[str, str]:
    out = {"torch_cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch_cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return out


def _set_rng_state(state: Mapping[str, str]) -> None:
    def tensor(b64: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)
    if "torch_cpu" in state:
        torch.set_rng_state(tensor(state["torch_cpu"]))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensor(state["torch_cuda"]))


def _scheduler_state(scheduler: Any, num_groups: int) -> dict[str, Any]:
    """JSON-able scheduler state; per-group lists that hold one value are stored once (``per_group``)."""
    out: dict[str, Any] = {"per_group": []}
    for k, v in scheduler.state_dict().items():
        if isinstance(v, list) and len(v) == num_groups and v and all(x == v[0] for x in v):
            out[k] = v[0]
            out["per_group"].append(k)
        else:
            try:
                json.dumps(v)
            except TypeError:
                continue                         # e.g. LambdaLR's lambdas: rebuilt by the caller
            out[k] = v
    return out


def _load_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer | None, saved: Mapping[str, Any]) -> None:
    n = len(optimizer.param_groups) if optimizer is not None else 1
    state = scheduler.state_dict()
    for k, v in saved.items():
        if k != "per_group":
            state[k] = [v] * n if k in saved.get("per_group", ()) else v
    scheduler.load_state_dict(state)
    if optimizer is not None:                    # load_state_dict leaves the groups' lr at their initial value
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr


# ----------------------------------------------------------------------------- save


def _manifest(saved: Any, folder: Path, distributed: bool) -> dict[str, Any] | None:
    """The file list of the checkpoint just written to ``folder`` (size and SHA-256 of every tensor file DCP's
    metadata ``saved`` names, and of ``.metadata``; :func:`hpp.runtime.checkpoint.reader.file_manifest`) on rank 0,
    None elsewhere. The ranks hash a share of the files each (collective)."""
    from hpp.runtime.checkpoint.reader import DCP_METADATA_FILE, file_manifest
    names = sorted({info.relative_path for info in (saved.storage_data or {}).values()})
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    mine = file_manifest(folder, names[rank::world])
    parts: list[Any] = [None] * world
    if distributed:
        dist.all_gather_object(parts, mine)
    else:
        parts = [mine]
    if rank != 0:
        return None
    out = {k: v for part in parts for k, v in part.items()}
    out.update(file_manifest(folder, [DCP_METADATA_FILE]))
    return out


def save_checkpoint(root: str | Path, *, step: int, module: nn.Module, optimizer: torch.optim.Optimizer | None,
                    scheduler: Any = None, model_name: str, num_layers: int,
                    extra: Mapping[str, Any] | None = None) -> Path:
    """Write the checkpoint of ``step`` to ``root/step-<step>`` (collective over the world when initialised).

    Parameters
    ----------
    root : path
        The ``--save`` directory, on a file system every rank sees.
    step : int
        Steps done; the resumed run starts at this step (its data position).
    module : nn.Module
        This rank's stage (parameter names global, ``layers.<l>.<path>``; DTensors under TP).
    optimizer, scheduler : this rank's optimizer (over ``module``'s parameters) and LR scheduler, or None.
    model_name : str
        The runtime model's name, checked on load.
    num_layers : int
        The model's layer count, checked on load.
    extra : mapping, optional
        JSON-able data kept in the metadata (e.g. the seed, the global batch size).

    Returns
    -------
    Path
        ``root/step-<step>``, complete (marker written) when this returns on any rank.

    A checkpoint of the same step already there is replaced (the old one is moved
    aside first, so a crash leaves one of the two complete).
    """
    root = Path(root)
    distributed = is_distributed()
    rank = dist.get_rank() if distributed else 0
    tmp, final = tmp_step_dir(root, step), step_dir(root, step)
    t0 = time.perf_counter()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if distributed:
        dist.barrier()
    model_sd = _global_state(module)
    chosen = _chosen_names(model_sd, distributed)
    state: dict[str, Any] = {MODEL_PREFIX + k: v for k, v in model_sd.items() if k in chosen}
    for name, _p, st in _optim_entries(module, optimizer):
        if name in chosen:
            state.update({f"{OPTIM_PREFIX}{name}.{k}": v for k, v in st.items()})
    files = _manifest(dcp_io("save", state, tmp), tmp, distributed)
    if rank == 0:
        groups = len(optimizer.param_groups) if optimizer is not None else 1
        meta = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model": model_name,
                "num_layers": num_layers, "step": step,
                "optimizer": type(optimizer).__name__ if optimizer is not None else None,
                "scheduler": _scheduler_state(scheduler, groups) if scheduler is not None else None,
                "rng": _rng_state(), "extra": dict(extra or {}),
                "world_size": dist.get_world_size() if distributed else 1, "files": files,
                "torch_version": torch.__version__, "saved_unix_s": time.time()}
        write_synced(tmp / META_FILE, json.dumps(meta, indent=1) + "\n")
        old = root / f".old-step-{step}-{os.getpid()}"
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        write_synced(final / COMPLETE_MARKER, f"{step}\n")
        fsync_dir(root)
    if distributed:
        dist.barrier()
    logger.info("checkpoint of step %d saved to %s in %.2f s", step, final, time.perf_counter() - t0)
    return final


# ----------------------------------------------------------------------------- load


def _check_identity(meta: Mapping[str, Any], path: Path, model_name: str | None, num_layers: int | None,
                    optimizer: torch.optim.Optimizer | None) -> None:
    same_name = model_name is None or str(meta.get("model", "")).strip().lower() == model_name.strip().lower()
    if not same_name or (num_layers is not None and meta.get("num_layers") != num_layers):
        raise other_model_error(meta, str(path), model_name, num_layers)
    saved_opt = meta.get("optimizer")
    if optimizer is not None and saved_opt is not None and saved_opt != type(optimizer).__name__:
        raise HppInputError(f"checkpoint has {saved_opt} optimizer state, this run uses {type(optimizer).__name__}",
                            source=str(path), field="--optimizer",
                            fix=f"resume with --optimizer {saved_opt.lower()}")


def _placeholder(like: torch.Tensor, stored: Any, key: str) -> torch.Tensor:
    """A tensor to load ``key`` into: shaped like the parameter if the stored size matches, else as stored."""
    size = tuple(getattr(stored, "size", ()))
    if size == tuple(like.shape):
        return torch.zeros_like(like)
    if hasattr(stored, "properties"):
        return torch.zeros(size, dtype=stored.properties.dtype)
    raise HppInputError(f"checkpoint entry {key!r} is not a tensor", field="--resume",
                        fix="resume from a checkpoint written by hpp run --save")


def load_checkpoint(path: str | Path, *, module: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, model_name: str | None = None, num_layers: int | None = None,
                    restore_rng: bool = True) -> int:
    """Load the checkpoint ``path`` names into this rank's stage, optimizer and scheduler; return its step.

    Collective over the world when initialised. Works for any plan of the same model:
    each rank reads the names its ``module`` holds (resharded by DCP).

    Parameters
    ----------
    path : path
        A ``--save`` directory (its latest complete checkpoint) or one ``step-K`` folder.
    module, optimizer, scheduler : as for :func:`save_checkpoint`; a fresh optimizer
        (no state yet) is filled from the checkpoint.
    model_name, num_layers : checked against the checkpoint's when given.
    restore_rng : set torch's RNG state to rank 0's at save time.

    Returns
    -------
    int
        The saved step (the next step to run).

    Raises
    ------
    HppInputError
        A missing or incomplete checkpoint, one of another model (name or layer count),
        another optimizer, or a parameter the checkpoint lacks or stores with another shape.
    """
    p = resolve_checkpoint(path)
    meta = read_checkpoint_meta(p)
    _check_identity(meta, p, model_name, num_layers, optimizer)
    stored = stored_entries(p)
    model_sd = _global_state(module)
    state: dict[str, Any] = {}
    for k, v in model_sd.items():
        entry = stored.get(MODEL_PREFIX + k)
        if entry is None or tuple(getattr(entry, "size", ())) != tuple(v.shape):
            what = "lacks" if entry is None else f"stores {tuple(getattr(entry, 'size', ()))} for"
            raise HppInputError(f"checkpoint of {meta.get('model')!r} {what} parameter {k} {tuple(v.shape)}",
                                source=str(p), field="--resume",
                                fix="resume from a checkpoint of this model (same architecture and sizes)")
        state[MODEL_PREFIX + k] = v
    new_state: dict[int, dict[str, torch.Tensor]] = {}
    params: dict[int, torch.Tensor] = {}
    for name, param, _st in _optim_entries(module, optimizer):
        prefix = f"{OPTIM_PREFIX}{name}."
        for key in (k for k in stored if k.startswith(prefix) and "." not in k[len(prefix):]):
            t = _placeholder(param, stored[key], key)
            state[key] = t
            new_state.setdefault(id(param), {})[key[len(prefix):]] = t
            params[id(param)] = param
    dcp_io("load", state, p)
    with torch.no_grad():
        module.load_state_dict({k[len(MODEL_PREFIX):]: v for k, v in state.items() if k.startswith(MODEL_PREFIX)})
    if optimizer is not None:
        for pid, st in new_state.items():
            optimizer.state[params[pid]] = st
    if scheduler is not None and meta.get("scheduler") is not None:
        _load_scheduler(scheduler, optimizer, meta["scheduler"])
    if restore_rng:
        _set_rng_state(meta.get("rng", {}))
    logger.info("resumed step %d from %s", meta["step"], p)
    return int(meta["step"])
