"""Benchmarks and paper-style evaluation (research harness; the core never imports it).

instance_format     the benchmark instance (cluster, profile, batch, options) and its JSON format
instances           the instance library: bundled scenarios and seeded synthetic families (re-exports the format)
solvers             ``hpp bench-solvers``: CP-SAT / MILP / heuristic on the instance library
search_overhead     search time and quality of HPP vs Metis's search and the baselines (measuring)
search_report       the search benchmark's CSV row, summary table and target checks
cli                 the ``hpp instances`` and ``hpp bench-solvers`` commands
evaluation          README result tables from the experiments' CSV files
runtime_validation  predicted vs measured iteration time of plans run on emulated CPU clusters
"""
