"""The search's truth oracle: random small instances and the exhaustive optimum of the cost model.

Shared by ``tests/test_search_truth.py`` (the default suite's 100 instances, and the ``slow`` run) and
``experiments/search_truth.py`` (the CSV and summary of a long run).

Instances (:func:`truth_instance`): 2-4 GPU types of 1-3 GPUs each, 4-8 layers, 2-3 stages at most, micro-batch
sizes {1, 2} or {2}, drawn from one of :data:`FAMILIES` by the seed:

- ``independent``: each type's memory, speed and links drawn independently (orderings agree or not, by chance);
- ``inverted``: the orderings disagree on purpose: the fastest type has the least memory and the slowest links,
  the slowest type the most memory and the fastest links;
- ``per-pair``: a version-2 cluster, one inter-node link per pair of types (the types' orderings independent);
- ``zoned``: per-pair, with every node in one of two zones and a link between the zones;
- ``bundled``: 2-4 of the bundled GPU types (1-3 each) with their measured per-pair links and a bundled model's
  measured profile (OPT-350 or GPT-Neo-2.7, TP up to 2), whose speed, memory and link orderings disagree
  (e.g. the V100's small memory, the RTX types' slow links).

Drawn by name only (:data:`NAMED_FAMILIES`, not in the seed rotation): ``packed``, 1-3 types on one or two whole
nodes of 2-4 devices, fast in-node links and slow ones across nodes, large gradients: pipelines that fit one node
and the gradient rings through their nodes decide the plan (the copy bound's one-node and crossing columns).

Links are drawn from the bundled public network fits (Sailor's), non-monotone ones included (the effective
bandwidth falls for some message sizes).

The oracle (:func:`exhaustive_optimum`) enumerates every multiset of copies of the UNPRUNED candidates (every
pruning rule off: every shape of the space, every order of its type groups, every micro-batch size, the
least-bottleneck and the least-fill partition of each) that fits the inventory, binds each to devices with the
planner's own binding rules and data split (:func:`hpp.formulation.binding.build_plan`) and prices it with the
cost model (:func:`hpp.formulation.cost_model.estimate_plan`, gradient sync and point-to-point on the bound
devices' links included). Plans the cost model says do not fit memory are not plans. To keep it fast, a multiset
is priced in full only when a lower bound of its price from the cost model's own terms is below the best price
found so far: the data split's least time with each pipeline's compute alone
(:func:`~hpp.formulation.cost_model.stage_compute_s`; transfers, sync and optimizer step dropped, each >= 0);
``skip=False`` prices every multiset (tested equal).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from hpp.errors import HppInputError, InfeasibleError
from hpp.formulation.space_limits import SearchSpace
from hpp.formulation.cost_model import stage_compute_s
from hpp.formulation.data_balance import least_time_s
from hpp.planner import make_problem
from hpp.profiles.bundled import load_bundled_profile
from hpp.profiles.cluster import Cluster, Link, Node
from hpp.profiles.devices import DeviceType
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.pruning.rules import PruningOptions
from hpp.scenarios import make_cluster
from tests.test_certified import _per_pair_cluster, public_fits

__all__ = ["FAMILIES", "NAMED_FAMILIES", "NO_PRUNING", "TruthInstance", "Oracle", "Check", "truth_instance", "exhaustive_optimum",
           "instance_or_none", "check_instance"]

GB = 10**9
FAMILIES = ("independent", "inverted", "per-pair", "zoned", "bundled")
#: Families drawn by name only (not in the seed rotation of :data:`FAMILIES`): ``packed`` (module docstring).
NAMED_FAMILIES = ("packed",)
#: Every pruning rule off (memoisation stays: it changes no value).
NO_PRUNING = PruningOptions(memory_infeasible=False, dominated=False, incumbent_bound=False, symmetry=False,
                            canonical_order=False)


@dataclass(frozen=True)
class TruthInstance:
    """One random instance: ``(cluster, profile, global_batch_size, space)`` and its family."""

    seed: int
    family: str
    cluster: Cluster
    profile: ModelProfile
    global_batch_size: int
    space: SearchSpace


def truth_instance(seed: int, *, family: str | None = None, max_gpus_per_type: int = 3) -> TruthInstance:
    """The instance of ``seed`` (module docstring); ``family`` None: ``FAMILIES[seed % 5]``."""
    family = family or FAMILIES[seed % len(FAMILIES)]
    known = FAMILIES + NAMED_FAMILIES
    if family not in known:
        raise ValueError(f"unknown family {family!r}; known: {known}")
    rng = random.Random(seed * 7919 + known.index(family))
    if family == "bundled":
        return _bundled_instance(seed, rng, max_gpus_per_type)
    if family == "packed":
        return _packed_instance(seed, rng, max_gpus_per_type)
    fits = public_fits()
    n_types = rng.choice([2, 2, 3, 3, 4])
    top = max(1, min(max_gpus_per_type, {2: 3, 3: 2, 4: 2}[n_types]))
    L = rng.randint(4, 8)
    params = [rng.randint(100, 900) * 10**6 for _ in range(L)]      # bytes per layer: 0.1-0.9 GB
    act = [rng.randint(50, 400) * 10**6 for _ in range(L)]
    out = [rng.randint(1, 64) * 10**6 for _ in range(L)]
    base = [rng.uniform(0.01, 0.1) for _ in range(L)]
    mems = [rng.choice([11, 16, 24, 40, 48, 80, 96]) * GB for _ in range(n_types)]
    slows = [rng.uniform(0.5, 3.0) for _ in range(n_types)]
    links = [rng.choice(fits) for _ in range(n_types)]
    if family == "inverted":
        # the fastest type (least slowdown) gets the least memory and the slowest link (least peak), and so on
        mems.sort()
        slows.sort()
        links.sort(key=lambda fp: fp[1])                 # slowest link (least peak) first: the fastest type's
    types, entries, nodes = {}, {}, []
    for i in range(n_types):
        name = f"T{i}"
        per_node = rng.choice([1, 2, 2, 4])
        types[name] = DeviceType(name, mems[i], per_node)
        for b in (1, 2):
            e = LayerProfile(name, 1, b, tuple(f * slows[i] * b for f in base),
                             tuple(2 * f * slows[i] * b for f in base), tuple(0.002 * slows[i] for _ in range(L)),
                             tuple(params), tuple(a * b for a in act), tuple(o * b for o in out))
            entries[e.key] = e
        count = rng.randint(1, top)
        while count > 0:
            n = min(per_node, count)
            fit, peak = links[i] if family == "inverted" else rng.choice(fits)
            nodes.append(Node(name, n, Link(peak, rng.choice([0.0, 1e-5]), fit)))
            count -= n
    fit, peak = rng.choice(fits)
    if family == "inverted":
        fit, peak = min(fits, key=lambda fp: fp[1]) if rng.random() < 0.5 else (fit, peak)
    cluster = Cluster(f"truth-{family}-{seed}", types, tuple(nodes), Link(peak, rng.choice([0.0, 1e-5]), fit))
    if family in ("per-pair", "zoned"):
        cluster = _per_pair_cluster(cluster, rng, fits, zoned=family == "zoned")
    profile = ModelProfile("truth", L, 128, entries, "synthetic", "CC0")
    space = SearchSpace(max_stages=rng.choice([2, 3]), micro_batch_sizes=(1, 2) if rng.random() < 0.5 else (2,))
    return TruthInstance(seed, family, cluster, profile, rng.randint(4, 32), space)


def _packed_instance(seed: int, rng: random.Random, max_gpus_per_type: int) -> TruthInstance:
    """Family ``packed`` (module docstring): 1-3 types on one or two whole nodes of 2-4 devices each (one node where a
    node holds more than ``max_gpus_per_type`` + 1), fast in-node links and slow ones across nodes, large gradients
    and small activations,
    so that a pipeline whole on one node and the gradient rings through that node (in-node, hierarchical or flat)
    decide the plan."""
    fits = sorted(public_fits(), key=lambda fp: fp[1])
    slow, fast = fits[:max(1, len(fits) // 3)], fits[-max(1, len(fits) // 3):]
    n_types = rng.choice([1, 2, 2, 3])
    L = rng.randint(4, 6)
    params = [rng.randint(300, 900) * 10**6 for _ in range(L)]
    act = [rng.randint(5, 80) * 10**6 for _ in range(L)]
    out = [rng.randint(1, 16) * 10**6 for _ in range(L)]
    base = [rng.uniform(0.01, 0.1) for _ in range(L)]
    types, entries, nodes = {}, {}, []
    for i in range(n_types):
        name = f"T{i}"
        per_node = rng.choice([2, 2, 3, 4])
        slowdown = rng.uniform(0.5, 3.0)
        types[name] = DeviceType(name, rng.choice([16, 24, 40, 80]) * GB, per_node)
        for b in (1, 2):
            e = LayerProfile(name, 1, b, tuple(f * slowdown * b for f in base),
                             tuple(2 * f * slowdown * b for f in base), tuple(0.002 * slowdown for _ in range(L)),
                             tuple(params), tuple(a * b for a in act), tuple(o * b for o in out))
            entries[e.key] = e
        fit, peak = rng.choice(fast)
        # whole nodes only: with a part node the binding of a composition depends on the order of its copies, and
        # the oracle, which orders them by its own candidate indices, would not price the best of them
        for _ in range(1 if per_node > max_gpus_per_type + 1 else rng.choice([1, 2])):
            nodes.append(Node(name, per_node, Link(peak, rng.choice([0.0, 1e-5]), fit)))
    fit, peak = rng.choice(slow)
    cluster = Cluster(f"truth-packed-{seed}", types, tuple(nodes), Link(peak, rng.choice([0.0, 1e-5]), fit))
    profile = ModelProfile("truth", L, 128, entries, "synthetic", "CC0")
    space = SearchSpace(max_stages=rng.choice([2, 3]), micro_batch_sizes=(1, 2) if rng.random() < 0.5 else (2,))
    return TruthInstance(seed, "packed", cluster, profile, rng.randint(4, 32), space)


def _bundled_instance(seed: int, rng: random.Random, max_gpus_per_type: int) -> TruthInstance:
    """Family ``bundled`` (module docstring)."""
    model = rng.choice(["OPT-350", "OPT-350", "GPT-Neo-2.7"])
    profile = load_bundled_profile(model)
    have = sorted({k[0] for k in profile.entries})
    n_types = rng.choice([2, 2, 3, 3, 4])
    top = max(1, min(max_gpus_per_type, {2: 3, 3: 2, 4: 2}[n_types]))
    gpus = {t: rng.randint(1, top) for t in rng.sample(have, n_types)}
    cluster = make_cluster(f"truth-bundled-{seed}", gpus)
    sizes = sorted({k[2] for k in profile.entries})
    b = rng.choice([s for s in sizes if s <= 8])
    mbs = tuple(x for x in (b, 2 * b) if x in sizes) if rng.random() < 0.5 else (b,)
    space = SearchSpace(max_stages=rng.choice([2, 3]), micro_batch_sizes=mbs, max_tp=rng.choice([1, 2]))
    return TruthInstance(seed, "bundled", cluster, profile, rng.choice([8, 16, 32, 64]), space)


@dataclass(frozen=True)
class Oracle:
    """The exhaustive optimum: ``counts`` of the unpruned problem's candidates, its cost-model ``time_s`` and
    ``plan``; ``compositions`` multisets enumerated, ``priced`` of them priced in full, ``not_fitting`` priced
    ones the cost model says overflow memory (not plans)."""

    counts: dict
    time_s: float
    plan: object
    compositions: int
    priced: int
    not_fitting: int
    num_candidates: int
    problem: object = field(repr=False, default=None)


def _compute_only(cand, profile: ModelProfile) -> tuple[float, float]:
    """(bottleneck, fill) [s] of one copy with compute alone (the cost model's F_s + B_s per stage)."""
    e_of = {}
    times = []
    bnd = cand.partition.boundaries
    for s, kind in enumerate(cand.shape):
        key = (kind.device_type, kind.tp_degree)
        if key not in e_of:
            e_of[key] = profile.layer_profile(kind.device_type, kind.tp_degree, cand.micro_batch_size,
                                              estimate=False)
        f, b = stage_compute_s(e_of[key], bnd[s], bnd[s + 1], cand.partition.recompute[s])
        times.append(f + b)
    return max(times), sum(times)


def _multisets(problem, limit: int) -> list[dict[int, int]]:
    """Every non-empty multiset of candidate copies that fits the inventory (HppInputError above ``limit``)."""
    n = len(problem.candidates)
    out: list[dict[int, int]] = []

    def rec(i: int, counts: dict[int, int]) -> None:
        if i == n:
            if counts:
                out.append(dict(counts))
                if len(out) > limit:
                    raise HppInputError(f"more than {limit} compositions", field="instance",
                                        fix="the exhaustive oracle is for small instances only")
            return
        rec(i + 1, counts)
        x = 1
        while True:
            counts[i] = x
            if not problem.fits(counts):
                break
            rec(i + 1, counts)
            x += 1
        del counts[i]

    rec(0, {})
    return out


def exhaustive_optimum(inst: TruthInstance, *, limit: int = 200_000, skip: bool = True) -> Oracle:
    """The cost model's optimum over every composition of the unpruned candidates (module docstring).

    Raises
    ------
    InfeasibleError
        No candidate fits memory.
    HppInputError
        More than ``limit`` multisets.
    """
    full, _ = make_problem(inst.cluster, inst.profile, inst.global_batch_size, space=inst.space, pruning=NO_PRUNING,
                           workers=1)
    cands = full.candidates
    G = inst.global_batch_size
    comp = [_compute_only(c, inst.profile) for c in cands]
    rows = []
    for counts in _multisets(full, limit):
        lb = least_time_s([(comp[c][0], comp[c][1], cands[c].micro_batch_size, x) for c, x in counts.items()], G)
        rows.append((lb * (1 - 1e-9), counts))
    rows.sort(key=lambda r: r[0])
    best: tuple[float, dict, object] = (math.inf, {}, None)
    priced = not_fitting = 0
    for lb, counts in rows:
        if skip and lb >= best[0]:
            break
        plan, est = full.estimator(counts)
        priced += 1
        if not est.fits_memory:
            not_fitting += 1
            continue
        if est.iteration_time_s < best[0]:
            best = (est.iteration_time_s, counts, plan)
    return Oracle(best[1], best[0], best[2], len(rows), priced, not_fitting, len(cands), full)


def instance_or_none(seed: int, **kw) -> TruthInstance | None:
    """:func:`truth_instance`, or None when no shape of it fits memory (no plan: nothing to compare)."""
    inst = truth_instance(seed, **kw)
    try:
        make_problem(inst.cluster, inst.profile, inst.global_batch_size, space=inst.space, workers=1)
    except (InfeasibleError, HppInputError):
        return None
    return inst


@dataclass(frozen=True)
class Check:
    """One instance checked against the oracle: the search's figures, the oracle's, and what was violated."""

    seed: int
    family: str
    settings: str
    num_gpus: int
    num_types: int
    candidates: int
    compositions: int
    priced: int
    status: str
    objective_s: float
    bound_s: float
    oracle_s: float
    source: str
    bound_method: str
    search_s: float
    oracle_wall_s: float
    violations: tuple[str, ...]

    @property
    def excess(self) -> float:
        """objective / oracle - 1 (0 at the optimum)."""
        return self.objective_s / self.oracle_s - 1.0


def check_instance(inst: TruthInstance, settings, *, label: str = "default", limit: int = 3000) -> Check | None:
    """Plan ``inst`` with ``settings`` (:func:`hpp.planner.plan_hpp`, no baseline seeds) and compare with the oracle;
    None when the oracle would need more than ``limit`` compositions (the instance proves nothing then).

    Violations (each a line): an OPTIMAL plan above the oracle's optimum (beyond the solve path's optimality
    tolerance), a bound above it, a plan below it (the oracle missed a plan: not exhaustive), a bound above the
    plan's own time.
    """
    import time

    from hpp.formulation.composition.solve import OPTIMUM_ATOL_S, OPTIMUM_RTOL
    from hpp.planner import plan_hpp

    t0 = time.perf_counter()
    try:
        orc = exhaustive_optimum(inst, limit=limit)
    except HppInputError:
        return None
    t1 = time.perf_counter()
    res = plan_hpp(inst.cluster, inst.profile, inst.global_batch_size, space=inst.space, settings=settings)
    s = res.search
    bad = []
    if s.status == "OPTIMAL" and s.objective_s - orc.time_s > OPTIMUM_ATOL_S + OPTIMUM_RTOL * orc.time_s:
        bad.append(f"OPTIMAL at {s.objective_s:.6g} s above the optimum {orc.time_s:.6g} s")
    if s.bound_s > orc.time_s * (1 + 1e-9):
        bad.append(f"bound {s.bound_s:.6g} s above the optimum {orc.time_s:.6g} s")
    if s.objective_s < orc.time_s * (1 - 1e-9):
        bad.append(f"plan {s.objective_s:.6g} s below the oracle's optimum {orc.time_s:.6g} s")
    if s.bound_s > s.objective_s * (1 + 1e-9):
        bad.append(f"bound {s.bound_s:.6g} s above the plan's {s.objective_s:.6g} s")
    return Check(inst.seed, inst.family, label, inst.cluster.num_devices, len(inst.cluster.count_by_type()),
                 orc.num_candidates, orc.compositions, orc.priced, s.status, s.objective_s, s.bound_s, orc.time_s,
                 s.source, s.bound_method, res.wall_s, t1 - t0, tuple(bad))
