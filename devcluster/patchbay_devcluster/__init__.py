"""patchbay-devcluster: a real, loopback-only Kubernetes cluster for the demo, the tests and the
benchmarks: the control plane, kwok nodes, optionally a real kubelet node on containerd, and
Patchbay's images and chart built and installed the user's way."""

from patchbay_devcluster.cluster import (
    ClusterError,
    DevCluster,
    default_state_dir,
    find_bin_dir,
    real_node_holder,
)

__all__ = ["ClusterError", "DevCluster", "default_state_dir", "find_bin_dir", "real_node_holder"]
