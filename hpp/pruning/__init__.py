"""The search's pruning rules, each named and switchable for ablations (:mod:`hpp.pruning.rules`).

Imports nothing from :mod:`hpp.formulation` (the formulation imports the rules, not the other way round).
"""
