"""hpp profile: a valid native profile with positive times, scaled emulated entries, clean refusals."""

from __future__ import annotations

import pytest
import torch

from hpp.errors import HppInputError
from hpp.profiles.profile_format import load_profile, profile_to_dict
from hpp.runtime.cli import profile_main
from hpp.runtime.profile.profiler import profile_model, scale_profile, write_profile


@pytest.fixture(scope="module")
def tiny_profile():
    return profile_model("gpt-tiny", micro_batch_sizes=(1, 2), warmup=1, repeats=3)


def test_profile_round_trips_with_positive_times(tiny_profile, tmp_path):
    path = tmp_path / "p.json"
    write_profile(tiny_profile, path)
    back = load_profile(path)
    assert profile_to_dict(back) == profile_to_dict(tiny_profile)
    assert back.num_layers == 6 and back.device_types == ("cpu",)
    for b in (1, 2):
        e = back.entries[("cpu", 1, b)]
        assert all(t > 0 for t in e.forward_s + e.backward_s + e.optimizer_s)
        assert all(x > 0 for x in e.param_bytes + e.activation_bytes + e.output_bytes)
    e1, e2 = back.entries[("cpu", 1, 1)], back.entries[("cpu", 1, 2)]
    assert e1.param_bytes == e2.param_bytes
    assert all(2 * a == b for a, b in zip(e1.output_bytes, e2.output_bytes))
    assert all(a < b for a, b in zip(e1.activation_bytes[1:], e2.activation_bytes[1:]))
    assert {"machine", "torch", "date", "spread"} <= set(back.meta)
    assert not list(tmp_path.glob("*.tmp"))


def test_scaled_profile_for_emulated_device_types(tiny_profile):
    scaled = scale_profile(tiny_profile, {"cpu-2x": 2.0}, base_device_type="cpu")
    base, em = scaled.entries[("cpu", 1, 2)], scaled.entries[("cpu-2x", 1, 2)]
    assert em.forward_s == tuple(2.0 * t for t in base.forward_s)
    assert em.backward_s == tuple(2.0 * t for t in base.backward_s)
    assert em.optimizer_s == base.optimizer_s and "emulated" in em.note and "x 2.0" in em.note
    with pytest.raises(HppInputError, match="no entries for 'gpu'"):
        scale_profile(tiny_profile, {"x": 2.0}, base_device_type="gpu")


def test_unknown_model_and_tp_are_refused_without_a_file(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert profile_main(["--model", "gpt-huge", "--no-time-terms", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "the runtime has no model 'gpt-huge'" in err and "gpt-tiny" in err and "llama-tiny" in err
    assert len(err.splitlines()) == 1
    assert profile_main(["--model", "gpt-tiny", "--tp", "2", "--no-time-terms", "--out", str(out)]) == 2
    assert "TP degree 1 only" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_profile_cli_writes_scaled_entries(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert profile_main(["--model", "gpt-tiny", "--micro-batch-sizes", "1", "--repeats", "2", "--warmup", "1",
                         "--emulate", "cpu-3x=3", "--no-time-terms", "--out", str(out)]) == 0
    back = load_profile(out)
    assert set(back.entries) == {("cpu", 1, 1), ("cpu-3x", 1, 1)}
    assert not any(e.has_step_time for e in back.entries.values()) and "host_time" not in back.meta


def _fake_host_terms():
    """Model-independent time terms with chosen values (the real probe takes about a minute)."""
    from hpp.profiles.step_time import HostTimeTerms
    from hpp.runtime.profile.host_probe import P2PFit
    from hpp.runtime.profile.time_terms import HostStepTerms, ScheduleOverheadFit

    def fit(stages: int, per_mb: float) -> ScheduleOverheadFit:
        return ScheduleOverheadFit("1F1B", stages, (2, 4), (0.0, 0.0), (0.0, 0.0), 1e-4 * stages, per_mb, 0.5)
    return HostStepTerms(fit(1, 2e-4), fit(2, 5e-4), P2PFit("gloo", (8, 1024), (1e-5, 2e-5), 3e-5, 1e9, 0.1),
                         HostTimeTerms(2, (1.0, 1.25)))


def test_profile_cli_adds_the_runtime_steps_time_terms_by_default_on_cpu(tmp_path, capsys, monkeypatch):
    """One command gives a profile with the loss, schedule and p2p terms; emulated types too."""
    import hpp.runtime.profile.time_terms as tp
    monkeypatch.setattr(tp, "measure_host_step_terms", lambda quick=False: _fake_host_terms())
    out = tmp_path / "p.json"
    assert profile_main(["--model", "gpt-tiny", "--micro-batch-sizes", "1", "--repeats", "1", "--warmup", "0",
                         "--emulate", "cpu-3x=3", "--no-memory-terms", "--json", "--out", str(out)]) == 0
    import json
    assert json.loads(capsys.readouterr().out)["time_terms"] is True
    back = load_profile(out)
    for b in (1,):
        t, t3 = back.entries[("cpu", 1, b)].step_time, back.entries[("cpu-3x", 1, b)].step_time
        assert t.micro_batch_overhead_s == 2e-4 and t.micro_batch_overhead_in_op == 0.5
        assert t.p2p_latency_s == 3e-5 and t.p2p_overhead_s == pytest.approx(3e-4)
        assert t.step_overhead_s == pytest.approx(2e-4)                 # the larger of the 1- and 2-stage fits
        assert t.loss_forward_s > 0 and t.loss_backward_s > 0         # measured: lm_loss on (b, s, V) logits
        assert t3 == t.emulated(3.0)
    assert back.meta["host_time"]["cores"] == 2 and back.meta["host_time"]["contention"] == [1.0, 1.25]
    # the switch, and no CPU terms for a GPU profile
    assert profile_main(["--model", "gpt-tiny", "--device", "cuda", "--time-terms", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--time-terms with --device cuda" in err and len(err.splitlines()) == 1


def test_out_of_memory_names_the_largest_micro_batch_that_fits(monkeypatch, tmp_path, capsys):
    """The OOM path, driven without a GPU: micro-batch 4 raises torch's OutOfMemoryError while measuring."""
    import torch

    import hpp.runtime.profile.profiler as profiler

    real = profiler.measure_layer

    def measure(layer, make_input, **kw):
        if make_input().shape[0] >= 4:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(layer, make_input, **kw)

    monkeypatch.setattr(profiler, "measure_layer", measure)
    out = tmp_path / "p.json"
    assert profile_main(["--model", "gpt-tiny", "--micro-batch-sizes", "1,2,4", "--repeats", "1", "--warmup", "0",
                         "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "micro-batch size 4 runs out of memory" in err and "the largest size that fits is 2" in err
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


@pytest.mark.parametrize("name", ["llama-tiny", "examples.user_model:build"])
def test_profiles_any_runtime_model_through_the_protocol(name):
    from hpp.runtime.models.zoo import load_runtime_model
    model = load_runtime_model(name)
    prof = profile_model(name, micro_batch_sizes=(1,), warmup=0, repeats=1)
    assert prof.model == model.spec.name and prof.num_layers == model.spec.num_layers
    assert prof.meta["runtime_model"] == name
    hp = prof.meta["hyper_parameters"]
    assert (hp["num_heads"], hp["num_kv_heads"], hp["ffn_size"]) == (
        model.spec.num_heads, model.spec.num_kv_heads, model.spec.ffn_size)
    e = prof.entries[("cpu", 1, 1)]
    assert all(t > 0 for t in e.forward_s + e.backward_s)
    expect = [sum(p.numel() * p.element_size() for p in model.build_layer(l, seed=0, dtype=torch.float32).parameters())
              for l in range(model.spec.num_layers)]
    assert list(e.param_bytes) == expect
    assert e.output_bytes[-1] == model.spec.seq_len * model.spec.vocab_size * 4


def test_bad_module_function_is_one_line(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert profile_main(["--model", "no_such_module_xyz:build", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot import 'no_such_module_xyz'" in err and len(err.splitlines()) == 1
    assert profile_main(["--model", "json:loads_nothing", "--out", str(out)]) == 2
    assert "has no function 'loads_nothing'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("name", ["opt-tiny", "gpt-neo-tiny", "llama-tiny"])
def test_bundled_tiny_profiles_match_their_runtime_models(name):
    from hpp.profiles.bundled import bundled_models, load_bundled_profile
    from hpp.runtime.models.zoo import load_runtime_model
    assert name in bundled_models()
    prof, model = load_bundled_profile(name), load_runtime_model(name)
    assert (prof.model, prof.num_layers, prof.sequence_length) == (name, model.spec.num_layers, model.spec.seq_len)
    assert set(prof.entries) == {(d, t, b) for d in ("cpu", "cpu-2x") for t in (1, 2) for b in (1, 2, 4)}
    hp = prof.meta["hyper_parameters"]
    assert (hp["num_heads"], hp["num_kv_heads"], hp["ffn_size"]) == (
        model.spec.num_heads, model.spec.num_kv_heads, model.spec.ffn_size)
    assert prof.meta["runtime_model"] == name
    tp1 = prof.entries[("cpu", 1, 2)]
    assert list(tp1.param_bytes) == [sum(p.numel() * 4 for p in model.build_layer(l, seed=0, dtype=torch.float32)
                                         .parameters()) for l in range(model.spec.num_layers)]
    tp2 = prof.entries[("cpu", 2, 2)]
    assert "measured on 2 gloo ranks" in tp2.note and "measured by hpp profile" in tp1.note
    assert all(t > 0 for t in tp2.forward_s + tp2.backward_s) and tp2.activation_bytes == tp1.activation_bytes
    assert all(a <= b for a, b in zip(tp2.param_bytes, tp1.param_bytes))
    assert tp1.param_bytes[1] < 2 * tp2.param_bytes[1] < 1.05 * tp1.param_bytes[1]   # a block: all but norms, some biases halved
    for tp in (1, 2):
        fast, slow = prof.entries[("cpu", tp, 2)], prof.entries[("cpu-2x", tp, 2)]
        assert slow.forward_s == tuple(2 * t for t in fast.forward_s)


def test_tiny_model_plans_on_the_cpu_cluster_with_tp_2(tmp_path, capsys):
    import json

    from hpp.cli import main
    cluster = tmp_path / "c.json"
    assert main(["scenarios", "--cluster", "cpu-hetero-4"]) == 0
    cluster.write_text(capsys.readouterr().out)
    out = tmp_path / "p.json"
    assert main(["plan", "--cluster", str(cluster), "--model", "llama-tiny", "--gbs", "8", "--max-tp", "2",
                 "--no-baselines", "--quiet", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert (plan["model"], plan["num_layers"], plan["profile"]) == ("llama-tiny", 7, {"name": "llama-tiny"})
    assert {s["tp_degree"] for p in plan["pipelines"] for s in p["stages"]} <= {1, 2}


def test_measured_tp2_param_bytes_equal_the_tp_plan_share():
    """The bytes each TP rank held when measured = the share tp_plan gives (colwise/rowwise/vocab halves)."""
    import importlib.util
    from pathlib import Path

    from hpp.profiles.bundled import load_bundled_profile
    from hpp.runtime.models.zoo import load_runtime_model
    path = Path(__file__).resolve().parents[1] / "experiments" / "profile_tiny_models.py"
    spec = importlib.util.spec_from_file_location("profile_tiny_models", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("opt-tiny", "gpt-neo-tiny", "llama-tiny"):
        model = load_runtime_model(name)
        expect = [mod.tp_param_bytes(model, l, 2) for l in range(model.spec.num_layers)]
        assert list(load_bundled_profile(name).entries[("cpu", 2, 1)].param_bytes) == expect


def test_profile_carries_the_runtime_steps_memory_terms_unless_asked_not_to():
    """hpp profile measures the memory of the runtime's real step per layer (FakeTensor + MemTracker)."""
    from hpp.runtime.profile.profiler import profile_model
    with_terms = profile_model("llama-tiny", micro_batch_sizes=(1,), warmup=0, repeats=1, mixed_precision=True)
    e = next(iter(with_terms.entries.values()))
    assert e.has_step_memory and len(e.step_activation_bytes) == with_terms.num_layers
    assert with_terms.meta["memory"]["dtype"] == "bfloat16" and "autocast" in with_terms.meta["dtype"]
    without = profile_model("llama-tiny", micro_batch_sizes=(1,), warmup=0, repeats=1, memory_terms=False)
    assert not next(iter(without.entries.values())).has_step_memory


def test_saved_bytes_counts_saved_activations_and_keeps_no_graph_alive():
    """Linear saves its input (2 x 8 float32 = 64 B), tanh its output (64 B); the weight is a parameter.

    tanh saving its own output is the case where a pack hook that kept the tensor made a
    reference cycle through C++: the output (and every activation) outlived the measurement.
    """
    import weakref

    from hpp.runtime.profile.profiler import _saved_bytes

    lin = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8, requires_grad=True)
    y, saved = _saved_bytes(lambda: torch.tanh(lin(x)), list(lin.parameters()))
    assert saved == 2 * 8 * 4 + 2 * 8 * 4
    with pytest.raises(RuntimeError, match="no backward"):
        y.sum().backward()
    alive = weakref.ref(y)
    del y
    assert alive() is None


def test_profile_measures_memory_terms_before_it_times_a_layer(monkeypatch):
    """The memory terms fork a child per layer; a process that ran autograd on a GPU cannot fork one."""
    import hpp.runtime.profile.memory_terms as memory_terms
    import hpp.runtime.profile.profiler as profiler

    order: list[str] = []
    real_terms, real_rows = memory_terms.memory_terms, profiler._measure_rows

    def terms(*args, **kwargs):
        order.append("memory")
        return real_terms(*args, **kwargs)

    def rows(*args, **kwargs):
        order.append("timing")
        return real_rows(*args, **kwargs)

    monkeypatch.setattr(memory_terms, "memory_terms", terms)
    monkeypatch.setattr(profiler, "_measure_rows", rows)
    prof = profile_model("gpt-tiny", micro_batch_sizes=(1, 2), warmup=0, repeats=1)
    assert order == ["memory", "memory", "timing"]
    assert all(e.has_step_memory for e in prof.entries.values())
