"""Lower-bound pipeline times of the candidates: stage point-to-point at the cheapest link a binding can give.

The search prices each stage boundary over the link the stage-cost tables assume (v1 clusters:
the inter-node link, :func:`hpp.planner.pipeline_link`); the cost model prices the link the binding
actually puts there (``cluster.link(last device of stage s, first device of stage s+1)``), which
can be faster (two stages of one type on one node). For the bound, every boundary is re-priced at
the cheapest link it can get:

- every link a binding can put there: ``collectives.p2p_link_options(cluster, a, b)`` with
  ``run=None`` (issue 19's lower-bound set), the links the search priced, and, when both stages
  are of one device type, the intra-node link of each node of that type that holds both TP groups
  (``num_devices >= tp_a + tp_b``; a version-1 cluster's option set lacks them).

The search's price of a boundary is the cheapest of ``priced_links(a, b, run)`` (the stage-cost
cache's options; ``run``: stages left after a in its run of equal kinds, as the stage balance
passes it: a packed run is priced intra-node only where a binding packing it would put it).

With ``c`` the one-way transfer (:func:`hpp.formulation.cost_model.p2p_transfer_s`), ``k`` the
transfer waits per micro-batch and ``dc = c_priced - c_cheapest >= 0`` per boundary, stage s's time
per micro-batch can drop by at most ``D_s = k_s (dc_in + dc_out)`` and the fill
``phi = sum D + 2 sum c`` by ``sum_s D_s + 2 sum dc``. So

    tau_lb = tau - max_s D_s,    phi_lb = phi - sum_s D_s - 2 sum dc

are lower bounds of the candidate's bottleneck and fill under any binding (``max_s (x_s - d_s) >=
max_s x_s - max_s d_s``). Both, and the optimizer step, are also shrunk by ``1e-9`` relative
against floating-point summation order.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from hpp.formulation.candidates import Candidate
from hpp.formulation.cost_model import CostModelConfig, p2p_transfer_s, p2p_waits_per_transfer
from hpp.formulation.stage_balance import StageKind
from hpp.profiles.cluster import Cluster, Link
from hpp.profiles.model_profile import ModelProfile

__all__ = ["lower_bound_candidates", "SHRINK"]

log = logging.getLogger(__name__)

#: Relative shrink of every lower-bound time (summation-order rounding of the cost model's sums).
SHRINK = 1e-9


def _cheapest_links(cluster: Cluster, priced: tuple[Link, ...], a: StageKind, b: StageKind) -> tuple[Link, ...]:
    """Every link a binding can put between stages of kinds a -> b (module docstring)."""
    extra: list[Link] = []
    try:
        from hpp.formulation.collectives import p2p_link_options   # issue 19; absent before it
        extra += p2p_link_options(cluster, a, b)
    except ImportError:
        pass
    if a.device_type == b.device_type:
        extra += [n.intra_node for n in cluster.nodes
                  if n.device_type == a.device_type and n.num_devices >= a.tp_degree + b.tp_degree]
    return tuple(dict.fromkeys((*priced, *extra)))


def _runs_after(shape: Sequence[StageKind]) -> list[int | None]:
    """Per boundary i (stage i -> i+1): the stages after i in its run of equal kinds (None across kinds)."""
    out: list[int | None] = []
    for i in range(len(shape) - 1):
        if shape[i + 1] != shape[i]:
            out.append(None)
            continue
        r = 1
        while i + r + 1 < len(shape) and shape[i + r + 1] == shape[i]:
            r += 1
        out.append(r)
    return out


def lower_bound_candidates(cluster: Cluster, profile: ModelProfile, candidates: Sequence[Candidate], *,
                           pipeline_link: Link, config: CostModelConfig = CostModelConfig(),
                           priced_links: Callable[..., tuple[Link, ...]] | None = None) -> list[Candidate]:
    """The candidates with lower-bound bottleneck, fill and optimizer step (module docstring), same order.

    Parameters
    ----------
    cluster, profile, config : as for the search.
    candidates : the search's candidates.
    pipeline_link : the link the search's stage-cost tables priced boundaries at without ``priced_links``.
    priced_links : ``(kind_a, kind_b, run) -> links`` the search priced a boundary at (the stage-cost
        cache's ``links``); None: ``(pipeline_link,)``.

    Returns
    -------
    list of Candidate
        New records (partitions replaced); shapes, devices and TP groups unchanged.
    """
    priced_of = priced_links or (lambda a, b, run=None: (pipeline_link,))
    links: dict[tuple, tuple[tuple[Link, ...], tuple[Link, ...]] | None] = {}
    entries: dict[tuple[str, int, int], object] = {}
    drops: dict[tuple, tuple[float, float, float, float]] = {}
    keep = 1.0 - SHRINK

    def pair(a: StageKind, b: StageKind, run: int | None):
        got = links.get((a, b, run), ())
        if got == ():
            priced = tuple(priced_of(a, b, run))
            cheap = _cheapest_links(cluster, priced, a, b)
            got = links[(a, b, run)] = None if cheap == priced else (priced, cheap)
        return got

    def entry(k: StageKind, mbs: int):
        key = (k.device_type, k.tp_degree, mbs)
        e = entries.get(key)
        if e is None:
            e = entries[key] = profile.layer_profile(k.device_type, k.tp_degree, mbs, estimate=False)
        return e

    transfers: dict[tuple, float] = {}

    def cheapest(k: StageKind, mbs: int, v: int, options: tuple[Link, ...]) -> float:
        """min over ``options`` of the transfer of kind k's output after layer v-1 (memoised)."""
        key = (k, mbs, v, options)
        got = transfers.get(key)
        if got is None:
            e = entry(k, mbs)
            out_bytes = e.output_bytes[v - 1]
            got = transfers[key] = min(p2p_transfer_s(e, link, out_bytes) for link in options)
        return got

    def drop(a: StageKind, b: StageKind, run: int | None, mbs: int, v: int) -> tuple[float, float, float, float]:
        """(dc_out of a, k_a, dc_in of b, k_b) at the boundary after layer v-1."""
        key = (a, b, run, mbs, v)
        got = drops.get(key)
        if got is None:
            both = pair(a, b, run)
            if both is None:
                got = (0.0, 0.0, 0.0, 0.0)
            else:
                priced, cheap = both
                da = cheapest(a, mbs, v, priced) - cheapest(a, mbs, v, cheap)
                db = cheapest(b, mbs, v, priced) - cheapest(b, mbs, v, cheap)
                got = (max(0.0, da), p2p_waits_per_transfer(entry(a, mbs), config), max(0.0, db),
                       p2p_waits_per_transfer(entry(b, mbs), config))
            drops[key] = got
        return got

    out = []
    corrected = 0
    for cand in candidates:
        p = cand.partition
        shape, bnd = cand.shape, p.boundaries
        tau, phi = p.bottleneck_s, p.fill_s
        runs = _runs_after(shape) if len(shape) > 1 else []
        if runs and any(pair(a, b, r) is not None for a, b, r in zip(shape, shape[1:], runs)):
            stage_drop = [0.0] * len(shape)
            fill_drop = 0.0
            for i in range(len(shape) - 1):
                dc_out, k_a, dc_in, k_b = drop(shape[i], shape[i + 1], runs[i], cand.micro_batch_size, bnd[i + 1])
                stage_drop[i] += k_a * dc_out
                stage_drop[i + 1] += k_b * dc_in
                fill_drop += 2.0 * dc_out
            if fill_drop > 0 or any(stage_drop):
                corrected += 1
                tau -= max(stage_drop)
                phi -= sum(stage_drop) + fill_drop
        part = p._replace(bottleneck_s=max(0.0, tau) * keep, fill_s=max(0.0, phi) * keep,
                          optimizer_s=p.optimizer_s * keep)
        out.append(Candidate(shape, cand.micro_batch_size, part, cand.devices, cand.tp_groups))
    log.debug("lower-bound candidates: %d of %d with a cheaper stage link possible", corrected, len(candidates))
    return out
