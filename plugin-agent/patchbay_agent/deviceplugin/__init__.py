"""The Device Plugin API v1beta1 front-end: the gRPC service, registration with the kubelet,
Allocate and GetPreferredAllocation, and the ListAndWatch encoding with the kubelet's 4 MiB limit."""
