"""``patchbay-uninstall-check``: the chart's pre-delete hook (templates/uninstall-hook.yaml).

``helm uninstall`` deletes the agents' ServiceAccounts, RBAC and admission policies, but not the
agent DaemonSets: their profiles own them, and the CRD and its profiles outlive the release
(``crds.keep``). Uninstalling while profiles exist would leave privileged agents on every node
with no identity (a DRA agent then fails every claim it is asked to prepare with a 401) and no
admission rules around what they write (docs/operations.md#uninstall). So before Helm deletes
anything, this command decides:

- no profile exists: nothing to do; exit 0 and say nothing; except that the shared node agent
  kept for the nodes' inventories (``inventory.alwaysOn``) has no profile to own it, so it is
  stopped as below (the operator first) and said in one line;
- profiles exist: print ONE line naming them and the command that deletes them, and exit 1: the
  hook fails and Helm deletes nothing of the release;
- profiles exist and the chart's ``uninstall.allowWithProfiles`` is true (``--allow-with-profiles``):
  stop the operator (its Deployment scaled to 0, its pods gone: a running operator would put the
  agents straight back), delete every agent DaemonSet of the namespace and wait until their pods
  are gone, say so in one line, exit 0. Nothing then runs that needs what Helm deletes next;
  the profiles, their DeviceClasses and the static capacity they set stay, for a reinstall.

With the chart's ``inventory.nodeLabels`` (``--inventory-labels``), once the uninstall goes on,
the operator is stopped (as above) and the inventory labels it kept are removed from every node
(a server-side apply of no label by their field manager: labels of other owners stay), said in
one line.

Everything it does is bounded by ``--timeout`` (below the Job's activeDeadlineSeconds), so a
stuck wait ends with a line saying what it waited for rather than a bare DeadlineExceeded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from patchbay_operator.constants import LABEL_NAME
from patchbay_operator.inventorylabels import INVENTORY_LABELS_MANAGER, apply_body, owned_labels
from patchbay_operator.kube import (
    APPLY_PATCH,
    MERGE_PATCH,
    NODES_PATH,
    PROFILES_PATH,
    Kube,
    KubeError,
    load_configuration,
)
from patchbay_operator.render import AGENT_NAME

AGENT_SELECTOR = f"{LABEL_NAME}={AGENT_NAME}"
NAMES_SHOWN = 10
"""Profiles named in the line; the rest are counted (the line stays one line)."""


class RefusedError(Exception):
    """The uninstall must not go on; the message is the one line the hook prints."""


def named(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def counted(profiles: Sequence[str]) -> str:
    return f"{len(profiles)} DevicePluginProfile{'s' if len(profiles) != 1 else ''}"


def refusal(profiles: Sequence[str]) -> str:
    """The line a refused uninstall prints. Helm 4 shows the hook's log through its logger
    (``level=INFO msg="..."``, which escapes double quotes): no double quote in it."""
    return (
        f"patchbay: not uninstalling: {counted(profiles)} exist ({named(profiles)}); delete them first "
        "with `kubectl delete dpp --all` (it returns once the operator has removed what they set), "
        "or set uninstall.allowWithProfiles=true to uninstall anyway (docs/operations.md#uninstall)"
    )


class Check:
    """One run of the hook in the release's namespace; ``request`` is ``Kube.request`` (a fake in
    the unit tests)."""

    def __init__(
        self,
        request: Callable[..., Any],
        namespace: str,
        deadline: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.request, self.ns, self.deadline = request, quote(namespace, safe=""), deadline
        self.clock, self.sleep = clock, sleep

    def profiles(self) -> list[str]:
        """Every profile's name, sorted; none when the CRD itself is gone (404).

        The hook's RoleBinding was created a moment before its pod: a 403 is retried until the
        deadline, since the API server's RBAC cache may not have it yet."""
        while True:
            try:
                got = self.request("GET", PROFILES_PATH, ok=(404,))
            except KubeError as e:
                if e.status != 403 or self.clock() >= self.deadline:
                    raise
                self.sleep(1.0)
                continue
            return sorted(p["metadata"]["name"] for p in (got or {}).get("items", []))

    def pods(self, selector: str) -> list[str]:
        got = self.request("GET", f"/api/v1/namespaces/{self.ns}/pods", query={"labelSelector": selector})
        return [p["metadata"]["name"] for p in got.get("items", [])]

    def wait_gone(self, what: str, selector: str) -> None:
        """Until no pod matches ``selector``; ``RefusedError`` naming ``what`` past the deadline."""
        while left := self.pods(selector):
            if self.clock() >= self.deadline:
                waited = f"timed out waiting for {what} to stop: {named(left)}"
                raise RefusedError(f"patchbay: uninstall.allowWithProfiles: {waited}")
            self.sleep(1.0)

    def agent_daemonsets(self) -> list[str]:
        """The agent DaemonSets of the namespace, by name."""
        daemonsets = f"/apis/apps/v1/namespaces/{self.ns}/daemonsets"
        got = self.request("GET", daemonsets, query={"labelSelector": AGENT_SELECTOR})
        return sorted(d["metadata"]["name"] for d in got.get("items", []))

    def stop_operator(self, deployment: str, operator_selector: str) -> None:
        """Scale the operator to 0 and wait until its pods are gone."""
        scale = f"/apis/apps/v1/namespaces/{self.ns}/deployments/{quote(deployment, safe='')}/scale"
        self.request("PATCH", scale, {"spec": {"replicas": 0}}, content_type=MERGE_PATCH, ok=(404,))
        self.wait_gone("the operator", operator_selector)

    def remove_inventory_labels(self) -> int:
        """Remove the inventory labels from every node that carries some the operator set (its
        field manager owns them): how many nodes. A page of nodes at a time."""
        removed, cont = 0, ""
        while True:
            query = {"limit": "500", **({"continue": cont} if cont else {})}
            got = self.request("GET", NODES_PATH, query=query)
            for node in got.get("items", []):
                if owned_labels(node):
                    name = node["metadata"]["name"]
                    path = f"{NODES_PATH}/{quote(name, safe='')}"
                    manager = {"fieldManager": INVENTORY_LABELS_MANAGER, "force": "false"}
                    body = apply_body(name, {})
                    self.request("PATCH", path, body, content_type=APPLY_PATCH, query=manager, ok=(404,))
                    removed += 1
            cont = (got.get("metadata") or {}).get("continue") or ""
            if not cont:
                return removed

    def stop_agents(self, deployment: str, operator_selector: str) -> list[str]:
        """Scale the operator to 0 and wait for its pods, then delete the agent DaemonSets and wait
        for theirs; returns the DaemonSets' names. The operator goes first: it watches its
        DaemonSets and would apply a deleted one again at once."""
        self.stop_operator(deployment, operator_selector)
        daemonsets = f"/apis/apps/v1/namespaces/{self.ns}/daemonsets"
        names = self.agent_daemonsets()
        for name in names:
            body = {"propagationPolicy": "Background"}
            self.request("DELETE", f"{daemonsets}/{quote(name, safe='')}", body, ok=(404,))
        self.wait_gone("the agents", AGENT_SELECTOR)
        return names

    def run(
        self,
        *,
        allow: bool,
        deployment: str,
        operator_selector: str,
        labels: bool = False,
        stops: bool = True,
    ) -> str:
        """The lines to print ('' for none); ``RefusedError`` when the uninstall must stop.
        With ``labels`` (inventory.nodeLabels), once it goes on: the operator stopped, the
        inventory labels removed."""
        line = self._agents(
            allow=allow, deployment=deployment, operator_selector=operator_selector, stops=stops
        )
        if not labels:
            return line
        if not line:  # the operator still runs (no agent to stop): it would put them back
            self.stop_operator(deployment, operator_selector)
        removed = self.remove_inventory_labels()
        said = f"patchbay: inventory labels removed from {removed} node{'s' if removed != 1 else ''}"
        return f"{line}\n{said}" if line else said

    def _agents(self, *, allow: bool, deployment: str, operator_selector: str, stops: bool) -> str:
        """`stops`: the chart gave the check its Role to stop the operator and the agents
        (uninstall.allowWithProfiles, inventory.alwaysOn or inventory.nodeLabels). Without it no
        node agent outlives the last profile (the operator deletes it), and the check may not
        even list DaemonSets: with no profile it has nothing to do."""
        profiles = self.profiles()
        if not profiles:
            if not stops or not self.agent_daemonsets():
                return ""
            stopped = self.stop_agents(deployment, operator_selector)
            return (
                f"patchbay: no profile; operator stopped, the node agent kept for the inventory "
                f"deleted ({named(stopped) or 'none'})"
            )
        if not allow:
            raise RefusedError(refusal(profiles))
        stopped = self.stop_agents(deployment, operator_selector)
        return (
            f"patchbay: uninstall.allowWithProfiles: operator stopped, agent DaemonSets deleted "
            f"({named(stopped) or 'none'}); kept {counted(profiles)} "
            f"({named(profiles)}) and the static capacity they set, served again once the chart "
            "is installed again"
        )


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="patchbay-uninstall-check", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--namespace", default=os.environ.get("PATCHBAY_NAMESPACE", ""), help="the release's namespace"
    )
    p.add_argument("--operator-deployment", required=True, help="the operator's Deployment")
    p.add_argument("--operator-selector", required=True, help="the operator pods' label selector")
    p.add_argument("--allow-with-profiles", action="store_true", help="uninstall.allowWithProfiles")
    p.add_argument("--inventory-labels", action="store_true", help="inventory.nodeLabels: remove them")
    p.add_argument(
        "--stops",
        action="store_true",
        help="the chart's Role lets the check stop the operator and delete the agent DaemonSets "
        "(uninstall.allowWithProfiles, inventory.alwaysOn or inventory.nodeLabels)",
    )
    p.add_argument("--timeout", type=float, default=150.0, help="seconds for the whole check")
    args = p.parse_args(argv)
    if not args.namespace:
        p.error("--namespace (or PATCHBAY_NAMESPACE) is required")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    kube = Kube(load_configuration(None, 1))
    check = Check(kube.request, args.namespace, time.monotonic() + args.timeout)
    try:
        line = check.run(
            allow=args.allow_with_profiles,
            deployment=args.operator_deployment,
            operator_selector=args.operator_selector,
            labels=args.inventory_labels,
            stops=args.stops,
        )
    except RefusedError as e:
        print(e, flush=True)
        return 1
    except KubeError as e:
        # One line, whatever the API server's body held.
        print("patchbay: uninstall check failed: " + " ".join(str(e).split()), flush=True)
        return 1
    finally:
        kube.close()
    if line:
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
