"""Predicted iteration time of a CPU run whose ranks share this host's cores.

The cost model (:func:`hpp.formulation.cost_model.estimate_plan`) prices a plan on
dedicated devices. A CPU run of ``hpp run`` puts ``R`` ranks (one compute thread each) on
one host of ``C`` cores, which changes the time in two ways this module models:

- **Sharing**: while ``n`` ranks compute at once, each gets ``min(1, C / n)`` of a core.
- **Contention**: a CPU second buys less work while several cores compute (SMT siblings,
  shared caches): ``kappa(b)`` = CPU time of an op while ``b`` cores are busy / alone,
  measured by :func:`hpp.runtime.profile.host_probe.measure_contention` (``meta["host_time"]`` of
  the profile; 1 when not measured).
- **Other load** (``background``): processes of other users that compute all the time
  take their share of the cores too (0 on a quiet host).
- **Steal** (``steal``): on a virtual host the hypervisor takes a share of the time a core
  wants to run; a computing rank gets ``1 - steal`` of its share (:mod:`hpp.runtime.host.steal`).
- **Real-op costs** (:mod:`hpp.runtime.host.ops`, ``meta["host_time"]["op_probe"]`` when the
  profile has it): ``kappa(n)`` measured with the model's own layer op for ``n`` *runnable*
  processes, past the cores (oversubscription), replaces the matmul contention; and each
  forward/backward op that starts after its rank waited (a receive, a transfer, the
  emulation's sleep, the step's sync) costs ``wake_s(R)`` more CPU seconds (``R`` ranks on
  the host): the op runs with caches the other ranks (and, on an idle virtual CPU, the
  hypervisor) refilled. On Dec 1 (15:53, quiet host) the ranks used 1.13-1.60 x the
  profiled CPU seconds, 1.0-2.1 ms more per op whatever the op's size; the profile's
  back-to-back layer loop never pays it. A rank asleep in a receive wakes ``recv_wake_s(k)``
  later than the uncontended transfer while ``k`` other ranks compute (gloo's thread and
  then the rank must get a core: 1.2-2 ms on Dec 1 with the cores busy, vs 0.05-0.08 ms
  for the profile's idle ping-pong).

and, with ``--emulate-speed``, the padding of :mod:`hpp.runtime.host.emulation`: a rank of a
device type ``k`` x slower (``k``: the profile's slowdown of an emulated type, else the cluster's,
:func:`believed_slowdown`) at time scale ``D`` sleeps after each forward/backward op until
the op lasts ``k D`` x the CPU time it used, so contention is padded too.

:func:`simulate_host_run` replays one training step event by event: every rank runs its
stage's schedule (1F1B: ``min(m, S - s)`` forwards, then one backward and one forward
alternately; GPipe: all forwards, then all backwards); a forward waits for the previous
stage's forward of that micro-batch and its transfer, a backward for the next stage's
backward and its transfer; after each op that sends, the sender waits for the transfer
(``k = 1``, as torch's schedules wait on a send with the next receive). CPU work runs at
the shared, contended rate; paddings and transfers take wall time only. After the last
rank's schedule, the gradient all-reduce takes the cost model's ``grad_sync_s``, then
every rank runs its optimizer step (CPU work, shared). Per-op work is the profile's at the
speed it was measured (the base device type of emulated types), split into the part inside
the padded ops (layers, loss backward, the in-op share of the schedule overhead) and the
part outside (loss forward, the rest of the overhead, the per-step overhead).

On ``C >= R`` cores, without contention and emulation, the result is the 1F1B schedule's
exact length, which the cost model's closed form approximates.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import Any

from hpp.errors import HppInputError
from hpp.formulation.cost_config import CostModelConfig
from hpp.formulation.cost_model import estimate_plan, stage_compute_s
from hpp.formulation.collectives import p2p_transfer_s
from hpp.plan_data import Plan
from hpp.profiles.cluster import Cluster
from hpp.profiles.model_profile import LayerProfile, ModelProfile
from hpp.profiles.step_time import HostTimeTerms
from hpp.runtime.host.ops import OpProbe, op_probe_of

__all__ = ["schedule_order", "HostPrediction", "simulate_host_run", "base_entry", "believed_slowdown", "host_terms",
           "scale_cpu_work", "emulated_entry", "emulation_mismatches", "EMULATION_TOLERANCE"]

#: the relative difference between an emulated type's entries / its base type's and its ``meta["emulated"]``
#: slowdown above which :func:`emulation_mismatches` reports the pair (a profile written by ``hpp profile
#: --emulate`` or ``hpp run --calibrate`` has them equal up to rounding)
EMULATION_TOLERANCE = 0.05

_EPS = 1e-12


@dataclass(frozen=True)
class HostPrediction:
    """Predicted step of a CPU run on a shared host [s].

    Attributes
    ----------
    iteration_time_s : float
        Start of the step to the end of the last rank's optimizer step.
    schedule_end_s : tuple of float
        Per rank, when its schedule ended.
    cpu_s : tuple of float
        Per rank, CPU seconds its forward/backward ops used (what the worker's ``cpu_s`` reports).
    grad_sync_s : float
    cores : int
    emulated : bool
    time_scale : float
    """

    iteration_time_s: float
    schedule_end_s: tuple[float, ...]
    cpu_s: tuple[float, ...]
    grad_sync_s: float
    cores: int
    emulated: bool
    time_scale: float


def host_terms(profile: ModelProfile, *, cores: int) -> HostTimeTerms:
    """The profile's ``meta["host_time"]`` (contention measured with the profile), or none (kappa = 1)."""
    d = profile.meta.get("host_time")
    return HostTimeTerms.from_dict(d) if d else HostTimeTerms(cores, ())


def base_entry(profile: ModelProfile, device_type: str, tp_degree: int, micro_batch_size: int) -> LayerProfile:
    """The entry as measured on this host: an emulated type's base entry (``meta["emulated"]``), else its own."""
    emu = profile.meta.get("emulated", {}).get(device_type)
    base = str(emu["base"]) if emu else device_type
    return profile.layer_profile(base, tp_degree, micro_batch_size)


def emulated_entry(base: LayerProfile, device_type: str, slowdown: float) -> LayerProfile:
    """``base`` (the base type's entry) as the emulation runs it on a ``slowdown`` x slower ``device_type``: forward
    and backward x ``slowdown``, the step's time terms as :meth:`~hpp.profiles.step_time.StepTimeTerms.emulated`
    pads them, the optimizer step unscaled (:mod:`hpp.runtime.host.emulation` pads the forward/backward ops only).

    Raises
    ------
    HppInputError
        ``slowdown`` < 1 (an emulation only slows down).

    Examples
    --------
    >>> b = LayerProfile("cpu", 1, 1, (1.0,), (2.0,), (0.5,), (8,), (8,), (8,))
    >>> e = emulated_entry(b, "cpu-2x", 2.0)
    >>> e.device_type, e.forward_s, e.backward_s, e.optimizer_s
    ('cpu-2x', (2.0,), (4.0,), (0.5,))
    """
    if not slowdown >= 1.0:
        raise HppInputError(f"slowdown {slowdown} for {device_type!r}", field="slowdown", fix="use a factor >= 1")
    return replace(base, device_type=device_type, forward_s=tuple(v * slowdown for v in base.forward_s),
                   backward_s=tuple(v * slowdown for v in base.backward_s),
                   step_time=base.step_time.emulated(slowdown) if base.step_time is not None else None,
                   estimated=base.estimated,
                   note=f"emulated: {base.device_type} measurement with forward and backward x {slowdown} "
                        "(sleep padding of hpp run --emulate-speed); optimizer step unscaled")


def emulation_mismatches(profile: ModelProfile, *, tolerance: float = EMULATION_TOLERANCE) -> list[str]:
    """One line per emulated type whose entries disagree with its ``meta["emulated"]`` slowdown.

    The planner prices an emulated type by its entries, the CPU run's prediction pads its ops by the slowdown
    (:func:`believed_slowdown`); the two say the same when each entry's forward + backward is the slowdown x its
    base type's entry's. Compared on the entries whose base type has the same key; reported when the ratio differs
    from the slowdown by more than ``tolerance`` (relative).

    >>> b = LayerProfile("cpu", 1, 1, (1.0,), (2.0,), (0.5,), (8,), (8,), (8,))
    >>> e = emulated_entry(b, "cpu-2x", 2.0)
    >>> p = ModelProfile("m", 1, 1, entries={b.key: b, e.key: e},
    ...                  meta={"emulated": {"cpu-2x": {"base": "cpu", "slowdown": 4.0}}})
    >>> emulation_mismatches(p)
    ['meta.emulated.cpu-2x.slowdown is 4 but its entries are x2.000 of the base type cpu (cpu-2x/tp1/mb1)']
    """
    out = []
    for dtype, emu in sorted(profile.meta.get("emulated", {}).items()):
        k = float(emu["slowdown"])
        for key in sorted(key for key in profile.entries if key[0] == dtype):
            base = profile.entries.get((str(emu["base"]), key[1], key[2]))
            if base is None:
                continue
            e = profile.entries[key]
            ratio = (sum(e.forward_s) + sum(e.backward_s)) / (sum(base.forward_s) + sum(base.backward_s))
            if abs(ratio / k - 1.0) > tolerance:
                out.append(f"meta.emulated.{dtype}.slowdown is {k:g} but its entries are x{ratio:.3f} of "
                           f"the base type {emu['base']} ({dtype}/tp{key[1]}/mb{key[2]})")
                break
    return out


def believed_slowdown(profile: ModelProfile, cluster: Cluster, device_type: str) -> float:
    """The slowdown the prediction pads ``device_type``'s ops by: the profile's (``meta["emulated"]``), else the
    cluster's.

    The emulation pads a rank by the cluster's slowdown (the emulated hardware, the truth of a run); the
    prediction is the profile's belief, so a profile wrong about an emulated type's speed predicts wrong, as a
    wrong GPU profile would, and a profile calibrated by a run (:mod:`hpp.runtime.calibrate`) carries the
    measured slowdown.
    """
    emu = profile.meta.get("emulated", {}).get(device_type)
    return float(emu["slowdown"]) if emu else cluster.device_types[device_type].slowdown


def scale_cpu_work(profile: ModelProfile, factor: float) -> ModelProfile:
    """Every CPU term of ``profile`` x ``factor`` (layers, optimizer, loss, schedule overheads, the op probe's
    seconds); transfers and the probe's kappa (a ratio) unchanged.

    The host's speed during a run relative to when it was profiled (``factor`` > 1: slower).
    """
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor}")

    def entry(e: LayerProfile) -> LayerProfile:
        t = e.step_time
        if t is not None:
            t = replace(t, loss_forward_s=t.loss_forward_s * factor, loss_backward_s=t.loss_backward_s * factor,
                        micro_batch_overhead_s=t.micro_batch_overhead_s * factor,
                        step_overhead_s=t.step_overhead_s * factor, p2p_overhead_s=t.p2p_overhead_s * factor)
        return replace(e, forward_s=tuple(v * factor for v in e.forward_s),
                       backward_s=tuple(v * factor for v in e.backward_s),
                       optimizer_s=tuple(v * factor for v in e.optimizer_s), step_time=t)

    meta = profile.meta
    ops = op_probe_of(meta)
    if ops is not None:
        scaled = replace(ops, hot_s=ops.hot_s * factor, wake_s=tuple(w * factor for w in ops.wake_s))
        meta = {**meta, "host_time": {**meta["host_time"], "op_probe": scaled.to_dict()}}
    return replace(profile, entries={k: entry(e) for k, e in profile.entries.items()}, meta=meta)


@dataclass
class _Seg:
    kind: str                  # "cpu" (work, pad factor), "dep" (wait for key + delay), "sleep", "sync"
    work: float = 0.0
    pad: float = 1.0
    key: tuple | None = None   # "cpu": op completed at its end; "dep": the op waited for
    delay: float = 0.0
    in_op: bool = False


def _stage_ops(e: LayerProfile, lo: int, hi: int, recompute: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """((F in-op, F outside), (B in-op, B outside)) work per micro-batch [s]."""
    f_layers, b_layers = stage_compute_s(replace(e, step_time=None), lo, hi, recompute)
    t = e.step_time
    if t is None:
        return (f_layers, 0.0), (b_layers, 0.0)
    last = hi == e.num_layers
    inside = t.micro_batch_overhead_s * t.micro_batch_overhead_in_op
    outside = t.stage_overhead_s(int(lo > 0) + int(hi < e.num_layers)) - inside
    return ((f_layers + inside / 2, outside / 2 + (t.loss_forward_s if last else 0.0)),
            (b_layers + inside / 2 + (t.loss_backward_s if last else 0.0), outside / 2))


def schedule_order(stage: int, num_stages: int, num_micro_batches: int, schedule: str) -> list[tuple[str, int]]:
    """The op order ``[("F"|"B", micro_batch), ...]`` of ``stage`` under ``schedule``.

    >>> schedule_order(0, 2, 3, "1F1B")
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
    """
    m = num_micro_batches
    if schedule == "GPipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(num_stages - stage, m)
    order = [("F", i) for i in range(warm)]
    nf, nb = warm, 0
    while nb < m:
        order.append(("B", nb))
        nb += 1
        if nf < m:
            order.append(("F", nf))
            nf += 1
    return order


def _rank_segments(plan: Plan, cluster: Cluster, profile: ModelProfile, *, emulate: bool, time_scale: float
                   ) -> tuple[list[list[_Seg]], list[float]]:
    segs: list[list[_Seg]] = []
    opt: list[float] = []
    for p, pipe in enumerate(plan.pipelines):
        S, m = pipe.num_stages, pipe.num_micro_batches
        ents = [base_entry(profile, st.device_type, st.tp_degree, pipe.micro_batch_size) for st in pipe.stages]
        links = [cluster.link(a.device_ids[-1], b.device_ids[0]) for a, b in zip(pipe.stages, pipe.stages[1:])]
        c = [p2p_transfer_s(e, link, e.output_bytes[st.layer_stop - 1])
             for e, link, st in zip(ents, links, pipe.stages)]
        for s, (st, e) in enumerate(zip(pipe.stages, ents)):
            c_in = c[s - 1] if s > 0 else 0.0
            c_out = c[s] if s < S - 1 else 0.0
            (f_in, f_out), (b_in, b_out) = _stage_ops(e, st.layer_start, st.layer_stop, st.recompute)
            pad = believed_slowdown(profile, cluster, st.device_type) * time_scale if emulate else 1.0
            step_ovh = e.step_time.step_overhead_s if e.step_time is not None and m > 0 else 0.0
            for lane in range(st.tp_degree):
                out = [_Seg("cpu", step_ovh)]
                for kind, i in schedule_order(s, S, m, pipe.schedule):
                    if kind == "F":
                        if s > 0:
                            out.append(_Seg("dep", key=(p, s - 1, lane, "F", i), delay=c_in))
                        out.append(_Seg("cpu", f_in, pad, key=(p, s, lane, "F", i), in_op=True))
                        out.append(_Seg("cpu", f_out))
                        if s < S - 1:
                            out.append(_Seg("sleep", delay=c_out))
                    else:
                        if s < S - 1:
                            out.append(_Seg("dep", key=(p, s + 1, lane, "B", i), delay=c_out))
                        out.append(_Seg("cpu", b_in, pad, key=(p, s, lane, "B", i), in_op=True))
                        out.append(_Seg("cpu", b_out))
                        if s > 0:
                            out.append(_Seg("sleep", delay=c_in))
                out.append(_Seg("sync"))
                segs.append(out)
                opt.append(sum(e.optimizer_s[st.layer_start:st.layer_stop]))
    return segs, opt


def simulate_host_run(plan: Plan, cluster: Cluster, profile: ModelProfile, *, cores: int, emulate_speed: bool,
                      time_scale: float = 1.0, host: HostTimeTerms | None = None, background: float = 0.0,
                      ops: OpProbe | None = None, steal: float = 0.0,
                      config: CostModelConfig = CostModelConfig()) -> HostPrediction:
    """One step of ``plan`` as ``hpp run`` executes it on a host of ``cores`` cores (see the module docstring).

    Parameters
    ----------
    cores : int
        Cores of the host (>= 1).
    emulate_speed : bool
        Whether ops are padded to ``slowdown x time_scale`` x their CPU time.
    host : HostTimeTerms, optional
        Contention factors (default: the profile's ``meta["host_time"]``, else none).
    background : float
        Other processes computing all the time (>= 0; 0 = a quiet host).
    steal : float
        Share of the time a virtual core wants to run that the hypervisor takes (in [0, 1); 0 = a
        dedicated host; :mod:`hpp.runtime.host.steal` measures it): a computing rank's core share
        ``min(1, C / n)`` becomes ``(1 - steal) min(1, C / n)``, in CPU seconds as in work, as
        Linux charges stolen time to no thread.
    ops : OpProbe, optional
        Real-op costs (kappa past the cores, CPU per op after a wait, a receive's late wake). Default: the profile's
        ``meta["host_time"]["op_probe"]`` when ``host`` is not given either, else none.

    Raises
    ------
    HppInputError
        A stage's entry is missing from the profile.
    ValueError
        ``cores < 1``, ``time_scale < 1``, ``background < 0`` or ``steal`` outside [0, 1).
    """
    if cores < 1 or not time_scale >= 1.0 or background < 0 or not 0.0 <= steal < 1.0:
        raise ValueError(f"cores={cores}, time_scale={time_scale}, background={background}, steal={steal}")
    if ops is None and host is None:
        ops = op_probe_of(profile.meta)
    host = host or host_terms(profile, cores=cores)
    sync_s = estimate_plan(plan, cluster, profile, config=config).grad_sync_s
    segs, opt = _rank_segments(plan, cluster, profile, emulate=emulate_speed, time_scale=time_scale)
    sim = _HostSim(segs, opt, sync_s=sync_s, cores=cores, host=host, ops=ops, background=background, steal=steal)
    sim.run()
    return HostPrediction(max(sim.finish), tuple(sim.sched_end), tuple(sim.cpu_in_ops), sync_s, cores, emulate_speed,
                          time_scale)


class _HostSim:
    """The event simulation of :func:`simulate_host_run`: ranks walk their segments; computing ranks share the
    cores (``rate`` = core share / kappa profile seconds per wall second); waits end on timers or on the op a
    rank depends on; the gradient sync starts when every rank's schedule has ended."""

    def __init__(self, segs: list[list[_Seg]], opt: list[float], *, sync_s: float, cores: int, host: HostTimeTerms,
                 ops: OpProbe | None, background: float, steal: float) -> None:
        self.R = R = len(segs)
        self.segs, self.sync_s, self.cores, self.host, self.ops = segs, sync_s, cores, host, ops
        self.background, self.steal = background, steal
        self.wake = ops.wake_at(R) if ops is not None else 0.0
        self.waited = [True] * R                                # the step starts after the last one's sync
        for r in range(R):
            segs[r].append(_Seg("cpu", opt[r]))
        self.pos = [0] * R
        self.done: dict[tuple, float] = {}
        self.state: list[dict[str, Any]] = [{} for _ in range(R)]   # current segment's progress
        self.cpu_in_ops = [0.0] * R
        self.sched_end = [math.nan] * R
        self.finish = [math.nan] * R
        self.sync_at: float | None = None
        self.t = 0.0
        self.timers: list[tuple[float, int]] = []                # (time, rank): a wall-clock wait ends

    def _wait(self, r: int, until: float) -> None:
        self.state[r] = {"until": until}
        heapq.heappush(self.timers, (until, r))
        self.waited[r] = True

    def start(self, r: int) -> None:
        """Walk rank ``r`` forward from its current segment until it computes, waits or is done."""
        segs, pos, t = self.segs[r], self.pos, self.t
        while pos[r] < len(segs):
            g = segs[pos[r]]
            if g.kind == "cpu":
                work = g.work + (self.wake if g.in_op and self.waited[r] else 0.0)
                if g.in_op:
                    self.waited[r] = False
                if work <= _EPS:
                    self._complete(r, g, t)
                    continue
                self.state[r] = {"left": work, "cpu": 0.0, "t0": t, "pad_until": None}
                return
            if g.kind == "dep":
                if g.key in self.done:
                    ready = self.done[g.key] + g.delay
                    if ready <= t + _EPS:
                        pos[r] += 1
                        continue
                    self._wait(r, ready + self.recv_wake(r))     # the rank sleeps in the receive
                    return
                self.state[r] = {"blocked": g.key}
                self.waited[r] = True
                return
            if g.kind == "sleep":
                if g.delay <= _EPS:
                    pos[r] += 1
                    continue
                self._wait(r, t + g.delay)
                return
            if g.kind == "sync":
                self.sched_end[r] = t
                if self.sync_at is None and all(not math.isnan(x) for x in self.sched_end):
                    self.sync_at = max(self.sched_end) + self.sync_s
                    for q in range(self.R):
                        heapq.heappush(self.timers, (self.sync_at, q))
                if self.sync_at is not None and t >= self.sync_at - _EPS:
                    pos[r] += 1
                    continue
                self.state[r] = {"sync": True}
                self.waited[r] = True
                return
        self.finish[r] = t
        self.state[r] = {"done": True}

    def recv_wake(self, q: int) -> float:
        """Extra wall seconds before rank ``q``, asleep in a receive, runs again (the others computing now)."""
        if self.ops is None or not self.ops.recv_wake_s:
            return 0.0
        busy = sum(1 for x, st in enumerate(self.state) if x != q and "left" in st and st["pad_until"] is None)
        return self.ops.recv_wake_at(busy + self.background)

    def _complete(self, r: int, g: _Seg, when: float) -> None:
        if g.key is not None:
            self.done[g.key] = when
            for q in range(self.R):                              # release ranks waiting for this op
                if self.state[q].get("blocked") == g.key:
                    until = when + self.segs[q][self.pos[q]].delay + self.recv_wake(q)
                    self.state[q] = {"until": until}
                    heapq.heappush(self.timers, (until, q))
        self.pos[r] += 1

    def run(self) -> None:
        for r in range(self.R):
            self.start(r)
        while any(not st.get("done") for st in self.state):
            self._advance()
            self._settle_computing()
            self._fire_timers()

    def _advance(self) -> None:
        """Move the clock to the next event; computing ranks progress at the shared rate meanwhile."""
        state, t = self.state, self.t
        computing = [r for r in range(self.R) if "left" in state[r] and state[r]["pad_until"] is None]
        n = len(computing) + self.background
        share = (1.0 - self.steal) * (min(1.0, self.cores / n) if n > 0 else 1.0)
        kappa = self.ops.kappa_at(n) if self.ops is not None else self.host.kappa(min(n, self.cores))
        rate = share / kappa                                    # work [profile s] per wall s
        t_next = math.inf
        for r in computing:
            t_next = min(t_next, t + state[r]["left"] / rate)
        for r in range(self.R):
            pu = state[r].get("pad_until") if "left" in state[r] else None
            if pu is not None:
                t_next = min(t_next, pu)
        if self.timers:
            t_next = min(t_next, self.timers[0][0])
        if math.isinf(t_next):
            raise RuntimeError("host simulation deadlocked (a dependency that no rank produces)")
        dt = max(0.0, t_next - t)
        for r in computing:
            state[r]["left"] -= rate * dt
            state[r]["cpu"] += share * dt
        self.t = t_next

    def _settle_computing(self) -> None:
        """Ranks whose work ran out: pad (the emulation's sleep) or complete the segment and walk on."""
        t = self.t
        for r in range(self.R):
            st = self.state[r]
            if "left" in st:
                g = self.segs[r][self.pos[r]]
                if st["pad_until"] is None and st["left"] <= _EPS:
                    if g.in_op:
                        self.cpu_in_ops[r] += st["cpu"]
                    target = st["t0"] + g.pad * st["cpu"] if g.pad > 1.0 else t
                    if target > t + _EPS:
                        st["pad_until"] = target
                        self.waited[r] = True                  # the emulation's sleep
                        continue
                    self._complete(r, g, t)
                    self.start(r)
                elif st["pad_until"] is not None and st["pad_until"] <= t + _EPS:
                    self._complete(r, g, t)
                    self.start(r)

    def _fire_timers(self) -> None:
        t = self.t
        while self.timers and self.timers[0][0] <= t + _EPS:
            _when, r = heapq.heappop(self.timers)
            st = self.state[r]
            if ("until" in st and st["until"] <= t + _EPS) or (st.get("sync") and self.sync_at is not None
                                                                 and self.sync_at <= t + _EPS):
                self.pos[r] += 1
                self.start(r)
