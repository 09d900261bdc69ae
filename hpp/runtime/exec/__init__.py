"""One rank's training step: its stage's TP sharding, the pipeline schedule, the block gradient sync,
the optimizer and LR schedule, the data, and the single-device reference that ``--verify`` compares with.

Imports the model side (:mod:`hpp.runtime.models`), the step's instrument (:mod:`hpp.runtime.host`) and
checkpoints (:mod:`hpp.runtime.checkpoint`); never the launchers or ``hpp run`` above it.
"""
