"""``hpp profile-network``: measure the links between hosts and devices, fit them, and write a cluster file."""
