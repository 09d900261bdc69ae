"""A pipeline stage: layers ``[lo, hi)`` of a runtime model applied in order.

:func:`build_stage` builds a stage of any model that follows the protocol of
:mod:`hpp.runtime.models.api`; ``build_stage(model, 0, L, ...)`` is the whole model
on one device (the ``--verify`` reference).

Parameter names are global, ``layers.<l>.<path>`` with ``l`` the model's layer
index, so stages and the whole model can be compared name by name. Each layer is
initialised from ``(seed, l)`` alone (:func:`hpp.runtime.models.api.layer_generator`),
so a stage gets exactly the weights the whole model has.

Tied parameters (``model.tied_parameters()``, e.g. the token table and the output
head): every layer holds its own copy, drawn identically; a stage that holds both
ends of a pair makes them ONE ``nn.Parameter`` (the second name's module attribute
points at the first name's parameter), as in single-device training. Keeping copies
on different stages in sync is the runtime's job (:mod:`hpp.runtime.exec.gradsync`).

Activation recomputation (a plan stage's ``recompute``): ``"full"`` wraps each of
the stage's layers in ``torch.utils.checkpoint`` (non-reentrant), so a micro-batch
in flight keeps only each layer's input and the layer's activations are rebuilt
during its backward: one extra forward, which is what the cost model charges
(:func:`hpp.formulation.cost_model.stage_compute_s`). ``"selective"`` (Megatron's
recomputation of the attention core only) is refused: the runtime's models use
fused attention, which keeps no ``s x s`` attention matrix, and the profiler does
not measure an attention share, so there is nothing selective could drop that the
planner could price.

Shapes: tokens ``(b, s)`` int64 -> hidden ``(b, s, h)`` -> logits ``(b, s, V)``.
"""

from __future__ import annotations

from typing import Iterator, Mapping

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpp.errors import HppInputError
from hpp.runtime.models.api import RuntimeModel, layer_seed

__all__ = ["RUNTIME_RECOMPUTE_MODES", "check_recompute", "StageModule", "build_layer", "build_stage", "tie_within",
           "split_global_name"]

#: Recomputation modes the runtime executes (``"selective"`` is refused, see the module docstring).
RUNTIME_RECOMPUTE_MODES = ("none", "full")


def check_recompute(mode: str, *, field: str = "recompute") -> str:
    """Return ``mode`` if the runtime can execute it.

    Raises
    ------
    HppInputError
        ``"selective"`` (not supported by the runtime) or an unknown mode.
    """
    if mode in RUNTIME_RECOMPUTE_MODES:
        return mode
    if mode == "selective":
        raise HppInputError("selective activation recomputation is not supported by hpp run (its models use fused "
                            "attention, which keeps no attention matrix to drop)", field=field,
                            fix="plan with recompute 'full' or 'none' for this stage")
    raise HppInputError(f"unknown recompute mode {mode!r}", field=field, fix="use 'none' or 'full'")


def split_global_name(name: str) -> tuple[int, str]:
    """``"layers.3.mlp.fc1.weight"`` -> ``(3, "mlp.fc1.weight")``.

    Raises
    ------
    HppInputError
        A name that does not start with ``layers.<int>.``.
    """
    head, _, rest = name.partition(".")
    idx, _, path = rest.partition(".")
    if head != "layers" or not idx.isdigit() or not path:
        raise HppInputError(f"parameter name {name!r} is not 'layers.<index>.<path>'", field="tied_parameters",
                            fix="name tied parameters globally, e.g. 'layers.0.embed_tokens.weight'")
    return int(idx), path


class StageModule(nn.Module):
    """Layers ``[layer_start, layer_stop)`` applied in order.

    Parameters
    ----------
    layers : {layer index: nn.Module}
        At least the indices ``layer_start .. layer_stop - 1``.
    layer_start, layer_stop : int
        The stage's layer range (``layer_stop`` exclusive).
    recompute : ``"none"`` or ``"full"``

    Parameter names are global: ``layers.<l>.<...>``.
    """

    def __init__(self, layers: Mapping[int, nn.Module], *, layer_start: int, layer_stop: int,
                 recompute: str = "none") -> None:
        super().__init__()
        self.layer_start, self.layer_stop = layer_start, layer_stop
        self.recompute = check_recompute(recompute)
        self.layers = nn.ModuleDict({str(l): layers[l] for l in range(layer_start, layer_stop)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: tokens ``(b, s)`` on the first stage, hidden ``(b, s, h)`` elsewhere."""
        for layer in self.layers.values():
            if self.recompute == "full" and torch.is_grad_enabled():
                x = checkpoint(layer, x, use_reentrant=False)   # keeps x only; re-runs layer in backward
            else:
                x = layer(x)
        return x

    def layer_parameters(self) -> Iterator[tuple[int, str, nn.Parameter]]:
        """``(layer index, global name, parameter)`` in layer order, each parameter once.

        A parameter shared by two layers of the stage (a tied pair) is yielded once,
        under the layer that comes first.
        """
        seen: set[int] = set()
        for key, layer in self.layers.items():
            for name, p in layer.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield int(key), f"layers.{key}.{name}", p


def build_layer(model: RuntimeModel, index: int, *, seed: int, dtype: torch.dtype) -> nn.Module:
    """``model.build_layer(index, seed=seed, dtype=dtype)`` with torch's default (CPU) generator seeded from
    ``(seed, index)`` (:func:`hpp.runtime.models.api.layer_seed`) and restored afterwards.

    The protocol asks a model to draw its initial weights from ``(seed, index)`` alone; a model that does not (it
    initialises with ``torch.randn`` or the modules' own ``reset_parameters``, as ``nn.Linear`` does) would build
    different weights on every rank that holds the layer, and in the single-device reference. Seeding the default
    generator makes such draws a function of ``(seed, index)`` too, the same on every rank. Draws from other
    generators (numpy, ``random``) are not covered here: the worker broadcasts every replicated parameter from one
    holder before the first step (:func:`hpp.runtime.exec.gradsync.broadcast_initial_parameters`), as DDP does.
    """
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(layer_seed(seed, index))
        return model.build_layer(index, seed=seed, dtype=dtype)


def _init_tied_copies(model: RuntimeModel, layers: Mapping[int, nn.Module], pairs: tuple[tuple[str, str], ...], *,
                      seed: int, dtype: torch.dtype) -> None:
    """A stage holding only the second name of a tied pair gets the first name's initial value.

    In the single-device model the pair is one tensor (the first name's draw), so a copy on
    another stage must start from that draw too, whatever the model's own ``build_layer`` of
    the second layer drew (the runtime then keeps the copies equal by summing their gradients).
    """
    for first, second in pairs:
        (la, pa), (lb, pb) = split_global_name(first), split_global_name(second)
        if lb in layers and la not in layers:
            src = build_layer(model, la, seed=seed, dtype=dtype).get_parameter(pa)
            dst = layers[lb].get_parameter(pb)
            if src.shape != dst.shape:
                raise HppInputError(f"tied parameters {first} {tuple(src.shape)} and {second} {tuple(dst.shape)} "
                                    "differ in shape", field="tied_parameters", fix="tie parameters of one shape")
            with torch.no_grad():
                dst.copy_(src)


def tie_within(layers: Mapping[int, nn.Module], pairs: tuple[tuple[str, str], ...]) -> int:
    """Make each tied pair whose two layers are both in ``layers`` one parameter; return how many.

    The second name's module attribute is set to the first name's parameter.
    """
    tied = 0
    for first, second in pairs:
        (la, pa), (lb, pb) = split_global_name(first), split_global_name(second)
        if la not in layers or lb not in layers:
            continue
        param = layers[la].get_parameter(pa)
        owner_path, _, attr = pb.rpartition(".")
        owner = layers[lb].get_submodule(owner_path) if owner_path else layers[lb]
        old = getattr(owner, attr)
        if old.shape != param.shape:
            raise HppInputError(f"tied parameters {first} {tuple(param.shape)} and {second} {tuple(old.shape)} "
                                "differ in shape", field="tied_parameters", fix="tie parameters of one shape")
        setattr(owner, attr, param)
        tied += 1
    return tied


def build_stage(model: RuntimeModel, lo: int, hi: int, *, seed: int, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", recompute: str = "none") -> StageModule:
    """The stage holding layers ``[lo, hi)`` of ``model``.

    Parameters
    ----------
    model : RuntimeModel
        Any object following :mod:`hpp.runtime.models.api`'s protocol.
    lo, hi : int
        ``0 <= lo < hi <= model.spec.num_layers``.
    seed : int
        Initialisation seed (layer ``l`` draws from ``layer_generator(seed, l)``).
    dtype : torch.dtype
    device : torch.device or str
    recompute : ``"none"`` or ``"full"``

    Returns
    -------
    StageModule
        On ``device``; tied pairs held entirely by the stage are one parameter.

    Raises
    ------
    HppInputError
        Layers outside the model, or a recompute mode the runtime does not execute.
    """
    check_recompute(recompute)
    n = model.spec.num_layers
    if not 0 <= lo < hi <= n:
        raise HppInputError(f"layers [{lo}, {hi}) outside [0, {n}) of {model.spec.name}",
                            field="layers", fix=f"{model.spec.name} has {n} layers")
    layers = {l: build_layer(model, l, seed=seed, dtype=dtype) for l in range(lo, hi)}
    pairs = tuple(model.tied_parameters())
    _init_tied_copies(model, layers, pairs, seed=seed, dtype=dtype)
    tie_within(layers, pairs)
    return StageModule(layers, layer_start=lo, layer_stop=hi, recompute=recompute).to(device)
