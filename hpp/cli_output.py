"""What ``hpp plan`` and ``hpp estimate`` print: the plan table (identical pipelines grouped), its JSON,
and the one-line notes (where the returned plan came from, idle devices, types left out, a named solver
that did not run).

Pure formatting: estimates and plans in, strings out (or written to a stream).
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from hpp.wording import count

__all__ = ["optimality_tolerance", "status_text", "estimate_header", "block_forms", "print_memory_breakdown", "num",
           "estimate_json", "print_estimate", "index_ranges", "plan_source", "idle_alternative", "idle_devices_note", "named_solver_note",
           "search_json", "baselines_json", "print_plan_report"]


def num(x: Any) -> Any:
    """``x``, or None for a non-finite float (JSON has no inf/nan)."""
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def estimate_json(est) -> dict[str, Any]:
    """The cost model's breakdown of a plan as a JSON object (keys of the CONTRACT)."""
    return {
        "iteration_time_s": est.iteration_time_s,
        "pipeline_time_s": est.pipeline_time_s,
        "grad_sync_s": est.grad_sync_s,
        "grad_sync_block_s": est.grad_sync_block_s,
        "grad_sync_layer_s": est.grad_sync_layer_s,
        "optimizer_s": est.optimizer_s,
        "throughput_samples_per_s": est.throughput_samples_per_s,
        "throughput_tokens_per_s": est.throughput_tokens_per_s,
        "peak_memory_bytes": est.peak_memory_bytes,
        "fits_memory": est.fits_memory,
        "uses_estimated_profile": est.uses_estimated_profile,
        "device_types": sorted({s.device_type for p in est.pipelines for s in p.stages}),   # the ones the plan uses
        "pipelines": [{
            "time_s": p.time_s, "num_micro_batches": p.num_micro_batches, "micro_batch_size": p.micro_batch_size,
            "num_samples": p.num_samples, "bottleneck_s": p.bottleneck_s,
            "stages": [{"layers": [s.layer_start, s.layer_stop], "device_type": s.device_type,
                        "tp_degree": s.tp_degree, "recompute": s.recompute, "forward_s": s.forward_s,
                        "backward_s": s.backward_s, "p2p_s": s.p2p_s, "busy_s": s.busy_s, "bubble_s": s.bubble_s,
                        "optimizer_s": s.optimizer_s, "grad_sync_s": s.grad_sync_s,
                        "in_flight_micro_batches": s.in_flight_micro_batches, "memory_bytes": s.memory_bytes,
                        "capacity_bytes": s.capacity_bytes, "headroom_bytes": s.headroom_bytes,
                        "memory_breakdown": dict(s.memory_breakdown)}
                       for s in p.stages]} for p in est.pipelines],
        "blocks": [{"layers": [b.layer_start, b.layer_stop], "holder_stages": list(b.holders),
                    "bytes": b.num_bytes, "allreduce_s": b.allreduce_s, "allreduce_method": b.allreduce_method,
                    "link_bytes_per_s": b.link_bytes_per_s} for b in est.blocks],
    }


def optimality_tolerance() -> dict[str, float]:
    """``search.optimality_rtol`` and ``optimality_atol_s``: OPTIMAL means objective - bound <= atol + rtol x
    objective (:func:`hpp.formulation.composition.solve.status_of`)."""
    from hpp.formulation.composition.solve import OPTIMUM_ATOL_S, OPTIMUM_RTOL    # lazy: numpy (see hpp.cli)
    return {"optimality_rtol": OPTIMUM_RTOL, "optimality_atol_s": OPTIMUM_ATOL_S}


def status_text(comp) -> str:
    """The status as ``hpp plan`` prints it: ``OPTIMAL (gap within the 0.1 % optimality tolerance)`` when the proof
    leaves a gap the tolerance covers, else the status alone."""
    if comp.status != "OPTIMAL" or not comp.gap > 0:
        return comp.status
    return f"OPTIMAL (gap within the {optimality_tolerance()['optimality_rtol']:.1%} optimality tolerance)"


def estimate_header(path, plan, cluster, src: str | None, *, cluster_file=None) -> str:
    """``hpp estimate``'s first line: the plan, its model, pipelines and devices; for a converted plan whose cluster
    holds more devices than it uses (Sailor's: one node per stage replica), how many and why; with ``cluster_file``
    (``--cluster``), the plan's devices of that cluster's."""
    if cluster_file is not None:
        extra = f" of {cluster_file}'s {cluster.num_devices} (bound by --cluster)"
    else:
        extra = (f" of the converted cluster's {cluster.num_devices} (each stage replica on its own node, as {src} "
                 f"runs it)" if src and cluster.num_devices > plan.num_devices else "")
    return (f"plan {path}{f' ({src} plan)' if src else ''}: {plan.model}, {count(plan.num_pipelines, 'pipeline')} on "
            f"{count(plan.num_devices, 'device')}{extra}, global batch {plan.global_batch_size}")


def block_forms(blocks) -> str:
    """`` (2 hierarchical, 1 flat ring; slowest ring link 1.72 GB/s peak)``: how the blocks' all-reduces are priced
    (:class:`hpp.formulation.cost_model.BlockEstimate`): their forms and the least peak of the links they are
    priced on; '' when no block is synced."""
    forms = Counter(b.allreduce_method for b in blocks if b.allreduce_method != "none")
    if not forms:
        return ""
    names = {"hierarchical": "hierarchical", "ring": "flat ring"}
    slowest = min(b.link_bytes_per_s for b in blocks if b.allreduce_method != "none")
    return (" (" + ", ".join(f"{n} {names.get(m, m)}" for m, n in sorted(forms.items())) +
            f"; slowest ring link {slowest / 1e9:.3g} GB/s peak)")


def _mem_unit(capacity_bytes: float) -> tuple[float, str]:
    """GiB for GPU-sized capacities, MiB below 1 GiB (emulated CPU devices)."""
    return (2**30, "GiB") if capacity_bytes >= 2**30 else (2**20, "MiB")


def index_ranges(indices: Iterable[int]) -> str:
    """Compact text of sorted indices: runs become ``a-b``.

    Examples
    --------
    >>> index_ranges([0, 1, 2, 5, 7, 8])
    '0-2,5,7-8'
    """
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def print_memory_breakdown(est, out=None) -> None:
    """Per distinct stage, the predicted peak memory's parts (``StageEstimate.memory_breakdown``) [MiB or GiB].

    Profiles measured by ``hpp profile`` carry the runtime step's terms (parameters, gradients,
    optimizer states, pipelining buffers, embedding, head and loss, activations, backward
    transient, optimizer step, framework); the bundled GPU profiles the calibrated formula's
    (framework, weights and states, activations, backward workspace, pipelining buffers).
    """
    w = (out or sys.stdout).write
    unit, uname = _mem_unit(min(s.capacity_bytes for p in est.pipelines for s in p.stages))
    seen: set[tuple] = set()
    w(f"memory per stage [{uname}] (peak = the largest of the step's phases):\n")
    for i, p in enumerate(est.pipelines):
        for j, s in enumerate(p.stages):
            parts = {k: v for k, v in s.memory_breakdown.items() if k not in ("peak", "phase")}
            key = (s.device_type, s.tp_degree, s.layer_start, s.layer_stop, s.recompute, tuple(parts.items()))
            if not parts or key in seen:
                continue
            seen.add(key)
            body = ", ".join(f"{k.replace('_', ' ')} {v / unit:.1f}" for k, v in parts.items() if v)
            w(f"  pipeline {i} stage {j} ({s.device_type}, layers [{s.layer_start},{s.layer_stop})): "
              f"peak {s.memory_bytes / unit:.1f} of {s.capacity_bytes / unit:.1f} = {body}\n")


def print_estimate(est, plan, out=None) -> None:
    """The plan table: one row per stage of each distinct pipeline, identical pipelines counted once.

    Two pipelines are identical when every printed figure of every stage is (device type, TP,
    layers, recomputation, micro-batches, times, memory) and so are their samples and time; the
    group's rows name its pipelines (``0-7``) and the footer its count.
    """
    w = (out or sys.stdout).write          # sys.stdout at call time (it may be replaced after import)
    unit, uname = _mem_unit(min(s.capacity_bytes for p in est.pipelines for s in p.stages))
    groups: dict[tuple, list[int]] = {}
    rows_of: dict[tuple, list[str]] = {}
    for i, (p, pe) in enumerate(zip(plan.pipelines, est.pipelines)):
        rows = [f"{j:>5} {s.device_type:>12} {s.tp_degree:>2} {f'[{s.layer_start},{s.layer_stop})':>9} "
                f"{s.recompute[:4]:>4} {p.micro_batch_size:>3} {p.num_micro_batches:>4} "
                f"{1e3 * (se.forward_s + se.backward_s):>10.2f} {1e3 * se.p2p_s:>7.2f} {max(se.bubble_s, 0.0):>8.3f} "
                f"{se.grad_sync_s:>7.3f} {se.memory_bytes / unit:>6.1f}/{se.capacity_bytes / unit:>6.1f} {uname}"
                for j, (s, se) in enumerate(zip(p.stages, pe.stages))]
        key = (tuple(rows), p.num_samples, f"{pe.time_s:.3f}")
        groups.setdefault(key, []).append(i)
        rows_of[key] = rows
    names = {k: index_ranges(v) for k, v in groups.items()}
    width = max(5, *(len(n) for n in names.values()))
    w(f"{'pipes':>{width}} {'stage':>5} {'device':>12} {'tp':>2} {'layers':>9} {'rec':>4} {'mb':>3} {'#mb':>4} "
      f"{'fwd+bwd ms':>10} {'p2p ms':>7} {'bubble s':>8} {'sync s':>7} {'memory / capacity':>17}\n")
    for key, members in groups.items():
        for j, row in enumerate(rows_of[key]):
            w(f"{names[key] if j == 0 else '':>{width}} {row}\n")
        n, each = len(members), (" each" if len(members) > 1 else "")
        w(f"{'':>{width}} {'1 pipeline' if n == 1 else f'{n} identical pipelines'}: {count(key[1], 'sample')}{each}, "
          f"{key[2]} s{each}\n")
    kinds = f"{len(groups)} distinct kind{'' if len(groups) == 1 else 's'}"
    w(f"{count(len(plan.pipelines), 'pipeline')} in {kinds}; blocks: {len(est.blocks)}{block_forms(est.blocks)}; gradient sync "
      f"block-wise {est.grad_sync_block_s:.3f} s (per-layer all-reduce would take {est.grad_sync_layer_s:.3f} s)\n")
    w(f"predicted iteration time {est.iteration_time_s:.3f} s = pipelines {est.pipeline_time_s:.3f} + sync "
      f"{est.grad_sync_s:.3f} + optimizer {est.optimizer_s:.3f}; throughput {est.throughput_samples_per_s:.1f} "
      f"samples/s ({est.throughput_tokens_per_s:,.0f} tokens/s); peak memory {est.peak_memory_bytes / unit:.1f} "
      f"{uname}\n")
    if not est.fits_memory:
        w("WARNING: some device exceeds its memory capacity (memory above its capacity in the table)\n")
    for msg in est.warnings:
        w(f"note: {msg}\n")


def plan_source(stats: Mapping[str, Any], comp) -> tuple[str, str]:
    """(``search.source`` key, one sentence) saying where the returned plan came from.

    ``comp`` is the search's :class:`~hpp.formulation.composition.solve.SolveResult`: its objective, bound, gap and status
    describe the returned plan whatever its source (the search's heuristic incumbent, the exact
    solver's answer, a baseline's plan or the surviving pipelines of ``--previous``).
    """
    src = comp.source
    if src == "baseline:previous":        # hpp.replan.SEED_NAME: the surviving pipelines of --previous
        return ("previous", "plan returned: the surviving pipelines of --previous, which the cost model prices below "
                            "the search's best; objective, bound and gap above are this plan's")
    if src.startswith("baseline:"):
        name = src.split(":", 1)[1]
        return (src, f"plan returned: the {name} baseline's, which the cost model prices below the search's best; "
                     f"objective, bound and gap above are this plan's")
    what = {"cp-sat": "CP-SAT's solution", "milp": "the MILP's solution",
            "lp-rounding": "a rounded solution of the bound's LP, improved by a local search",
            "local-search": "a neighbour of the best plan that the cost model itself prices lower (local search)"
            }.get(src, "the heuristic incumbent")
    return src, f"plan returned: the search's, {what}"


def idle_alternative(res, cluster, gbs: int) -> dict | None:
    """:func:`hpp.planner.plan_using_idle_devices` of the search's answer when it leaves devices idle (memoised on
    the result's stats; None for a returned seed, or a batch smaller than the devices)."""
    from hpp.planner import plan_using_idle_devices      # lazy: numpy/OR-Tools, as hpp.cli's
    got = res.stats.get("idle_alternative", False)
    if got is False:
        idle = len(set(res.plan.device_ids)) < cluster.num_devices <= gbs
        got = plan_using_idle_devices(res.problem, res.search.counts) if idle and res.search.counts and \
            res.problem is not None else None
        res.stats["idle_alternative"] = got
    return got


def idle_devices_note(plan, cluster, gbs: int, *, left_out: set[str] = frozenset(),
                      predicted_s: float | None = None, alternative: dict | None = None) -> str | None:
    """A note when the plan leaves devices idle: how many, of which types, and why (None if all are used).

    ``left_out``: device types the search could not use at all (no usable TP degree or micro-batch
    size; said in an earlier note). ``alternative``: the best plan found that uses them
    (:func:`hpp.planner.plan_using_idle_devices`), said with how much slower it was predicted than
    ``predicted_s``.
    """
    used = set(plan.device_ids)
    idle: dict[str, int] = {}
    for d in cluster.devices:
        if d.device_id not in used:
            idle[d.device_type] = idle.get(d.device_type, 0) + 1
    if not idle:
        return None
    n = sum(idle.values())
    types = ", ".join(f"{c} x {t}" for t, c in sorted(idle.items()))
    why = []
    if set(idle) & left_out:
        why.append(f"{', '.join(sorted(set(idle) & left_out))} left out (see above)")
    if set(idle) - left_out:
        if gbs < cluster.num_devices:
            why.append(f"the global batch of {count(gbs, 'sample')} allows at most {count(gbs, 'pipeline')} (each needs a "
                       f"sample), and "
                       f"more or longer pipelines were not predicted faster; raise --gbs to use more devices")
        else:
            why.append("using them was not predicted faster (a slow or memory-short device, or the gradient sync "
                       "among more replicas, would cost more than it adds)")
            if alternative and predicted_s:
                t = alternative["iteration_time_s"]
                why.append(f"the best plan found that uses them ({count(alternative['devices_used'], 'device')}) was "
                           f"predicted {(t - predicted_s) / predicted_s:+.1%} ({t:.4f} s vs {predicted_s:.4f} s)")
            elif predicted_s:
                why.append("no candidate pipeline could add a copy on them")
    return f"{n} of {count(cluster.num_devices, 'device')} {'is' if n == 1 else 'are'} idle ({types}): {'; '.join(why)}"


def named_solver_note(named: str | None, comp, cpsat_params: str | None = None) -> str | None:
    """A note when the exact solver named with ``--solver`` was skipped for having too many candidates, or when
    ``--cpsat-params`` (``cpsat_params``) were given to another solver than CP-SAT (they are then unused).

    ``named``: the ``--solver`` value (None when not given); ``comp``: the search's ``SolveResult``. None when
    the solver ran, was not named, or was not needed (the incumbent already met the bound).
    """
    if cpsat_params and comp.solver != "cp-sat":
        return f"--cpsat-params unused: --solver {comp.solver} does not run CP-SAT"
    if named not in ("cp-sat", "milp") or comp.solver_status or "skipped" not in (comp.note or ""):
        return None
    return (f"--solver {named} did not run: {comp.note}; add --cpsat-on-subset to run it on the best ones (it may "
            f"improve the plan, its bound does not count)")


def search_json(outcome, plan, cluster, gbs: int, *, replan: Mapping[str, Any] | None) -> dict[str, Any]:
    """``search`` of ``hpp plan --json`` (docs/CONTRACT.md): the returned plan's figures and where it came from.

    ``outcome``: :class:`~hpp.request.PlanOutcome`; ``plan``: the plan written (with its ``predicted`` block);
    ``replan``: ``search.replan`` (None without ``--exclude-*`` / ``--previous``).
    """
    res = outcome.result
    comp = res.search
    source, _ = plan_source(res.stats, comp)
    return {"wall_s": res.wall_s, "status": comp.status, "gap": num(comp.gap), "objective_s": num(comp.objective_s),
            "bound_s": num(comp.bound_s), "bound_method": comp.bound_method, "solver": comp.solver,
            "solver_status": comp.solver_status or None, "solver_model_objective_s": num(comp.solver_model_objective_s),
            "note": comp.note or None, **optimality_tolerance(), "solve_s": comp.wall_s, "source": source,
            "hit_time_limit": comp.hit_time_limit, "num_candidates": comp.num_candidates,
            "baselines_s": outcome.baselines_s, "idle_devices": cluster.num_devices - len(set(plan.device_ids)),
            "idle_alternative": idle_alternative(res, cluster, gbs), "replan": replan,
            "stats": {k: (num(v) if isinstance(v, float) else v) for k, v in res.stats.items()}}


def baselines_json(outcome) -> dict[str, Any]:
    """``baselines`` of ``hpp plan --json``: per baseline its predicted time, HPP's speedup over it, its search."""
    t = outcome.result.estimate.iteration_time_s
    return {k: {"iteration_time_s": num(b.iteration_time_s), "throughput_samples_per_s": num(b.throughput),
                "speedup_of_hpp": num(b.iteration_time_s / t) if b.iteration_time_s else None, "wall_s": b.wall_s,
                "description": b.description, "feasible": b.feasible, "candidates": b.candidates}
            for k, b in outcome.baselines.items()}


def print_plan_report(outcome, plan, cluster, name: str, model: str, notes: Sequence[str], *, replanned_from=None,
                      out: str | None = None) -> None:
    """``hpp plan``'s text output: the plan table, the search line, where the plan came from, the baselines, notes.

    ``replanned_from``: the cluster before ``--exclude-*`` (given with ``--exclude-*`` or ``--previous``: a
    ``re-plan`` line); ``out``: the plan file written, if any.
    """
    from hpp.replan import SEED_NAME          # lazy: numpy/OR-Tools (see hpp.cli's module top)

    res = outcome.result
    comp = res.search
    print(f"HPP plan for {model} on {name}: {count(cluster.num_devices, 'device')} "
          f"({', '.join(f'{n} x {t}' for t, n in sorted(cluster.count_by_type().items()))}), "
          f"global batch {plan.global_batch_size}")
    print_estimate(res.estimate, plan)
    how = f" ({comp.note})" if comp.note else ""
    ran = comp.solver == "heuristic" or bool(comp.solver_status)    # "cp-sat FEASIBLE" would read as CP-SAT's answer
    print(f"search: {res.wall_s:.2f} s, solver {comp.solver}{'' if ran else ' not run'}, status {status_text(comp)}, "
          f"objective {comp.objective_s:.4f} s (the returned plan's predicted time), bound {comp.bound_s:.4f} s "
          f"({'LP and copy bound' if comp.bound_method == 'lp' else comp.bound_method}), gap {comp.gap:.2%}, "
          f"{comp.num_candidates} of {count(res.stats['num_candidates'], 'candidate')} left after the incumbent "
          f"bound{how}"
          f"{'; the wall-clock limit stopped the solver' if comp.hit_time_limit else ''}")
    print(plan_source(res.stats, comp)[1])
    if replanned_from is not None:
        print(f"re-plan: {replanned_from.num_devices} -> {count(cluster.num_devices, 'device')} in "
              f"{outcome.seed_s + res.wall_s:.2f} s"
              f"{' (the --previous seed was returned)' if res.stats.get('seeded_from') == SEED_NAME else ''}")
    for k, b in outcome.baselines.items():
        if b.feasible:
            print(f"baseline {k:>12}: {b.iteration_time_s:.3f} s/iter, HPP speedup "
                  f"{b.iteration_time_s / res.estimate.iteration_time_s:.2f}x ({b.description})")
        else:
            print(f"baseline {k:>12}: no feasible plan ({b.description})")
    for line in notes:
        print(f"note: {line}")
    if out:
        print(f"plan written to {out}")
