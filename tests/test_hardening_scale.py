"""Scale and output: baselines without recursion on 1,024 and 4,096 GPUs of a type,
their deadlines and progress, the uniform baseline's fast pricing (equal to the cost model), one story
about where the plan came from, grouped plan tables and short, aligned lines."""

import itertools
import json
import math

import pytest

from hpp.baselines.shapes import group_splits, iter_group_splits, lazy_product, type_orders
from hpp.baselines.uniform import (_even_split, _make_plan, _price, _uniform_groups, _uniform_layout,
                                  _uniform_pipe_bound_s, _uniform_pipeline, _uniform_sync_s, _uniform_time_s)
from hpp.baselines.single_shape import _single_shape_candidates, run_baselines, shape_label, single_shape_baseline
from hpp.baselines.uniform import uniform_baseline
from hpp.cli import main
from hpp.formulation.space_limits import SearchSpace, common_micro_batch_sizes
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.stage_balance import StageKind
from hpp.profiles.bundled import load_bundled_profile
from hpp.scenarios import SCENARIOS, get_scenario, make_cluster

OPT = load_bundled_profile("OPT-350")


def _recursive_splits(n, sizes):
    """The enumeration as it was (one recursion level per group): the reference order."""
    out = []

    def rec(left, maxsize, acc):
        if left == 0:
            out.append(acc)
            return
        for s in sizes:
            if s <= left and s <= maxsize:
                rec(left - s, s, acc + (s,))

    rec(n, max(sizes), ())
    return out


# --------------------------------------------------------------------------- 2. no recursion, fast

@pytest.mark.parametrize("sizes", [[1, 2, 4], [2, 4], [1, 3], [4], [1, 2, 4, 8]])
def test_iterative_splits_equal_the_recursive_ones_in_order(sizes):
    for n in range(0, 25):
        ref = _recursive_splits(n, sizes)
        assert group_splits(n, sizes) == ref
        for cap in (0, 1, 3, 7):
            assert group_splits(n, sizes, max_groups=cap) == [s for s in ref if len(s) <= cap]


def test_bounded_product_equals_the_filtered_product():
    splits = [_recursive_splits(6, [1, 2]), _recursive_splits(4, [1, 2, 4]), _recursive_splits(3, [1])]
    for mpl in (None, 4):
        full = list(itertools.product(*[list(type_orders(s, mpl)) for s in splits]))
        for cap in (5, 8, 13):
            assert list(lazy_product(splits, mpl, max_total=cap)) == [c for c in full if sum(map(len, c)) <= cap]


def test_splits_of_thousands_of_devices_need_no_stack():
    # 4,096 devices in groups of 1, 2, 4 within 26 stages: the recursion needed 4,096 frames (and 10^6 splits)
    assert group_splits(4096, [1, 2, 4], max_groups=26) == []
    assert group_splits(100, [1, 2, 4], max_groups=26) == [(4,) * 24 + (2, 2), (4,) * 25] == \
        [s for s in _recursive_splits(100, [1, 2, 4]) if len(s) <= 26]
    count = sum(1 for c4 in range(501) for c2 in range((2000 - 4 * c4) // 2 + 1)
                if c4 + c2 + (2000 - 4 * c4 - 2 * c2) <= 520)             # (4s, 2s, 1s) with at most 520 groups
    assert sum(1 for _ in iter_group_splits(2000, [1, 2, 4], max_groups=520)) == count == 154


@pytest.mark.parametrize("gpus", [1024, 4096])
def test_baselines_on_a_single_type_of_thousands_of_gpus(gpus):
    """RecursionError at ~1,000 GPUs of a type; both searches now finish untruncated."""
    cl = make_cluster(f"a100x{gpus}", {"A100-40": gpus})
    res = run_baselines(cl, OPT, 4 * gpus)
    for r in res.values():
        assert r.feasible and "truncated" not in r.description and "stopped" not in r.description
    # On one type the single-shape baseline's winner is a uniform layout (even split, cluster order),
    # which the uniform baseline prices exactly as the cost model does: it is never worse. (They were equal
    # while the uniform baseline priced the sync as a flat ring over cluster.inter_node; priced as the cost
    # model does, DP=1024/4096 TP=1 wins the uniform search, which the single-shape baseline, ranking its
    # shapes with the composition model, does not pick.)
    assert res["uniform"].iteration_time_s <= res["single-shape"].iteration_time_s * (1 + 1e-9)
    assert res["uniform"].plan.num_devices == gpus


def test_mixed_tp_single_shape_on_1024_gpus_finishes():
    cl = make_cluster("a100x1024", {"A100-40": 1024})
    r = single_shape_baseline(cl, OPT, 4096, space=SearchSpace(mixed_tp_pipelines=True))
    assert r.feasible and "truncated" not in r.description and r.candidates > 100


# --------------------------------------------------------------------------- 3. deadlines, progress

def test_a_zero_budget_stops_both_baselines_before_any_work():
    # 512 GPUs of 2 types: single shapes exist in the space (of 4 types, as opt350-1024-4types, none
    # does with max_types_per_pipeline=2, and "no feasible single shape" would be the honest answer)
    sc = get_scenario("opt350-512")
    assert next(iter(_single_shape_candidates(sc.cluster(), OPT, SearchSpace())), None) is not None
    said = []
    res = run_baselines(sc.cluster(), OPT, sc.global_batch_size, time_budget_s=0.0, progress=said.append)
    assert res["uniform"].candidates == 0 and "stopped at the time limit after 0 layouts" in res["uniform"].description
    assert res["single-shape"].candidates == 0
    assert "truncated after 0 candidates at the time limit" in res["single-shape"].description
    assert said[0].startswith("baseline uniform") and any(m.startswith("baseline single-shape") for m in said)
    assert said[-1].startswith("baseline single-shape: no feasible plan (0 priced")


def test_searches_report_progress_while_they_run(monkeypatch):
    import hpp.baselines.uniform as bu
    monkeypatch.setattr(bu._Clock.__init__, "__defaults__", (0.0,))       # a line at every check, not every 2 s
    said = []
    cl = make_cluster("c", {"A100-40": 8, "V100-16": 8})
    assert uniform_baseline(cl, OPT, 64, progress=said.append).feasible
    assert single_shape_baseline(cl, OPT, 64, progress=said.append).feasible
    assert any(m.startswith("uniform: ") and " layouts priced, best " in m for m in said)
    assert any(m.startswith("single-shape: ") and " candidates priced, best " in m for m in said)


def test_plan_cli_reports_the_baselines_on_stderr(capsys):
    assert main(["plan", "--baseline-time-limit", "3", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    for line in ("[hpp plan] baselines (together at most 3 s; --baseline-time-limit S, --no-baselines)",
                 "[hpp plan] baseline uniform (Megatron DP x PP x TP), up to 1.5 s",
                 "[hpp plan] baseline uniform: 44.792 s/iter", "[hpp plan] baseline single-shape: "):
        assert line in err, line


# --------------------------------------------------------------------------- uniform fast pricing == cost model

@pytest.mark.parametrize("gpus, gbs, grad_sync", [({"A100-40": 6, "V100-16": 8}, 64, "block"),
                                                  ({"A100-40": 8, "V100-16": 8, "GH-96": 4}, 7, "block"),
                                                  ({"A100-40": 8, "V100-16": 8, "GH-96": 4}, 33, "layer"),
                                                  ({"RTX-3090": 12, "V100-16": 6}, 100, "block")])
def test_uniform_layouts_priced_from_distinct_pipelines_equal_the_cost_model(gpus, gbs, grad_sync):
    cl, config = make_cluster("u", gpus), CostModelConfig(grad_sync=grad_sync)
    types = sorted(cl.count_by_type())
    checked = finite = 0
    for tp in (1, 2, 4):
        groups = _uniform_groups(cl, tp)
        for pp in range(1, min(OPT.num_layers, len(groups)) + 1):
            bounds = [0, *itertools.accumulate(_even_split(OPT.num_layers, pp))]
            samples = _even_split(gbs, len(groups) // pp)
            layout = _uniform_layout(cl, groups, pp, samples)
            for b in common_micro_batch_sizes(OPT, tuple(StageKind(t, tp) for t in types), SearchSpace()):
                for rec in ("none", "full"):
                    reps = [_uniform_pipeline(OPT, groups, r, pp, tp, bounds, b, samples[r], rec) for r in layout[0]]
                    fast = _uniform_time_s(cl, OPT, gbs, layout, reps, bounds, tp, b, config)
                    whole = [_uniform_pipeline(OPT, groups, r, pp, tp, bounds, b, n, rec)
                             for r, n in enumerate(samples) if n]
                    exact = _price(_make_plan(OPT, cl, gbs, whole), cl, OPT, config)
                    checked += 1
                    if math.isinf(exact):
                        assert math.isinf(fast)
                        continue
                    finite += 1
                    assert fast == pytest.approx(exact, rel=1e-12)
                    sync, opt = _uniform_sync_s(cl, OPT, layout, bounds, tp, b, config)
                    bound = _uniform_pipe_bound_s(OPT, groups, layout, samples, bounds, tp, b, rec) + sync + opt
                    assert bound <= exact * (1 + 1e-12)          # the pruning bound never cuts a better layout
    assert checked > 100 and finite > 20


# --------------------------------------------------------------------------- 9. one story about the plan

def test_the_returned_plan_has_one_source(capsys):
    # the default, deterministic budget (a wall-clock one would depend on the host's load)
    assert main(["plan", "--no-baselines", "--workers", "1", "--cpsat-on-subset"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("plan returned:")]
    assert len(lines) == 1 and lines[0].startswith("plan returned: the search's, ")
    assert "(CP-SAT found none better)" not in out
    assert main(["plan", "--no-baselines", "--workers", "1", "--cpsat-on-subset", "--json"]) == 0
    search = json.loads(capsys.readouterr().out)["search"]      # CP-SAT ran on a subset: its own status, said so
    assert search["solver_status"] in ("OPTIMAL", "FEASIBLE") and search["note"].startswith("cp-sat saw 12 of 733")
    # search.source: where the plan came from; search.solver: the solver asked for (SolveResult.solver =
    # settings.solver, --solver, default cp-sat), not the one whose answer won
    assert main(["plan", "--no-baselines", "--workers", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["search"]["source"] == "heuristic" and res["search"]["solver"] == "cp-sat"
    # ... which did not run here (733 candidates): its status is null and the note says why
    assert res["search"]["solver_status"] is None and res["search"]["note"].startswith("cp-sat skipped: 733 candidates")
    assert main(["plan", "--no-baselines", "--workers", "1", "--json", "--solver", "heuristic"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["search"]["source"] == "heuristic" and res["search"]["solver"] == "heuristic"


def test_a_baseline_plan_returned_is_said_once_and_consistently(capsys, monkeypatch):
    # The search beats both baselines on every bundled scenario (the single-shape baseline keeps to
    # max_types_per_pipeline, so on 3 types it has no plan), so a weaker search is built: one-stage candidates
    # of TP 2 or more only (pure DP over TP groups: 21.87 s), which the single-shape baseline (21.68 s) beats
    import hpp.planner as hp
    build = hp.build_candidates_bounded

    def one_stage_candidates(*a, **k):
        cands, bounds, stats = build(*a, **k)
        keep = [i for i, c in enumerate(cands) if len(c.shape) == 1 and c.shape[0].tp_degree >= 2]
        return [cands[i] for i in keep], [bounds[i] for i in keep], stats

    monkeypatch.setattr(hp, "build_candidates_bounded", one_stage_candidates)
    args = ["plan", "--workers", "1"]
    assert main([*args, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["search"]["source"] == "baseline:single-shape"
    assert res["predicted"]["iteration_time_s"] == pytest.approx(res["baselines"]["single-shape"]["iteration_time_s"])
    assert res["search"]["objective_s"] == pytest.approx(res["predicted"]["iteration_time_s"])
    assert main(args) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("plan returned:")]
    assert lines == ["plan returned: the single-shape baseline's, which the cost model prices below the search's "
                     "best; objective, bound and gap above are this plan's"]
    assert "the plan is the heuristic incumbent" not in out


# --------------------------------------------------------------------------- 12. output

def test_identical_pipelines_are_one_group_in_the_table(capsys):
    assert main(["plan", "--scenario", "opt350-a100x8-v100x8", "--no-baselines", "--workers", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert main(["plan", "--scenario", "opt350-a100x8-v100x8", "--no-baselines", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    kinds = {json.dumps([p["num_samples"], [(s["device_type"], s["tp_degree"], s["layers"], s["recompute"])
                                            for s in p["stages"]]]) for p in plan["pipelines"]}
    assert len(plan["pipelines"]) > len(kinds)                    # there are copies to group
    rows = [line for line in out.splitlines() if "GiB" in line and "[" in line]
    assert len(rows) == sum(len(json.loads(k)[1]) for k in kinds)  # one row per stage of each kind
    assert f"{len(plan['pipelines'])} pipelines in {len(kinds)} distinct kind{'' if len(kinds) == 1 else 's'}" in out
    assert "identical pipelines:" in out


def test_single_shape_lines_are_short_and_have_no_doubled_x(capsys):
    assert shape_label((StageKind("cpu-2x", 1), StageKind("cpu-2x", 1), StageKind("cpu", 2))) == \
        "2xcpu-2x+1xcpu(tp2)"
    assert main(["plan", "--scenario", "cpu-hetero-4", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    base = [line for line in out.splitlines() if line.startswith("baseline")]
    assert base and all("xx" not in line for line in base)       # was "cpu-2xx1"
    sc = get_scenario("opt350-1024-4types")
    r = single_shape_baseline(sc.cluster(), OPT, sc.global_batch_size, time_budget_s=1.0)
    assert len(r.description) < 200 and " | " not in r.description


def test_instances_list_columns_align(capsys):
    assert main(["instances", "list", "--suite", "full"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0]
    for col in ("family", "model", "mbs"):                        # left-aligned columns start together
        start = header.index(col)
        assert all(line[start - 1] == " " and line[start] != " " for line in lines[1:]), col
    for col in ("GPUs", "types", "stages"):                       # right-aligned columns end together
        end = header.index(col) + len(col)
        assert all(line[end - 1] != " " and line[end] == " " for line in lines[1:]), col


def test_the_4096_gpu_six_type_scenario_is_bundled():
    sc = SCENARIOS["opt350-4096-6types"]
    cl = sc.cluster()
    assert cl.num_devices == 4096 and len(cl.count_by_type()) == 6 and sc.model == "OPT-350"
    assert set(cl.count_by_type()) <= set(OPT.device_types)
    assert max(cl.count_by_type().values()) >= 1024               # a type past the old recursion limit
