"""``kubectl patchbay diff -f FILE``: the API server's dry run of each profile in the file, then
per node what the change would do (views/plan.py), with what the node's NodeInventory says the new
discovery matches. Exit codes are kubectl diff's: 0 nothing lost, 1 something would be lost
(``Exit``), 2 an error (cli.py)."""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from urllib.parse import quote

import yaml

from patchbay_kubectl import agentpods, kube, output
from patchbay_kubectl.arguments import namespace_of
from patchbay_kubectl.kube import ConflictError, Kube, KubeError
from patchbay_kubectl.output import Exit
from patchbay_kubectl.views.inventory import inventory_index as discover_index
from patchbay_kubectl.views.objects import Obj, name_of
from patchbay_kubectl.views.objects import spec as spec_of
from patchbay_kubectl.views.plan import lowered_static_nodes, profile_plan, static_holders


def _documents(filename: str) -> list[Obj]:
    text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    docs: list[Obj] = []
    for doc in yaml.safe_load_all(text):
        if isinstance(doc, dict) and doc.get("kind") == "List":
            docs += [d for d in doc.get("items") or [] if isinstance(d, dict)]
        elif isinstance(doc, dict):
            docs.append(doc)
    profiles = [d for d in docs if d.get("kind") == "DevicePluginProfile"]
    for d in docs:
        if d.get("kind") != "DevicePluginProfile":
            note = f"{d.get('kind')} {name_of(d)}: not a DevicePluginProfile, not compared"
            print(f"note: {note}", file=sys.stderr)
    if not profiles:
        raise KubeError(f"no DevicePluginProfile in {filename}")
    return profiles


def diff_collection(doc: Obj) -> str:
    """Where a file's profile is read and dry-run: its own ``apiVersion`` when it is one of
    Patchbay's group, else the version the plugin reads."""
    api_version = str(doc.get("apiVersion") or "")
    if api_version.startswith(f"{kube.GROUP}/"):
        return f"/apis/{api_version}/devicepluginprofiles"
    return kube.PROFILES


def _dry_run(k: Kube, args: argparse.Namespace, doc: Obj, live: Obj | None) -> Obj:
    """The profile as the API server would store it. ``--server-side``: a dry-run server-side
    apply as ``--field-manager`` (fields other managers own stay, a conflict is the server's
    error unless ``--force-conflicts``), as ``kubectl apply --server-side`` and Flux apply;
    otherwise a dry-run create, or a replace of the live object by the file (fields the file
    leaves out are dropped, as the file's owner would see after a plain replace)."""
    collection = diff_collection(doc)
    path = f"{collection}/{quote(name_of(doc), safe='')}"
    if args.server_side:
        return k.apply(path, doc, args.field_manager, force=args.force_conflicts, dry_run=True)
    if live is None:
        return k.create(collection, doc, dry_run=True)
    wanted = copy.deepcopy(doc)
    wanted.setdefault("metadata", {})["resourceVersion"] = live["metadata"]["resourceVersion"]
    return k.replace(path, wanted, dry_run=True)


REREADS = 5
"""How often ``diff`` reads the live profile and dry-runs against it when the dry-run replace
meets a conflict (an object written in between)."""


def _live_and_after(k: Kube, args: argparse.Namespace, doc: Obj, path: str) -> tuple[Obj | None, Obj]:
    """The live profile and the dry run of the file against it. The dry-run replace is pinned to
    the live object's resourceVersion, and the operator writes the profile's status all the time
    (a status write moves the object's resourceVersion too), so a write between the two requests
    makes the server refuse the replace as a conflict: read the live object again and redo the
    dry run (bounded). A server-side apply's conflict is another manager's field: said as is."""
    for attempt in range(REREADS):
        live = k.get(path)
        try:
            return live, _dry_run(k, args, doc, live)
        except ConflictError:
            if args.server_side or live is None or attempt == REREADS - 1:
                raise
    raise AssertionError("unreachable")


INVENTORY_LIST_FROM = 50
"""``diff`` reads the NodeInventories of the nodes a change of discovery touches: a GET each, or
one LIST where the cluster has more nodes than this (at 5,000 nodes of about 1.4 kB each, one
7 MB answer instead of 5,000 requests)."""


class Inventories:
    """The NodeInventory of a node, asked at most once per node (``views.plan.InventoryOf``). Where
    they cannot be read (no RBAC to read them, the CRD not installed), none: said once on stderr."""

    def __init__(self, k: Kube, nodes: int) -> None:
        self._k, self._many = k, nodes > INVENTORY_LIST_FROM
        self._seen: dict[str, Obj | None] = {}
        self._listed = self._failed = False

    def __call__(self, node: str) -> Obj | None:
        if self._failed:
            return None
        try:
            if self._many and not self._listed:
                self._seen.update(discover_index(self._k.list(kube.INVENTORIES)))
                self._listed = True
            if node not in self._seen and not self._many:
                self._seen[node] = self._k.get(f"{kube.INVENTORIES}/{quote(node, safe='')}")
        except KubeError as e:
            note = f"cannot read NodeInventories, what the new discovery matches is not shown ({e})"
            print(f"note: {note}", file=sys.stderr)
            self._failed = True
            return None
        return self._seen.get(node)


def cmd_diff(k: Kube, args: argparse.Namespace) -> str:
    try:
        docs = _documents(args.filename)
    except (OSError, yaml.YAMLError) as e:
        raise KubeError(f"cannot read {args.filename}: {e}") from e
    nodes: list[Obj] | None = None
    inventories: Inventories | None = None
    plans = []
    for doc in docs:
        name = name_of(doc)
        if not name:
            raise KubeError(f"a DevicePluginProfile in {args.filename} has no metadata.name")
        # The file's own API version (v1alpha1 too): the server converts, both sides alike.
        collection = diff_collection(doc)
        path = f"{collection}/{quote(name, safe='')}"
        live, after = _live_and_after(k, args, doc, path)
        if live is None:
            action = "created"
        else:
            action = "configured" if spec_of(after) != spec_of(live) else "unchanged"
        if nodes is None:
            nodes = k.list("/api/v1/nodes")
        reports = k.list(
            kube.reports_path(namespace_of(args)), label_selector=f"{agentpods.LABEL_PROFILE}={name}"
        )
        if inventories is None:
            inventories = Inventories(k, len(nodes))
        plan = profile_plan(live, after, action, nodes, reports, inventory_of=inventories)
        resource = str(spec_of(after).get("resourceName") or "")
        by_node = {n.node: n for n in plan.nodes}
        for node_name in lowered_static_nodes(plan):
            pods = k.list("/api/v1/pods", field_selector=f"spec.nodeName={node_name}")
            static_holders(by_node[node_name], resource, pods)
        plans.append(plan)
    text = output.plan(plans, args.output)
    if any(p.loses for p in plans):
        raise Exit(text, 1)
    return text
