"""Checkpoints by global parameter name: save and load under any plan of the same model (torch DCP,
:mod:`~hpp.runtime.checkpoint.dcp`), the on-disk store and its completeness rules
(:mod:`~hpp.runtime.checkpoint.store`), the checked reader, and export to one file.
"""
