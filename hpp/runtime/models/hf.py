"""OPT, GPT-Neo and Llama runtime models built from Hugging Face ``transformers`` classes.

Each model is built from a config shipped in ``hpp/runtime/models/configs/<name>.json`` (the
published ``config.json`` of the hub model under ``hf_config``, parsed with the
architecture's config class; no download, random initialisation) and cut into the
layers its bundled profile counts:

- layer 0, the embedding: token (+ learned position) embeddings, and OPT's
  ``project_in`` where its word-embedding width differs from the hidden size;
- layers ``1 .. N``: one HF decoder layer each (``OPTDecoderLayer``, ``GPTNeoBlock``,
  ``LlamaDecoderLayer``), subclassed so that it takes and returns ONE tensor and makes
  its own mask and positions: OPT and Llama use ``sdpa`` with no mask (= causal, what the
  HF model passes them), GPT-Neo's eager attention applies its own causal or
  sliding-window (``local``, window ``window_size``) mask buffer, and each Llama
  block holds a non-persistent ``LlamaRotaryEmbedding``;
- Llama only (``separate_final_norm``): layer ``L-2`` is the final RMSNorm, as
  the bundled profile LLAMA-3-8 counts it (35 layers);
- layer ``L-1``, the head: final norm (OPT: only with ``do_layer_norm_before``;
  opt-350 is post-LayerNorm and has none), OPT's ``project_out``, and ``lm_head``.

Parameter paths inside a layer are HF's (``self_attn.q_proj.weight``), so
:meth:`HFModel.hf_name` maps a global name to the ``*ForCausalLM`` state-dict name
(the tests copy the weights into the HF model and compare logits; ``hpp run --weights`` reads
a Hugging Face folder by these names and the export writes one: :mod:`hpp.runtime.models.hf_folder`).

Initialisation (:func:`init_parameters`), as HF's ``_init_weights``: Linear and
Embedding weights ~ normal(0, ``initializer_range`` or ``init_std``), biases 0, norms 1
and 0, drawn in the layer's dtype (float32 for bfloat16) from
:func:`hpp.runtime.models.api.layer_generator` ``(seed, l)`` in module order; a tied head
draws layer 0's token table again (the first draw of layer 0's generator). Differences from HF: OPT's token table
has no ``padding_idx`` (the pad row is an ordinary, trained row and is not zeroed at
initialisation), so that the vocabulary-parallel embedding treats every row alike;
the shipped configs set dropout to 0 (a run must be deterministic for ``--verify``).
Only parameters are cast to ``dtype``; buffers (rotary frequencies, masks) stay as HF
builds them.

Numerics: HF computes Llama's RMSNorm and GPT-Neo's attention scores in float32 even
for float64 inputs; these layers do the same (they are HF's code), so a float64 run is
float64 except there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Mapping

import torch
from torch import nn

from hpp.errors import HppInputError
from hpp.runtime.models.api import ModelSpec, check_tp_degree, layer_generator
from hpp.runtime.models.stage import split_global_name

__all__ = ["HFModel", "hf_model", "load_model_file", "init_parameters", "HF_ARCHITECTURES"]

#: ``model_type`` of the supported architectures.
HF_ARCHITECTURES = ("opt", "gpt_neo", "llama")


def load_model_file(name: str) -> dict:
    """The shipped JSON of model ``name`` (``hpp/runtime/models/configs/<name>.json``)."""
    res = resources.files("hpp.runtime.models").joinpath("configs").joinpath(f"{name}.json")
    if not res.is_file():
        raise HppInputError(f"no shipped config for model {name!r}", field="model",
                            fix="use a name from hpp.runtime.models.zoo.runtime_model_names()")
    return json.loads(res.read_text())


def hf_model(name: str) -> "HFModel":
    """The runtime model ``name`` built from its shipped config (see the module docstring)."""
    d = load_model_file(name)
    return HFModel(d["name"], d["hf_config"], seq_len=int(d["seq_len"]),
                   separate_final_norm=bool(d.get("separate_final_norm", False)))


def _std(config) -> float:
    std = getattr(config, "initializer_range", None)
    return float(std if std is not None else getattr(config, "init_std", 0.02))


def init_parameters(module: nn.Module, gen: torch.Generator, *, std: float, skip: frozenset[str] = frozenset()
                    ) -> None:
    """HF-style initialisation of every parameter of ``module``, in ``named_modules`` order.

    Linear / Embedding weights ~ normal(0, std) (drawn in their dtype), biases 0, norms
    (class name containing ``LayerNorm`` or ``RMSNorm``) weight 1, bias 0. Parameters in
    ``skip`` (names relative to ``module``) are left as they are.

    Raises
    ------
    AssertionError
        A parameter that none of the rules covers (an internal error).
    """
    done: set[str] = set(skip)
    with torch.no_grad():
        for mname, mod in module.named_modules():
            prefix = f"{mname}." if mname else ""
            norm = "LayerNorm" in type(mod).__name__ or "RMSNorm" in type(mod).__name__
            for pname, p in mod.named_parameters(recurse=False):
                full = prefix + pname
                if full in done:
                    continue
                if norm:
                    p.fill_(1.0 if pname == "weight" else 0.0)
                elif pname == "bias":
                    p.zero_()
                elif isinstance(mod, (nn.Linear, nn.Embedding)) and pname == "weight":
                    _normal_(p, gen, std=std)
                else:
                    raise AssertionError(f"no initialisation rule for {full} of {type(mod).__name__}")
                done.add(full)
    missing = {n for n, _ in module.named_parameters()} - done
    assert not missing, f"parameters left uninitialised: {sorted(missing)}"


def _normal_(p: torch.Tensor, gen: torch.Generator, *, std: float) -> None:
    """``p`` = normal(0, 1) draws x ``std``, drawn in ``p``'s dtype (float32 for lower precisions).

    Drawing in the parameter's own dtype straight into it keeps initialisation fast (a float64
    draw costs about 4x a float32 one on CPU; llama-3-8 has 8 billion parameters) and needs no
    temporary the size of a vocabulary table. Models of different dtypes therefore hold
    different draws; every rank of one run uses one dtype.
    """
    if p.dtype in (torch.float32, torch.float64):
        torch.randn(p.shape, generator=gen, dtype=p.dtype, out=p.data)
        p.data.mul_(std)
    else:
        p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std))


def _cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast parameters only (buffers such as rotary frequencies keep HF's dtype)."""
    for mod in module.modules():
        for pname, p in list(mod.named_parameters(recurse=False)):
            if p.dtype != dtype:
                setattr(mod, pname, nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad))
    return module


@dataclass(frozen=True)
class _Arch:
    """Per-architecture names: HF state-dict prefixes, the token table's path, TP plan of a block."""

    embed_prefix: str
    block_prefix: str            # str.format(i=block index from 0)
    final_prefix: str            # final norm / project_out inside the base model
    token_table: str             # path of the token embedding inside layer 0
    block_tp: Mapping[str, str]
    heads_attr: str | None       # path of the attention module whose num_heads a TP shard must divide


_ARCHS = {
    "opt": _Arch("model.decoder.", "model.decoder.layers.{i}.", "model.decoder.", "embed_tokens",
                 {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
                  "self_attn.out_proj": "rowwise", "fc1": "colwise", "fc2": "rowwise"}, "self_attn"),
    "gpt_neo": _Arch("transformer.", "transformer.h.{i}.", "transformer.", "wte",
                     {"attn.attention.q_proj": "colwise", "attn.attention.k_proj": "colwise",
                      "attn.attention.v_proj": "colwise", "attn.attention.out_proj": "rowwise",
                      "mlp.c_fc": "colwise", "mlp.c_proj": "rowwise"}, "attn.attention"),
    "llama": _Arch("model.", "model.layers.{i}.", "model.", "embed_tokens",
                   {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
                    "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                    "mlp.down_proj": "rowwise"}, None),
}


class HFModel:
    """A runtime model (:class:`hpp.runtime.models.api.RuntimeModel`) of HF decoder layers.

    Parameters
    ----------
    name : str
    hf_config : dict
        A hub ``config.json`` (its ``model_type``: ``opt``, ``gpt_neo`` or ``llama``).
    seq_len : int
        Tokens per sample (<= the config's ``max_position_embeddings``).
    separate_final_norm : bool
        Llama only: the final RMSNorm is its own layer (``L = blocks + 3``).

    Raises
    ------
    HppInputError
        An unsupported ``model_type``, or ``seq_len`` beyond the position table.
    """

    def __init__(self, name: str, hf_config: Mapping, *, seq_len: int, separate_final_norm: bool = False) -> None:
        from hpp.runtime.models import hf_layers   # not on top: imports transformers, 2-10 s (-X importtime)
        arch = hf_config.get("model_type")
        if arch not in HF_ARCHITECTURES:
            raise HppInputError(f"model {name!r}: model_type {arch!r}", field="model_type",
                                fix=f"use one of {HF_ARCHITECTURES}")
        if separate_final_norm and arch != "llama":
            raise HppInputError(f"model {name!r}: separate_final_norm is for llama only", field="separate_final_norm",
                                fix="set it to false")
        self.name, self.arch = name, arch
        self._names = _ARCHS[arch]
        self.config = hf_layers.make_config(arch, dict(hf_config))
        c = self.config
        self.separate_final_norm = separate_final_norm
        if seq_len > c.max_position_embeddings:
            raise HppInputError(f"model {name!r}: seq_len {seq_len} > max_position_embeddings "
                                f"{c.max_position_embeddings}", field="seq_len",
                                fix=f"use at most {c.max_position_embeddings} tokens")
        blocks = c.num_hidden_layers
        heads = c.num_attention_heads
        kv = getattr(c, "num_key_value_heads", None) or heads
        ffn = {"opt": lambda: c.ffn_dim, "gpt_neo": lambda: c.intermediate_size or 4 * c.hidden_size,
               "llama": lambda: c.intermediate_size}[arch]()
        self.spec = ModelSpec(name=name, num_layers=blocks + 2 + int(separate_final_norm), seq_len=seq_len,
                              vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_heads=heads,
                              num_kv_heads=kv, ffn_size=ffn)
        self._num_blocks = blocks

    # -- layers --------------------------------------------------------------------------------------
    def layer_kind(self, index: int) -> str:
        """``"embedding"``, ``"block"``, ``"final_norm"`` or ``"head"``."""
        last = self.spec.num_layers - 1
        if not 0 <= index <= last:
            raise HppInputError(f"layer {index} outside [0, {self.spec.num_layers}) of {self.name}", field="layer",
                                fix=f"{self.name} has {self.spec.num_layers} layers")
        if index == 0:
            return "embedding"
        if index == last:
            return "head"
        if self.separate_final_norm and index == last - 1:
            return "final_norm"
        return "block"

    def build_layer(self, index: int, *, seed: int, dtype: torch.dtype = torch.float32) -> nn.Module:
        """Layer ``index``, its parameters drawn from ``layer_generator(seed, index)`` (module docstring)."""
        from hpp.runtime.models import hf_layers   # not on top: imports transformers, 2-10 s (-X importtime)
        kind = self.layer_kind(index)
        std = _std(self.config)
        if kind == "embedding":
            mod = hf_layers.embedding(self.arch, self.config)
        elif kind == "block":
            mod = hf_layers.block(self.arch, self.config, index - 1)
        elif kind == "final_norm":
            mod = hf_layers.final_norm(self.arch, self.config)
        else:
            mod = hf_layers.head(self.arch, self.config, with_norm=not self.separate_final_norm)
        _cast_parameters(mod, dtype)
        tied = kind == "head" and bool(self.tied_parameters())
        init_parameters(mod, layer_generator(seed, index), std=std,
                        skip=frozenset({"lm_head.weight"}) if tied else frozenset())
        if tied:        # the token table is the first draw of layer 0's generator
            with torch.no_grad():
                _normal_(mod.lm_head.weight, layer_generator(seed, 0), std=std)
        return mod

    # -- protocol ------------------------------------------------------------------------------------
    def tied_parameters(self) -> tuple[tuple[str, str], ...]:
        """``(("layers.0.<token table>.weight", "layers.<L-1>.lm_head.weight"),)`` if the config ties them."""
        if not getattr(self.config, "tie_word_embeddings", False):
            return ()
        return ((f"layers.0.{self._names.token_table}.weight", f"layers.{self.spec.num_layers - 1}.lm_head.weight"),)

    def tp_plan(self, index: int, tp_degree: int) -> dict[str, str]:
        """HF's ``base_model_tp_plan`` for layer ``index``: attention q/k/v and MLP up colwise, their outputs rowwise.

        The token table (``"embedding"``) and ``lm_head`` (``"output"``) are vocabulary-parallel
        only when ``tp_degree`` divides the vocabulary; norms, position tables and OPT's
        projections stay replicated.

        Raises
        ------
        HppInputError
            ``tp_degree`` does not divide the heads, key/value heads or MLP width.
        """
        check_tp_degree(self.spec, tp_degree)
        if tp_degree == 1:
            return {}
        kind = self.layer_kind(index)
        vocab_ok = self.spec.vocab_size % tp_degree == 0
        if kind == "block":
            return dict(self._names.block_tp)
        if kind == "embedding":
            return {self._names.token_table: "embedding"} if vocab_ok else {}
        if kind == "head":
            return {"lm_head": "output"} if vocab_ok else {}
        return {}

    def prepare_tp(self, layer: nn.Module, index: int, tp_degree: int) -> None:
        """Set the per-rank head count of modules that reshape by ``self.num_heads`` (OPT, GPT-Neo)."""
        check_tp_degree(self.spec, tp_degree)
        if self.layer_kind(index) == "block" and self._names.heads_attr is not None:
            attn = layer.get_submodule(self._names.heads_attr)
            attn.num_heads = self.spec.num_heads // tp_degree

    # -- HF names ------------------------------------------------------------------------------------
    def hf_name(self, name: str) -> str:
        """The ``*ForCausalLM`` state-dict name of global parameter ``name`` (``layers.<l>.<path>``)."""
        index, path = split_global_name(name)
        kind = self.layer_kind(index)
        n = self._names
        if kind == "embedding":
            return n.embed_prefix + path
        if kind == "block":
            return n.block_prefix.format(i=index - 1) + path
        if path.startswith("lm_head."):
            return path
        return n.final_prefix + path
