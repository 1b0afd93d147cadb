"""``kubectl patchbay``: Patchbay's kubectl plugin: devices, nodes, why a profile is not Ready, and
cordon, drain, uncordon of a DRA profile's devices (DeviceTaintRules)."""
