"""The planner's model: cost model, stage costs, stage balance, candidate pipelines, binding, and the
composition problem (:mod:`hpp.formulation.composition`: which candidates, how many copies, solved).

Imports only :mod:`hpp.profiles`, :mod:`hpp.pruning` and the plan data; never the benchmarks
(:mod:`hpp.bench`) or the reference planners (:mod:`hpp.baselines`).
"""
