"""``kubectl patchbay``: the commands, kubectl's conventions, and the entry points.

kubectl runs ``kubectl-patchbay`` from PATH with the words after ``patchbay`` and passes none of
its own flags, so the plugin takes kubectl's: ``--kubeconfig``, ``--context``, ``-n``, ``-A``,
``-o wide|json|yaml``, ``--request-timeout``. Exit codes are kubectl's: 0 done, 1 an error from
the server or the kubeconfig (printed as ``error: ...`` or ``Error from server (...)``), 2 a
usage error. The commands and their flags are declared in arguments.py; shell completion, by
kubectl's plugin protocol, is completion.py (``complete_main``, the ``kubectl_complete-patchbay``
entry point, is exported here).

``cordon``, ``drain`` and ``uncordon`` take a DRA profile's devices out of service and back
through DeviceTaintRules (Kubernetes 1.37 on; maintenance.py). ``rollout status|history|pause|
resume|undo`` are kubectl's verbs for a profile's revisions (rollout.py): ``pause``, ``resume`` and
``undo`` write the profile's spec, as ``kubectl rollout`` writes a Deployment's. ``diff -f`` asks
the API server for a dry run and says what each node would lose (views/plan.py); its exit codes
are kubectl diff's: 0 nothing lost, 1 something would be lost, 2 an error.

Agent pods and DeviceReports live in the operator's namespace: ``-n`` names it (default
``$PATCHBAY_NAMESPACE``, else ``patchbay-system``, the chart's documented namespace); ``-A``
reads them in every namespace.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from urllib.parse import quote

from patchbay_api.revisions import spec_revision
from patchbay_kubectl import agentpods, kube, maintenance, output, rollout
from patchbay_kubectl.arguments import build_parser, namespace_of
from patchbay_kubectl.completion import complete_main
from patchbay_kubectl.diff import cmd_diff
from patchbay_kubectl.kube import Kube, KubeError, Target
from patchbay_kubectl.output import Exit
from patchbay_kubectl.views import diagnosis, discover
from patchbay_kubectl.views.devices import device_rows
from patchbay_kubectl.views.nodes import node_rows, profile_agents
from patchbay_kubectl.views.objects import (
    DRA,
    STATIC,
    Inputs,
    Obj,
    driver_of,
    mode_of,
    name_of,
    pod_ready,
    utcnow,
)
from patchbay_kubectl.views.objects import spec as spec_of

EVENT_NAMESPACE = "default"
"""Events about a cluster-scoped profile are in "default", where the operator posts them."""
DIFF_ERROR = 2
"""``diff``'s exit code for an error (kubectl diff's: above 1); 1 is "something would be lost"."""


def _profiles(k: Kube, name: str | None) -> list[Obj]:
    if name is None:
        return k.list(kube.PROFILES)
    obj = k.get(kube.profile_path(name))
    if obj is None:
        raise KubeError(f'Error from server (NotFound): devicepluginprofiles.patchbay.dev "{name}" not found')
    return [obj]


def _nodes(k: Kube, name: str | None) -> list[Obj]:
    if name is None:
        return k.list("/api/v1/nodes")
    obj = k.get(kube.node_path(name))
    if obj is None:
        raise KubeError(f'Error from server (NotFound): nodes "{name}" not found')
    return [obj]


def _reports(
    k: Kube, ns: str | None, profile: str | None, node: str | None = None, profiles: Sequence[Obj] = ()
) -> list[Obj]:
    """The DeviceReports to show. For one node in one namespace, a GET of each profile's report
    (named ``<profile>.<node>``) instead of a LIST of every node's: at 5,000 nodes that is the
    difference between one small answer per profile and the whole collection."""
    if node is not None and ns is not None:
        names = [name_of(p) for p in profiles if mode_of(p) != STATIC]
        found = (k.get(f"{kube.reports_path(ns)}/{quote(f'{n}.{node}', safe='')}") for n in names)
        return [r for r in found if r is not None]
    sel = f"{agentpods.LABEL_PROFILE}={profile}" if profile else ""
    return k.list(kube.reports_path(ns), label_selector=sel)


def gather_devices(k: Kube, args: argparse.Namespace) -> Inputs:
    profiles = _profiles(k, args.profile)
    modes = {mode_of(p) for p in profiles}
    data = Inputs(profiles=profiles)
    if modes - {STATIC}:
        data.reports = _reports(k, namespace_of(args), args.profile, args.node, profiles)
    if STATIC in modes:
        data.nodes = _nodes(k, args.node)
        # A Static resource's holders: the pods that ask for it (running or waiting on a node).
        fields = ["status.phase!=Succeeded", "status.phase!=Failed"]
        if args.node:
            fields.append(f"spec.nodeName={args.node}")
        data.pods = k.list("/api/v1/pods", field_selector=",".join(fields))
    if DRA in modes:
        fields = [f"spec.nodeName={args.node}"] if args.node else []
        dra = [p for p in profiles if mode_of(p) == DRA]
        if len(dra) == 1:
            fields.append(f"spec.driver={driver_of(dra[0])}")
        data.slices = k.list(f"{kube.RESOURCE_API}/resourceslices", field_selector=",".join(fields))
        data.claims = k.list(f"{kube.RESOURCE_API}/resourceclaims")
        try:
            data.rules = k.list(maintenance.RULES)  # [] where not served (before 1.37)
        except KubeError as e:
            print(f"note: cannot read DeviceTaintRules, maintenance not shown ({e})", file=sys.stderr)
    return data


def _node_config(k: Kube, ns: str | None) -> agentpods.NodeConfig | None:
    """The shared node agent's config (which profiles it serves on which nodes); None when there
    is none, or, with a note, when it cannot be read: each profile's own node selection then
    stands for it."""
    try:
        found = k.list(kube.configmaps_path(ns), label_selector=agentpods.SHARED_AGENT_SELECTOR)
    except KubeError as e:
        note = "cannot read the node agent's config, its profiles' selectors stand in"
        print(f"note: {note} ({e})", file=sys.stderr)
        return None
    return agentpods.node_config(found) if found else None


def _agent_pods(k: Kube, ns: str | None, profile: str | None, node: str | None) -> list[Obj]:
    """The agent pods of both shapes (on ``node``): for one profile, its own agent's and the
    shared node agent's (which may serve it, or still serve it while it moves to its own)."""
    fields = f"spec.nodeName={node}" if node else ""
    if profile is None:
        return k.list(kube.pods_path(ns), label_selector=agentpods.AGENT_SELECTOR, field_selector=fields)
    own = f"{agentpods.AGENT_SELECTOR},{agentpods.LABEL_PROFILE}={profile}"
    pods = k.list(kube.pods_path(ns), label_selector=own, field_selector=fields)
    shared = agentpods.SHARED_AGENT_SELECTOR
    return pods + k.list(kube.pods_path(ns), label_selector=shared, field_selector=fields)


def gather_nodes(k: Kube, args: argparse.Namespace) -> Inputs:
    profiles = _profiles(k, args.profile)
    ns = namespace_of(args)
    data = Inputs(profiles=profiles, nodes=_nodes(k, args.node))
    served = [p for p in profiles if mode_of(p) != STATIC]
    if served:
        data.pods = _agent_pods(k, ns, args.profile, args.node)
        data.reports = _reports(k, ns, args.profile, args.node, profiles)
        if any(agentpods.uses_shared_agent(p) for p in served):
            data.node_config = _node_config(k, ns)
    return data


def cmd_devices(k: Kube, args: argparse.Namespace) -> str:
    rows = device_rows(
        gather_devices(k, args), node=args.node, profile=args.profile, unhealthy=args.unhealthy
    )
    if not rows and args.output not in ("json", "yaml"):
        print("No devices found.", file=sys.stderr)
    return output.devices(rows, args.output, utcnow())


def cmd_discover(k: Kube, args: argparse.Namespace) -> str:
    """The NodeInventories (one GET with --node), grouped by kind; --propose reads the Nodes too."""
    if args.node is not None:
        inventories = [i for i in [k.get(f"{kube.INVENTORIES}/{quote(args.node, safe='')}")] if i is not None]
    else:
        inventories = k.list(kube.INVENTORIES)
    kinds = discover.select(discover.kinds_of(inventories), unserved=args.unserved, kind=args.kind)
    if args.propose is not None:
        if len(kinds) != 1:
            raise KubeError(
                f"--propose needs one KIND of: {', '.join(x.key for x in kinds) or '(none found)'}"
            )
        return discover.propose(kinds[0], args.propose, args.mode, _nodes(k, None))
    if not kinds and args.output not in ("json", "yaml"):
        print(
            "No devices found (is the shared node agent running? kubectl get nodeinventories).",
            file=sys.stderr,
        )
    return discover.render(kinds, discover.omitted_count(inventories), args.output)


def cmd_nodes(k: Kube, args: argparse.Namespace) -> str:
    rows = node_rows(gather_nodes(k, args), node=args.node, profile=args.profile)
    if not rows and args.output not in ("json", "yaml"):
        print("No nodes found.", file=sys.stderr)
    return output.nodes(rows, args.output)


def _shared_agents(k: Kube, ns: str | None, profile: Obj) -> list[Obj]:
    """The shared node agent's pods that serve ``profile``. Where every one of them is on a node
    the profile has a report from (a healthy cluster), those nodes are all it takes; otherwise
    (a pod not scheduled, or on a node without the profile's report: the profile is not served
    there, or its agent never got that far) the nodes' labels and the node agent's config
    decide, at the cost of a LIST of the nodes."""
    name = name_of(profile)
    shared = k.list(kube.pods_path(ns), label_selector=agentpods.SHARED_AGENT_SELECTOR)
    if not shared:
        return []
    reports = k.list(kube.reports_path(ns), label_selector=f"{agentpods.LABEL_PROFILE}={name}")
    reported = {str(r.get("nodeName", "")) for r in reports}
    data = Inputs(profiles=[profile], pods=shared, reports=reports)
    if all(str((p.get("spec") or {}).get("nodeName") or "") in reported for p in shared):
        data.nodes = [{"metadata": {"name": n}} for n in sorted(reported)]
    else:
        data.nodes, data.node_config = k.list("/api/v1/nodes"), _node_config(k, ns)
    return profile_agents(profile, data)


def cmd_why(k: Kube, args: argparse.Namespace) -> str:
    (profile,) = _profiles(k, args.profile)
    ns = namespace_of(args)
    pods: list[Obj] = []
    if mode_of(profile) != STATIC:
        sel = f"{agentpods.AGENT_SELECTOR},{agentpods.LABEL_PROFILE}={args.profile}"
        pods = k.list(kube.pods_path(ns), label_selector=sel)
        if agentpods.uses_shared_agent(profile):
            pods += _shared_agents(k, ns, profile)
    events = k.list(
        kube.events_path(EVENT_NAMESPACE),
        field_selector=f"involvedObject.kind=DevicePluginProfile,involvedObject.name={args.profile}",
    )
    if any(not pod_ready(p) for p in pods):
        # The kubelet's and scheduler's words about the agent pods (only when one is in trouble).
        events += k.list(kube.events_path(ns), field_selector="involvedObject.kind=Pod,type=Warning")
    doc = diagnosis.why(profile, pods, events, utcnow())
    if mode_of(profile) != STATIC:
        doc["nodeInventories"] = _why_nodes(k, profile, ns, getattr(args, "node", None))
    return output.why(doc, args.output)


def _why_nodes(k: Kube, profile: Obj, ns: str | None, node: str | None) -> list[Obj]:
    """``why PROFILE NODE``, or the first nodes that report no devices: what each serves and,
    from its NodeInventory, what the discovery matches there (views/diagnosis.py)."""
    out = []
    for name in [node] if node else diagnosis.empty_nodes(profile):
        obj = k.get(kube.node_path(name))
        if obj is None and node:
            raise KubeError(f'Error from server (NotFound): nodes "{name}" not found')
        if obj is None:
            continue  # gone since the status named it
        report = None
        if ns is not None:
            report = k.get(f"{kube.reports_path(ns)}/{quote(f'{name_of(profile)}.{name}', safe='')}")
        try:
            inventory = k.get(f"{kube.INVENTORIES}/{quote(name, safe='')}")
        except KubeError as e:
            print(f"note: cannot read the NodeInventory of {name} ({e})", file=sys.stderr)
            inventory = None
        out.append(diagnosis.node_inventory(profile, obj, report, inventory))
    return out


def _maintenance_target(k: Kube, args: argparse.Namespace) -> tuple[str, str]:
    """Check the input against the cluster; (the driver, the rule's name)."""
    if not maintenance.served(k.get(maintenance.RULES_API)):
        raise KubeError(
            "this cluster serves no DeviceTaintRules (resource.k8s.io/v1, Kubernetes 1.37 on): "
            "device maintenance needs them"
        )
    (profile,) = _profiles(k, args.profile)
    if mode_of(profile) != DRA:
        raise maintenance.InputError(
            f"DevicePluginProfile {args.profile} is in mode {mode_of(profile)}: device maintenance "
            "works on DRA profiles (their devices are in ResourceSlices); for a node's whole resource "
            f"use `kubectl cordon {args.node}` / `kubectl drain {args.node}`"
        )
    driver = driver_of(profile)
    slices = k.list(
        f"{kube.RESOURCE_API}/resourceslices",
        field_selector=f"spec.driver={driver},spec.nodeName={args.node}",
    )
    known = maintenance.slice_devices(slices)
    if args.command == "uncordon":
        # The device may have gone from the slice since: its name as given, or its ID's name.
        if args.device not in known:
            args.device = {i: n for n, i in known.items()}.get(args.device, args.device)
    else:
        if not slices:
            raise maintenance.InputError(
                f"--node {args.node}: no ResourceSlice of {driver} on that node (does the profile "
                f"select it, and is its agent running there? `kubectl patchbay why {args.profile}`)"
            )
        args.device = maintenance.resolve_device(args.device, known, args.profile, args.node)
        maintenance.check_reason(args.reason)
    return driver, maintenance.rule_name(args.profile, args.node, args.device)


def cmd_maintenance(k: Kube, args: argparse.Namespace) -> str:
    """cordon, drain [--preview], uncordon."""
    driver, name = _maintenance_target(k, args)
    path = f"{maintenance.RULES}/{quote(name, safe='')}"
    existing = k.get(path)
    preview = bool(getattr(args, "preview", False))
    effect = maintenance.PREVIEW if preview else maintenance.EFFECTS.get(args.command, "")
    wanted = maintenance.rule(
        name, driver, args.node, args.device, effect=effect, reason=getattr(args, "reason", "")
    )
    if existing is not None and not maintenance.same_target(existing, wanted):
        raise maintenance.InputError(
            f"DeviceTaintRule {name} exists and selects other devices "
            f"({existing['spec'].get('deviceSelector')}): not touching it"
        )
    if args.command == "uncordon":
        if existing is None or not k.delete(path):
            print(f"devicetaintrule/{name} not found: nothing to return", file=sys.stderr)
            return ""
        what = f"device {args.device}" if args.device else "every device"
        return (
            f"devicetaintrule/{name} deleted: {what} of {args.profile} on node {args.node} in service again\n"
        )
    if preview and existing is not None:
        # The controller writes a preview once per spec: a new rule asks for a fresh one.
        k.delete(path)
    stored = k.apply(path, wanted, maintenance.FIELD_MANAGER)
    deadline = time.monotonic() + max(0.0, args.wait)
    answer = maintenance.eviction(stored)
    while answer is None and time.monotonic() < deadline:
        time.sleep(0.5)
        stored = k.get(path) or stored
        answer = maintenance.eviction(stored)
    if args.output in ("json", "yaml"):
        return output.dump(stored, args.output)
    lines = [maintenance.summary(stored, args.profile, args.node, args.device)]
    if answer is not None:
        lines.append(
            f"{'preview' if preview else 'eviction'}: {answer.get('message') or answer.get('reason')}"
        )
    elif args.wait > 0:
        lines.append(
            f"no answer about the pods within {args.wait:g}s (the device-taint-eviction controller of "
            "kube-controller-manager writes it into the rule's status)"
        )
    return "\n".join(lines) + "\n"


def _profile(k: Kube, name: str) -> Obj:
    (profile,) = _profiles(k, name)
    return profile


def _revisions(k: Kube, args: argparse.Namespace, profile: Obj) -> list[rollout.Revision]:
    found = k.list(
        kube.revisions_path(namespace_of(args)), label_selector=f"{agentpods.LABEL_PROFILE}={args.profile}"
    )
    return rollout.revisions(found, profile)


def cmd_rollout_status(k: Kube, args: argparse.Namespace) -> str:
    """Print the status as it changes (only when the line changes, as kubectl does) until done,
    halted or --timeout."""
    if not args.watch:
        st = rollout.rollout_status(_profile(k, args.profile))
        if st.failed:
            raise Exit(st.text + "\n", 1)
        return st.text + "\n"
    _profile(k, args.profile)  # NotFound in kubectl's words before any waiting
    forever = args.timeout <= 0
    seconds = 365 * 86400.0 if forever else args.timeout
    last = ""
    for obj in k.watch(kube.PROFILES, args.profile, seconds):
        st = rollout.rollout_status(obj)
        if st.text != last:
            sys.stdout.write(st.text + "\n")
            sys.stdout.flush()
            last = st.text
        if st.failed:
            raise Exit("", 1)
        if st.done:
            return ""
    if k.get(kube.profile_path(args.profile)) is None:
        raise KubeError(f'devicepluginprofiles.patchbay.dev "{args.profile}" was deleted')
    raise KubeError("timed out waiting for the condition")


def cmd_rollout_history(k: Kube, args: argparse.Namespace) -> str:
    profile = _profile(k, args.profile)
    revs = _revisions(k, args, profile)
    title = f"{rollout.KIND}/{args.profile}"
    if args.revision:
        rev = rollout.find(revs, args.revision)
        if args.output in ("json", "yaml"):
            return output.dump({"revision": rev.number, "name": rev.name, "data": rev.data}, args.output)
        return f"{title} with revision #{rev.number} ({rev.name})\n" + output.dump(rev.data, "yaml")
    if not revs:
        print(f"No rollout history found in {title}.", file=sys.stderr)
        return ""
    return output.history(title, rollout.history_rows(revs, profile), args.output)


def cmd_rollout_pause(k: Kube, args: argparse.Namespace) -> str:
    pause = args.verb == "pause"
    patch = rollout.pause_patch(_profile(k, args.profile), pause)
    k.patch(kube.profile_path(args.profile), patch, "application/merge-patch+json")
    return f"{rollout.KIND}/{args.profile} {'paused' if pause else 'resumed'}\n"


UNDO_TRIES = 5
"""Reads and patches an undo tries while the spec keeps changing under it."""
FAILED_TEST = "the server rejected our request due to an error in our request"
"""What the API server answers (422 Invalid) when a JSON patch's ``test`` op fails."""


def cmd_rollout_undo(k: Kube, args: argparse.Namespace) -> str:
    """The spec back to a revision's settings, in one JSON patch made against the spec read: its
    first op tests ``metadata.generation``, which only a change of the spec moves (the status
    subresource's writes, which the operator makes all through a rollout, move the
    resourceVersion but not the generation). A spec changed in between: read again and tried
    again, up to `UNDO_TRIES` times."""
    title = f"{rollout.KIND}/{args.profile}"
    changed: KubeError | None = None
    for _ in range(UNDO_TRIES):
        profile = _profile(k, args.profile)
        target = rollout.undo_target(_revisions(k, args, profile), profile, args.to_revision)
        if target.digest == spec_revision(spec_of(profile)):
            return f"{title} skipped rollback (current settings already match revision {target.number})\n"
        if args.dry_run == "client":
            return f"{title} rolled back to revision {target.number} (dry run)\n"
        generation = (profile.get("metadata") or {}).get("generation")
        ops = [{"op": "test", "path": "/metadata/generation", "value": generation}]
        ops += rollout.undo_patch(profile, target.data)
        path, dry_run = kube.profile_path(args.profile), args.dry_run == "server"
        try:
            k.patch(path, ops, "application/json-patch+json", dry_run=dry_run)
        except KubeError as e:
            if FAILED_TEST not in str(e):
                raise
            changed = e
            continue
        return f"{title} rolled back to revision {target.number}{' (server dry run)' if dry_run else ''}\n"
    raise KubeError(
        f"error: {title}'s spec changed while it was being rolled back, {UNDO_TRIES} times in a row; "
        "nothing was written: try again"
    ) from changed


ROLLOUT_HANDLERS: dict[str, Callable[[Kube, argparse.Namespace], str]] = {
    "status": cmd_rollout_status,
    "history": cmd_rollout_history,
    "pause": cmd_rollout_pause,
    "resume": cmd_rollout_pause,
    "undo": cmd_rollout_undo,
}


def cmd_rollout(k: Kube, args: argparse.Namespace) -> str:
    return ROLLOUT_HANDLERS[args.verb](k, args)


HANDLERS: dict[str, Callable[[Kube, argparse.Namespace], str]] = {
    "devices": cmd_devices,
    "nodes": cmd_nodes,
    "why": cmd_why,
    "discover": cmd_discover,
    "cordon": cmd_maintenance,
    "drain": cmd_maintenance,
    "uncordon": cmd_maintenance,
    "rollout": cmd_rollout,
    "diff": cmd_diff,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        k = Kube(Target(args.kubeconfig, args.context, args.request_timeout))
        try:
            text = HANDLERS[args.command](k, args)
        finally:
            k.close()
    except Exit as e:
        sys.stdout.write(e.text)
        return e.code
    except (KubeError, maintenance.InputError, rollout.RolloutError) as e:
        msg = str(e)
        print(msg if msg.startswith("Error from server") else f"error: {msg}", file=sys.stderr)
        return DIFF_ERROR if args.command == "diff" else 1
    sys.stdout.write(text)
    return 0


__all__ = ["complete_main", "main"]

if __name__ == "__main__":
    sys.exit(main())
