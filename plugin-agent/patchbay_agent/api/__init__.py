"""The kubelet APIs the agent speaks, written as .proto files, with the stubs grpcio-tools generates:

* `api.proto`: the Device Plugin API v1beta1 (`v1beta1.Registration`, `v1beta1.DevicePlugin`);
* `podresources.proto`: the PodResources API v1 (`v1.PodResourcesLister`), read by
  `patchbay_agent.kubelet.podresources`.

Regenerate with `make generate`; `make verify` fails when the stubs are stale.
"""
