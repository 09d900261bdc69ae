"""``hpp run --weights DIR``: a Hugging Face model folder's tensors into a (TP-sharded) stage, slice by slice.

:func:`load_stage_weights` runs on every rank after its stage is built and sharded
(:func:`hpp.runtime.exec.tensor_parallel.parallelize_stage`). For each parameter the rank
holds it reads, from the folder's safetensors file that holds it
(:class:`hpp.runtime.models.hf_folder.WeightsFolder`), only the rank's own slice: a DTensor's
local shard is ``get_slice(name)[offsets : offsets + local shape]`` (offsets from
``compute_local_shape_and_global_offset``, the function DTensor itself shards with), a
replicated parameter the whole tensor. The slice is cast to the parameter's dtype (a
bfloat16 folder into a float64 run: cast up; float32 into bfloat16 mixed precision: the fp32
master weights) and copied into the parameter in place. A tied parameter held alone (the
head on the last stage) reads the token table, which is the one tensor the folder stores.

Memory: each file is opened (``safe_open``, memory-mapped) for one tensor and closed after
it, so what loading adds to a rank's resident memory at any moment is one tensor's mapped
pages (all of them for a slice along dimension 1 of a row-major tensor: its rows are
strided) plus the slice and its cast copy. :func:`load_stage_weights` first hands the
allocator's free pages back to the OS (:func:`release_free_memory`: the full layers that
sharding freed), then samples the resident set (``/proc/self/statm``) while each slice is
held and returns the largest growth over the resident set before loading, beside the bound
it must stay under (:func:`load_margin_bytes`).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import torch

from hpp.runtime.exec.tensor_parallel import local_tensor
from hpp.runtime.models.hf_folder import WeightsFolder
from hpp.runtime.models.stage import StageModule

__all__ = ["SLACK_BYTES", "release_free_memory", "rss_bytes", "local_slices", "load_margin_bytes", "load_stage_weights",
           "load_weights_folder"]

logger = logging.getLogger(__name__)

#: Allocator and interpreter slack allowed on top of one tensor while loading [bytes].
SLACK_BYTES = 16 * 2**20

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def release_free_memory() -> None:
    """Hand the C allocator's free pages back to the OS (glibc ``malloc_trim(0)``; nothing elsewhere).

    Called before loading: the stage's full layers, freed when TP sharding replaced them, would otherwise sit
    in the allocator's free lists, so the memory loading needs would reuse them unseen by the resident set.
    """
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass


def rss_bytes() -> int:
    """This process's resident set size [bytes] now (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def local_slices(p: torch.Tensor) -> tuple[slice, ...]:
    """The index of this rank's part of parameter ``p`` in the full tensor (all of it unless ``p`` is a DTensor)."""
    from torch.distributed.tensor import DTensor
    if isinstance(p, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        return tuple(slice(o, o + n) for o, n in zip(offset, shape))
    return tuple(slice(0, n) for n in p.shape)


def _source_name(model, name: str) -> str:
    """The folder's tensor name for hpp global parameter ``name`` (a tied second name reads the first's)."""
    first = {b: a for a, b in model.tied_parameters()}.get(name, name)
    return model.hf_name(first)


def load_margin_bytes(folder: WeightsFolder, module: StageModule, model) -> int:
    """The most :func:`load_stage_weights` may add to the resident set [bytes]: the most file bytes one tensor's
    read maps (a slice along dimension 0 maps its rows only; any other slice, the whole tensor as stored), plus
    twice the largest local part (the slice and its cast copy, at the larger of the stored and the run's dtype),
    plus :data:`SLACK_BYTES`."""
    mapped = part = 0
    for _l, name, p in module.layer_parameters():
        src = _source_name(model, name)
        size = _DTYPE_BYTES.get(folder.dtypes[src], 8)
        shape = folder.shapes[src]
        lt = local_tensor(p)
        rows_only = tuple(lt.shape[1:]) == tuple(shape[1:])
        mapped = max(mapped, (lt.numel() if rows_only else math.prod(shape)) * size)
        part = max(part, lt.numel() * max(lt.element_size(), size))
    return mapped + 2 * part + SLACK_BYTES


def load_stage_weights(module: StageModule, model, folder: WeightsFolder) -> dict[str, Any]:
    """Copy this rank's part of every parameter of ``module`` from ``folder`` (see the module docstring).

    Parameters
    ----------
    module : StageModule
        The rank's stage, TP-sharded or not; parameters are overwritten in place.
    model : hpp.runtime.models.hf.HFModel
        Its ``hf_name`` and ``tied_parameters`` name the tensors.
    folder : WeightsFolder
        Checked against ``model`` (:func:`hpp.runtime.models.hf_folder.check_weights_match`).

    Returns
    -------
    dict
        ``tensors`` (count), ``bytes`` (the rank's loaded parameters in the run's dtype: its shard),
        ``read_bytes`` (the slices' bytes as stored), ``rss_before_bytes``, ``peak_rss_growth_bytes``
        (the largest sampled growth of the resident set while loading) and ``margin_bytes``
        (:func:`load_margin_bytes`, the bound on that growth).

    Raises
    ------
    KeyError
        A parameter the folder does not hold (an unchecked folder: an internal error).
    """
    from safetensors import safe_open
    release_free_memory()
    before = rss_bytes()
    peak = tensors = loaded = read = 0
    for _l, name, p in module.layer_parameters():
        src = _source_name(model, name)
        local = local_tensor(p)
        index = local_slices(p)
        with safe_open(str(folder.file_of(src)), framework="pt") as f:
            piece = f.get_slice(src)[index]
            value = piece.to(local.dtype)
            if tuple(value.shape) != tuple(local.shape):
                raise AssertionError(f"{name}: slice {tuple(value.shape)} of {src}, local shard {tuple(local.shape)}")
            with torch.no_grad():
                local.copy_(value)
            read += piece.numel() * piece.element_size()
            peak = max(peak, rss_bytes() - before)     # the slice, its copy and the file pages read: all held
            del piece, value
        tensors += 1
        loaded += local.numel() * local.element_size()
    stats = {"tensors": tensors, "bytes": loaded, "read_bytes": read, "rss_before_bytes": before,
             "peak_rss_growth_bytes": max(0, peak), "margin_bytes": load_margin_bytes(folder, module, model)}
    logger.info("loaded %d tensors (%d bytes) from %s", tensors, loaded, folder.path)
    return stats


def load_weights_folder(module: StageModule, model, path: str | os.PathLike) -> dict[str, Any]:
    """:func:`load_stage_weights` from the folder ``path`` (opened here, headers only; checked by ``hpp run`` before
    any rank started)."""
    from hpp.runtime.models.hf_folder import open_weights_folder
    return load_stage_weights(module, model, open_weights_folder(path))
