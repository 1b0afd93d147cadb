"""Observed state -> a profile's status (pure functions; the operator writes the result).

What the scheduler really sees is the truth: node capacity and allocatable for the resource.
In DevicePlugin mode the agents tell the rest: their DaemonSet's rollout, their pods' trouble
(agentpods.py) and, per node, every device's health, why and who holds it (DeviceReports).
In DRA mode devices never reach node capacity (the scheduler reads ResourceSlices), so the
agents' DeviceReports are the device counts, and there is no wait for the kubelet's node status;
what the API server kept of the DeviceClass (``extendedResourceName``) and of the slices' device
taints is read back, never assumed (docs/dra.md#releases), and said in ``status.dra``.

Conditions follow the abnormal-true convention that kstatus (and so Flux; Argo CD through the
health check in examples/gitops/argocd) reads, docs/facts.md#kstatus, always all four,
metav1.Condition shape:

- ``Ready``: every selected node advertises the resource as intended;
- ``Reconciling``: work is under way that can finish by itself (patching nodes, a rollout, a
  first start) -> kstatus InProgress;
- ``Stalled``: it cannot finish without a change (an image that cannot be pulled, a crash loop,
  an invalid label, a name conflict) -> kstatus Failed; ``Reconciling`` is then False;
- ``Degraded``: something does not work (devices unhealthy, agents down, nodes that need a fix).

Problems name the node, the device where there is one, a CamelCase reason, a message and since
when; the status lists at most ``MAX_PROBLEMS`` of them, sorted, so it stays small and stable at
thousands of nodes (``problemCount`` has them all). Equal inputs give an equal dict, so the
caller can skip writes when nothing changed.

The package is split by mode: ``conditions`` holds what every mode shares (``Problem``, the four
conditions, the status document, the name conflict); ``static``, ``deviceplugin`` and ``dra`` each
judge their own mode; ``daemonset`` holds what the two agent modes share (the agent DaemonSet's
rollout and the conditions it drives). ``evaluation.evaluate`` is the one entry point.
"""
