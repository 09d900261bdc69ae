"""The fit of ``hpp profile-network`` recovers known links from simulated timings (noise added).

The known links are the bundled A100-40 inter-node figures (Sailor's fits): one flow
``[-0.00244, 0.1409, 1.1168]`` GB/s capped at 2.42 GB/s, four flows together
``[-0.0367, 0.4773, 4.5593]`` GB/s capped at 6.04 GB/s (the cap binds around 64 MB), with 20 us latency.
Each simulated time is ``Link.transfer_s`` of the known link (per flow: its share of the aggregate) times
a lognormal noise of 2 %, the median of 5 repeats, as the measurement takes it; the latency probes (bytes to
kilobytes) take the latency plus the bytes at the link's peak (the fit describes messages of a megabyte and
more).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hpp.profiles.cluster import AggregateFit, Link
from hpp.profiles.network_fit import LATENCY_PROBE_BYTES, FlowTimes, fit_bandwidth, fit_latency_s, fit_link

A100 = Link(2.42e9, 20e-6, (-0.00244, 0.1409, 1.1168),
            aggregate=(AggregateFit(4, 6.04e9, (-0.0367, 0.4773, 4.5593)),))
V100 = Link(1.72e9, 20e-6, (-0.00227, 0.0905, 0.8713),
            aggregate=(AggregateFit(4, 5.79e9, (-0.0322, 0.4405, 3.9543)),))
SIZES = [int(1e6 * 2 ** i) for i in range(11)]                 # 1 MB .. 1 GB, as the default
NOISE = 0.02
REPEATS = 5


def simulate(link: Link, sizes, flow_counts, *, seed: int, noise: float = NOISE) -> list[FlowTimes]:
    """Each flow's median over ``REPEATS`` of the known one-way time x lognormal(0, noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in flow_counts:
        shared = link.shared(k)
        for x in sizes:
            exact = shared.transfer_s(x)
            out.append(FlowTimes(x, k, tuple(float(np.median(exact * rng.lognormal(0.0, noise, REPEATS)))
                                             for _ in range(k))))
    return out


def probes(link: Link, *, seed: int, noise: float = NOISE) -> list[FlowTimes]:
    """The latency probes: one flow, ``latency + bytes / peak``, noise as :func:`simulate`."""
    rng = np.random.default_rng(seed + 1000)
    return [FlowTimes(x, 1, (float(np.median((link.latency_s + x / link.max_bytes_per_s)
                                              * rng.lognormal(0.0, noise, REPEATS))),))
            for x in LATENCY_PROBE_BYTES]


def _close(got: float, want: float, rel: float = 0.10) -> bool:
    return abs(got / want - 1.0) <= rel


def test_recovers_one_flow_and_four_flow_aggregate_within_10_percent():
    f = fit_link(simulate(A100, SIZES, (1, 4), seed=1), latency_samples=probes(A100, seed=1)).link
    assert _close(f.latency_s, 20e-6)
    assert [a.flows for a in f.aggregate] == [4]
    for x in SIZES:
        assert _close(f.single_flow_bytes_per_s(x), A100.single_flow_bytes_per_s(x)), x
        assert _close(f.aggregate_bytes_per_s(4, x), A100.aggregate_bytes_per_s(4, x)), x
        assert _close(f.transfer_s(x), A100.transfer_s(x)), x
        assert _close(f.shared(4).transfer_s(x), A100.shared(4).transfer_s(x)), x
    assert _close(f.max_bytes_per_s, 2.28e9)                   # the largest bandwidth measured (1 GB), not the cap
    assert _close(f.aggregate[0].max_bytes_per_s, 6.04e9)      # the cap binds: measured there


def test_the_recovered_fit_is_not_another_links_control():
    """Control: the same check against the V100-16 figures must fail (the test can tell two real links apart)."""
    f = fit_link(simulate(A100, SIZES, (1, 4), seed=1), latency_samples=probes(A100, seed=1)).link
    assert not all(_close(f.single_flow_bytes_per_s(x), V100.single_flow_bytes_per_s(x)) for x in SIZES)
    assert not all(_close(f.aggregate_bytes_per_s(4, x), V100.aggregate_bytes_per_s(4, x)) for x in SIZES)


def test_latency_is_the_intercept_of_the_small_message_times():
    """Without probes, small messages (4 KB .. 1 MB) on a 1 GB/s link with 50 us latency: the latency within 10 %,
    the bandwidth within 10 %; and a fit that ignores the latency (times read as all bandwidth) is off by far more
    (control)."""
    link = Link(1e9, 50e-6)
    sizes = [4096 * 2 ** i for i in range(9)]
    samples = simulate(link, sizes, (1,), seed=2)
    f = fit_link(samples).link
    assert _close(f.latency_s, 50e-6) and _close(f.max_bytes_per_s, 1e9)
    assert all(_close(f.transfer_s(x), link.transfer_s(x)) for x in sizes)
    naive = [s.message_bytes / s.seconds[0] for s in samples]
    assert naive[0] < 0.2 * 1e9                                # 4 KB in 54 us: 0.08 GB/s if latency is ignored


@settings(max_examples=40, deadline=None)
@given(a=st.floats(-0.05, 0.0), b=st.floats(0.0, 1.0), c=st.floats(0.5, 20.0),
       latency_us=st.floats(0.0, 100.0), k=st.integers(2, 8), share=st.floats(0.3, 1.0))
def test_noiseless_times_give_the_fit_back_exactly(a, b, c, latency_us, k, share):
    """Without noise, with the fit positive over the sizes and a cap above it, the coefficients, latency and aggregate
    come back exactly."""
    fit = (a, b, c)
    assume(min(a * L * L + b * L + c for L in range(11)) >= 0.1)
    agg = (a * k * share, b * k * share, c * k * share)
    top = max(a * L * L + b * L + c for L in range(11)) * 1e9
    link = Link(2 * top, latency_us * 1e-6, fit, aggregate=(AggregateFit(k, 2 * k * top, agg),))
    got = fit_link(simulate(link, SIZES, (1, k), seed=0, noise=0.0), latency_samples=probes(link, seed=0, noise=0.0))
    assert got.largest_error < 1e-6
    assert got.link.fit_gb_per_s == pytest.approx(fit, abs=1e-6)
    assert got.link.aggregate[0].fit_gb_per_s == pytest.approx(agg, abs=1e-5)
    assert got.link.latency_s == pytest.approx(latency_us * 1e-6, abs=1e-9)
    assert math.isclose(got.link.max_bytes_per_s, top, rel_tol=1e-6)


def test_without_probes_a_growing_bandwidth_is_partly_taken_for_latency():
    """Why the probes: at 1-4 MB the A100 link's bandwidth still grows with the size, so the intercept of those
    times (no latency probes) reads a latency far above the 20 us (control of the probe-based test above)."""
    f = fit_link(simulate(A100, SIZES, (1,), seed=1)).link
    assert f.latency_s > 5 * 20e-6


def test_two_sizes_fit_a_line_and_one_size_a_constant():
    (a, b, c), peak = fit_bandwidth([1e6, 2e6], [1e9, 2e9])
    assert (a, round(b, 9), round(c, 9), peak) == (0.0, 1.0, 1.0, 2e9)
    assert fit_bandwidth([1e6, 1e6], [1e9, 3e9]) == ((0.0, 0.0, 2.0), 3e9)
    assert fit_latency_s([1e6], [1e-3]) == 0.0


def test_bad_samples_are_refused():
    with pytest.raises(ValueError, match="2 flows but 1 times"):
        FlowTimes(1000, 2, (1.0,))
    with pytest.raises(ValueError, match="finite and > 0"):
        FlowTimes(1000, 1, (0.0,))
    with pytest.raises(ValueError, match="no one-flow sample"):
        fit_link([FlowTimes(1000, 2, (1.0, 1.0))])
