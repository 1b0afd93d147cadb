"""`helm upgrade` from each earlier release to this one, on the real node, while every mode serves
and pods hold devices: what a GitOps user does when they move their pinned version forward.

The earlier releases (CHANGELOG.md), one test each:

- **0.2.0**, the commit 52c4ee0, the release before this one, **the way clusters install**: its
  images pushed to the cluster's OCI registry and its chart to `oci://`, the node pulling the
  images by digest; then this checkout's images and chart pushed to the same registry and
  `helm upgrade` from `oci://` (docs/install.md#1-the-images-and-the-chart-into-your-registry).
- **0.1.0**, the commit 8f15ab3, never packaged: its images imported into the node, as its users
  did, and `helm upgrade` to this checkout's packaged chart, imported too.

Each is checked out with `git worktree add` into a temporary directory, its images built from
there (`imagebuild.build_all`, cached by content like this checkout's) and its chart packaged and
installed with the chart's default values but the images, on a cluster with no Patchbay left (the
session's release uninstalled and its CRDs deleted, as on a cluster that never had Patchbay).
Then, written as that release's users wrote them (0.1.0: `patchbay.dev/v1alpha1`, the only version
it serves; 0.2.0: `v1beta1`):

- a Static profile, and a pod holding one unit of it;
- a DevicePlugin profile served by the shared node agent, and a pod holding one of its devices;
- a DevicePlugin profile with an agent of its own, and a pod holding one of its devices;
- a DRA profile served by the shared node agent, and a pod holding a device through a claim.

Then `helm upgrade` to this checkout's chart as `helm package` makes it (the session's archive),
and the new operator rolls the agents to the new image; the test ends with the release as the
session fixture made it. Checked:

- the kubelet's own count of each device-plugin resource (PodResources GetAllocatableResources,
  sampled all along) never drops below its devices; the DRA driver's devices in the node's
  ResourceSlices and the Static resource's allocatable, sampled from the API server, never do
  either;
- no pod restarts: every holder is the same pod, Running, with no container restart;
- every profile is Current in kstatus terms afterwards, read under v1beta1;
- every stored profile and DeviceReport is valid under v1beta1: read back under it, and admitted
  by the API server's v1beta1 validation as it is stored (a dry-run create of it answers 409
  AlreadyExists, which the API server says only once the object passed the schema and its CEL
  rules; an invalid one is 422, tests/integration/test_api_versions.py);
- the objects the operator owns for a profile name it as patchbay.dev/v1beta1.

Needs the history of the checkout (8f15ab3, 52c4ee0): a shallow clone fails here, saying so.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client import ApiException
from support.clusters import Cluster, kstatus
from support.dranode import claim_pod, claim_template, dra_profile, slice_devices
from support.ociregistry import relabelled
from support.realnode import (
    AGENT_SELECTOR,
    DEVICES,
    REPO,
    SHARED_SELECTOR,
    Installed,
    busybox_pod,
    limits,
    serial_profile,
    wait_for,
)
from support.rollout import AllocatableSampler, dips

from patchbay_devcluster import DevCluster
from patchbay_devcluster.imagebuild import BuiltImage, build_all
from patchbay_devcluster.install import Release, helm_install, helm_uninstall, node_images, package_chart

GROUP, OLD, NEW = "patchbay.dev", "v1alpha1", "v1beta1"


@dataclass(frozen=True)
class Previous:
    """An earlier release: its version, its commit (CHANGELOG.md), the API versions its CRDs serve
    (the first one its users write) and whether it is installed through the cluster's registry."""

    version: str
    commit: str
    serves: tuple[str, ...]
    registry: bool


PREVIOUS = {
    "0.1.0": Previous("0.1.0", "8f15ab3", (OLD,), registry=False),
    "0.2.0": Previous("0.2.0", "52c4ee0", (NEW, OLD), registry=True),
}
CRDS = ("devicepluginprofiles.patchbay.dev", "devicereports.patchbay.dev")
STATIC_CAPACITY = 3
LABEL = "patchbay.dev/e2e-upgrade"
SAMPLE_EVERY = 0.05
SETTLE = 10.0
"""Seconds sampled after the last rollout: a leaving agent's exit lands after its pod is gone."""


class Samples:
    """``read()`` every ``every`` seconds in a thread of its own until the block ends:
    (monotonic time, value); a read that fails is kept as None."""

    def __init__(self, read: Callable[[], int | None], every: float = 0.5) -> None:
        self._read, self._every = read, every
        self.values: list[tuple[float, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            try:
                value = self._read()
            except Exception:
                value = None
            self.values.append((at, value))
            self._stop.wait(max(0.0, at + self._every - time.monotonic()))

    def below(self, full: int) -> list[tuple[float, int | None]]:
        return [(at, v) for at, v in self.values if v is None or v < full]

    def __enter__(self) -> Samples:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture(params=sorted(PREVIOUS))
def previous(request: pytest.FixtureRequest) -> Previous:
    return PREVIOUS[request.param]


@pytest.fixture
def previous_checkout(previous: Previous, tmp_path: Path) -> Iterator[Path]:
    """The earlier release's commit, checked out in a worktree of this repository's own."""
    path = tmp_path / f"patchbay-{previous.version}"
    res = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), previous.commit],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, (
        f"git worktree add {previous.commit} failed (a shallow clone lacks the release's commit: "
        f"`git fetch --unshallow`):\n{res.stdout}{res.stderr}"
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
            capture_output=True,
            timeout=120,
            check=False,
        )


def custom_objects(
    custom: client.CustomObjectsApi, version: str, plural: str, namespace: str = ""
) -> list[dict[str, Any]]:
    if namespace:
        got = custom.list_namespaced_custom_object(GROUP, version, namespace, plural)
    else:
        got = custom.list_cluster_custom_object(GROUP, version, plural)
    return cast(list[dict[str, Any]], cast(dict[str, Any], got)["items"])


def no_patchbay_left(patchbay: Installed, e2e_cluster: DevCluster) -> None:
    """The session's release uninstalled and its CRDs deleted (the chart keeps them): a cluster
    as an earlier release's users had it before they installed it. A profile left by an earlier test loses
    its finalizer first (no operator runs any more to remove it). Without the chart's pre-delete
    check (``--no-hooks``), which would refuse while such a profile exists."""
    helm_uninstall(e2e_cluster, patchbay.release, hooks=False)
    wait_for("no operator pod", lambda: not patchbay.operator_pods(), 120)
    custom = client.CustomObjectsApi(patchbay.api)
    ext = client.ApiextensionsV1Api(patchbay.api)
    for profile in custom_objects(custom, NEW, "devicepluginprofiles"):
        name = profile["metadata"]["name"]
        custom.patch_cluster_custom_object(
            GROUP, NEW, "devicepluginprofiles", name, {"metadata": {"finalizers": None}}
        )
        custom.delete_cluster_custom_object(GROUP, NEW, "devicepluginprofiles", name)
    for crd in CRDS:
        try:
            ext.delete_custom_resource_definition(crd)
        except ApiException as e:
            if e.status != 404:
                raise

    def gone() -> bool:
        names = {c.metadata.name for c in ext.list_custom_resource_definition().items if c.metadata}
        return not names & set(CRDS)

    # docs/operations.md#uninstall: on 1.37 a CRD's finalizer may wait for its informer's resync.
    wait_for("Patchbay's CRDs deleted", gone, 420)
    apps = client.AppsV1Api(patchbay.api)

    def no_agents() -> bool:
        """The agent DaemonSets of the profiles that went are garbage-collected (their owners)."""
        left = apps.list_namespaced_daemon_set(patchbay.namespace, label_selector=AGENT_SELECTOR).items
        return (
            not left
            and not patchbay.core.list_namespaced_pod(patchbay.namespace, label_selector=AGENT_SELECTOR).items
        )

    wait_for("no agent DaemonSet or pod left", no_agents, 180)


def rolled(patchbay: Installed, daemonset: str, selector: str, node: str, image: str) -> bool:
    """The DaemonSet rolled on ``node``: one pod, Ready, of ``image``, and nothing else left."""
    apps = client.AppsV1Api(patchbay.api)
    ds = apps.read_namespaced_daemon_set_status(daemonset, patchbay.namespace)
    st, meta = ds.status, ds.metadata
    if st is None or meta is None or (st.observed_generation or 0) < (meta.generation or 0):
        return False
    if not (st.desired_number_scheduled == st.updated_number_scheduled == st.number_available):
        return False
    pods = [
        p
        for p in patchbay.core.list_namespaced_pod(patchbay.namespace, label_selector=selector).items
        if p.spec is not None and p.spec.node_name == node
    ]
    if len(pods) != 1 or pods[0].metadata is None or pods[0].metadata.deletion_timestamp:
        return False
    spec, status = pods[0].spec, pods[0].status
    assert spec is not None
    ready = [c for c in (status.conditions if status else None) or [] if c.type == "Ready"]
    return spec.containers[0].image == image and bool(ready) and ready[0].status == "True"


def holder_state(core: client.CoreV1Api, namespace: str, name: str) -> tuple[str, str, int]:
    """(uid, phase, container restarts) of a pod holding devices."""
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.metadata is not None and pod.status is not None
    restarts = sum(c.restart_count for c in pod.status.container_statuses or [])
    return str(pod.metadata.uid), str(pod.status.phase), restarts


def current(cluster: Cluster, name: str) -> bool:
    """The profile exists and kstatus calls it Current."""
    obj = cluster.profile(name)
    return obj is not None and kstatus(obj) == "Current"


def all_current(cluster: Cluster, profiles: tuple[str, ...], release: str) -> None:
    """Every profile Current, read under ``cluster.version``, with ``release`` installed."""
    for name in profiles:
        wait_for(
            f"profile {name} Current under {release}",
            partial(current, cluster, name),
            180,
            detail=partial(status_of, cluster, name),
        )


def status_of(cluster: Cluster, name: str) -> str:
    return str((cluster.profile(name) or {}).get("status"))


def admitted_as_stored(custom: client.CustomObjectsApi, obj: dict[str, Any]) -> int:
    """The HTTP status of a dry-run create, under v1beta1, of ``obj`` as it is stored (its name,
    labels, annotations and content; status left out, as a create ignores it): 409 once the
    object passed v1beta1's schema and CEL rules, 422 naming what is invalid."""
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
    body = {**{k: v for k, v in obj.items() if k not in ("metadata", "status")}, "metadata": meta}
    body["apiVersion"] = f"{GROUP}/{NEW}"
    plural = "devicereports" if obj["kind"] == "DeviceReport" else "devicepluginprofiles"
    try:
        if meta.get("namespace"):
            custom.create_namespaced_custom_object(GROUP, NEW, meta["namespace"], plural, body, dry_run="All")
        else:
            custom.create_cluster_custom_object(GROUP, NEW, plural, body, dry_run="All")
    except ApiException as e:
        return int(e.status or 0)
    return 201


@pytest.mark.timeout(2400)
def test_helm_upgrade_from_the_previous_release_while_every_mode_serves(
    patchbay: Installed,
    e2e_cluster: DevCluster,
    bin_dir: Path,
    cluster: Cluster,
    real_node: str,
    namespace: str,
    fake_dev: Path,
    previous: Previous,
    previous_checkout: Path,
    tmp_path: Path,
) -> None:
    core, custom, apps = cluster.core, cluster.custom, client.AppsV1Api(cluster.api)
    socket = e2e_cluster.real_node().paths.pod_resources_socket
    version = previous.version
    # Through the registry: every image pulled by the node, by digest; else imported into it.
    registry = e2e_cluster.start_registry() if previous.registry else None
    restored = False
    try:
        # --- the earlier release, as its users have it --------------------------------------------
        old_images: dict[str, BuiltImage] = build_all(previous_checkout)
        assert all(i.tag.startswith(f"{version}-") for i in old_images.values()), old_images
        old_chart = package_chart(
            bin_dir / "helm", previous_checkout / "charts" / "patchbay", tmp_path / "chart"
        )
        assert old_chart.name == f"patchbay-{version}.tgz"
        no_patchbay_left(patchbay, e2e_cluster)
        # As the session's release: the chart's default values but the images.
        old_release: Release = helm_install(e2e_cluster, old_chart, old_images, registry=registry)
        old = Installed(e2e_cluster, patchbay.api, old_release, old_images)
        wait_for(f"the {version} operator pod Ready", old.operator_ready, 120)
        crd = client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(CRDS[0])
        assert crd.spec is not None and tuple(v.name for v in crd.spec.versions) == previous.serves

        cluster.version = previous.serves[0]
        static, static_resource = f"{cluster.prefix}static", f"e2e.patchbay.dev/{cluster.tag}-static"
        cluster.set_labels(real_node, {LABEL: cluster.tag})
        cluster.create_profile(
            static,
            {
                "resourceName": static_resource,
                "mode": "Static",
                "nodeSelector": {"matchLabels": {LABEL: cluster.tag}},
                "static": {"capacity": STATIC_CAPACITY},
            },
        )
        shared, shared_resource = serial_profile(
            cluster, fake_dev, real_node, suffix="shared", agent=None, label=LABEL, subdir="shared"
        )
        own, own_resource = serial_profile(
            cluster, fake_dev, real_node, suffix="own", label=LABEL, subdir="own"
        )
        dra, _dra_resource, driver = dra_profile(cluster, fake_dev, real_node, own_agent=False)
        profiles = (static, shared, own, dra)

        def advertised(resource: str, count: int) -> bool:
            return cluster.values(real_node, resource) == (str(count), str(count))

        for resource in (shared_resource, own_resource):
            wait_for(f"{resource} on the node", partial(advertised, resource, DEVICES), 180)
        wait_for(
            "the static resource on the node", partial(advertised, static_resource, STATIC_CAPACITY), 120
        )
        wait_for(
            "the DRA devices in a ResourceSlice",
            lambda: len(slice_devices(cluster, driver, real_node)) == DEVICES,
            180,
        )

        claim_template(custom, namespace, "upgrade-serial", driver)
        holders = {
            "hold-static": limits(busybox_pod("hold-static", real_node, "sleep 86400"), static_resource, 1),
            "hold-shared": limits(busybox_pod("hold-shared", real_node, "sleep 86400"), shared_resource, 1),
            "hold-own": limits(busybox_pod("hold-own", real_node, "sleep 86400"), own_resource, 1),
            "hold-dra": claim_pod("hold-dra", real_node, "upgrade-serial", fake_dev),
        }
        for pod in holders.values():
            core.create_namespaced_pod(namespace, cast(Any, pod))

        def running(name: str) -> bool:
            return holder_state(core, namespace, name)[1] == "Running"

        for name in holders:
            wait_for(f"{name} Running", partial(running, name), 180)
        all_current(cluster, profiles, version)
        before = {name: holder_state(core, namespace, name) for name in holders}
        old_agent = old_release.values["agent"]["image"]  # as installed: imported, or from a registry
        own_selector = f"{AGENT_SELECTOR},patchbay.dev/profile={own}"
        for daemonset, selector in (
            ("patchbay-node-agent", SHARED_SELECTOR),
            (f"patchbay-{own}", own_selector),
        ):
            wait_for(
                f"{daemonset}: one Ready {version} agent on the node",
                partial(rolled, old, daemonset, selector, real_node, old_agent),
                120,
            )

        if registry is not None:
            pulled = node_images(e2e_cluster)
            assert old_agent.startswith(registry.host) and old_agent in pulled, (old_agent, sorted(pulled))

        # --- helm upgrade to this release, sampled all along --------------------------------------

        def static_allocatable() -> int | None:
            value = cluster.values(real_node, static_resource)[1]
            return None if value is None else int(value)

        with (
            AllocatableSampler(
                cluster.api, real_node, shared_resource, socket, SAMPLE_EVERY, with_api=False
            ) as s1,
            AllocatableSampler(
                cluster.api, real_node, own_resource, socket, SAMPLE_EVERY, with_api=False
            ) as s2,
            Samples(lambda: len(slice_devices(cluster, driver, real_node))) as dra_devices,
            Samples(static_allocatable) as static_values,
        ):
            time.sleep(2.0)  # a baseline before the upgrade
            if registry is None:
                new_release = helm_install(
                    e2e_cluster, patchbay.release.chart, patchbay.images, patchbay.release.values
                )
                restored = True  # the session's release as the fixture made it
            else:
                # The chart's defaults but this release's images, from the registry by digest:
                # relabelled, their own image IDs, so that the session's imported ones stay usable.
                mine = {n: relabelled(i, "upgrade", tmp_path / "relabel") for n, i in patchbay.images.items()}
                new_release = helm_install(e2e_cluster, patchbay.release.chart, mine, registry=registry)
            new_agent = new_release.values["agent"]["image"]
            wait_for("this release's operator pod Ready", patchbay.operator_ready, 120)
            wait_for(
                "the shared node agent rolled to the new image",
                lambda: rolled(patchbay, "patchbay-node-agent", SHARED_SELECTOR, real_node, new_agent),
                300,
            )
            wait_for(
                "the own agent rolled to the new image",
                lambda: rolled(patchbay, f"patchbay-{own}", own_selector, real_node, new_agent),
                300,
            )
            time.sleep(SETTLE)
        figures = {
            "samples": (len(s1.samples), len(s2.samples), len(dra_devices.values), len(static_values.values)),
            "dips": {
                r: dips(s.samples, DEVICES)[:10] for r, s in ((shared_resource, s1), (own_resource, s2))
            },
            "draBelow": dra_devices.below(DEVICES)[:10],
            "staticBelow": static_values.below(STATIC_CAPACITY)[:10],
        }
        print(f"upgrade {version} -> {patchbay.release.chart.name}: {figures}")
        if registry is not None:
            pulled = node_images(e2e_cluster)
            assert new_agent.startswith(registry.host) and new_agent in pulled, (new_agent, sorted(pulled))

        # The kubelet's count never dipped; neither did the DRA devices and the static resource.
        assert s1.samples and s2.samples and dra_devices.values and static_values.values, figures
        for r, s in ((shared_resource, s1), (own_resource, s2)):
            assert dips(s.samples, DEVICES) == [], figures
            assert s.samples[-1].kubelet == DEVICES, (r, figures)
        assert dra_devices.below(DEVICES) == [], figures
        assert static_values.below(STATIC_CAPACITY) == [], figures

        # No pod restarted.
        after = {name: holder_state(core, namespace, name) for name in holders}
        assert after == before, (before, after)

        # Every profile Current, read under v1beta1.
        cluster.version = NEW
        all_current(cluster, profiles, "this release")

        # Every stored profile and report valid under v1beta1.
        stored = custom_objects(custom, NEW, "devicepluginprofiles")
        reports = custom_objects(custom, NEW, "devicereports", patchbay.namespace)
        assert set(profiles) <= {p["metadata"]["name"] for p in stored}
        ours = [r for r in reports if r["profile"] in profiles]
        assert {r["profile"] for r in ours} == {shared, own, dra}, [r["metadata"]["name"] for r in reports]
        for obj in stored + reports:
            assert obj["apiVersion"] == f"{GROUP}/{NEW}"
            assert admitted_as_stored(custom, obj) == 409, obj["metadata"]["name"]
        for report in ours:
            summary = report["summary"]
            assert summary["total"] == DEVICES and summary["healthy"] == DEVICES, report["metadata"]["name"]

        # What the operator owns for a profile names it as v1beta1 (it applied them at start).
        def owner_versions() -> set[str]:
            ds = apps.read_namespaced_daemon_set(f"patchbay-{own}", patchbay.namespace)
            assert ds.metadata is not None
            return {
                o.api_version for o in ds.metadata.owner_references or [] if o.kind == "DevicePluginProfile"
            }

        wait_for(
            "the own agent's DaemonSet owned as v1beta1", lambda: owner_versions() == {f"{GROUP}/{NEW}"}, 60
        )
    finally:
        for name in ("hold-static", "hold-shared", "hold-own", "hold-dra"):
            try:
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    raise
        if not restored:
            # The session's release as the fixture made it, for the tests after this one.
            helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, patchbay.release.values)
        cluster.version = NEW  # the chart installed now serves both versions
        cluster.set_labels(real_node, {LABEL: None, "patchbay.dev/e2e-dra": None})
