"""The DRA front-end: the kubelet plugin (registration and DRA sockets), preparing claims, the
ResourceSlice documents and the device-health stream."""
