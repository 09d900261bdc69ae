"""The batched search on per-pair links prices stages exactly as the per-shape DP and the tables do.

The batched stage balance reads each stage's time from its DP cost (not from a table per link options) and
shares one table per (kind, micro-batch size); these tests pin that it still equals the per-shape DP bit for
bit on a per-pair bundled cluster, and that ``StageCostCache.times`` equals the tables' arrays.
"""

from functools import partial

import numpy as np
import pytest

from hpp.formulation.space_limits import SearchSpace, common_micro_batch_sizes, stage_kinds
from hpp.formulation.candidates import enumerate_shapes
from hpp.formulation.collectives import p2p_link_options
from hpp.formulation.stage_balance import StageBalancer, StageKind
from hpp.formulation.stage_balance_batch import balance_pairs
from hpp.formulation.collectives import pipeline_link
from hpp.profiles.bundled import load_bundled_profile
from hpp.formulation.stage_costs import StageCostCache
from hpp.pruning.rules import PruningOptions
from hpp.scenarios import get_scenario


def _balancer(cl, prof, space, packed=True):
    caps = {t: d.memory_bytes for t, d in cl.device_types.items()}
    cache = StageCostCache(prof, caps, pipeline_link(cl), pair_links=partial(p2p_link_options, cl) if cl.per_pair
                           else None)
    return StageBalancer(cache, allow_recompute=space.allow_recompute, packed_p2p=packed)


@pytest.mark.parametrize("name, recompute, packed", [("opt350-a100x8-v100x8", True, True),
                                                     ("opt350-a100x8-v100x8", False, False),
                                                     ("cpu-hetero-4", True, True)])
def test_batched_equals_per_shape_dp_on_a_per_pair_bundled_scenario(name, recompute, packed):
    """Per-pair links (opt350), and a one-link cluster whose profile has the runtime's time terms (cpu-hetero-4:
    fixed time per stage, measured send/recv floor): the batched stage times are built from the same parts."""
    sc = get_scenario(name)
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    assert cl.per_pair == name.startswith("opt350")
    space = SearchSpace(allow_recompute=recompute, max_stages=6)
    shapes = list(enumerate_shapes(cl, stage_kinds(cl, prof, space), space, PruningOptions(), prof.num_layers))
    pairs = [(i, b) for i, s in enumerate(shapes) for b in common_micro_batch_sizes(prof, s, space)]
    bal, want = _balancer(cl, prof, space, packed), []
    for i, b in pairs:
        part, few = bal.balance_both(shapes[i], b)
        if part is not None:
            want += [(i, b, 0, part)] + ([(i, b, 1, few)] if few is not None else [])
    batch, stats = balance_pairs(_balancer(cl, prof, space, packed), shapes, pairs)
    got = [(int(i), int(b), int(v), p) for i, b, v, p in zip(batch.shape_index, batch.micro_batch_size,
                                                             batch.variant, batch.partitions())]
    assert len(got) > 20
    assert got == want                 # every field of every partition, floats bit for bit
    # on per-pair links the options differ across the kinds: the rows are not those of one link
    assert (len(bal._option_list) > 1) == cl.per_pair


def test_cache_times_equal_the_tables_on_those_links():
    sc = get_scenario("opt350-3types-40")
    cl, prof = sc.cluster(), load_bundled_profile(sc.model)
    bal = _balancer(cl, prof, SearchSpace())
    a, g = StageKind("A100-40", 1), StageKind("GH-96", 1)
    ids = {bal.link_out((a, g)), bal.link_out((a, a)), bal.link_out((g,)), bal.link_out((a, a, a))}
    assert len(ids) >= 3
    for kind in (a, g):
        for i in ids:
            for o in ids:
                tab = bal.table(kind, 1, i, o)
                none, full, p2p = bal.link_times(kind, 1, i, o)
                for x, y in ((none, tab.compute_none_s), (full, tab.compute_full_s), (p2p, tab.p2p_s)):
                    assert np.array_equal(x, y)
                # everything but the times is the links' common table
                base = bal.base_table(kind, 1)
                assert np.array_equal(base.param_bytes, tab.param_bytes)
                assert np.array_equal(base.memory_bytes(2, False), tab.memory_bytes(2, False))
    # a control: two different link options do price the same stage differently
    t1, t2 = (bal.link_times(a, 1, bal.link_out((a, a)), o)[0] for o in (bal.link_out((a, g)), bal.link_out((a,))))
    assert not np.array_equal(t1, t2)
