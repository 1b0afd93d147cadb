"""Patchbay agent: a kubelet device plugin (v1beta1) configured by a DevicePluginProfile."""
