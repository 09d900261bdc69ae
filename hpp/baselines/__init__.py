"""Reference planners the HPP search is compared with (research harness; the core never imports them).

uniform       one pipeline shape on every device type (the uniform baseline)
shapes        the pipeline shapes the single-shape baseline enumerates
single_shape  the single-shape baseline, exhaustive composition, ``run_baselines``
metis         a port of Metis's search (USENIX ATC'24) for search-overhead comparisons
metis_pricing its configurations priced on HPP's cost model (stage tables, layer-partition DP)
"""

#: Default time for both baselines together [s] (``hpp plan --baseline-time-limit``, ``hpp.plan``): ``hpp plan``
#: on 4,096 GPUs stays under 30 s with it.
DEFAULT_BASELINE_TIME_LIMIT_S = 10.0
