"""Patchbay operator: makes every DevicePluginProfile real and says how it stands: static node
capacity (Static), agent ConfigMaps and DaemonSets, the shared node agent's included (DevicePlugin,
DRA), a DeviceClass per DRA profile, and each profile's status from the nodes, the agents' pods and
their DeviceReports."""
