"""The DRA front-end: the kubelet plugin (registration and DRA sockets), preparing claims (a CDI
spec per claim), what was prepared in each claim's `status.devices`, the ResourceSlice documents
and their publisher (`slicepublisher.py`), and the device-health stream (`healthservice.py`);
composed in `frontend.py`."""
