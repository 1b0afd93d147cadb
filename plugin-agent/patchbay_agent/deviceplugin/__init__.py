"""The Device Plugin API v1beta1 front-end: the gRPC service (ListAndWatch, Allocate,
GetPreferredAllocation, PreStartContainer), registration with the kubelet and staying registered
across kubelet restarts and rollouts, and the ListAndWatch encoding with the kubelet's 4 MiB limit;
composed in `frontend.py`."""
