"""``kubectl patchbay``: Patchbay's kubectl plugin (devices, nodes, why a profile is not Ready)."""
