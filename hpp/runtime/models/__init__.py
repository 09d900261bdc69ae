"""What a model is to the runtime: the protocol (:mod:`~hpp.runtime.models.api`), a stage of its layers
(:mod:`~hpp.runtime.models.stage`), the zoo of named models (:mod:`~hpp.runtime.models.zoo`: Hugging Face
architectures from the shipped ``configs/`` and the GPT toys) and users' ``MODULE:FUNCTION`` models.

The lowest layer of the runtime: imports nothing else from it.
"""
