"""Export an hpp checkpoint's model for use outside hpp: one file of full tensors by global name.

Runs in one process without a process group, from a complete checkpoint written by
:func:`hpp.runtime.checkpoint.dcp.save_checkpoint` under any plan: DCP reads every stored
piece of each ``model.<name>`` entry into one full tensor (optimizer state is left out).

- ``format="torch"``: ``torch.save`` of ``{name: tensor}``;
- ``format="safetensors"``: a safetensors file (metadata: model, step, naming).

The names are hpp's global names ``layers.<l>.<path>`` (the runtime's layer modules),
NOT Hugging Face's: a tied pair appears under both of its names.

    python -m hpp.runtime.checkpoint.export DIR OUT [--format torch|safetensors] [--force]

(``--format`` defaults to OUT's suffix: ``.safetensors`` writes safetensors, anything else torch.)

An existing OUT is refused unless ``--force``; OUT gets the mode ``open()`` would give a new
file (``0o666`` less the umask). Bad input is one line ``python -m hpp.runtime.checkpoint.export:
error: ...`` on stderr, exit code 2 (:func:`hpp.cliparse.run_command`).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Sequence

import torch

from hpp.cliparse import Parser, run_command
from hpp.errors import HppInputError
from hpp.fileio import write_atomic
from hpp.runtime.checkpoint.store import MODEL_PREFIX, read_checkpoint_meta, resolve_checkpoint, stored_entries

__all__ = ["EXPORT_FORMATS", "export_checkpoint", "main"]

logger = logging.getLogger(__name__)

EXPORT_FORMATS = ("torch", "safetensors")

#: The command's name in its usage and error lines.
PROG = "python -m hpp.runtime.checkpoint.export"


def export_checkpoint(path: str | Path, out_file: str | Path, *, format: str | None = None,
                      dtype: torch.dtype = torch.float32, force: bool = False) -> dict[str, tuple[int, ...]]:
    """Write the model of checkpoint ``path`` as one file of full tensors by global name (one process).

    Parameters
    ----------
    path : a ``--save`` directory or one ``step-K`` folder.
    out_file : path
        Written via a temporary file and a rename, with the mode ``open()`` would give a new file
        (``0o666`` less the process umask); its folder must exist.
    format : ``"torch"`` (``torch.save`` of ``{name: tensor}``) or ``"safetensors"``; None (default): from
        ``out_file``'s suffix (``.safetensors``: safetensors, else torch).
        The names are hpp's global names (``layers.<l>.<path>``), not Hugging Face's.
    dtype : torch.dtype
        Of every exported tensor (float32 by default).
    force : bool
        Replace an existing ``out_file`` (refused otherwise).

    Returns
    -------
    dict
        ``{name: shape}`` of what was written.

    Raises
    ------
    HppInputError
        An unknown format, a missing / incomplete checkpoint (field ``DIR``), an existing
        ``out_file`` without ``force`` or a missing folder of it (field ``OUT``).
    """
    if format is None:
        format = "safetensors" if Path(out_file).suffix == ".safetensors" else "torch"
    if format not in EXPORT_FORMATS:
        raise HppInputError(f"unknown export format {format!r}", field="--format", fix=f"use one of {EXPORT_FORMATS}")
    out = Path(out_file)
    if out.is_dir():
        raise HppInputError(f"{out} is a folder", field="OUT", fix="give a file name, e.g. model.safetensors")
    if out.exists() and not force:
        raise HppInputError(f"{out} exists", field="OUT", fix="give another OUT, or --force to overwrite")
    if not out.parent.is_dir():
        raise HppInputError(f"no folder {out.parent} for {out.name}", field="OUT", fix="create the folder first")
    try:
        p = resolve_checkpoint(path)
        meta = read_checkpoint_meta(p)
    except HppInputError as exc:   # its field is hpp run's --resume: name this command's argument
        raise HppInputError(exc.message, source=exc.source, field="DIR",
                            fix=(exc.fix or "").replace("resume from the", "give the") or None) from None
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for k, m in stored_entries(p).items() if k.startswith(MODEL_PREFIX)}
    import torch.distributed.checkpoint as dcp   # here, not on top: 2-3.5 s to import (-X importtime)
    from hpp.runtime.checkpoint.reader import CheckedFileSystemReader, check_files
    if meta.get("files"):
        check_files(p, meta["files"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=CheckedFileSystemReader(p), no_dist=True)   # one process, even inside a group
    tensors = {k[len(MODEL_PREFIX):]: v.to(dtype).contiguous() for k, v in sorted(state.items())}

    def write(tmp: Path) -> None:
        if format == "torch":
            torch.save(tensors, tmp)
        else:
            from safetensors.torch import save_file
            save_file(tensors, str(tmp), metadata={"format": "pt", "hpp_model": str(meta.get("model")),
                                                   "hpp_step": str(meta.get("step")),
                                                   "names": "hpp global names layers.<l>.<path>, not Hugging Face's"})
        os.chmod(tmp, 0o666 & ~_umask())   # safetensors creates 0600: give what open() gives a new file
    write_atomic(out, write)               # no half-written file left behind
    logger.info("exported %d tensors of %s (step %s) to %s", len(tensors), meta.get("model"), meta.get("step"), out)
    return {k: tuple(v.shape) for k, v in tensors.items()}


def _umask() -> int:
    """The process umask (read by setting it and setting it back)."""
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpp.runtime.checkpoint.export DIR OUT [--format torch|safetensors] [--force]``: export a checkpoint.

    Bad input: one line ``python -m hpp.runtime.checkpoint.export: error: ...`` on stderr, exit code 2.
    """
    parser = Parser(prog=PROG, description="export an hpp checkpoint's model to one file")
    parser.add_argument("checkpoint", type=Path, metavar="DIR",
                        help="a --save directory (its latest complete step) or a step-K")
    parser.add_argument("out", type=Path, metavar="OUT", help="the file to write (.pt or .safetensors)")
    parser.add_argument("--format", choices=EXPORT_FORMATS,
                        help="default: safetensors for an OUT ending in .safetensors, else torch")
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    args = parser.parse_args(argv)

    def export() -> int:
        shapes = export_checkpoint(args.checkpoint, args.out, format=args.format, force=args.force)
        print(f"wrote {len(shapes)} tensors to {args.out}", file=sys.stderr)
        return 0

    return run_command(PROG, export)


if __name__ == "__main__":
    raise SystemExit(main())
