"""CPU emulation of a GPU cluster and its time truth: the instrument that pads each stage op to its emulated
device's speed (:mod:`~hpp.runtime.host.emulation`), the host's op costs (:mod:`~hpp.runtime.host.ops`),
CPU steal from ``/proc/stat`` (:mod:`~hpp.runtime.host.steal`), and the simulation of one step on this host
that ``hpp run`` predicts with (:mod:`~hpp.runtime.host.time_model`).
"""
