"""``hpp profile``: a model's per-layer time and memory, the runtime's own time terms and memory terms,
and the probes of this host (its ops, its speed against a profile) that predictions are calibrated with.
"""
