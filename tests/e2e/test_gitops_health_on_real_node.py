"""What Argo CD and Flux show for a profile, in each state it goes through on the real node.

One profile, driven as an administrator's mistakes would drive it: created with an agent image
the node cannot get (Stalled), fixed (the agents roll: Reconciling, then Ready), a device that
vanishes (Degraded), the device back, the profile deleted. A watch keeps EVERY version of the
profile the operator wrote; each is then judged by the project's Argo CD health check run as Argo
CD runs it (its Lua VM, its conventions) and by kstatus (Flux's library), and the two must agree
(support/gitopshealth.agrees). Each phase ends in the Argo CD state it must: Degraded naming the
node and the kubelet's reason, Healthy, Degraded naming the device, Progressing while deleted.

With PATCHBAY_RECORD_GITOPS=DIR the last version of each phase is written to DIR as the
health_test.yaml and testdata/ of the check (`make record-gitops-health`): the statuses the
conformance test holds the check to are recorded here, not written by hand.
"""

from __future__ import annotations

import copy
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import watch
from support.clusters import Cluster, kstatus
from support.gitopshealth import Verdict, agrees, build, conditions, evaluate
from support.realnode import DEVICES, Installed, add_fake_device, wait_for
from urllib3.exceptions import ProtocolError

GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "devicepluginprofiles"


class Recorder:
    """Every version of one profile, from a watch (a poll would miss the short states)."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster, self.name = cluster, name
        self.versions: list[tuple[str, dict[str, Any]]] = []  # (phase, object)
        self.phase = "created"
        self._watch = watch.Watch()
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Watch from where the last watch ended (the API server may end one at any time), so no
        version is missed; stop() ends it."""
        since = ""
        while not self._stopping.is_set():
            try:
                stream = self._watch.stream(
                    self.cluster.custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                    field_selector=f"metadata.name={self.name}",
                    resource_version=since,
                    timeout_seconds=600,
                )
                for event in stream:
                    obj = event["object"]
                    since = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        with self._lock:
                            self.versions.append((self.phase, copy.deepcopy(obj)))
                            self._lock.notify_all()
            except ProtocolError:
                continue  # the connection ended: watch again from `since`

    def enter(self, phase: str, now: dict[str, Any] | None = None, timeout: float = 60) -> None:
        """Versions from here on belong to `phase`; `now`: the object as the test last read it,
        whose version (and so every one before it) is recorded in the phase that ends first. The
        watch delivers a version later than a GET returns it: without this wait, the version that
        ended a phase could be filed under the next one."""
        with self._lock:
            if now is not None:
                rv = now["metadata"]["resourceVersion"]
                seen = self._lock.wait_for(
                    lambda: any(o["metadata"]["resourceVersion"] == rv for _, o in self.versions), timeout
                )
                assert seen, f"the watch never delivered resourceVersion {rv}"
            self.phase = phase

    def stop(self) -> list[tuple[str, dict[str, Any]]]:
        self._stopping.set()
        self._watch.stop()
        self._thread.join(timeout=30)
        with self._lock:
            return list(self.versions)


@pytest.fixture(scope="module")
def gitopshealth() -> Path:
    return build()


def test_argo_cd_and_flux_agree_on_every_state_of_a_profile_on_the_real_node(
    patchbay: Installed, cluster: Cluster, real_node: str, fake_dev: Path, gitopshealth: Path
) -> None:
    name = f"{cluster.prefix}gitops"
    label = "patchbay.dev/e2e-gitops"
    for i in range(DEVICES):
        add_fake_device(fake_dev, f"ttyGitops{i}")
    cluster.set_labels(real_node, {label: cluster.tag})
    recorder = Recorder(cluster, name)
    try:
        # 1. An agent image the node does not have and may not pull: Stalled (kstatus Failed).
        recorder.enter("stalled")
        cluster.create_profile(
            name,
            {
                "resourceName": f"e2e.patchbay.dev/{cluster.tag}-gitops",
                "mode": "DevicePlugin",
                "nodeSelector": {"matchLabels": {label: cluster.tag}},
                "plugin": {
                    "discovery": {"paths": {"globs": [f"{fake_dev}/ttyGitops*"]}},
                    "health": {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1},
                },
                "agent": {
                    "image": "ghcr.io/kube-patchbay/patchbay-agent:0.0.0-missing",
                    "imagePullPolicy": "Never",
                },
            },
        )
        wait_for("kstatus Failed", lambda: kstatus(cluster.profile(name) or {}) == "Failed", 120)

        # 2. The fix: the agents roll (Reconciling), then every device is served (Ready).
        recorder.enter("fixed", now=cluster.profile(name))
        cluster.patch_spec(
            name,
            {
                "agent": {
                    "image": patchbay.release.values["agent"]["image"],
                    "imagePullPolicy": "IfNotPresent",
                }
            },
        )

        def served() -> bool:
            obj = cluster.profile(name) or {}
            st = obj.get("status") or {}
            return kstatus(obj) == "Current" and st.get("problems") == [] and st.get("nodesReady") == "1/1"

        wait_for("every device served after the fix", served, 180)

        # 3. A device vanishes: Degraded, naming it.
        recorder.enter("degraded", now=cluster.profile(name))
        victim = fake_dev / "ttyGitops0"
        victim.unlink()

        def degraded_message() -> str:
            return str((conditions(cluster.profile(name) or {}).get("Degraded") or {}).get("message", ""))

        wait_for("Degraded naming the vanished device", lambda: victim.name in degraded_message(), 60)

        # 4. Back: Ready, nothing degraded.
        recorder.enter("recovered", now=cluster.profile(name))
        add_fake_device(fake_dev, victim.name)
        wait_for(
            "Degraded False again",
            lambda: (conditions(cluster.profile(name) or {}).get("Degraded") or {}).get("status") == "False",
            60,
        )

        # 5. Deleted: the finalizer holds it while the operator cleans up.
        recorder.enter("deleting", now=cluster.profile(name))
        cluster.delete_profile(name)
        wait_for("the profile gone", lambda: cluster.profile(name) is None, 120)
    finally:
        versions = recorder.stop()
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {label: None})

    judged = [
        (phase, obj, v)
        for (phase, obj), v in zip(versions, evaluate(gitopshealth, [o for _, o in versions]), strict=True)
    ]
    disagreements = [
        f"{phase} rv={obj['metadata']['resourceVersion']}: {why}"
        for phase, obj, v in judged
        if (why := agrees(obj, v)) is not None
    ]
    assert not disagreements, "\n".join(disagreements)
    assert {v.argocd[0] for _, _, v in judged} >= {"Healthy", "Progressing", "Degraded"}

    def in_phase(phase: str) -> list[Verdict]:
        return [v for p, _, v in judged if p == phase]

    stalled = in_phase("stalled")[-1]
    assert stalled.argocd[0] == "Degraded" and stalled.kstatus[0] == "Failed", stalled
    assert f"node {real_node}" in stalled.argocd[1] and "ErrImageNeverPull" in stalled.argocd[1], stalled
    fixed = [v.argocd[0] for v in in_phase("fixed")]
    assert "Progressing" in fixed, f"no Progressing version while the fixed agents rolled: {fixed}"
    assert fixed[-1] == "Healthy", fixed
    degraded = in_phase("degraded")[-1]
    assert degraded.argocd[0] == "Degraded" and victim.name in degraded.argocd[1], degraded
    assert in_phase("recovered")[-1].argocd[0] == "Healthy", in_phase("recovered")
    deleting = in_phase("deleting")
    assert deleting and all(v.argocd[0] == "Progressing" for v in deleting), deleting

    if record := os.environ.get("PATCHBAY_RECORD_GITOPS"):
        # Each phase's last version; and two short states: the profile before the operator's first
        # status write, and the agents rolling after the fix.
        kept = {"new": (judged[0][1], judged[0][2])}
        rolling = [(obj, v) for p, obj, v in judged if p == "fixed" and v.argocd[0] == "Progressing"]
        kept["rolling"] = rolling[0]
        kept.update({phase: (obj, v) for phase, obj, v in judged})
        write_record(Path(record), kept)


def trimmed(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as Argo CD's test inputs keep them: without managedFields (noise for a check)."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("managedFields", None)
    return obj


def write_record(directory: Path, last: dict[str, tuple[dict[str, Any], Verdict]]) -> None:
    """health_test.yaml and testdata/<name>.yaml in Argo CD's resource_customizations layout."""
    (directory / "testdata").mkdir(parents=True, exist_ok=True)
    tests = []
    for phase, (obj, verdict) in last.items():
        (directory / "testdata" / f"{phase}.yaml").write_text(yaml.safe_dump(trimmed(obj), sort_keys=False))
        status, message = verdict.argocd
        expected = {"status": status, "message": message}
        tests.append({"healthStatus": expected, "inputPath": f"testdata/{phase}.yaml"})
    (directory / "health_test.yaml").write_text(yaml.safe_dump({"tests": tests}, sort_keys=False))
