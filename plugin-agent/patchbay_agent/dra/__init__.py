"""The DRA front-end: the kubelet plugin (registration and DRA sockets), preparing claims (a CDI
spec per claim), what was prepared in each claim's `status.devices`, the ResourceSlice documents
and the device-health stream."""
