"""Export an hpp checkpoint's model for use outside hpp: one file of full tensors by global name.

Runs in one process without a process group, from a complete checkpoint written by
:func:`hpp.runtime.checkpoint.save_checkpoint` under any plan: DCP reads every stored
piece of each ``model.<name>`` entry into one full tensor (optimizer state is left out).

- ``format="torch"``: ``torch.save`` of ``{name: tensor}``;
- ``format="safetensors"``: a safetensors file (metadata: model, step, naming).

The names are hpp's global names ``layers.<l>.<path>`` (the runtime's layer modules),
NOT Hugging Face's: a tied pair appears under both of its names.

    python -m hpp.runtime.checkpoint_export DIR OUT [--format torch|safetensors]
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path
from typing import Sequence

import torch

from hpp.errors import HppInputError
from hpp.runtime.checkpoint_store import MODEL_PREFIX, read_checkpoint_meta, resolve_checkpoint, stored_entries

__all__ = ["EXPORT_FORMATS", "export_checkpoint", "main"]

logger = logging.getLogger(__name__)

EXPORT_FORMATS = ("torch", "safetensors")


def export_checkpoint(path: str | Path, out_file: str | Path, *, format: str = "torch",
                      dtype: torch.dtype = torch.float32) -> dict[str, tuple[int, ...]]:
    """Write the model of checkpoint ``path`` as one file of full tensors by global name (one process).

    Parameters
    ----------
    path : a ``--save`` directory or one ``step-K`` folder.
    out_file : path
        Written via a temporary file and a rename.
    format : ``"torch"`` (``torch.save`` of ``{name: tensor}``) or ``"safetensors"``.
        The names are hpp's global names (``layers.<l>.<path>``), not Hugging Face's.
    dtype : torch.dtype
        Of every exported tensor (float32 by default).

    Returns
    -------
    dict
        ``{name: shape}`` of what was written.

    Raises
    ------
    HppInputError
        An unknown format, or a missing / incomplete checkpoint.
    """
    if format not in EXPORT_FORMATS:
        raise HppInputError(f"unknown export format {format!r}", field="--format", fix=f"use one of {EXPORT_FORMATS}")
    p = resolve_checkpoint(path)
    meta = read_checkpoint_meta(p)
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for k, m in stored_entries(p).items() if k.startswith(MODEL_PREFIX)}
    import torch.distributed.checkpoint as dcp   # here, not on top: 2-3.5 s to import (-X importtime)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=dcp.FileSystemReader(p), no_dist=True)   # one process, even inside a group
    tensors = {k[len(MODEL_PREFIX):]: v.to(dtype).contiguous() for k, v in sorted(state.items())}
    out = Path(out_file)
    tmp = out.with_name(out.name + ".tmp")
    if format == "torch":
        torch.save(tensors, tmp)
    else:
        from safetensors.torch import save_file
        save_file(tensors, str(tmp), metadata={"format": "pt", "hpp_model": str(meta.get("model")),
                                               "hpp_step": str(meta.get("step")),
                                               "names": "hpp global names layers.<l>.<path>, not Hugging Face's"})
    tmp.replace(out)
    logger.info("exported %d tensors of %s (step %s) to %s", len(tensors), meta.get("model"), meta.get("step"), out)
    return {k: tuple(v.shape) for k, v in tensors.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpp.runtime.checkpoint_export DIR OUT [--format torch|safetensors]``: export a checkpoint."""
    parser = argparse.ArgumentParser(prog="python -m hpp.runtime.checkpoint_export",
                                     description="export an hpp checkpoint's model to one file")
    parser.add_argument("checkpoint", type=Path, help="a --save directory (its latest complete step) or a step-K")
    parser.add_argument("out", type=Path)
    parser.add_argument("--format", choices=EXPORT_FORMATS, default="torch")
    args = parser.parse_args(argv)
    try:
        shapes = export_checkpoint(args.checkpoint, args.out, format=args.format)
    except HppInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(shapes)} tensors to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
