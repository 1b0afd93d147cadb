"""Patchbay operator: DevicePluginProfile -> agent DaemonSets and static node capacity."""
