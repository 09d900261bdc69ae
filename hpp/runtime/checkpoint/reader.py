"""Reading a checkpoint that may come from someone else, or may be damaged: no code runs, and a bad file is named.

A checkpoint folder (:mod:`hpp.runtime.checkpoint.store`) holds three kinds of files:

- ``hpp_checkpoint.json``: JSON (:func:`~hpp.runtime.checkpoint.store.read_checkpoint_meta`);
- DCP's ``.metadata``: torch writes it with ``pickle.dump`` and its ``FileSystemReader`` reads it with plain
  ``pickle.load``, which runs whatever callable the file names. :func:`read_dcp_metadata` reads it through a
  restricted unpickler (Python's "Restricting Globals" recipe, ``pickle.Unpickler.find_class``) that admits
  only the classes DCP's metadata is made of (:data:`ALLOWED_GLOBALS`) and refuses anything else, and then
  refuses metadata that declares a byte entry (``BytesStorageMetadata``: DCP reads those with
  ``torch.load(weights_only=False)``, a second way to run code; hpp writes tensors only);
- the tensor files (``*.distcp``): DCP reads each tensor with ``torch.load(weights_only=True)``; reading them
  through :class:`CheckedFileSystemReader` keeps it so (a BYTE_IO read is refused) and names the file a read
  fails on.

:class:`CheckedFileSystemReader` is DCP's ``FileSystemReader`` with those two methods replaced; every read of
hpp (``hpp run --resume``, the checkpoint's entries, export) goes through it.

Damage: :func:`file_manifest` records each file's size and SHA-256 at save time (into ``hpp_checkpoint.json``,
``files``) and :func:`check_files` compares them before any rank starts, so that a truncated or altered shard is
one line naming the file. The manifest detects damage, not malice: whoever can change a shard can change the
manifest too (what a checkpoint is trusted for: docs/RUNTIME.md, "Checkpoints").
"""

from __future__ import annotations

import hashlib
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan

from hpp.errors import HppInputError

__all__ = ["ALLOWED_GLOBALS", "DCP_METADATA_FILE", "read_dcp_metadata", "CheckedFileSystemReader", "file_manifest",
           "check_files"]

#: DCP's metadata file in a checkpoint folder (``torch.distributed.checkpoint.filesystem._metadata_fn``).
DCP_METADATA_FILE = ".metadata"

_DCP_METADATA = "torch.distributed.checkpoint.metadata"

#: (module, name) of every global DCP's metadata pickle may name: the metadata dataclasses, the file storage
#: record, ``torch.Size``, ``pathlib`` paths (``StorageMeta.checkpoint_id``) and the layout lookup that torch's
#: own ``weights_only`` loader admits too (``torch.serialization._get_layout``, a dict lookup by name). dtypes
#: (``torch.float32`` ...) are admitted by type in :meth:`_MetadataUnpickler.find_class`.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    *((_DCP_METADATA, n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                   "TensorStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING",
                                   "BytesStorageMetadata")),    # built (an empty dataclass), then refused by name
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
})

#: Bytes read at a time when hashing a file.
_CHUNK_BYTES = 1 << 24


class _RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global outside :data:`ALLOWED_GLOBALS`."""


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose globals are :data:`ALLOWED_GLOBALS` and torch's dtypes; anything else raises."""

    def find_class(self, module: str, name: str) -> Any:
        import torch
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) not in ALLOWED_GLOBALS:
            raise _RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


def read_dcp_metadata(path: str | os.PathLike, *, source: str | None = None) -> Metadata:
    """DCP's ``Metadata`` from the file ``path``, unpickled with only DCP's metadata classes admitted.

    Parameters
    ----------
    path : the ``.metadata`` file.
    source : what to name in an error (default: ``path``).

    Raises
    ------
    HppInputError
        The file is missing, unreadable, damaged (not a whole pickle), names a global outside
        :data:`ALLOWED_GLOBALS` (nothing it names is called: the refusal comes before), is not DCP metadata, or
        declares a byte entry (read by DCP with ``torch.load(weights_only=False)``).
    """
    where = source or str(path)
    fix_damaged = "resume from another checkpoint (this file is damaged or was not written by hpp run --save)"
    try:
        with open(path, "rb") as f:
            md = _MetadataUnpickler(f).load()
    except _RefusedGlobal as exc:
        raise HppInputError(f"refused to read DCP metadata that names {exc.args[0]} (only DCP's metadata classes "
                            f"are loaded from a checkpoint: reading it could run code)", source=where,
                            field="--resume", fix="resume only from checkpoints written by hpp run --save") from None
    except OSError as exc:
        raise HppInputError(f"cannot read DCP metadata ({exc.strerror})", source=where, field="--resume",
                            fix=fix_damaged) from None
    except Exception as exc:          # noqa: BLE001 -- a damaged pickle raises many types (EOFError, ValueError, ...)
        raise HppInputError(f"damaged DCP metadata ({type(exc).__name__}: {exc})".replace("\n", " "), source=where,
                            field="--resume", fix=fix_damaged) from None
    if not isinstance(md, Metadata) or not isinstance(getattr(md, "state_dict_metadata", None), dict):
        raise HppInputError(f"not DCP metadata (a {type(md).__name__})", source=where, field="--resume",
                            fix=fix_damaged)
    byte_keys = [k for k, v in md.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
    if byte_keys:
        raise HppInputError(f"DCP metadata declares {len(byte_keys)} byte entr{'y' if len(byte_keys) == 1 else 'ies'} "
                            f"(e.g. {byte_keys[0]!r}), which DCP would load with torch.load(weights_only=False); hpp "
                            f"checkpoints hold tensors only", source=where, field="--resume",
                            fix="resume only from checkpoints written by hpp run --save")
    outside = next((str(getattr(v, "relative_path", v)) for v in (md.storage_data or {}).values()
                    if Path(str(getattr(v, "relative_path", ""))).name != str(getattr(v, "relative_path", ""))
                    or not str(getattr(v, "relative_path", ""))), None)
    if outside is not None:
        raise HppInputError(f"DCP metadata points at {outside!r}, which is not a file of the checkpoint's folder",
                            source=where, field="--resume", fix="resume only from checkpoints written by hpp run --save")
    return md


class CheckedFileSystemReader(FileSystemReader):
    """DCP's ``FileSystemReader`` that reads ``.metadata`` with :func:`read_dcp_metadata`, refuses byte reads (the
    tensors load with ``weights_only=True`` only) and names the file a read fails on (:class:`HppInputError`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        md = read_dcp_metadata(path)
        if getattr(md, "storage_meta", None) is None:     # as FileSystemReader.read_metadata does
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def read_data(self, plan: LoadPlan, planner: Any) -> Any:
        by_file: dict[str, list[Any]] = {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                raise HppInputError(f"checkpoint entry {item.storage_index.fqn!r} is stored as bytes (DCP would load "
                                    f"it with torch.load(weights_only=False))", source=str(self.path),
                                    field="--resume", fix="resume only from checkpoints written by hpp run --save")
            by_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        fut = None
        for name, items in by_file.items():
            try:
                fut = super().read_data(LoadPlan(items=items, storage_data=plan.storage_data,
                                                 planner_data=plan.planner_data), planner)
            except HppInputError:
                raise
            except Exception as exc:  # noqa: BLE001 -- torch.load of a damaged file raises many types
                first = (str(exc).splitlines() or ["no message"])[0]
                first = first if len(first) <= 120 else first[:first.find(":", 0, 120) + 1 or 117] + "..."
                raise HppInputError(f"cannot read this checkpoint file ({type(exc).__name__}: {first})",
                                    source=str(Path(self.path) / name), field="--resume",
                                    fix="resume from another checkpoint (this file is damaged)") from None
        return fut if fut is not None else super().read_data(plan, planner)


def _digest(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


def file_manifest(folder: str | os.PathLike, names: Iterable[str], *, workers: int | None = None
                  ) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes": size, "sha256": hex digest}}`` of the files ``names`` in ``folder`` (hashed in
    ``workers`` threads: hashlib releases the GIL on large buffers; about 1 s per GB and thread on this project's
    host).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (Path(d) / "a").write_bytes(b"abc")
    ...     got = file_manifest(d, ["a"])["a"]
    >>> got["sha256"][:12], got["bytes"]
    ('ba7816bf8f01', 3)
    """
    root = Path(folder)
    names = sorted(set(names))
    with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(names, pool.map(lambda n: _digest(root / n), names)))


def check_files(folder: str | os.PathLike, manifest: Mapping[str, Mapping[str, Any]], *,
                workers: int | None = None) -> None:
    """Refuse a checkpoint folder whose files differ from the ``manifest`` saved with it (:func:`file_manifest`):
    a file missing, of another size, or of another SHA-256.

    Raises
    ------
    HppInputError
        Naming the first such file, what differs and the fix.
    """
    root = Path(folder)
    fix = "resume from another checkpoint (this one was damaged after it was saved)"
    for name, want in sorted(manifest.items()):
        if Path(name).name != name:
            raise HppInputError(f"the checkpoint's file list names {name!r}, which is not a file of its folder",
                                source=str(root / "hpp_checkpoint.json"), field="files",
                                fix="resume only from checkpoints written by hpp run --save")
        p = root / name
        if not p.is_file():
            raise HppInputError("checkpoint file missing", source=str(p), field="--resume", fix=fix)
        size = p.stat().st_size
        if size != want.get("bytes"):
            raise HppInputError(f"checkpoint file of {size} bytes, saved with {want.get('bytes')}", source=str(p),
                                field="--resume", fix=fix)
    got = file_manifest(root, manifest, workers=workers)
    for name, want in sorted(manifest.items()):
        if got[name]["sha256"] != want.get("sha256"):
            raise HppInputError("checkpoint file damaged: its SHA-256 differs from the one saved with it",
                                source=str(root / name), field="--resume", fix=fix)
