"""Global batches for ``hpp run``: synthetic tokens (default) or a local token file (``--data FILE``).

Every rank builds the same :class:`BatchSource` and draws the same global batch of a
step, then keeps its pipeline's slice; the single-device reference of ``--verify``
draws the same batches too.

Files (``--data FILE``, described by :func:`data_spec`):

- ``*.txt`` (any other suffix than ``.npy`` too): bytes, tokenised byte-level
  (byte ``v`` -> token id ``v``, ids 0-255), so the model's vocabulary must hold at
  least 256 ids (refused otherwise: taking ids modulo the vocabulary would train on
  a different text than the file's).
- ``*.npy`` of integer token ids, either 1-D (a token stream, like the text file) or
  2-D ``(num_samples, seq_len + 1)`` (one sample per row, already cut; negative
  entries are padding: input token 0, target :data:`IGNORE_INDEX`).

A stream of ``N`` tokens holds ``W = (N - 1) // seq_len`` windows of ``seq_len + 1``
tokens with stride ``seq_len`` (each token after the first is a target exactly once,
as in Megatron's GPT dataset); a 2-D file holds one window per row. Sample ``i`` of
step ``k`` is window ``(k * G + i) mod W``: a fixed order, the same in every rank and
in every run. A file with fewer than ``G`` windows cannot fill one global batch and
is refused; one with fewer than ``steps * G`` wraps around
(:meth:`BatchSource.wraps` says so and ``hpp run`` prints a note).

The loss of padded data is right because the worker divides the summed loss by the
count of targets that are not :data:`IGNORE_INDEX` in the whole global batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from hpp.errors import HppInputError
from hpp.runtime.models.api import IGNORE_INDEX, RuntimeModel, synthetic_batch

__all__ = ["BatchSource", "make_batch_source", "data_spec", "BYTE_VOCAB_SIZE"]

#: Token ids of the byte-level tokenizer: one per byte value.
BYTE_VOCAB_SIZE = 256


def data_spec(path: str | Path) -> dict[str, Any]:
    """The JSON-able description of ``--data FILE`` that every rank gets (absolute path and format).

    Raises
    ------
    HppInputError
        The file does not exist or is not a file.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise HppInputError(f"--data file {str(path)!r} does not exist" if not p.exists()
                            else f"--data {str(path)!r} is not a file", field="data",
                            fix="give a local .txt file or a .npy of token ids")
    return {"path": str(p.resolve()), "format": "npy" if p.suffix.lower() == ".npy" else "text"}


def _load_tokens(spec: Mapping[str, Any], vocab_size: int) -> np.ndarray:
    """The file's tokens, memory-mapped: 1-D ``(N,)`` or 2-D ``(rows, seq_len + 1)``; ids checked."""
    path = spec["path"]
    if not Path(path).is_file():
        raise HppInputError(f"--data file {path!r} does not exist", field="data",
                            fix="give a local .txt file or a .npy of token ids")
    if spec.get("format") == "npy":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise HppInputError(f"--data {path!r} is not a readable .npy file ({exc})", field="data",
                                fix="write token ids with numpy.save(path, ids)") from None
        if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2):
            raise HppInputError(f"--data {path!r} holds a {arr.ndim}-D array of {arr.dtype}", field="data",
                                fix="save integer token ids, 1-D (a stream) or 2-D (one sample per row)")
        top = int(arr.max()) if arr.size else -1
        if top >= vocab_size:
            raise HppInputError(f"--data {path!r} has token id {top} but the model's vocabulary has {vocab_size} "
                                "ids", field="data", fix="tokenize for this model's vocabulary")
        return arr
    if vocab_size < BYTE_VOCAB_SIZE:
        raise HppInputError(f"--data {path!r} is read byte-level ({BYTE_VOCAB_SIZE} token ids) but the model's "
                            f"vocabulary has {vocab_size} ids", field="data",
                            fix=f"use a model with a vocabulary of at least {BYTE_VOCAB_SIZE}, or a .npy of ids "
                                f"below {vocab_size}")
    if Path(path).stat().st_size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


@dataclass(frozen=True)
class BatchSource:
    """Next-token batches of ``model``: synthetic (or the model's own ``make_batch``) or from a file.

    Attributes
    ----------
    model : RuntimeModel
    seed : int
    global_batch_size : int
        G, samples per step.
    data : Mapping or None
        :func:`data_spec` of a file; ``None`` = synthetic tokens.
    """

    model: RuntimeModel
    seed: int
    global_batch_size: int
    data: Mapping[str, Any] | None = None
    _tokens: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def seq_len(self) -> int:
        return self.model.spec.seq_len

    @property
    def num_windows(self) -> int | None:
        """Windows (samples) the file holds; ``None`` for synthetic data (unbounded)."""
        if self._tokens is None:
            return None
        if self._tokens.ndim == 2:
            return int(self._tokens.shape[0])
        return max(0, (int(self._tokens.shape[0]) - 1) // self.seq_len)

    def wraps(self, steps: int) -> bool:
        """Whether ``steps`` steps need more windows than the file holds (the order then wraps around)."""
        n = self.num_windows
        return n is not None and n < steps * self.global_batch_size

    def _window(self, j: int) -> np.ndarray:
        s, toks = self.seq_len, self._tokens
        assert toks is not None
        if toks.ndim == 2:
            return np.asarray(toks[j], dtype=np.int64)
        return np.asarray(toks[j * s:j * s + s + 1], dtype=np.int64)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of step ``step``, each ``(G, seq_len)`` int64 (targets may hold IGNORE_INDEX)."""
        if self._tokens is None:
            make = getattr(self.model, "make_batch", None)
            if make is not None:
                return make(step, seed=self.seed, global_batch_size=self.global_batch_size)
            spec = self.model.spec
            return synthetic_batch(step, seed=self.seed, global_batch_size=self.global_batch_size,
                                   seq_len=spec.seq_len, vocab_size=spec.vocab_size)
        g, w = self.global_batch_size, self.num_windows
        assert w  # checked in make_batch_source
        rows = np.stack([self._window((step * g + i) % w) for i in range(g)])      # (G, s + 1)
        tokens = torch.from_numpy(rows)
        inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        inputs[inputs < 0] = 0
        targets[targets < 0] = IGNORE_INDEX
        return inputs, targets


def make_batch_source(data: Mapping[str, Any] | None, model: RuntimeModel, *, seed: int,
                      global_batch_size: int) -> BatchSource:
    """The batch source that ``data`` describes (``None``: synthetic tokens).

    Parameters
    ----------
    data : Mapping or None
        :func:`data_spec` of ``--data FILE`` (``{"path", "format"}``).
    model : RuntimeModel
        Gives ``seq_len`` and the vocabulary size the token ids must fit.
    seed : int
        Synthetic data only.
    global_batch_size : int
        G.

    Raises
    ------
    HppInputError
        The file is missing or unreadable, holds ids outside the vocabulary (or is text
        for a vocabulary below 256), has rows of another length than ``seq_len + 1``, a row
        without a target token, or too few windows for one global batch.
    """
    if data is None:
        return BatchSource(model, seed, global_batch_size)
    spec = model.spec
    tokens = _load_tokens(data, spec.vocab_size)
    path = data["path"]
    if tokens.ndim == 2:
        if tokens.shape[1] != spec.seq_len + 1:
            raise HppInputError(f"--data {path!r} has rows of {tokens.shape[1]} tokens but {spec.name} takes "
                                f"samples of seq_len + 1 = {spec.seq_len + 1}", field="data",
                                fix="cut the rows to seq_len + 1 tokens (pad with -1), or save a 1-D stream")
        empty = np.flatnonzero((np.asarray(tokens[:, 1:]) >= 0).sum(axis=1) == 0)
        if empty.size:
            raise HppInputError(f"--data {path!r}: row {int(empty[0])} has no target token (all padding)",
                                field="data", fix="drop rows that hold fewer than 2 tokens")
    src = BatchSource(model, seed, global_batch_size, data=dict(data), _tokens=tokens)
    n = src.num_windows or 0
    if n < global_batch_size:
        have = (f"{tokens.shape[0]} rows" if tokens.ndim == 2
                else f"{tokens.shape[0]} tokens = {n} windows of {spec.seq_len} + 1")
        raise HppInputError(f"--data {path!r} is too short for one global batch: {have}, the plan's global batch "
                            f"needs {global_batch_size} samples", field="data",
                            fix=f"give at least {global_batch_size * spec.seq_len + 1} tokens"
                                if tokens.ndim == 1 else f"give at least {global_batch_size} rows")
    return src
