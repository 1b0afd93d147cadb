"""Talking to the kubelet's node-local surfaces that every front-end shares: the PodResources API,
the Unix sockets plugins serve in the kubelet's directories (their names, stale-socket removal)
and the gRPC server that binds one of them."""
