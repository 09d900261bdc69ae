"""A local Hugging Face model folder: ``config.json`` + safetensors, read lazily and written by name.

The folder is what ``save_pretrained`` writes: ``config.json`` and either one
``model.safetensors`` or shards named by ``model.safetensors.index.json`` (its
``weight_map``: tensor name -> shard file). Tensor names are the ``*ForCausalLM``
state-dict names (:meth:`hpp.runtime.models.hf.HFModel.hf_name` maps hpp's global names
to them); a tied output head is stored once, under the token table's name.

Reading (:func:`open_weights_folder`, :func:`check_weights_match`) opens each file with
``safetensors.safe_open``, which parses the header only (safetensors refuses a file whose
header does not cover the file exactly, so a truncated file is refused here); tensors are
read later, slice by slice (:mod:`hpp.runtime.exec.weights`). Every refusal is one
:class:`~hpp.errors.HppInputError` naming the file, the field and the fix, before any rank
starts.

Writing (:func:`write_hf_folder`): the config (the model's, ``architectures`` and ``dtype``
set) and the tensors, split into shards of at most ``max_shard_bytes`` with
``huggingface_hub.split_torch_state_dict_into_shards`` (the helper ``save_pretrained``
uses) and the standard index, so that ``from_pretrained`` loads the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from hpp.errors import HppInputError
from hpp.fileio import process_umask, read_json

__all__ = ["CONFIG_FILE", "SINGLE_FILE", "INDEX_FILE", "ARCH_FIELDS", "WeightsFolder", "open_weights_folder",
           "check_weights_match", "hf_state_dict", "write_hf_folder"]

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

#: The config fields that decide the architecture's parameters and computation, per ``model_type`` (read from the
#: parsed config object, so aliases such as GPT-Neo's ``num_layers`` compare under the standard name). Dropout,
#: token ids, ``use_cache`` and the stored ``dtype`` are not among them: a run uses its own.
ARCH_FIELDS: dict[str, tuple[str, ...]] = {
    "opt": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
            "tie_word_embeddings", "ffn_dim", "word_embed_proj_dim", "do_layer_norm_before",
            "_remove_final_layer_norm", "layer_norm_elementwise_affine", "enable_bias", "activation_function"),
    "gpt_neo": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
                "tie_word_embeddings", "intermediate_size", "attention_layers", "window_size", "layer_norm_epsilon",
                "activation_function"),
    "llama": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
              "tie_word_embeddings", "intermediate_size", "num_key_value_heads", "head_dim", "rms_norm_eps",
              "hidden_act", "rope_parameters", "rope_theta", "rope_scaling", "attention_bias", "mlp_bias"),
}

_FIX_FOLDER = "give a folder written by save_pretrained (config.json and safetensors weights)"


@dataclass(frozen=True)
class WeightsFolder:
    """A checked Hugging Face model folder.

    Attributes
    ----------
    path : Path
        The folder (absolute).
    config : dict
        Its ``config.json``.
    files : dict[str, str]
        Tensor name -> the safetensors file (a name in ``path``) that holds it.
    shapes : dict[str, tuple[int, ...]]
        Tensor name -> its shape as stored.
    dtypes : dict[str, str]
        Tensor name -> its safetensors dtype (``F32``, ``BF16``, ...).
    """

    path: Path
    config: dict
    files: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]

    def file_of(self, name: str) -> Path:
        """The path of the file holding tensor ``name`` (KeyError: none does)."""
        return self.path / self.files[name]


def _header(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Shapes and dtypes of the tensors of safetensors file ``path`` (its header only)."""
    from safetensors import safe_open
    if not path.is_file():
        raise HppInputError("safetensors file missing", source=str(path), field="--weights",
                            fix="copy the whole model folder (every file the index names)")
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes, dtypes = {}, {}
            for name in f.keys():
                s = f.get_slice(name)
                shapes[name], dtypes[name] = tuple(int(n) for n in s.get_shape()), str(s.get_dtype())
            return shapes, dtypes
    except Exception as exc:   # noqa: BLE001 -- safetensors raises SafetensorError / OSError for a bad file
        first = (str(exc).splitlines() or ["no message"])[0]
        raise HppInputError(f"not a complete safetensors file ({first})", source=str(path), field="--weights",
                            fix="copy or download the file again (it is truncated or damaged)") from None


def open_weights_folder(path: str | os.PathLike) -> WeightsFolder:
    """Read and check the folder ``path`` (headers only; no tensor is read).

    Raises
    ------
    HppInputError
        No such folder; no or an unreadable ``config.json``; neither ``model.safetensors`` nor
        ``model.safetensors.index.json``; an index without a ``weight_map`` of names to files in the
        folder; a missing, truncated or damaged shard (naming it); an index naming a tensor that its
        shard does not hold.
    """
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise HppInputError("no such folder", source=str(path), field="--weights", fix=_FIX_FOLDER)
    if not (root / CONFIG_FILE).is_file():
        raise HppInputError(f"no {CONFIG_FILE}", source=str(root), field="--weights", fix=_FIX_FOLDER)
    config = read_json(root / CONFIG_FILE, what="Hugging Face model config")
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise HppInputError("no model_type", source=str(root / CONFIG_FILE), field="model_type", fix=_FIX_FOLDER)
    files: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    index_path = root / INDEX_FILE
    if index_path.is_file():
        index = read_json(index_path, what="safetensors index")
        wmap = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
            raise HppInputError("no weight_map of tensor names to shard files", source=str(index_path),
                                field="weight_map", fix=_FIX_FOLDER)
        outside = next((f for f in wmap.values() if Path(f).name != f), None)
        if outside is not None:
            raise HppInputError(f"names the shard {outside!r}, which is not a file of the folder",
                                source=str(index_path), field="weight_map", fix=_FIX_FOLDER)
        held = {f: _header(root / f) for f in sorted(set(wmap.values()))}
        for name, f in wmap.items():
            if name not in held[f][0]:
                raise HppInputError(f"names tensor {name!r} in shard {f}, which has no such tensor",
                                    source=str(index_path), field="weight_map",
                                    fix="use the index written with the shards (save_pretrained writes both)")
            files[name], shapes[name], dtypes[name] = f, held[f][0][name], held[f][1][name]
    elif (root / SINGLE_FILE).is_file():
        s, d = _header(root / SINGLE_FILE)
        files, shapes, dtypes = dict.fromkeys(s, SINGLE_FILE), s, d
    else:
        raise HppInputError(f"neither {SINGLE_FILE} nor {INDEX_FILE}", source=str(root), field="--weights",
                            fix="save the model with save_pretrained (safetensors, its default); "
                                "pytorch_model.bin is not read")
    return WeightsFolder(root, config, files, shapes, dtypes)


def check_weights_match(folder: WeightsFolder, model) -> None:
    """Refuse ``folder`` unless it holds ``model``'s architecture and every parameter in its shape.

    Parameters
    ----------
    folder : WeightsFolder
    model : hpp.runtime.models.hf.HFModel
        The run's model; its config is compared field by field (:data:`ARCH_FIELDS`) with the
        folder's, both parsed by the architecture's config class.

    Raises
    ------
    HppInputError
        Another ``model_type`` or a differing field (naming it and both values); a parameter of
        the model that no file holds, or holds in another shape.
    """
    from hpp.runtime.models import hf_layers   # imports transformers
    src = str(folder.path / CONFIG_FILE)
    fix = (f"give a folder of the model {model.name}, or run a plan of the folder's model "
           f"(its shipped config: hpp/runtime/models/configs/{model.name}.json)")
    theirs = folder.config.get("model_type")
    if theirs != model.arch:
        raise HppInputError(f"model_type {theirs!r}, but the run's model {model.name} is {model.arch!r}",
                            source=src, field="model_type", fix=fix)
    cfg = hf_layers.make_config(model.arch, dict(folder.config))
    for key in ARCH_FIELDS[model.arch]:
        a, b = getattr(cfg, key, None), getattr(model.config, key, None)
        if a != b:
            raise HppInputError(f"{key} {a!r}, but the run's model {model.name} has {b!r}", source=src, field=key,
                                fix=fix)
    tied = {model.hf_name(b) for _a, b in model.tied_parameters()}     # stored once, under the first name
    for name, shape in hf_layers.parameter_shapes(model.config).items():
        if name in tied:
            continue
        if name not in folder.files:
            raise HppInputError(f"no tensor {name!r} in the folder's safetensors files", source=str(folder.path),
                                field="--weights", fix=_FIX_FOLDER)
        if folder.shapes[name] != shape:
            raise HppInputError(f"tensor {name!r} has shape {list(folder.shapes[name])}, the model's parameter "
                                f"{list(shape)}", source=str(folder.file_of(name)), field=name, fix=fix)


def hf_state_dict(model, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{HF name: tensor}`` of hpp's full tensors by global name (a tied pair once, under the first name).

    Raises
    ------
    HppInputError
        A global name the model has no HF name for, or two different names mapping to one HF name.
    """
    second = {b for _a, b in model.tied_parameters()}
    out: dict[str, torch.Tensor] = {}
    for name, t in sorted(tensors.items()):
        if name in second:
            continue
        key = model.hf_name(name)
        if key in out:
            raise HppInputError(f"{name} and another parameter both map to {key!r}", field="model",
                                fix="export this model with --format safetensors (hpp's global names)")
        out[key] = t
    return out


def write_hf_folder(model, state: Mapping[str, torch.Tensor], out: str | os.PathLike, *, dtype: torch.dtype,
                    max_shard_bytes: int, force: bool = False) -> list[str]:
    """Write ``state`` (``{HF name: tensor}``, :func:`hf_state_dict`) and ``model``'s config as a folder.

    The folder is built beside ``out`` and renamed into place (an existing ``out`` is replaced only
    with ``force``), so no half-written folder is left. Files get the mode ``open()`` gives a new
    file. Returns the written file names.

    Raises
    ------
    HppInputError
        ``out`` exists (without ``force``) or is a file, its parent folder is missing, or a shard size < 1.
    """
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    from hpp.runtime.models import hf_layers
    out = Path(out)
    if max_shard_bytes < 1:
        raise HppInputError(f"shard size {max_shard_bytes} bytes", field="--max-shard-size", fix="give >= 1 bytes")
    if out.exists() and (not force or not out.is_dir()):
        raise HppInputError(f"{out} exists", field="OUT", fix="give a new folder, or --force to replace that folder"
                            if out.is_dir() else "give a folder name, not a file")
    if not out.parent.is_dir():
        raise HppInputError(f"no folder {out.parent} for {out.name}", field="OUT", fix="create the folder first")
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
    split = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_bytes)
    mode = 0o666 & ~process_umask()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        cfg = hf_layers.make_config(model.arch, model.config.to_dict())
        cfg.architectures = [hf_layers.causal_lm_class(model.arch).__name__]
        cfg.dtype = dtype
        cfg.save_pretrained(tmp)
        for fname, names in split.filename_to_tensors.items():
            save_file({n: tensors[n] for n in names}, str(tmp / fname), metadata={"format": "pt"})
        if split.is_sharded:
            (tmp / INDEX_FILE).write_text(json.dumps({"metadata": split.metadata,
                                                      "weight_map": split.tensor_to_filename}, indent=2) + "\n")
        for f in tmp.iterdir():
            os.chmod(f, mode)
        os.chmod(tmp, 0o777 & ~process_umask())
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(p.name for p in out.iterdir())

