"""patchbay-devcluster: a real, loopback-only Kubernetes control plane for the demo and the tests."""

from patchbay_devcluster.cluster import ClusterError, DevCluster, default_state_dir, find_bin_dir

__all__ = ["ClusterError", "DevCluster", "default_state_dir", "find_bin_dir"]
