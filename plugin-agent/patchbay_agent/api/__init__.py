"""The kubelet APIs the agent speaks, written as .proto files, with the stubs grpcio-tools generates:

* `api.proto`: the Device Plugin API v1beta1 (`v1beta1.Registration`, `v1beta1.DevicePlugin`),
  served by `patchbay_agent.deviceplugin`;
* `pluginregistration.proto`: the kubelet's plugin watcher (`pluginregistration.Registration`),
  how a DRA driver registers (`patchbay_agent.kubelet.draplugin`);
* `dra_v1.proto`, `dra_v1beta1.proto`: the DRA kubelet plugin service (`DRAPlugin`:
  NodePrepareResources, NodeUnprepareResources), both served (`patchbay_agent.kubelet.draplugin`);
* `dra_health_v1.proto`, `dra_health_v1alpha1.proto`: the device-health stream
  (`DRAResourceHealth`), both served (`patchbay_agent.dra.healthservice`);
* `podresources.proto`: the PodResources API v1 (`v1.PodResourcesLister`), read by
  `patchbay_agent.kubelet.podresources`.

Regenerate with `make generate`; `make verify` fails when the stubs are stale.
"""
