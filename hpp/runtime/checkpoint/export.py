"""Export an hpp checkpoint's model for use outside hpp: one file of full tensors by global name, or a Hugging
Face model folder.

Runs in one process without a process group, from a complete checkpoint written by
:func:`hpp.runtime.checkpoint.dcp.save_checkpoint` under any plan: DCP reads every stored
piece of each ``model.<name>`` entry into one full tensor (optimizer state is left out).

- ``format="torch"``: ``torch.save`` of ``{name: tensor}``;
- ``format="safetensors"``: a safetensors file (metadata: model, step, naming).

- ``format="hf"`` (OPT, GPT-Neo and Llama models only): OUT is a folder that ``transformers`` loads with
  ``from_pretrained``: ``config.json`` (the model's shipped config) and safetensors by Hugging Face name,
  split into shards of at most ``--max-shard-size`` with ``model.safetensors.index.json``
  (:func:`hpp.runtime.models.hf_folder.write_hf_folder`); a tied head is stored once, as ``save_pretrained``
  stores it.

The names of the torch and safetensors formats are hpp's global names ``layers.<l>.<path>`` (the runtime's
layer modules), NOT Hugging Face's: a tied pair appears under both of its names.

    python -m hpp.runtime.checkpoint.export DIR OUT [--format torch|safetensors|hf] [--dtype D]
        [--max-shard-size 5GB] [--force]

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
from hpp.fileio import process_umask, write_atomic
from hpp.runtime.checkpoint.store import MODEL_PREFIX, read_checkpoint_meta, resolve_checkpoint, stored_entries

__all__ = ["EXPORT_FORMATS", "EXPORT_DTYPES", "export_checkpoint", "parse_size", "main"]

logger = logging.getLogger(__name__)

EXPORT_FORMATS = ("torch", "safetensors", "hf")
#: ``--dtype`` choices.
EXPORT_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}
#: ``--max-shard-size`` units (powers of 1000, as ``save_pretrained``'s ``max_shard_size``).
_SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}

#: The command's name in its usage and error lines.
PROG = "python -m hpp.runtime.checkpoint.export"


def export_checkpoint(path: str | Path, out_file: str | Path, *, format: str | None = None,
                      dtype: torch.dtype = torch.float32, force: bool = False, max_shard_bytes: int = 5 * 10**9
                      ) -> dict[str, tuple[int, ...]]:
    """Write the model of checkpoint ``path`` as one file of full tensors by global name, or as a Hugging Face
    folder (one process).

    Parameters
    ----------
    path : a ``--save`` directory or one ``step-K`` folder.
    out_file : path
        Written via a temporary file and a rename, with the mode ``open()`` would give a new file
        (``0o666`` less the process umask); its folder must exist.
    format : ``"torch"`` (``torch.save`` of ``{name: tensor}``), ``"safetensors"`` or ``"hf"`` (``out_file`` is
        then a folder, see the module docstring); None (default): from ``out_file``'s suffix
        (``.safetensors``: safetensors, else torch). The names of torch and safetensors are hpp's global
        names (``layers.<l>.<path>``), not Hugging Face's.
    dtype : torch.dtype
        Of every exported tensor (float32 by default).
    force : bool
        Replace an existing ``out_file`` (refused otherwise).
    max_shard_bytes : int
        ``"hf"``: the largest safetensors shard [bytes] (one tensor larger than that is a shard of its own).

    Returns
    -------
    dict
        ``{name: shape}`` of what was written (``"hf"``: by Hugging Face name).

    Raises
    ------
    HppInputError
        An unknown format, a missing / incomplete checkpoint (field ``DIR``), an existing
        ``out_file`` without ``force`` or a missing folder of it (field ``OUT``); ``"hf"`` of a model that is
        not a shipped OPT, GPT-Neo or Llama model (field ``--format``).
    """
    if format is None:
        format = "safetensors" if Path(out_file).suffix == ".safetensors" else "torch"
    if format not in EXPORT_FORMATS:
        raise HppInputError(f"unknown export format {format!r}", field="--format", fix=f"use one of {EXPORT_FORMATS}")
    out = Path(out_file)
    if format == "hf":
        return _export_hf(path, out, dtype=dtype, force=force, max_shard_bytes=max_shard_bytes)
    if out.is_dir():
        raise HppInputError(f"{out} is a folder", field="OUT", fix="give a file name, e.g. model.safetensors")
    if out.exists() and not force:
        raise HppInputError(f"{out} exists", field="OUT", fix="give another OUT, or --force to overwrite")
    if not out.parent.is_dir():
        raise HppInputError(f"no folder {out.parent} for {out.name}", field="OUT", fix="create the folder first")
    meta, tensors = _read_model(path, dtype)

    def write(tmp: Path) -> None:
        if format == "torch":
            torch.save(tensors, tmp)
        else:
            from safetensors.torch import save_file
            save_file(tensors, str(tmp), metadata={"format": "pt", "hpp_model": str(meta.get("model")),
                                                   "hpp_step": str(meta.get("step")),
                                                   "names": "hpp global names layers.<l>.<path>, not Hugging Face's"})
        os.chmod(tmp, 0o666 & ~process_umask())   # safetensors creates 0600: give what open() gives a new file
    write_atomic(out, write)               # no half-written file left behind
    logger.info("exported %d tensors of %s (step %s) to %s", len(tensors), meta.get("model"), meta.get("step"), out)
    return {k: tuple(v.shape) for k, v in tensors.items()}


def _export_hf(path: str | Path, out: Path, *, dtype: torch.dtype, force: bool, max_shard_bytes: int
               ) -> dict[str, tuple[int, ...]]:
    """``format="hf"`` of :func:`export_checkpoint`."""
    from hpp.runtime.models.hf import HFModel
    from hpp.runtime.models.hf_folder import hf_state_dict, write_hf_folder
    from hpp.runtime.models.zoo import load_runtime_model
    if out.exists() and not force:       # before reading the checkpoint: refused at once
        raise HppInputError(f"{out} exists", field="OUT", fix="give a new folder, or --force to replace that folder")
    meta, tensors = _read_model(path, dtype)
    name = str(meta.get("model"))
    try:
        model = load_runtime_model(name)
    except HppInputError:
        model = None
    if not isinstance(model, HFModel) or model.spec.num_layers != meta.get("num_layers"):
        raise HppInputError(f"the checkpoint's model {name!r} is not a shipped OPT, GPT-Neo or Llama model, so it has "
                            f"no Hugging Face names", field="--format",
                            fix="export it with --format safetensors (its state dict by hpp's global names)")
    state = hf_state_dict(model, tensors)
    write_hf_folder(model, state, out, dtype=dtype, max_shard_bytes=max_shard_bytes, force=force)
    logger.info("exported %d tensors of %s (step %s) to the folder %s", len(state), name, meta.get("step"), out)
    return {k: tuple(v.shape) for k, v in state.items()}


def _read_model(path: str | Path, dtype: torch.dtype) -> tuple[dict, dict[str, torch.Tensor]]:
    """The checkpoint's metadata and its model's full tensors by global name, cast to ``dtype``."""
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
    return meta, {k[len(MODEL_PREFIX):]: v.to(dtype).contiguous() for k, v in sorted(state.items())}


def parse_size(text: str) -> int:
    """``--max-shard-size``: bytes, or a number with KB / MB / GB / TB (powers of 1000) or KiB / MiB / GiB.

    >>> parse_size("5GB"), parse_size("200KiB"), parse_size("1000")
    (5000000000, 204800, 1000)

    Raises
    ------
    HppInputError
        Not such a size, or < 1 byte.
    """
    t = text.strip().upper().replace(" ", "")
    unit = next((u for u in sorted(_SIZE_UNITS, key=len, reverse=True) if t.endswith(u)), None)
    try:
        n = int(float(t[:-len(unit)]) * _SIZE_UNITS[unit]) if unit else int(t)
    except ValueError:
        n = 0
    if n < 1:
        raise HppInputError(f"--max-shard-size {text!r}", field="--max-shard-size",
                            fix="give bytes or a size such as 500MB or 5GB")
    return n



def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpp.runtime.checkpoint.export DIR OUT [--format torch|safetensors] [--force]``: export a checkpoint.

    Bad input: one line ``python -m hpp.runtime.checkpoint.export: error: ...`` on stderr, exit code 2.
    """
    parser = Parser(prog=PROG, description="export an hpp checkpoint's model to one file or a Hugging Face folder")
    parser.add_argument("checkpoint", type=Path, metavar="DIR",
                        help="a --save directory (its latest complete step) or a step-K")
    parser.add_argument("out", type=Path, metavar="OUT",
                        help="the file to write (.pt or .safetensors), or the folder (--format hf)")
    parser.add_argument("--format", choices=EXPORT_FORMATS,
                        help="default: safetensors for an OUT ending in .safetensors, else torch; hf: a Hugging Face "
                             "folder (config.json + safetensors) for from_pretrained (OPT, GPT-Neo, Llama)")
    parser.add_argument("--dtype", choices=tuple(EXPORT_DTYPES), default="float32",
                        help="dtype of the written tensors (default float32)")
    parser.add_argument("--max-shard-size", default="5GB",
                        help="--format hf: largest safetensors shard (default 5GB, as save_pretrained)")
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    args = parser.parse_args(argv)

    def export() -> int:
        shapes = export_checkpoint(args.checkpoint, args.out, format=args.format, force=args.force,
                                   dtype=EXPORT_DTYPES[args.dtype], max_shard_bytes=parse_size(args.max_shard_size))
        print(f"wrote {len(shapes)} tensors to {args.out}", file=sys.stderr)
        return 0

    return run_command(PROG, export)


if __name__ == "__main__":
    raise SystemExit(main())
