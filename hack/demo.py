"""`make demo`: Patchbay as a cluster runs it, on a local cluster, with a summary of what happened.

The path is the one a user takes: the operator and agent images (built here with podman,
cached), a local cluster (real control plane, a real kubelet node ``localhost`` on containerd 2.4
and runc with a private pod network, 5 kwok nodes), ``helm install`` of charts/patchbay (the
operator is the chart's Deployment pod on the real node), ``kubectl apply`` of the three example
profiles (Static, DevicePlugin, DRA), ONE node agent pod serving the node's devices to the real
kubelet for both agent profiles (as a device plugin, and as a DRA driver), a profile change applied
live (no pod restart, the other resource never dips), and workload pods that use them. No
Patchbay process runs on the host.

Everything is real except the hardware: the serial adapters and lab sensors are FAKE character
devices that the demo makes with mknod under the machine's /dev/patchbay-demo/ (they are the null
device, 1:3), and the examples' discovery globs are pointed there.

`make demo-down` (`hack/demo.py down`) stops the cluster (every process by PID, every pod with
it) and removes the fake devices. `make test` and the other targets that need the machine's one
real node stop the demo first, saying so (`hack/demo.py make-room`); `make demo` run again while
the demo is up reuses its cluster.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config

from patchbay_devcluster import DevCluster, default_state_dir, find_bin_dir, real_node_holder
from patchbay_devcluster import registry as oci
from patchbay_devcluster.imagebuild import build_all
from patchbay_devcluster.images import BUSYBOX_IMAGE
from patchbay_devcluster.install import helm_install, local_values, node_images
from patchbay_devcluster.poll import poll_until
from patchbay_devcluster.releases import has, release_of

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "patchbay-system"
RELEASE = "patchbay"
STATIC = REPO / "examples" / "static-dongles.yaml"
PLUGIN = REPO / "examples" / "deviceplugin-serial.yaml"
DRA = REPO / "examples" / "dra-sensors.yaml"
FAKE_DEV = Path("/dev/patchbay-demo")
KWOK_NODES = 5
SERIAL_COUNT = 4
SENSOR_COUNT = 3
T = TypeVar("T")


def step(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def wait_for(what: str, check: Callable[[], T], timeout: float = 180) -> T:
    return poll_until(
        what, check, timeout=timeout, interval=0.5, error=lambda msg: SystemExit(f"demo: {msg}")
    )


class Tools:
    """kubectl as a user runs it, against the demo cluster; each command is echoed."""

    def __init__(self, cluster: DevCluster) -> None:
        bins = find_bin_dir()
        self.kubectl_bin = str(bins / "kubectl")
        # The venv's bin first: kubectl finds the `kubectl patchbay` plugin (kubectl-patchbay) there.
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": path}

    def run(self, argv: list[str], stdin: str | None = None, show: bool = True) -> str:
        if show:
            print(
                "$ " + " ".join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv)), flush=True
            )
        res = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=self.env, timeout=600)
        if res.returncode != 0:
            raise SystemExit(f"demo: {' '.join(argv[:3])} failed:\n{res.stdout}{res.stderr}")
        return res.stdout

    def kubectl(self, *args: str, stdin: str | None = None, show: bool = True) -> str:
        return self.run([self.kubectl_bin, *args], stdin, show)


def make_fake_devices(prefix: str, count: int) -> None:
    """FAKE devices: character devices under the machine's /dev (null device, 1:3)."""
    FAKE_DEV.mkdir(exist_ok=True)
    for i in range(count):
        dev = FAKE_DEV / f"{prefix}{i}"
        if not dev.exists():
            os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))


def up(cluster: DevCluster) -> None:
    t0 = time.monotonic()
    step("Images: the operator and the agent, from their Dockerfiles (podman; cached by content)")
    images = build_all(REPO)
    for image in images.values():
        how = "built" if image.built else "cached"
        print(f"    {image.ref}  {image.size_bytes / 1e6:.0f} MB ({how})")

    release = release_of(find_bin_dir())
    step(
        f"Local cluster (Kubernetes {release}; K8S_VERSION picks another release of the matrix): "
        f"control plane, the real node 'localhost' with a pod network, {KWOK_NODES} kwok nodes"
    )
    node_was_up = cluster.state_file.exists() and "kubelet" in {p.name for p in cluster.running()}
    cluster.up(nodes=KWOK_NODES, real_node=True, timeout=180)
    tools = Tools(cluster)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    if not node_was_up:
        forget_demo_pods(core)

    step("helm install: the chart's defaults; the operator is its Deployment pod on the real node")
    registry: oci.Registry | None = None
    if oci.enabled(default=True):
        registry = cluster.start_registry()
        print(
            "    Its pods reach the API server through the kubernetes Service, as in any cluster. The\n"
            f"    images and the chart go to the cluster's OCI registry ({registry.host}, TLS with the\n"
            "    cluster's CA): the node's containerd pulls the images BY DIGEST (PATCHBAY_REGISTRY=0\n"
            "    imports them into the node instead)."
        )
        print(f"$ podman push <images> docker://{registry.host}/kube-patchbay/...")
        print(f"$ helm push patchbay-<version>.tgz {registry.charts}")
        print(
            f"$ helm upgrade --install {RELEASE} {registry.charts}/patchbay --version <version> "
            f"-n {NAMESPACE} --values <images by digest> --wait"
        )
        release = helm_install(
            cluster,
            REPO / "charts" / "patchbay",
            images,
            release=RELEASE,
            namespace=NAMESPACE,
            registry=registry,
        )
        print("    " + json.dumps(release.values))
        for ref in sorted(node_images(cluster)):
            if ref.startswith(registry.host):
                print(f"    pulled by the node: {ref}")
    else:
        print(
            "    Its pods reach the API server through the kubernetes Service, as in any cluster; the only\n"
            "    values are the images built here (imported into the node, PATCHBAY_REGISTRY=0; unset, the\n"
            "    node pulls them from the cluster's own OCI registry)."
        )
        print(f"$ helm upgrade --install {RELEASE} charts/patchbay -n {NAMESPACE} --values <images> --wait")
        print("    " + json.dumps(local_values(cluster, images)))
        helm_install(cluster, REPO / "charts" / "patchbay", images, release=RELEASE, namespace=NAMESPACE)
    tools.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide")

    step("Static: 4 example.com/dongle on every node labelled example.com/dongle-port=true")
    for node in ["localhost", "kwok-node-0", "kwok-node-1", "kwok-node-2"]:
        tools.kubectl("label", "--overwrite", "node", node, "example.com/dongle-port=true", show=False)
    tools.kubectl("label", "--overwrite", "node", "kwok-node-2", "example.com/dongles=2")
    tools.kubectl("apply", "-f", str(STATIC))
    wait_for("dongles on localhost", lambda: allocatable(core, "example.com/dongle") == "4")

    step("DevicePlugin: serial adapters (FAKE: mknod under /dev/patchbay-demo) served by the agent pod")
    make_fake_devices("ttyUSB", SERIAL_COUNT)
    names = ", ".join(sorted(p.name for p in FAKE_DEV.glob("ttyUSB*")))
    print(f"    {names} in {FAKE_DEV} (char 1:3, the null device)")
    tools.kubectl("label", "--overwrite", "node", "localhost", "example.com/serial=present")
    plugin = yaml.safe_load(PLUGIN.read_text())
    plugin["spec"]["plugin"]["discovery"]["paths"]["globs"] = [f"{FAKE_DEV}/ttyUSB*"]
    print(f"    (the example's glob /dev/ttyUSB* pointed at the fake devices: {FAKE_DEV}/ttyUSB*)")
    tools.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(plugin))
    wait_for("the node agent's pod Ready", lambda: ds_ready(apps, NODE_AGENT))
    wait_for(
        "serial adapters on localhost", lambda: allocatable(core, "example.com/serial") == str(SERIAL_COUNT)
    )
    tools.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide")
    if registry is not None:
        for ref in sorted(node_images(cluster)):
            if ref.startswith(registry.host) and "/patchbay-agent@" in ref:
                print(f"    the agent's image, pulled by the node: {ref}")

    step(
        "DRA: lab sensors (FAKE: mknod under /dev/patchbay-demo) served by the SAME agent pod, "
        "as a DRA driver"
    )
    agent_pod = the_agent_pod(core)
    make_fake_devices("sensor", SENSOR_COUNT)
    tools.kubectl("label", "--overwrite", "node", "localhost", "example.com/sensors=dra")
    dra = yaml.safe_load(DRA.read_text())
    dra["spec"]["plugin"]["discovery"]["paths"]["globs"] = [f"{FAKE_DEV}/sensor*"]
    print(f"    (the example's glob /dev/sensor* pointed at the fake devices: {FAKE_DEV}/sensor*)")
    tools.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(dra))
    driver = f"{dra['metadata']['name']}.patchbay.dev"
    wait_for("the sensors in a ResourceSlice", lambda: slice_devices(tools, driver) == SENSOR_COUNT)
    same = the_agent_pod(core)
    print(
        f"    ONE agent pod on localhost serves both profiles: {same.metadata.name} "
        f"(uid {same.metadata.uid[:8]}, restarts {restarts(same)}; the same pod as before the "
        f"sensors profile: {same.metadata.uid == agent_pod.metadata.uid})"
    )
    tools.kubectl("-n", NAMESPACE, "get", "pods", "-l", "patchbay.dev/agent=shared", "-o", "wide")
    live_change(tools, core, cluster, dra["metadata"]["name"])
    tools.kubectl("get", "resourceslices,deviceclasses")
    # Unchanged pods reach DRA devices through the DeviceClass's extendedResourceName, which API
    # servers before 1.36 drop (DRAExtendedResource off; docs/compatibility.md): read back what
    # was stored, as the operator does, and leave that pod out where the cluster cannot serve it.
    stored = wait_for("the DRA profile's DeviceClass", lambda: device_class(tools, driver), 60)
    unchanged_served = bool(stored["spec"].get("extendedResourceName"))
    if not unchanged_served:
        print(
            "    This cluster's API server dropped the DeviceClass's extendedResourceName\n"
            "    (DRAExtendedResource is off before Kubernetes 1.36): pods that ask for\n"
            "    example.com/sensor in their limits are not served by DRA here; claims are.\n"
            "    What the profile says about it:"
        )
        profile = json.loads(tools.kubectl("get", "dpp", dra["metadata"]["name"], "-o", "json", show=False))
        for cond in (profile.get("status") or {}).get("conditions") or []:
            print(
                f"      {cond['type']}={cond['status']} {cond.get('reason', '')}: {cond.get('message', '')}"
            )
    # A claim template that picks ONE sensor by attribute (its path on the node).
    by_path = f'device.attributes["patchbay.dev"].path == "{FAKE_DEV}/sensor1"'
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "sensor-1", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "sensor",
                            "exactly": {
                                "deviceClassName": driver,
                                "selectors": [{"cel": {"expression": by_path}}],
                            },
                        }
                    ]
                }
            }
        },
    }
    tools.kubectl("apply", "-f", "-", stdin=json.dumps(template))

    step("Pods that use them (busybox on the real node, on the pod network)")
    pods = {
        "uses-dongle": ("example.com/dongle", 1, "echo dongles granted; sleep 3600"),
        "uses-serial": (  # its devices env and the device nodes in its /dev
            "example.com/serial",
            2,
            "echo PATCHBAY_DEVICES=$PATCHBAY_DEVICES SERIAL_BAUD=$SERIAL_BAUD; "
            "ls /dev/patchbay-demo; sleep 3600",
        ),
        # Unchanged: an extended resource, served by DRA through the DeviceClass.
        "uses-sensor": ("example.com/sensor", 1, "echo SENSORS=$SENSORS; ls /dev/patchbay-demo; sleep 3600"),
        # A claim for sensor1 by attribute (the template above).
        "uses-sensor-claim": (None, 0, "echo SENSORS=$SENSORS; ls /dev/patchbay-demo; sleep 3600"),
    }
    assert set(pods) <= set(DEMO_PODS), "DEMO_PODS names every pod the demo makes"
    if not unchanged_served:
        del pods["uses-sensor"]
    for pod, (resource, count, script) in pods.items():
        resources: dict[str, object] = (
            {"limits": {resource: str(count)}} if resource else {"claims": [{"name": "sensor"}]}
        )
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": "default"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "localhost"},
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": BUSYBOX_IMAGE,
                        "command": ["sh", "-c", script],
                        "resources": resources,
                    }
                ],
                **(
                    {}
                    if resource
                    else {"resourceClaims": [{"name": "sensor", "resourceClaimTemplateName": "sensor-1"}]}
                ),
            },
        }
        tools.kubectl("apply", "-f", "-", stdin=json.dumps(body))
    for pod in pods:
        wait_for(
            f"pod {pod} Running",
            lambda p=pod: core.read_namespaced_pod(p, "default").status.phase == "Running",
        )
    wait_for("the profiles' status", lambda: profiles_settled(tools), 60)
    pod_names = list(pods)
    # The agent learns who holds what from the kubelet about a second after the Allocate.
    wait_for(
        "the agent's report to name the pod holding 2 serial adapters", lambda: serial_held(tools) == 2, 60
    )
    summary(tools, core, pod_names)
    print(f"\nmake demo took {time.monotonic() - t0:.0f}s")


#: the pods the demo runs on the real node, in ``default`` (its last step)
DEMO_PODS = ("uses-dongle", "uses-serial", "uses-sensor", "uses-sensor-claim")


def forget_demo_pods(core: client.CoreV1Api) -> None:
    """The real node was just started under a cluster that already holds the demo's pods (the
    demo's processes ended without `make demo-down`: a reboot, a killed session). The kubelet's
    state those pods were admitted with may be gone: the machine's kubelet directory is shared with
    the tests' real node, which `make test` may have run since. A pod whose devices the kubelet no
    longer knows at admission runs WITHOUT them (the device manager skips a resource no plugin has
    registered yet), so the demo deletes its pods now, before the agents start, and its last step
    creates them again."""
    gone = []
    for name in DEMO_PODS:
        try:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            gone.append(name)
        except client.ApiException as e:
            if e.status != 404:
                raise
    if gone:
        print(f"    the real node started again: the demo's pods from before go, made afresh last: {gone}")

        def absent() -> bool:
            names = {p.metadata.name for p in core.list_namespaced_pod("default").items}
            return not names & set(gone)

        wait_for("the demo's old pods gone", absent, 120)


NODE_AGENT = "patchbay-node-agent"


def the_agent_pod(core: client.CoreV1Api) -> Any:
    """The one shared agent pod on localhost (the demo stops if there are more or none)."""
    pods = [
        p
        for p in core.list_namespaced_pod(NAMESPACE, label_selector="patchbay.dev/agent=shared").items
        if p.spec.node_name == "localhost" and p.metadata.deletion_timestamp is None
    ]
    if len(pods) != 1:
        raise SystemExit(f"demo: {len(pods)} node agent pods on localhost, expected one")
    return pods[0]


def restarts(pod: Any) -> int:
    return sum(c.restart_count for c in pod.status.container_statuses or [])


def live_change(tools: Tools, core: client.CoreV1Api, cluster: DevCluster, profile: str) -> None:
    """Change the sensors profile's plugin section; the agent pod reconfigures live: the sensors
    driver registers again, the serial adapters are untouched (the kubelet's own count of them,
    read from its PodResources API every 10 ms, never dips), and no pod restarts."""
    import asyncio
    import threading

    from patchbay_agent.kubelet.podresources import get_allocatable_resources

    step("A profile change, applied live: no pod restarts, the other resource never dips")

    def settled() -> bool:
        # The apply above processed and served everywhere first: a run over a cluster an earlier
        # run set up (after `helm uninstall` and install) would otherwise see the apply and the
        # patch below folded into one change, or into none.
        got = json.loads(tools.kubectl("get", "dpp", profile, "-o", "json", show=False))
        st = got.get("status") or {}
        return (
            st.get("observedGeneration") == got["metadata"]["generation"]
            and bool(st.get("currentRevision"))
            and st.get("currentRevision") == st.get("updateRevision")
        )

    wait_for(f"{profile}'s status up to date", settled, 120)
    before = the_agent_pod(core)
    restarts_before = tools.kubectl("-n", NAMESPACE, "logs", before.metadata.name, show=False).count(
        f"{profile} restarted"
    )
    socket = cluster.real_node().paths.pod_resources_socket
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        async def loop() -> None:
            while not done.is_set():
                got = await get_allocatable_resources(socket, rpc_timeout=1.0)
                samples.append(got.count("example.com/serial"))
                await asyncio.sleep(0.01)

        asyncio.run(loop())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.5)
    # A real change whatever an earlier run left (a run over a cluster it set up before, after
    # `helm uninstall` and install, finds 10 already: patching 10 again would change nothing).
    current = json.loads(
        tools.kubectl("get", "dpp", profile, "-o", "jsonpath={.spec.plugin.health}", show=False) or "{}"
    ).get("periodSeconds")
    patch = {"spec": {"plugin": {"health": {"periodSeconds": 7 if current == 10 else 10}}}}
    t0 = time.monotonic()
    tools.kubectl("patch", "dpp", profile, "--type", "merge", "-p", json.dumps(patch))

    def applied() -> bool:
        log = tools.kubectl("-n", NAMESPACE, "logs", before.metadata.name, show=False)
        return log.count(f"{profile} restarted") > restarts_before

    wait_for(f"the agent to restart {profile} alone", applied, 120)
    took = time.monotonic() - t0
    time.sleep(1.0)
    done.set()
    sampler.join(5)
    after = the_agent_pod(core)
    print(
        f"    applied -> effective on the node in {took:.1f}s (kubectl patch -> the agent's log line)\n"
        f"    agent pod: {after.metadata.name}, same pod {after.metadata.uid == before.metadata.uid}, "
        f"restarts {restarts(before)} -> {restarts(after)}\n"
        f"    example.com/serial allocatable at the kubelet (PodResources, {len(samples)} samples): "
        f"min {min(samples) if samples else '-'}, max {max(samples) if samples else '-'}"
    )
    if after.metadata.uid != before.metadata.uid or (samples and min(samples) < SERIAL_COUNT):
        raise SystemExit("demo: the live change restarted the agent pod or dipped the serial adapters")


def allocatable(core: client.CoreV1Api, resource: str, node: str = "localhost") -> str | None:
    return (core.read_node_status(node).status.allocatable or {}).get(resource)


def ds_ready(apps: client.AppsV1Api, name: str) -> bool:
    try:
        st = apps.read_namespaced_daemon_set_status(name, NAMESPACE).status
    except client.ApiException:
        return False
    return bool(st.desired_number_scheduled) and st.number_ready == st.desired_number_scheduled


def profiles_settled(tools: Tools) -> bool:
    """Every profile Ready=True for its current generation (what kstatus calls Current)."""
    items = json.loads(tools.kubectl("get", "dpp", "-o", "json", show=False))["items"]
    for p in items:
        st = p.get("status") or {}
        ready = [c for c in st.get("conditions") or [] if c["type"] == "Ready"]
        if (
            st.get("observedGeneration") != p["metadata"]["generation"]
            or not ready
            or ready[0]["status"] != "True"
        ):
            return False
    return bool(items)


def slice_devices(tools: Tools, driver: str) -> int:
    """Devices the driver's ResourceSlices publish."""
    items = json.loads(tools.kubectl("get", "resourceslices", "-o", "json", show=False))["items"]
    return sum(len(s["spec"].get("devices") or []) for s in items if s["spec"]["driver"] == driver)


def serial_held(tools: Tools) -> int:
    """Devices the serial profile's DeviceReports count as allocated."""
    items = json.loads(tools.kubectl("-n", NAMESPACE, "get", "dr", "-o", "json", show=False))["items"]
    return sum(
        int((r.get("summary") or {}).get("allocated") or 0)
        for r in items
        if r.get("profile") == "serial-adapters"
    )


def device_class(tools: Tools, name: str) -> dict[str, Any] | None:
    """The DeviceClass as the API server stored it, or None while it does not exist."""
    items = json.loads(tools.kubectl("get", "deviceclasses", "-o", "json", show=False))["items"]
    return next((d for d in items if d["metadata"]["name"] == name), None)


def summary(tools: Tools, core: client.CoreV1Api, pods: list[str]) -> None:
    step("kubectl get dpp")
    print(tools.kubectl("get", "dpp", show=False).rstrip())
    step("Patchbay's pods (the operator from the chart, ONE node agent pod per node for every profile)")
    print(tools.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide", show=False).rstrip())
    step("What the agents report on their node (kubectl get devicereports: health, who holds what)")
    print(tools.kubectl("-n", NAMESPACE, "get", "dr", show=False).rstrip())
    step("What the scheduler sees: allocatable/capacity per node (DRA devices are in ResourceSlices instead)")
    print(f"{'NODE':<14} {'example.com/dongle':>20} {'example.com/serial':>20}")
    for node in core.list_node().items:
        cap, alloc = node.status.capacity or {}, node.status.allocatable or {}
        cells = [
            f"{alloc.get(r, '-')}/{cap.get(r, '-')}" for r in ("example.com/dongle", "example.com/serial")
        ]
        print(f"{node.metadata.name:<14} {cells[0]:>20} {cells[1]:>20}")
    step("kubectl patchbay devices: every device of every profile, its health and holder")
    print(tools.kubectl("patchbay", "devices", show=False).rstrip())
    step("kubectl patchbay why serial-adapters: the profile in one screen")
    print(tools.kubectl("patchbay", "why", "serial-adapters", show=False).rstrip())
    step("What each pod received")
    for pod in pods:
        print(f"--- {pod} (pod IP {core.read_namespaced_pod(pod, 'default').status.pod_ip}):")
        print(core.read_namespaced_pod_log(pod, "default").rstrip())
    step("Done")
    print(f"export KUBECONFIG={tools.env['KUBECONFIG']}")
    print("kubectl describe dpp serial-adapters   # conditions, counts, problems, events")
    print("kubectl get resourceslices -o yaml     # the DRA agent's devices, attributes, taints")
    if has("health-in-pod-status", release_of(find_bin_dir())):
        health = "{.status.containerStatuses[0].allocatedResourcesStatus}"
        print(f"kubectl get pod uses-sensor-claim -o jsonpath='{health}'   # its device's health")
    print(f"kubectl -n {NAMESPACE} get dr -o yaml   # each device's health, reason, since, holders")
    print("The operator and the agents run as pods from the images above; nothing of Patchbay runs")
    print("on the host. Stop everything: make demo-down")


def down(cluster: DevCluster) -> None:
    stopped = cluster.down()
    print("stopped: " + (", ".join(stopped) if stopped else "no cluster was running"))
    if FAKE_DEV.exists():
        shutil.rmtree(FAKE_DEV)
        print(f"removed the fake devices in {FAKE_DEV}")


def room_for_tests(holder: Path | None, demo_dir: Path) -> str:
    """What the test targets do about the machine's one real node before they start: "" (it is
    free), "stop-demo" (the demo holds it: stop the demo), or a line saying who else holds it and
    how to stop that (the tests would wait for it and fail)."""
    if holder is None:
        return ""
    if holder.resolve() == demo_dir.resolve():
        return "stop-demo"
    return (
        f"another cluster's real node runs on this machine (state dir {holder}); the tests need it: "
        f"stop it with `patchbay-devcluster --state-dir {holder} down`"
    )


def make_room() -> None:
    """`hack/demo.py make-room`, run by `make test` (and the other targets that start a real node)."""
    demo_dir = default_state_dir()
    verdict = room_for_tests(real_node_holder(), demo_dir)
    if verdict == "stop-demo":
        print("==> The demo's cluster holds the machine's one real node, which the tests need: stopping it")
        print("    (`make demo` starts it again; the binaries and images stay cached)")
        down(DevCluster(demo_dir))
    elif verdict:
        raise SystemExit(verdict)


def main() -> None:
    # The cluster tool reports its progress (each component ready, nodes Ready) through logging.
    logging.basicConfig(level=logging.INFO, format="    %(message)s")
    cluster = DevCluster(default_state_dir())
    if sys.argv[1:] == ["down"]:
        down(cluster)
    elif sys.argv[1:] == ["make-room"]:
        make_room()
    elif sys.argv[1:] in ([], ["up"]):
        up(cluster)
    else:
        raise SystemExit(
            "usage: hack/demo.py [up|down|make-room]\n"
            "  By default the demo installs through the cluster's OCI registry (images pulled by digest,\n"
            "  the chart from oci://); PATCHBAY_REGISTRY=0 imports the images into the node instead"
        )


if __name__ == "__main__":
    main()
