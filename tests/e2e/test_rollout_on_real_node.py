"""An agent rollout on the real kubelet never leaves the node without its resource.

The profile's agent settings change (its CPU request: a change of the plugin settings reaches
the running agent live and rolls nothing), so the operator's DaemonSet rolls with maxSurge 1 and
maxUnavailable 0: the new agent pod starts beside the old one, serves its OWN socket, registers,
turns Ready; then the old pod is deleted and removes only its own socket. The node's allocatable
is sampled from the API server and from the kubelet's PodResources API every 50 ms through the
rollout and for a minute after it (``SETTLE``; 30 s on the releases before the newest:
``SETTLE_OLDER``); a pod created while both agents run starts.

What the kubelet does next depends on its release (docs/facts.md#kubelet-endpoints):

- v1.37 keeps several endpoints per resource, keyed by socket path, and promotes the remaining
  one: the new agent registers once and the kubelet's own view never drops;
- v1.34-v1.36 keep one client per resource: the old agent's stream ending would drop the NEW
  agent's client and mark the resource unhealthy. The new agent knows its kubelet (the Node's
  kubeletVersion) and, once its stream is open and before it turns Ready, hands over: it
  registers a throw-away socket that refuses the kubelet's dial-back, whose failed connect
  deletes the kubelet's client entry while the new agent's stream stays. The old agent's exit
  then closes nothing: the kubelet's own view never drops either. The test checks the sequence
  in the kubelet's log: two registration requests (the agent's, the hand-over's), the failed
  connect, no "Device plugin disconnected".
"""

from __future__ import annotations

from pathlib import Path

from support.realnode import DEVICES, OnNode, busybox_pod, limits, serial_profile, wait_for
from support.releases import has, newest
from support.rollout import SAMPLE_EVERY, run_rollout

SETTLE = 60.0
"""Seconds sampled after the rollout on the newest release: the minute issue 18 asks."""
SETTLE_OLDER = 30.0
"""On the older releases (CI's test-oldest): what differs there happens during the rollout (the
hand-over's failed connect, the old agent's stream ending before its pod is gone from the API,
which completes the rollout), and 30 s after it still spans three of the kubelet's node status
syncs (10 s), so a late drop would show in the API's samples as in the kubelet's."""


def test_a_rollout_keeps_every_healthy_device_allocatable(
    on_node: OnNode, tmp_path: Path, kube_release: str
) -> None:
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    name, resource = serial_profile(cluster, fake_dev, real_node)
    settle = SETTLE if newest(kube_release) else SETTLE_OLDER
    try:
        wait_for("the agent pod Ready", lambda: patchbay.ready_agents(name), 120)
        full = (str(DEVICES), str(DEVICES))
        wait_for("devices on the node", lambda: cluster.values(real_node, resource) == full, 60)

        def workload() -> str:
            pod = limits(busybox_pod("mid-rollout", real_node, "sleep 3600"), resource, 1)
            cluster.core.create_namespaced_pod(namespace, pod)
            return "mid-rollout"

        result = run_rollout(
            api=cluster.api,
            namespace=patchbay.namespace,
            daemonset=f"patchbay-{name}",
            agent_pods=lambda: patchbay.agent_pods(name),
            change=lambda: cluster.patch_spec(name, {"agent": {"resources": {"requests": {"cpu": "11m"}}}}),
            node=real_node,
            resource=resource,
            pod_resources=e2e_cluster.real_node().paths.pod_resources_socket,
            kubelet_log=e2e_cluster.log_dir / "kubelet.log",
            workload=workload,
            workload_namespace=namespace,
            settle=settle,
        )
        report = "\n".join(result.kubelet_lines)
        (tmp_path / "kubelet-during-rollout.log").write_text(report)
        print(f"rollout figures: {result.figures()}\nkubelet during the rollout:\n{report}")

        # Sampled often enough to see a dip: on average at least every 100 ms.
        span = result.samples[-1].at - result.samples[0].at
        assert len(result.samples) >= span / (2 * SAMPLE_EVERY), result.figures()
        assert result.minimum("api") == DEVICES, result.figures()
        assert result.mid_rollout_pod_started
        # The kubelet's own view never drops, on every release.
        assert result.minimum("kubelet") == DEVICES, result.figures()
        if has("device-plugin-endpoint-per-socket", kube_release):
            # The new agent, once; the old one never again (its own endpoint's disconnect is
            # logged, and the kubelet promotes the new one).
            assert result.registrations == 1, report
        else:
            # The new agent's registration and its hand-over's, whose connect the kubelet failed;
            # the old agent's exit disconnects nothing.
            assert result.registrations == 2, report
            assert any("Failed to connect to new client" in line for line in result.kubelet_lines), report
            assert not any("Device plugin disconnected" in line for line in result.kubelet_lines), report
        # Every device is back in the kubelet's own view at the end, whatever the release.
        assert result.samples[-1].kubelet == DEVICES, result.figures()
        assert result.old_pod != result.new_pod
        assert result.after >= settle
        # Only the new agent's socket is left in the kubelet's directory.
        sockets = sorted(p.name for p in Path("/var/lib/kubelet/device-plugins").glob("patchbay-*.sock"))
        assert len([s for s in sockets if cluster.tag in s]) == 1, sockets
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})
