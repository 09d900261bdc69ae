"""The runtime model zoo, the stage builder and the legacy GPT adapter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpp.errors import HppInputError
from hpp.runtime.models.api import check_protocol
from hpp.runtime.models.gpt import MODEL_CONFIGS, GPT, build_stage_module
from hpp.runtime.models.stage import build_stage
from hpp.runtime.models.zoo import check_layers_match, load_runtime_model, runtime_model_names

ROOT = Path(__file__).resolve().parents[1]


def test_names_and_profile_names_resolve():
    assert runtime_model_names() == ("gpt-tiny", "gpt-small", "opt-tiny", "gpt-neo-tiny", "llama-tiny", "opt-350",
                                     "gpt-neo-2.7", "llama-3-8")
    assert load_runtime_model("GPT-tiny").spec.num_layers == 6
    assert load_runtime_model("LLAMA-3-8").spec.name == "llama-3-8"
    assert load_runtime_model("OPT-350").spec.num_layers == 26
    assert load_runtime_model(" GPT-Neo-2.7 ").spec.num_layers == 34
    for name in runtime_model_names():
        check_protocol(load_runtime_model(name), source=name)


def test_unknown_name_lists_the_names():
    with pytest.raises(HppInputError) as exc:
        load_runtime_model("gpt-huge")
    msg = str(exc.value)
    assert "no model 'gpt-huge'" in msg and "llama-tiny" in msg and "MODULE:FUNCTION" in msg
    assert len(msg.splitlines()) == 1


def test_module_function_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad_model.py"
    bad.write_text("class NotAModel:\n    spec = None\n    def build_layer(self): pass\n\n"
                   "def build():\n    return NotAModel()\n\ndef boom():\n    raise RuntimeError('no')\n"
                   "import torch\nfrom hpp.runtime.models.api import ModelSpec\n"
                   "class Half:\n    spec = ModelSpec('h', 3, 4, 8, 4, 1, 1, 4)\n"
                   "    def build_layer(self, i, *, seed, dtype): pass\n    def tp_plan(self, i, t): return {}\n"
                   "    def tied_parameters(self): return ()\n    bad_spec = 1\n\ndef half():\n    return Half()\n")
    cases = {
        "no_such_module_xyz:build": "cannot import 'no_such_module_xyz' (ModuleNotFoundError",
        f"{bad}:missing": "has no function 'missing'",
        f"{bad}:build": "returned a NotAModel, which has no 'tp_plan'",
        f"{bad}:boom": "boom() raised RuntimeError: no",
        f"{tmp_path / 'absent.py'}:build": "cannot import",
        "json:": "is not MODULE:FUNCTION",
    }
    for name, text in cases.items():
        with pytest.raises(HppInputError) as exc:
            load_runtime_model(name)
        assert text in str(exc.value) and len(str(exc.value).splitlines()) == 1, (name, str(exc.value))
    assert load_runtime_model(f"{bad}:half").spec.name == "h"


def test_example_user_model_loads_by_module_and_by_path(monkeypatch):
    monkeypatch.chdir(ROOT)
    a = load_runtime_model("examples.user_model:build")
    b = load_runtime_model("examples/user_model.py:build")
    assert a.spec == b.spec and a.spec.num_layers == 5
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    ya = build_stage(a, 0, 5, seed=1, dtype=torch.float64)(x)
    yb = build_stage(b, 0, 5, seed=1, dtype=torch.float64)(x)
    assert torch.equal(ya, yb) and ya.shape == (2, 32, 256)
    assert a.tp_plan(2, 2)["o"] == "rowwise" and a.tp_plan(0, 2) == {}


def test_example_loads_from_the_repo_root_with_the_console_script_path():
    """``hpp`` (a console script) does not put the current directory on sys.path; the zoo does."""
    code = ("import sys; sys.path = [p for p in sys.path if p not in ('', '.')]; "
            "from hpp.runtime.models.zoo import load_runtime_model; print(load_runtime_model('examples.user_model:build')"
            ".spec.name)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "user-gpt", out.stderr


def test_legacy_adapter_builds_what_build_stage_module_built():
    cfg = MODEL_CONFIGS["gpt-tiny"]
    for tie in (False, True):
        old = build_stage_module(cfg, 0, 6, seed=2, dtype=torch.float64, tie_embeddings=tie)
        new = build_stage(GPT(cfg, tie_embeddings=tie), 0, 6, seed=2, dtype=torch.float64)
        a = [(n, p) for _l, n, p in old.layer_parameters()]
        b = [(n, p) for _l, n, p in new.layer_parameters()]
        assert [n for n, _ in a] == [n for n, _ in b] and all(torch.equal(p, q) for (_, p), (_, q) in zip(a, b))
    assert GPT(cfg).tp_plan(1, 2) == {"fc": "colwise", "out": "rowwise"}
    assert GPT(cfg).tp_plan(0, 2) == {"wte": "embedding"}


def test_stage_ties_a_pair_it_holds_and_yields_it_once():
    model = load_runtime_model("opt-tiny")
    whole = build_stage(model, 0, 6, seed=0)
    assert whole.layers["0"].embed_tokens.weight is whole.layers["5"].lm_head.weight
    names = [n for _l, n, _p in whole.layer_parameters()]
    assert "layers.0.embed_tokens.weight" in names and "layers.5.lm_head.weight" not in names
    assert len(names) == len(set(names))
    head = build_stage(model, 4, 6, seed=0)
    assert torch.equal(head.layers["5"].lm_head.weight, whole.layers["0"].embed_tokens.weight)
    assert head.layers["5"].lm_head.weight is not whole.layers["0"].embed_tokens.weight


@pytest.mark.parametrize("name", ["llama-tiny", "gpt-neo-tiny"])
def test_full_recompute_gives_the_same_gradients(name):
    model = load_runtime_model(name)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    grads = []
    for mode in ("none", "full"):
        stage = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=torch.float64, recompute=mode)
        stage(x).square().mean().backward()
        grads.append({n: p.grad for _l, n, p in stage.layer_parameters()})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])


def test_stage_refusals_and_layer_count_check():
    model = load_runtime_model("llama-tiny")
    with pytest.raises(HppInputError, match=r"layers \[5, 9\) outside \[0, 7\) of llama-tiny"):
        build_stage(model, 5, 9, seed=0)
    with pytest.raises(HppInputError, match="selective"):
        build_stage(model, 0, 2, seed=0, recompute="selective")
    check_layers_match(model, 7, source="plan p.json")
    with pytest.raises(HppInputError, match="model llama-tiny has 7 layers but plan p.json has 35"):
        check_layers_match(model, 35, source="plan p.json")


def test_planner_path_does_not_import_transformers():
    code = ("import sys, hpp.cli, hpp.planner, hpp.runtime.models.zoo, hpp.runtime.models.stage; "
            "hpp.runtime.models.zoo.load_runtime_model('gpt-tiny'); print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
