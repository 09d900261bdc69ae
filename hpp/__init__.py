"""hpp: Heterogeneous Pipeline Parallelism for training large models on mixed GPUs.

Every data-parallel replica may be a different pipeline (device types, stage
count, layer boundaries); the global batch is split unevenly across pipelines so
that all finish together (data balance) while layers are balanced within each
pipeline under each device's memory (stage balance). See README.md.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
