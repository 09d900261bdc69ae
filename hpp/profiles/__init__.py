"""Profiles and clusters: device types, links, per-layer model profiles, bundled data and loaders.

- :mod:`hpp.profiles.devices`: device types (GPU model, memory capacity);
- :mod:`hpp.profiles.cluster`: nodes, links and clusters (links per pair of node groups in version 2);
- :mod:`hpp.profiles.cluster_format`: the cluster file (JSON, versions 1 and 2);
- :mod:`hpp.profiles.model_profile`: per-layer profiles and their native JSON format;
- :mod:`hpp.profiles.public`: loaders of the public Sailor and Metis formats;
- :mod:`hpp.profiles.bundled`: profiles converted from the Sailor artifact, shipped with hpp;
- :mod:`hpp.profiles.network`: default links from Sailor's measured bandwidth fits.

The bundled data (``data/``) derive from eth-easl/sailor commit cf2c8e3, MIT licence,
Copyright ETH Zurich (``data/NOTICE``).
"""
