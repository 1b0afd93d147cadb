"""Patchbay agent: serves a node's devices to its kubelet for DevicePluginProfiles, as a device plugin
(Device Plugin API v1beta1: ListAndWatch, Allocate with CDI specs) or as a DRA driver
(ResourceSlices, claims prepared with CDI specs, their status and the device-health stream), and
writes each profile's DeviceReport. One process per profile with agent settings of its own, or the
shared node agent: one process per node serving every profile that shares it (`nodeagent.py`)."""
