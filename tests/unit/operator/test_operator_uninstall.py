"""The chart's pre-delete hook (``patchbay-uninstall-check``) against a fake API: what it refuses,
what it says, and the order in which the opt-in path stops the operator and the agents."""

from __future__ import annotations

from typing import Any

import pytest

from patchbay_operator.inventorylabels import INVENTORY_LABELS_MANAGER
from patchbay_operator.kube import NODES_PATH, PROFILES_PATH, KubeError
from patchbay_operator.uninstall import AGENT_SELECTOR, Check, RefusedError, refusal

NS = "patchbay-system"
OPERATOR = "app.kubernetes.io/name=patchbay,app.kubernetes.io/component=operator"
PODS = f"/api/v1/namespaces/{NS}/pods"
DAEMONSETS = f"/apis/apps/v1/namespaces/{NS}/daemonsets"
SCALE = f"/apis/apps/v1/namespaces/{NS}/deployments/patchbay/scale"


class FakeAPI:
    """Profiles, pods by selector and agent DaemonSets; every call recorded. Pods of a selector
    disappear after ``linger`` LISTs once their owner stopped (the operator scaled to 0, the
    agent DaemonSets deleted), as a real termination takes a while."""

    def __init__(self, profiles: list[str] | None, daemonsets: list[str], linger: int = 2) -> None:
        self.profiles, self.daemonsets, self.linger = profiles, daemonsets, linger
        self.calls: list[tuple[str, str]] = []
        self.stopped: dict[str, int] = {}
        self.forbidden = 0

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        self.calls.append((method, path))
        query, ok = options.get("query"), options.get("ok", ())
        if path == PROFILES_PATH:
            if self.forbidden:
                self.forbidden -= 1
                raise KubeError(403, method, path, "forbidden")
            if self.profiles is None:
                assert 404 in ok
                return None
            return {"items": [{"metadata": {"name": n}} for n in self.profiles]}
        if path == SCALE:
            assert body == {"spec": {"replicas": 0}}
            self.stopped[OPERATOR] = self.linger
            return {}
        if path == PODS:
            selector = (query or {})["labelSelector"]
            left = self.stopped.get(selector)
            if left == 0:
                return {"items": []}
            if left is not None:
                self.stopped[selector] = left - 1
            return {"items": [{"metadata": {"name": f"pod-of-{selector}"}}]}
        if path == DAEMONSETS:
            assert query == {"labelSelector": AGENT_SELECTOR}
            return {"items": [{"metadata": {"name": n}} for n in self.daemonsets]}
        if method == "DELETE" and path.startswith(DAEMONSETS + "/"):
            assert self.stopped.get(OPERATOR) == 0, "an agent DaemonSet deleted while the operator runs"
            self.stopped[AGENT_SELECTOR] = self.linger
            return {}
        raise AssertionError(f"unexpected {method} {path}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def check(api: FakeAPI, timeout: float = 100.0) -> Check:
    clock = Clock()
    return Check(api.request, NS, timeout, clock=clock, sleep=clock.sleep)


def run(api: FakeAPI, allow: bool, timeout: float = 100.0) -> str:
    return check(api, timeout).run(allow=allow, deployment="patchbay", operator_selector=OPERATOR)


@pytest.mark.parametrize("profiles", [[], None], ids=["no profiles", "no CRD"])
def test_without_profiles_the_uninstall_goes_on_and_nothing_is_touched(profiles: list[str] | None) -> None:
    api = FakeAPI(profiles, [])
    assert run(api, allow=False) == ""
    assert run(api, allow=True) == ""
    assert {m for m, _ in api.calls} == {"GET"} and {p for _, p in api.calls} == {PROFILES_PATH, DAEMONSETS}


def test_without_profiles_and_without_the_stopping_role_no_daemonset_is_even_listed() -> None:
    """The chart's default: the hook's Role (list and delete DaemonSets) exists only with
    uninstall.allowWithProfiles, inventory.alwaysOn or inventory.nodeLabels (`--stops`). Seen on
    the demo: after `kubectl delete dpp --all`, every `helm uninstall` failed, the check's LIST of
    DaemonSets answered 403 (the unit tests' fake allowed what the chart did not)."""
    api = FakeAPI([], ["patchbay-node-agent"])
    line = check(api).run(allow=False, deployment="patchbay", operator_selector=OPERATOR, stops=False)
    assert line == ""
    assert api.calls == [("GET", PROFILES_PATH)]


@pytest.mark.parametrize("allow", [False, True])
def test_without_profiles_the_node_agent_kept_for_the_inventory_is_stopped(allow: bool) -> None:
    """inventory.alwaysOn: the shared node agent runs with no profile, so nothing owns it and the
    garbage collector would never take it: the operator is stopped, then it is deleted."""
    api = FakeAPI([], ["patchbay-node-agent"])
    line = run(api, allow=allow)
    assert "\n" not in line and "node agent kept for the inventory deleted (patchbay-node-agent)" in line
    assert [p for m, p in api.calls if m == "DELETE"] == [f"{DAEMONSETS}/patchbay-node-agent"]
    assert api.calls[-1] == ("GET", PODS) and api.stopped[AGENT_SELECTOR] == 0


def test_profiles_refuse_the_uninstall_in_one_line_naming_them_and_the_command() -> None:
    api = FakeAPI(["usb", "dongles"], ["patchbay-node-agent"])
    with pytest.raises(RefusedError) as e:
        run(api, allow=False)
    line = str(e.value)
    assert "\n" not in line and '"' not in line  # Helm 4's logger would escape a double quote
    assert "2 DevicePluginProfiles exist (dongles, usb)" in line
    assert "`kubectl delete dpp --all`" in line and "uninstall.allowWithProfiles=true" in line
    assert api.calls == [("GET", PROFILES_PATH)], "a refusal changes nothing"


def test_a_long_list_of_profiles_is_counted_not_spelt_out() -> None:
    line = refusal([f"p{i:02}" for i in range(25)])
    assert "25 DevicePluginProfiles exist (p00, p01," in line and "p09 and 15 more)" in line
    assert refusal(["one"]).count("1 DevicePluginProfile exist (one)") == 1


def test_a_forbidden_first_list_is_retried_while_rbac_catches_up() -> None:
    api = FakeAPI(["usb"], [])
    api.forbidden = 2
    with pytest.raises(RefusedError):
        run(api, allow=False)
    api.forbidden = 1000
    with pytest.raises(KubeError):
        run(api, allow=False, timeout=5)


def test_opting_in_stops_the_operator_before_deleting_the_agents_and_waits_for_both() -> None:
    api = FakeAPI(["usb"], ["patchbay-node-agent", "patchbay-usb"])
    line = run(api, allow=True)
    assert "\n" not in line
    assert "operator stopped, agent DaemonSets deleted (patchbay-node-agent, patchbay-usb)" in line
    assert "kept 1 DevicePluginProfile (usb)" in line
    deletes = [p for m, p in api.calls if m == "DELETE"]
    assert deletes == [f"{DAEMONSETS}/patchbay-node-agent", f"{DAEMONSETS}/patchbay-usb"]
    # The last call: the agent pods are gone.
    assert api.calls[-1] == ("GET", PODS) and api.stopped[AGENT_SELECTOR] == 0


def test_opting_in_ends_with_a_line_when_the_agents_do_not_stop_in_time() -> None:
    api = FakeAPI(["usb"], ["patchbay-node-agent"], linger=10_000)
    with pytest.raises(RefusedError, match="timed out waiting for the operator to stop"):
        run(api, allow=True, timeout=30)


class LabelledAPI(FakeAPI):
    """Nodes too, some carrying inventory labels the operator's field manager owns; an apply of
    none by that manager removes them (and must come after the operator stopped)."""

    def __init__(self, profiles: list[str] | None, daemonsets: list[str]) -> None:
        super().__init__(profiles, daemonsets)
        key = "inventory.patchbay.dev/usb-0403-6001"
        owned = {"f:metadata": {"f:labels": {f"f:{key}": {}}}}
        self.nodes = {
            f"n{i}": {
                "metadata": {
                    "name": f"n{i}",
                    "labels": {key: "present"},
                    "managedFields": [
                        {
                            "manager": INVENTORY_LABELS_MANAGER if i < 2 else "kubectl-label",
                            "operation": "Apply",
                        }
                        | {"fieldsV1": owned}
                    ],
                }
            }
            for i in range(3)
        }
        self.applied: list[str] = []

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        if path == NODES_PATH:
            self.calls.append((method, path))
            return {"metadata": {}, "items": list(self.nodes.values())}
        if method == "PATCH" and path.startswith(NODES_PATH + "/"):
            self.calls.append((method, path))
            assert self.stopped.get(OPERATOR) == 0, "labels removed while the operator runs"
            assert options["query"] == {"fieldManager": INVENTORY_LABELS_MANAGER, "force": "false"}
            assert "labels" not in body["metadata"]
            self.applied.append(body["metadata"]["name"])
            return {}
        return super().request(method, path, body, **options)


@pytest.mark.parametrize("daemonsets", [[], ["patchbay-node-agent"]], ids=["operator only", "with agent"])
def test_inventory_labels_are_removed_once_the_operator_stopped(daemonsets: list[str]) -> None:
    """inventory.nodeLabels: the operator stopped first (it would apply them again), then every
    node whose labels its field manager owns gets an apply of none; a node labelled by someone
    else is left alone."""
    api = LabelledAPI([], daemonsets)
    line = check(api).run(allow=False, deployment="patchbay", operator_selector=OPERATOR, labels=True)
    assert line.splitlines()[-1] == "patchbay: inventory labels removed from 2 nodes"
    assert api.applied == ["n0", "n1"] and ("PATCH", SCALE) in api.calls
    refused = LabelledAPI(["usb"], [])
    with pytest.raises(RefusedError):
        check(refused).run(allow=False, deployment="patchbay", operator_selector=OPERATOR, labels=True)
    assert refused.applied == []
