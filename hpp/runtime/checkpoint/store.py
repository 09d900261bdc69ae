"""The on-disk side of a checkpoint (:mod:`hpp.runtime.checkpoint.dcp`): names, directories, metadata, durable writes.

Directory layout (``DIR`` is on a file system every rank sees)::

    DIR/.tmp-step-K/   written by all ranks (DCP files, then the JSON)
    DIR/step-K/        after the rename, by rank 0
    DIR/step-K/complete  written last: a checkpoint without it is never loaded

Stored keys: ``model.<name>`` (:data:`MODEL_PREFIX`) and ``optim.<name>.<state>``
(:data:`OPTIM_PREFIX`), ``<name>`` a global parameter name; the metadata
``hpp_checkpoint.json`` (:data:`META_FILE`) carries :data:`CHECKPOINT_FORMAT` and
:data:`CHECKPOINT_VERSION`.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch.distributed as dist

from hpp.errors import HppInputError

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "META_FILE", "COMPLETE_MARKER", "MODEL_PREFIX", "OPTIM_PREFIX",
           "step_dir", "tmp_step_dir", "complete_checkpoints", "latest_checkpoint", "other_model_error", "resolve_checkpoint", "read_checkpoint_meta",
           "stored_entries", "is_distributed", "dcp_io", "write_synced", "fsync_dir"]

CHECKPOINT_FORMAT = "hpp-checkpoint"
CHECKPOINT_VERSION = 1
META_FILE = "hpp_checkpoint.json"
COMPLETE_MARKER = "complete"
_STEP, _TMP = "step-", ".tmp-step-"
MODEL_PREFIX, OPTIM_PREFIX = "model.", "optim."


# ----------------------------------------------------------------------------- directories


def step_dir(root: str | Path, step: int) -> Path:
    """``root/step-<step>``: where :func:`save_checkpoint` puts the checkpoint of ``step``."""
    return Path(root) / f"{_STEP}{step}"


def tmp_step_dir(root: str | Path, step: int) -> Path:
    """``root/.tmp-step-<step>``: where every rank writes the checkpoint of ``step`` before the rename."""
    return Path(root) / f"{_TMP}{step}"


def _is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file() and (path / META_FILE).is_file()


def _steps(root: Path) -> Iterator[tuple[int, Path]]:
    if root.is_dir():
        for child in root.iterdir():
            tail = child.name[len(_STEP):]
            if child.name.startswith(_STEP) and tail.isdigit() and child.is_dir():
                yield int(tail), child


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(K, root/step-K)`` of every complete checkpoint under ``root`` (with its marker), by step; [] if none."""
    return sorted((k, p) for k, p in _steps(Path(root)) if _is_complete(p))


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint of the highest step under ``root`` (``root/step-K`` with its marker), or None."""
    done = complete_checkpoints(root)
    return done[-1][1] if done else None


def other_model_error(meta: Mapping[str, Any], source: str, model_name: str | None,
                      num_layers: int | None) -> HppInputError:
    """The error of resuming checkpoint ``meta`` (at ``source``) into another model (name, layer count)."""
    return HppInputError(f"checkpoint of model {meta.get('model')!r} ({meta.get('num_layers')} layers), not of "
                         f"{model_name!r} ({num_layers} layers)", source=source, field="--resume",
                         fix=f"resume from a checkpoint of {model_name}, or resume this one with a plan of "
                             f"{meta.get('model')} (hpp plan --model {meta.get('model')} ...)")


def resolve_checkpoint(path: str | Path) -> Path:
    """The complete checkpoint ``path`` names: a ``step-K`` directory, or a root holding some.

    Raises
    ------
    HppInputError
        ``path`` is missing, is an incomplete checkpoint, or holds no complete one
        (names the directory, the incomplete ones found and the fix).
    """
    p = Path(path)
    if not p.exists():
        raise HppInputError("no such checkpoint directory", source=str(p), field="--resume",
                            fix="give the --save directory of an earlier run (or one of its step-K folders)")
    if (p / META_FILE).exists() or (p / ".metadata").exists() or p.name.startswith((_STEP, _TMP)):
        if _is_complete(p):
            return p
        raise HppInputError(f"incomplete checkpoint (no '{COMPLETE_MARKER}' marker: the save did not finish)",
                            source=str(p), field="--resume",
                            fix=f"resume from the last complete one, {latest_checkpoint(p.parent) or 'none found'}")
    found = latest_checkpoint(p)
    if found is None:
        partial = sorted(c.name for c in p.iterdir() if c.name.startswith((_STEP, _TMP)))
        what = f"only incomplete ones ({', '.join(partial[:4])})" if partial else "none"
        raise HppInputError(f"no complete checkpoint in this directory: {what}", source=str(p), field="--resume",
                            fix="give the --save directory of a run that saved at least once")
    return found


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """The JSON metadata of the complete checkpoint ``path`` names (:func:`resolve_checkpoint`).

    Raises
    ------
    HppInputError
        Not a complete checkpoint, or metadata of another format or version.
    """
    p = resolve_checkpoint(path)
    try:
        meta = json.loads((p / META_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HppInputError(f"unreadable {META_FILE} ({exc})", source=str(p), field="--resume",
                            fix="resume from another checkpoint") from None
    if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
        raise HppInputError(f"not an {CHECKPOINT_FORMAT} v{CHECKPOINT_VERSION} checkpoint "
                            f"(format {meta.get('format')!r}, version {meta.get('version')!r})", source=str(p),
                            field="--resume", fix="resume from a checkpoint written by this hpp version")
    meta["path"] = str(p)
    return meta


# ----------------------------------------------------------------------------- reading and writing


def stored_entries(path: Path) -> Mapping[str, Any]:
    """DCP's metadata of each stored key (``TensorStorageMetadata``: size, dtype, chunks) of checkpoint ``path``,
    read with only DCP's metadata classes admitted (:func:`hpp.runtime.checkpoint.reader.read_dcp_metadata`).

    Raises
    ------
    HppInputError
        A damaged ``.metadata`` or one that names anything else (naming the file).
    """
    from hpp.runtime.checkpoint.reader import DCP_METADATA_FILE, read_dcp_metadata   # lazy: torch DCP, 2-3.5 s
    return read_dcp_metadata(Path(path) / DCP_METADATA_FILE).state_dict_metadata


def is_distributed() -> bool:
    """A process group is up (save and load are then collective)."""
    return dist.is_available() and dist.is_initialized()


def dcp_io(op: str, state: dict[str, Any], path: Path) -> Any:
    """``dcp.save`` / ``dcp.load`` of ``state`` at ``path``; in one process when no process group is up. Loads
    read through :class:`hpp.runtime.checkpoint.reader.CheckedFileSystemReader` (no code from the checkpoint runs;
    a damaged file is named). Returns ``dcp.save``'s global ``Metadata`` (every rank's), None for a load."""
    import torch.distributed.checkpoint as dcp   # here, not on top: 2-3.5 s to import (-X importtime)
    from hpp.runtime.checkpoint.reader import CheckedFileSystemReader
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        if op == "save":
            return dcp.save(state, storage_writer=dcp.FileSystemWriter(path), no_dist=not is_distributed())
        try:
            dcp.load(state, storage_reader=CheckedFileSystemReader(path), no_dist=not is_distributed())
        except dcp.api.CheckpointException as exc:    # DCP wraps every rank's error: surface the reader's one line
            inner = next((e for e, _trace in exc.failures.values() if isinstance(e, HppInputError)), None)
            if inner is None:
                raise
            raise inner from None
        return None


def write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` and fsync it (durable before the next step of a save)."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """fsync directory ``path`` (its renames durable); a file system that refuses is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
