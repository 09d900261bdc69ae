"""The runtime's model protocol: what ``hpp run`` and ``hpp profile`` need of a model.

A runtime model is cut into layers exactly as its profile counts them:

- layer ``0``: the embedding, tokens ``(b, s)`` int64 -> hidden ``(b, s, h)``;
- layers ``1 .. L-2``: the blocks, ``(b, s, h) -> (b, s, h)``;
- layer ``L-1``: final norm + output head, ``(b, s, h) -> logits (b, s, V)``.

A layer is an ``nn.Module`` with ONE tensor in and ONE tensor out (what a pipeline
stage sends), so a stage holding layers ``[lo, hi)`` is those layers applied in
order. The loss (summed next-token cross-entropy over the target tokens that are not
:data:`IGNORE_INDEX`, divided by the global batch's count of such tokens) is the
runtime's, not the model's.

The protocol (:class:`RuntimeModel`), which a user's ``MODULE:FUNCTION`` returns:

``spec`` : :class:`ModelSpec`
    Sizes (layers, sequence length, vocabulary, hidden size, heads).
``build_layer(index, *, seed, dtype) -> nn.Module``
    Layer ``index``, initialised from ``(seed, index)`` alone, so a stage builds
    only its own layers and still gets exactly the whole model's weights.
``tp_plan(index, tp_degree) -> {module path: style}``
    How to shard layer ``index`` at TP degree ``tp_degree`` (paths relative to the
    layer module, as torchtitan's parallelize plans): ``"colwise"``
    (``ColwiseParallel``), ``"rowwise"`` (``RowwiseParallel``), ``"embedding"``
    (vocabulary-parallel ``nn.Embedding``: ``RowwiseParallel(input_layouts=Replicate())``)
    or ``"output"`` (vocabulary-parallel head: ``ColwiseParallel(output_layouts=Replicate())``).
    Modules that reshape by head count must infer the local count from the tensor
    (``view(b, s, -1, head_dim)``), or the model adjusts them in ``tp_plan``'s caller
    hook :meth:`RuntimeModel.prepare_tp` if it defines one.
``tied_parameters() -> ((name, name), ...)``
    Pairs of global parameter names (``layers.<index>.<path>``) that are one tensor
    in the single-device model (tied embeddings), e.g.
    ``(("layers.0.embed_tokens.weight", "layers.25.lm_head.weight"),)``.

Optional: ``make_batch(step, *, seed, global_batch_size) -> (inputs, targets)``, each
``(G, s)`` int64, deterministic in ``(seed, step)`` (default: :func:`synthetic_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, runtime_checkable

import torch
from torch import nn

from hpp.errors import HppInputError

__all__ = ["IGNORE_INDEX", "TP_STYLES", "ModelSpec", "RuntimeModel", "PROTOCOL_MEMBERS", "check_protocol",
           "check_tp_degree", "synthetic_batch", "layer_seed", "layer_generator"]

#: Target value of positions that carry no loss (padding).
IGNORE_INDEX = -100
#: The sharding styles a ``tp_plan`` may name.
TP_STYLES = ("colwise", "rowwise", "embedding", "output")
#: Members every runtime model must have (``make_batch`` and ``prepare_tp`` are optional).
PROTOCOL_MEMBERS = ("spec", "build_layer", "tp_plan", "tied_parameters")
_SEED_STRIDE = 1_000_003


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Sizes of a runtime model.

    Attributes
    ----------
    name : str
    num_layers : int
        L = blocks + 2 (embedding, blocks, head); >= 3.
    seq_len, vocab_size, hidden_size : int
        Tokens per sample, vocabulary size V, hidden size h.
    num_heads, num_kv_heads : int
        Attention heads (query) and key/value heads (= ``num_heads`` without GQA).
    ffn_size : int
        MLP inner width.

    Raises
    ------
    HppInputError
        A non-positive size, fewer than 3 layers, or heads that do not divide h.
    """

    name: str
    num_layers: int
    seq_len: int
    vocab_size: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int

    def __post_init__(self) -> None:
        for f in ("num_layers", "seq_len", "vocab_size", "hidden_size", "num_heads", "num_kv_heads", "ffn_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise HppInputError(f"model {self.name!r}: {f} = {v!r}", field=f, fix="give a positive integer")
        if self.num_layers < 3:
            raise HppInputError(f"model {self.name!r} has {self.num_layers} layers", field="num_layers",
                                fix="a runtime model has an embedding, at least one block and a head (>= 3 layers)")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise HppInputError(f"model {self.name!r}: hidden size {self.hidden_size}, {self.num_heads} heads, "
                                f"{self.num_kv_heads} key/value heads", field="num_heads",
                                fix="heads must divide the hidden size and key/value heads the heads")

    @property
    def num_blocks(self) -> int:
        return self.num_layers - 2


@runtime_checkable
class RuntimeModel(Protocol):
    """See the module docstring."""

    spec: ModelSpec

    def build_layer(self, index: int, *, seed: int, dtype: torch.dtype) -> nn.Module: ...

    def tp_plan(self, index: int, tp_degree: int) -> Mapping[str, str]: ...

    def tied_parameters(self) -> tuple[tuple[str, str], ...]: ...


def check_protocol(obj: object, *, source: str) -> RuntimeModel:
    """Return ``obj`` if it follows :class:`RuntimeModel`.

    Raises
    ------
    HppInputError
        Names the first missing member (or a ``spec`` that is not a :class:`ModelSpec`).
    """
    for member in PROTOCOL_MEMBERS:
        if not hasattr(obj, member):
            raise HppInputError(f"{source} returned a {type(obj).__name__}, which has no {member!r}",
                                field="model", fix=f"return an object with {', '.join(PROTOCOL_MEMBERS)} "
                                                   "(the runtime model protocol, docs/RUNTIME.md 'Your own model')")
    if not isinstance(obj.spec, ModelSpec):  # type: ignore[attr-defined]
        raise HppInputError(f"{source}: 'spec' is a {type(obj.spec).__name__}, not a ModelSpec",  # type: ignore
                            field="model", fix="set spec = hpp.runtime.models.api.ModelSpec(...)")
    return obj  # type: ignore[return-value]


def check_tp_degree(spec: ModelSpec, tp_degree: int, *, field: str = "tp_degree") -> None:
    """Refuse a TP degree the model's heads, key/value heads or MLP width cannot be split by.

    Raises
    ------
    HppInputError
        Names both numbers.
    """
    if tp_degree < 1:
        raise HppInputError(f"TP degree {tp_degree}", field=field, fix="use 1, 2, 4 or 8")
    for what, n in (("attention heads", spec.num_heads), ("key/value heads", spec.num_kv_heads),
                    ("MLP width", spec.ffn_size)):
        if n % tp_degree:
            raise HppInputError(f"TP degree {tp_degree} does not divide {spec.name}'s {n} {what}", field=field,
                                fix=f"plan with a TP degree that divides {n} (hpp plan --max-tp)")


def layer_seed(seed: int, layer: int) -> int:
    """The seed of layer ``layer``'s initial parameters (:func:`layer_generator`, and torch's default generator while
    the runtime builds the layer: :func:`hpp.runtime.models.stage.build_layer`)."""
    return seed * _SEED_STRIDE + layer


def layer_generator(seed: int, layer: int) -> torch.Generator:
    """The CPU generator layer ``layer`` draws its initial parameters from (same on every rank)."""
    return torch.Generator().manual_seed(layer_seed(seed, layer))


def synthetic_batch(step: int, *, seed: int, global_batch_size: int, seq_len: int,
                    vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token batch of one step: ``(inputs, targets)``, each ``(G, seq_len)`` int64.

    Targets are the inputs shifted by one token (next-token prediction). Every rank
    draws the same batch and keeps its own slice.
    """
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    tokens = torch.randint(0, vocab_size, (global_batch_size, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
