"""``hpp run --calibrate``: the fits recover known layer times and links, the calibrated profile's format, the
refusals, and the calibration path through a run on the emulated CPU cluster."""

import json
import random
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from hpp.cli import main
from hpp.errors import HppInputError
from hpp.formulation.cost_model import estimate_plan
from hpp.plan_data import Pipeline, Plan, Stage
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.calibration_fit import fit_layers, fit_link
from hpp.profiles.calibration_record import FigureCalibration, ProfileCalibration
from hpp.profiles.profile_format import load_profile, profile_from_dict, profile_to_dict, save_profile
from hpp.replan import search_calibrated
from hpp.runtime.calibrate import (MAX_LINK_SPREAD, PAYS_ABOVE, _scaled_cluster, calibrate_run, cluster_path_of,
                                   replan_check, replan_command)
from hpp.runtime.host.time_model import believed_slowdown, emulation_mismatches
from hpp.scenarios import get_scenario
from tests.synthetic import toy_cluster, toy_profile

TRUE_FACTORS = (1.5, 0.8, 1.2)           # real / profiled time of each of the toy's 3 layers


def _toy_plan() -> Plan:
    """Two pipelines of type A that cut the 3 layers at different places (so the stages separate the layers)."""
    p0 = Pipeline((Stage(0, 1, "A", 1, (0,)), Stage(1, 3, "A", 1, (1,))), micro_batch_size=1, num_samples=4)
    p1 = Pipeline((Stage(0, 2, "A", 1, (2,)), Stage(2, 3, "A", 1, (3,))), micro_batch_size=1, num_samples=2)
    return Plan("toy", 3, 6, (p0, p1))


def _synthetic_report(plan, cluster, profile, *, link_factor: float, steps: int = 6, noise: float = 0.02,
                      seed: int = 0) -> dict:
    """What a GPU run would report if layer l took TRUE_FACTORS[l] x its profiled time and every link had
    link_factor x its bandwidth, each step's times off by up to +-noise."""
    rng = random.Random(seed)
    e = profile.entries[("A", 1, 1)]
    true_sync = estimate_plan(plan, _scaled_cluster(cluster, [0], link_factor), profile).grad_sync_s
    stages = []
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            per_mb = sum(a * (f + b) for a, f, b in zip(TRUE_FACTORS[st.layer_start:st.layer_stop],
                                                        e.forward_s[st.layer_start:st.layer_stop],
                                                        e.backward_s[st.layer_start:st.layer_stop]))
            stages.append({"pipeline": p, "stage": s,
                           "compute_steps_s": [pipe.num_micro_batches * per_mb * (1 + rng.uniform(-noise, noise))
                                               for _ in range(steps)],
                           "cpu_steps_s": [0.0] * steps})
    return {"model": "toy", "device": "cuda", "warmup_steps": 1, "emulate_speed": False,
            "predicted": {"time_scale": 1.0},
            "measured": {"stages": stages,
                         "grad_sync_steps_s": [true_sync * (1 + rng.uniform(-noise, noise)) for _ in range(steps)]}}


def test_calibration_recovers_a_known_layer_time_and_link_within_5_percent():
    profile = toy_profile({"A": 1.0})
    cluster = toy_cluster([("A", 4)], memory={"A": 10**9}, bw=1e3, latency=1e-3)
    plan = _toy_plan()
    rep = _synthetic_report(plan, cluster, profile, link_factor=0.4)
    cal = calibrate_run(rep, plan, cluster, profile, source="synthetic", plan_path="plan.json")
    old, new = profile.entries[("A", 1, 1)], cal.profile.entries[("A", 1, 1)]
    for layer, a in enumerate(TRUE_FACTORS):
        assert new.forward_s[layer] == pytest.approx(a * old.forward_s[layer], rel=0.05)
        assert new.backward_s[layer] == pytest.approx(a * old.backward_s[layer], rel=0.05)
    assert cal.cluster.nodes[0].intra_node.max_bytes_per_s == pytest.approx(0.4 * 1e3, rel=0.05)
    assert cal.cluster.nodes[0].intra_node.latency_s == 1e-3
    fig = cal.calibration.figure("A/tp1/mb1")
    assert (fig.status, fig.method, fig.steps) == ("calibrated", "least-squares", 5)
    assert 0 < fig.spread < 0.1
    link = cal.calibration.figure("link intra-node 0 (A)")
    assert (link.status, link.method) == ("calibrated", "bandwidth") and link.factor == pytest.approx(0.4, rel=0.05)
    # the single node: no inter-node link used, so it is kept and says so
    assert cal.calibration.figure("link inter-node").status == "kept"


def test_one_pipeline_cannot_separate_layers_and_fits_one_factor():
    """Control: one pipeline's stages hold disjoint layer sets; the split inside a stage is not determined, so the
    fit is one factor (the stages' total), and it misses the per-layer truth that least squares recovered."""
    profile = toy_profile({"A": 1.0})
    e = profile.entries[("A", 1, 1)]
    f, b = e.forward_s, e.backward_s
    stage_s = [sum(a * (x + y) for a, x, y in zip(TRUE_FACTORS[lo:hi], f[lo:hi], b[lo:hi]))
               for lo, hi in ((0, 1), (1, 3))]
    fit = fit_layers(f, b, [(0, 1, False), (1, 3, False)], [stage_s])
    assert fit.method == "scale"
    assert fit.total_factor == pytest.approx(sum(stage_s) / sum(x + y for x, y in zip(f, b)))
    assert len(set(fit.factors)) == 1 and abs(fit.factors[0] - TRUE_FACTORS[0]) > 0.05


def test_link_fit_floors_the_time_and_skips_hidden_syncs():
    lat, bw_s = 1e-4, 1e-2                        # 0.1 ms latency, 10 ms of bytes at the old bandwidth
    pred = lambda g: lat + bw_s / g               # noqa: E731
    assert fit_link([lat + bw_s / 2.5] * 3, pred).factor == pytest.approx(2.5)
    floored = fit_link([lat + 1e-6, lat + bw_s], pred)       # one step barely above the latency: bounded
    assert floored.floored and max(floored.factor, 10.0) == 10.0
    assert fit_link([0.0, 0.0, 0.0], pred) is None            # all-reduces hidden in the schedule: nothing measured
    with pytest.raises(ValueError, match="need one finite time"):
        fit_link([], pred)


def test_calibrate_run_refuses_zero_steps_and_another_model():
    profile = toy_profile({"A": 1.0})
    cluster = toy_cluster([("A", 4)], memory={"A": 10**9}, latency=1e-3)
    plan = _toy_plan()
    rep = _synthetic_report(plan, cluster, profile, link_factor=1.0, steps=1)      # 1 step = the warm-up
    with pytest.raises(HppInputError) as exc:
        calibrate_run(rep, plan, cluster, profile, source="s", plan_path="p.json")
    assert str(exc.value).splitlines() == [
        ("field '--steps': the run measured 0 steps after its 1 warm-up steps: nothing to calibrate from. "
         "Fix: run --steps 4 or more")]
    other = dict(_synthetic_report(plan, cluster, profile, link_factor=1.0), model="gpt-tiny")
    with pytest.raises(HppInputError, match="the run is of model 'gpt-tiny' but the profile is of 'toy'"):
        calibrate_run(other, plan, cluster, profile, source="s", plan_path="p.json")


def test_calibrated_profile_round_trips_and_refuses_bad_records(tmp_path):
    rec = ProfileCalibration("hpp run p.json --steps 4", "p.json", 3, 1, (
        FigureCalibration("cpu-2x/tp1/mb2", "calibrated", "scale", 2.0, 0.01, 3, "emulated"),
        FigureCalibration("cpu/tp1/mb1", "kept", "", 1.0, 0.0, 0, "not run")))
    prof = replace(load_bundled_profile("gpt-tiny"), calibration=rec)
    save_profile(prof, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").calibration == rec
    d = profile_to_dict(prof)
    bad = json.loads(json.dumps(d))
    bad["calibration"]["figures"][1]["steps"] = 2                 # a kept figure has 0 steps
    with pytest.raises(HppInputError, match=r"calibration.figures\[1\].*a kept figure"):
        profile_from_dict(bad, source="p.json")
    bad = json.loads(json.dumps(d))
    bad["calibration"]["figures"][0]["spred"] = 0.1
    with pytest.raises(HppInputError, match=r"unknown key 'spred'.*did you mean 'spread'"):
        profile_from_dict(bad, source="p.json")
    bad = json.loads(json.dumps(d))
    bad["entries"][0]["forwrd_s"] = [0.0]
    with pytest.raises(HppInputError, match=r"entries\[0\]\.forwrd_s.*did you mean 'forward_s'"):
        profile_from_dict(bad, source="p.json")
    bad = json.loads(json.dumps(d))
    bad["calibrated"] = {}
    with pytest.raises(HppInputError, match="unknown key 'calibrated'"):
        profile_from_dict(bad, source="p.json")


def test_prediction_pads_emulated_types_by_the_profiles_slowdown():
    cluster = get_scenario("cpu-hetero-4").cluster()
    prof = load_bundled_profile("gpt-tiny")
    assert believed_slowdown(prof, cluster, "cpu-2x") == 2.0 == cluster.device_types["cpu-2x"].slowdown
    wrong = replace(prof, meta=dict(prof.meta, emulated={"cpu-2x": {"base": "cpu", "slowdown": 1.0}}))
    assert believed_slowdown(wrong, cluster, "cpu-2x") == 1.0       # the belief, not the emulated truth
    assert believed_slowdown(wrong, cluster, "cpu") == 1.0          # not emulated: the cluster's


@pytest.fixture
def wrong_setup(tmp_path, capsys):
    """cpu-hetero-4's cluster (cpu-2x 2x slower: the truth) and a gpt-tiny profile believing cpu-2x as fast as
    cpu; a plan on them."""
    from hpp.profiles.cluster_format import save_cluster
    prof = load_bundled_profile("gpt-tiny")
    entries = {k: (replace(prof.entries[("cpu", k[1], k[2])], device_type="cpu-2x") if k[0] == "cpu-2x" else e)
               for k, e in prof.entries.items()}
    save_profile(replace(prof, entries=entries, meta=dict(prof.meta, emulated={"cpu-2x": {"base": "cpu",
                                                                                           "slowdown": 1.0}})),
                 tmp_path / "wrong.json")
    save_cluster(get_scenario("cpu-hetero-4").cluster(), tmp_path / "cluster.json")
    assert main(["plan", "--cluster", str(tmp_path / "cluster.json"), "--profile", str(tmp_path / "wrong.json"),
                 "--gbs", "8", "--out", str(tmp_path / "plan.json"), "--quiet"]) == 0
    capsys.readouterr()
    return tmp_path


def _refused(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    return err[0]


def test_calibrate_refusals_before_the_run(wrong_setup, capsys):
    plan, out = str(wrong_setup / "plan.json"), wrong_setup / "cal.json"
    out.write_text("{}")
    base = ["run", plan, "--launcher", "fork", "--emulate-speed"]
    assert _refused(capsys, base + ["--steps", "3", "--calibrate", str(out)]) == (
        f"hpp run: error: field '--calibrate': {out} exists. Fix: give another OUT.json, or --force to overwrite it")
    new = str(wrong_setup / "new.json")
    assert _refused(capsys, base + ["--steps", "1", "--calibrate", new]) == (
        "hpp run: error: field '--steps': --steps 1 with --warmup-steps 1 measures 0 steps to calibrate from. "
        "Fix: use --steps 4 or more")
    assert _refused(capsys, ["run", plan, "--steps", "3", "--calibrate", new]) == (
        "hpp run: error: field '--calibrate': --calibrate on CPU measures the emulated devices' speed. "
        "Fix: add --emulate-speed")
    assert not (wrong_setup / "new.json").exists() and not cluster_path_of(new).exists()


@pytest.mark.distributed
def test_run_calibrate_on_the_emulated_cluster_recovers_the_slowdown(wrong_setup, capsys):
    """A run of a plan made on a profile that believes cpu-2x as fast as cpu: --calibrate measures its 2x, writes a
    profile and cluster that hpp plan reads, and keeps what the run did not exercise."""
    out = wrong_setup / "cal.json"
    assert main(["run", str(wrong_setup / "plan.json"), "--steps", "3", "--launcher", "fork", "--emulate-speed",
                 "--calibrate", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    rep = json.loads(captured.out)
    assert "calibrate: wrote" in captured.err and "re-plan:" in captured.err
    cal = load_profile(out)
    assert cal.calibration is not None and cal.calibration.steps == 2 and cal.calibration.warmup_steps == 1
    assert cal.calibration.source == shlex.join(["hpp", "run", str(wrong_setup / "plan.json"), "--steps", "3",
                                                 "--launcher", "fork", "--emulate-speed", "--calibrate", str(out),
                                                 "--json"])
    # The measured slowdown is 2.0 on a quiet host; on a loaded 2-core host the padded ops overrun their targets
    # (2.25 seen at a load average of 4.6), so the band here is wide. The 5 % recovery is shown by the synthetic
    # test above and by experiments/calibration_loop.py; what must hold exactly is the written profile's consistency.
    slowdown = cal.meta["emulated"]["cpu-2x"]["slowdown"]
    assert slowdown == pytest.approx(2.0, rel=0.25)
    for mb in (1, 2, 4):
        f = cal.calibration.figure(f"cpu-2x/tp1/mb{mb}")
        assert f.status == "calibrated" and f.factor == pytest.approx(slowdown, rel=1e-9) and f.steps == 2
        assert cal.entries[("cpu-2x", 1, mb)].forward_s[1] == pytest.approx(
            slowdown * cal.entries[("cpu", 1, mb)].forward_s[1], rel=1e-9)
    assert all(cal.calibration.figure(f"cpu/tp1/mb{mb}").status == "kept" for mb in (1, 2, 4))
    assert rep["calibration"]["replan"]["current_s"] > 0
    assert main(["plan", "--cluster", str(cluster_path_of(out)), "--profile", str(out), "--gbs", "8",
                 "--quiet"]) == 0


def _cpu_plan() -> Plan:
    """cpu-hetero-4: pipeline 0 = cpu (layers 0-2) -> cpu-2x (3-5) at micro-batch 2, pipeline 1 = cpu-2x alone
    at micro-batch 1 (devices 0, 2 and 3)."""
    p0 = Pipeline((Stage(0, 3, "cpu", 1, (0,)), Stage(3, 6, "cpu-2x", 1, (2,))), micro_batch_size=2, num_samples=4)
    p1 = Pipeline((Stage(0, 6, "cpu-2x", 1, (3,)),), micro_batch_size=1, num_samples=4)
    return Plan("gpt-tiny", 6, 8, (p0, p1))


def _cpu_report(plan: Plan, slowdown_per_step: list[float], *, time_scale: float = 4.0) -> dict:
    """An emulated CPU run whose cpu-2x ops lasted ``slowdown x time_scale`` x their CPU time, step by step (cpu's:
    ``time_scale`` x); each stage used 10 ms of CPU time per step; no gradient all-reduce measured."""
    stages = []
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            pad = slowdown_per_step if st.device_type == "cpu-2x" else [1.0] * len(slowdown_per_step)
            stages.append({"pipeline": p, "stage": s, "cpu_steps_s": [0.01] * len(pad),
                           "compute_steps_s": [0.01 * time_scale * k for k in pad]})
    return {"model": "gpt-tiny", "device": "cpu", "warmup_steps": 1, "emulate_speed": True,
            "predicted": {"time_scale": time_scale}, "measured": {"stages": stages, "grad_sync_steps_s": []}}


def _with_cpu2x(prof, *, entry_factor: float, slowdown: float):
    """``prof`` with cpu-2x's forward/backward = cpu's x ``entry_factor`` and meta slowdown ``slowdown``."""
    entries = {k: (replace(prof.entries[("cpu", k[1], k[2])], device_type="cpu-2x",
                           forward_s=tuple(entry_factor * v for v in prof.entries[("cpu", k[1], k[2])].forward_s),
                           backward_s=tuple(entry_factor * v for v in prof.entries[("cpu", k[1], k[2])].backward_s))
                   if k[0] == "cpu-2x" else e) for k, e in prof.entries.items()}
    return replace(prof, entries=entries, meta=dict(prof.meta, emulated={"cpu-2x": {"base": "cpu",
                                                                                    "slowdown": slowdown}}))


@pytest.mark.parametrize("entry_factor, slowdown", [(1.0, 2.0), (2.0, 1.0), (1.0, 1.0), (2.0, 2.0), (3.0, 4.0)])
def test_emulated_type_is_written_as_base_times_measured_slowdown_whatever_the_old_pair(entry_factor, slowdown,
                                                                                           caplog):
    """Measured slowdown 2.1 (median of 2.0, 2.1, 2.3 after the warm-up step): meta.emulated.cpu-2x.slowdown = 2.1
    and every cpu-2x entry = cpu's x 2.1 (forward, backward; optimizer = cpu's), whatever the old entries (x1, x2,
    x3 of cpu's) and the old slowdown said; a figure's factor is new / old = 2.1 / entry_factor."""
    base = load_bundled_profile("gpt-tiny")
    prof = _with_cpu2x(base, entry_factor=entry_factor, slowdown=slowdown)
    plan, cluster = _cpu_plan(), get_scenario("cpu-hetero-4").cluster()
    cal = calibrate_run(_cpu_report(plan, [9.0, 2.0, 2.3, 2.1]), plan, cluster, prof, source="s",
                        plan_path="p.json")
    assert cal.profile.meta["emulated"]["cpu-2x"] == {"base": "cpu", "slowdown": pytest.approx(2.1)}
    for k in (("cpu-2x", 1, 1), ("cpu-2x", 1, 2), ("cpu-2x", 1, 4)):
        new, b = cal.profile.entries[k], base.entries[("cpu", k[1], k[2])]
        assert new.forward_s == pytest.approx([2.1 * v for v in b.forward_s])
        assert new.backward_s == pytest.approx([2.1 * v for v in b.backward_s])
        assert new.optimizer_s == b.optimizer_s
        fig = cal.calibration.figure(f"cpu-2x/tp{k[1]}/mb{k[2]}")
        assert (fig.status, fig.steps) == ("calibrated", 3)
        assert fig.factor == pytest.approx(2.1 / entry_factor)
        assert fig.spread == pytest.approx((2.3 - 2.0) / 2.1)
    assert cal.profile.entries[("cpu", 1, 2)] == base.entries[("cpu", 1, 2)]       # the base type is kept
    mismatch = [r.message for r in caplog.records if "meta.emulated.cpu-2x.slowdown" in r.message]
    assert bool(mismatch) == (entry_factor != slowdown)                          # warned when the pair disagreed
    assert emulation_mismatches(cal.profile) == []


def test_calibrating_the_calibrated_profile_again_changes_nothing():
    """Control for the fixed point: a profile already at the measured slowdown gets factor 1 and the same figures."""
    prof = _with_cpu2x(load_bundled_profile("gpt-tiny"), entry_factor=1.0, slowdown=2.0)
    plan, cluster = _cpu_plan(), get_scenario("cpu-hetero-4").cluster()
    once = calibrate_run(_cpu_report(plan, [2.0] * 4), plan, cluster, prof, source="s", plan_path="p.json")
    twice = calibrate_run(_cpu_report(plan, [2.0] * 4), plan, cluster, once.profile, source="s", plan_path="p.json")
    assert twice.profile.meta["emulated"]["cpu-2x"]["slowdown"] == pytest.approx(2.0)
    assert twice.calibration.figure("cpu-2x/tp1/mb2").factor == pytest.approx(1.0)
    assert twice.profile.entries[("cpu-2x", 1, 2)].forward_s == pytest.approx(
        once.profile.entries[("cpu-2x", 1, 2)].forward_s)


def test_a_noisy_link_is_kept_and_does_not_set_the_replan_bar():
    """Per-step factors 0.4, 0.4, 1.0, 0.4, 0.4 after the warm-up: spread (1.0 - 0.4) / 0.4 = 150 % > 50 %, so the
    link keeps its bandwidth, says why, and the re-plan bar is the layers' spread (< 10 %), not 150 %."""
    profile = toy_profile({"A": 1.0})
    cluster = toy_cluster([("A", 4)], memory={"A": 10**9}, bw=1e3, latency=1e-3)
    plan = _toy_plan()
    rep = _synthetic_report(plan, cluster, profile, link_factor=0.4)
    sync = lambda g: estimate_plan(plan, _scaled_cluster(cluster, [0], g), profile).grad_sync_s     # noqa: E731
    rep["measured"]["grad_sync_steps_s"] = [sync(g) for g in (0.4, 0.4, 0.4, 1.0, 0.4, 0.4)]
    cal = calibrate_run(rep, plan, cluster, profile, source="s", plan_path="p.json")
    link = cal.calibration.figure("link intra-node 0 (A)")
    assert (link.status, link.factor) == ("kept", 1.0)
    assert link.note == "too noisy (spread 150 % of the fitted factor x0.400 over 5 steps, above 50 %)"
    assert cal.cluster.nodes[0].intra_node.max_bytes_per_s == 1e3
    check = replan_check(plan, cal, search=search_calibrated, time_limit_s=2.0)
    assert check["threshold"] == max(PAYS_ABOVE, cal.calibration.figure("A/tp1/mb1").spread) < 0.1
    assert MAX_LINK_SPREAD == 0.5


def test_replan_command_plans_at_the_runs_global_batch():
    """The printed re-plan is the plan replan_check priced: the run's --gbs, its time limit, no baselines."""
    cmd = replan_command((Path("out/cal.json"), Path("out/cal.cluster.json")),
                         {"global_batch_size": 32, "time_limit_s": 10.0})
    assert cmd == ("hpp plan --profile out/cal.json --cluster out/cal.cluster.json --gbs 32 --time-limit 10 "
                   "--no-baselines --out out/cal.plan.json")


@pytest.mark.parametrize("emulated, message", [
    ({"cpu-2x": {"base": "cpu", "slowdwn": 2.0}},
     ("p.json: field 'meta.emulated.cpu-2x.slowdwn': unknown key 'slowdwn'. Fix: did you mean 'slowdown'? valid keys "
      "here: base, slowdown")),
    ({"cpu-2x": {"base": "cpu", "slowdown": 0.5}},
     ("p.json: field 'meta.emulated.cpu-2x.slowdown': slowdown 0.5. Fix: use a number >= 1 (an emulation only slows "
      "the base type down)")),
    ({"cpu-2x": {"base": "cpu", "slowdown": "2"}},
     ("p.json: field 'meta.emulated.cpu-2x.slowdown': slowdown '2'. Fix: use a number >= 1 (an emulation only slows "
      "the base type down)")),
    ({"cpu-2x": {"base": "gpu", "slowdown": 2.0}},
     "p.json: field 'meta.emulated.cpu-2x.base': base 'gpu' has no entries. Fix: use one of ['cpu', 'cpu-2x']"),
    ({"cpu-2x": {"slowdown": 2.0}},
     ("p.json: field 'meta.emulated.cpu-2x.base': missing field 'base'. Fix: give the base device type and the "
      "slowdown")),
])
def test_profile_meta_emulated_is_validated(emulated, message):
    d = profile_to_dict(load_bundled_profile("gpt-tiny"))
    d["meta"]["emulated"] = emulated
    with pytest.raises(HppInputError) as exc:
        profile_from_dict(d, source="p.json")
    assert str(exc.value).splitlines() == [message]


def test_a_bad_key_in_a_calibration_figure_or_step_time_is_one_line(tmp_path):
    rec = ProfileCalibration("s", "p.json", 3, 1, (FigureCalibration("cpu/tp1/mb1", "kept", "", 1.0, 0.0, 0, "x"),))
    d = profile_to_dict(replace(load_bundled_profile("gpt-tiny"), calibration=rec))
    d["calibration"]["figures"][0]["factr"] = d["calibration"]["figures"][0].pop("factor")
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(HppInputError) as exc:
        load_profile(tmp_path / "p.json")
    assert str(exc.value).splitlines() == [
        (f"{tmp_path / 'p.json'}: field 'calibration.figures[0].factr': unknown key 'factr'. Fix: did you mean "
         "'factor'? valid keys here: what, status, method, factor, spread, steps, note")]
    d = profile_to_dict(load_bundled_profile("gpt-tiny"))
    d["entries"][0]["step_time"]["loss_forwrd_s"] = 0.0
    with pytest.raises(HppInputError) as exc:
        profile_from_dict(d, source="p.json")
    assert str(exc.value).splitlines()[0].startswith(
        "p.json: field 'entries[0].step_time.loss_forwrd_s': unknown key 'loss_forwrd_s'. Fix: did you mean "
        "'loss_forward_s'?")
    assert len(str(exc.value).splitlines()) == 1


def test_a_link_at_the_time_floor_says_so_and_is_bounded_at_10x():
    """Every step's sync 1/20 of the bandwidth term above the latency (20x faster): bounded at the floor, x10, and
    the note says why; spread 0, so it is written."""
    profile = toy_profile({"A": 1.0})
    cluster = toy_cluster([("A", 4)], memory={"A": 10**9}, bw=1e3, latency=1e-3)
    plan = _toy_plan()
    rep = _synthetic_report(plan, cluster, profile, link_factor=1.0)
    sync = lambda g: estimate_plan(plan, _scaled_cluster(cluster, [0], g), profile).grad_sync_s     # noqa: E731
    rep["measured"]["grad_sync_steps_s"] = [sync(20.0)] * 6
    link = calibrate_run(rep, plan, cluster, profile, source="s", plan_path="p.json").calibration.figure(
        "link intra-node 0 (A)")
    assert (link.status, link.factor, link.spread) == ("calibrated", pytest.approx(10.0), 0.0)
    assert link.note == ("from the measured gradient sync (a step's sync within a tenth of the bandwidth term of the "
                         "latency counts as x10, the most a step can give)")


@pytest.mark.distributed
def test_run_calibrate_without_a_planner_says_the_replan_was_not_checked(wrong_setup, capsys):
    """hpp.runtime.cli's own entry point has no planner (the runtime imports no search code): the profile and links
    are still written, and the console says the re-plan was not checked instead of pricing one."""
    from hpp.runtime.cli import run_main
    out = wrong_setup / "cal.json"
    assert run_main([str(wrong_setup / "plan.json"), "--steps", "3", "--launcher", "fork", "--emulate-speed",
                     "--calibrate", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  re-plan: not checked (no planner was given to this entry point; `hpp run` checks it)" in lines
    assert load_profile(out).calibration is not None and cluster_path_of(out).exists()
