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

from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.cluster import DEFAULT_LATENCY_S, Cluster, Device, Link, NetworkLinks, Node
from hpp.profiles.cluster_format import cluster_from_dict, cluster_to_dict, load_cluster, save_cluster
from hpp.profiles.devices import BUNDLED_DEVICE_TYPES, DeviceType, device_type_from_dict, device_type_to_dict
from hpp.profiles.model_profile import LayerProfile, ModelProfile, estimate_micro_batch
from hpp.profiles.profile_format import load_profile, profile_from_dict, profile_to_dict, save_profile
from hpp.profiles.network import (INTER_NODE_ALIASES, default_inter_node_link, default_intra_node_link,
                                  default_pair_link)
from hpp.profiles.public import (METIS_FORWARD_FRACTION, METIS_MEMORY_PARAM_FACTOR, load_llm_info,
                                 load_metis_profiles, load_sailor_profiles)

__all__ = [
    "DeviceType", "BUNDLED_DEVICE_TYPES", "device_type_from_dict", "device_type_to_dict",
    "Link", "Node", "Device", "Cluster", "NetworkLinks", "cluster_from_dict", "cluster_to_dict", "load_cluster",
    "save_cluster", "DEFAULT_LATENCY_S",
    "LayerProfile", "ModelProfile", "profile_from_dict", "profile_to_dict", "load_profile", "save_profile",
    "estimate_micro_batch",
    "bundled_models", "load_bundled_profile",
    "default_intra_node_link", "default_inter_node_link", "default_pair_link", "INTER_NODE_ALIASES",
    "load_sailor_profiles", "load_metis_profiles", "load_llm_info",
    "METIS_MEMORY_PARAM_FACTOR", "METIS_FORWARD_FRACTION",
]
