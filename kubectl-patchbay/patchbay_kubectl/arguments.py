"""``kubectl patchbay``'s command line: its commands, kubectl's flags, and how they parse
(``build_parser``); the commands themselves are in cli.py, completion in completion.py."""

from __future__ import annotations

import argparse
import os
import re

from patchbay_kubectl import output
from patchbay_kubectl.views import discover

DEFAULT_NAMESPACE = "patchbay-system"
"""The operator's namespace when neither -n nor $PATCHBAY_NAMESPACE names one (the chart's)."""
COMMANDS = ("devices", "nodes", "why", "discover", "cordon", "drain", "uncordon", "rollout", "diff")
MAINTENANCE = ("cordon", "drain", "uncordon")
ROLLOUT = ("status", "history", "pause", "resume", "undo")


def duration(text: str) -> float:
    """A kubectl duration (``30s``, ``5m``, ``1h30m``; a bare number is seconds) in seconds."""
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return float(text)
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 30s, 5m, 1h30m)")
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * unit[u] for n, u in parts)


def boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (true or false)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    common.add_argument("--context", help="the kubeconfig context to use")
    common.add_argument(
        "-n",
        "--namespace",
        help=f"the operator's namespace, where agent pods, DeviceReports and revisions are "
        f"(default: $PATCHBAY_NAMESPACE or {DEFAULT_NAMESPACE})",
    )
    common.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="read agent pods and DeviceReports in every namespace",
    )
    common.add_argument("-o", "--output", choices=output.FORMATS, help="output format: wide, json or yaml")
    common.add_argument(
        "--request-timeout", type=float, default=30.0, metavar="SECONDS", help="per request (default 30)"
    )
    parser = argparse.ArgumentParser(
        prog="kubectl patchbay",
        description="Patchbay at a glance: devices, nodes, and why a DevicePluginProfile is not Ready; "
        "a profile's rollout (kubectl rollout's verbs) and what a change would take (diff).",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    dev = sub.add_parser(
        "devices",
        parents=[common],
        help="every device of every profile: health, reason, since, holder pod",
        description="One row per device across every profile and mode (DRA: from the ResourceSlices "
        "and ResourceClaims; Static: one row per node).",
    )
    dev.add_argument("--node", help="only this node")
    dev.add_argument("--profile", help="only this DevicePluginProfile")
    dev.add_argument("--unhealthy", action="store_true", help="only devices that are not Healthy")
    nodes = sub.add_parser(
        "nodes",
        parents=[common],
        help="per node: the profiles serving it, agent pod, registered, devices healthy/total",
    )
    nodes.add_argument("--node", help="only this node")
    nodes.add_argument("--profile", help="only the nodes this DevicePluginProfile selects")
    why = sub.add_parser(
        "why",
        parents=[common],
        help="why a profile is not Ready, in one screen",
        description="Conditions, problems, the agent pods' trouble in the kubelet's words, the last "
        "Events, what a node that serves none of the devices has (from its NodeInventory: what the "
        "discovery matches there, what comes closest), and what to do next.",
    )
    why.add_argument("profile", help="the DevicePluginProfile")
    why.add_argument(
        "node",
        nargs="?",
        help="a node that serves none of its devices: what its NodeInventory has that comes closest "
        "(without it: the first nodes that report none)",
    )
    discover.add_arguments(
        sub.add_parser(
            "discover",
            parents=[common],
            help="what hardware the nodes have, by kind, and what serves it; --propose a profile",
            description="From the NodeInventories the shared node agents keep (views/discover.py).",
        )
    )
    helps = {
        "cordon": (
            "keep new claims off a DRA profile's devices on a node (DeviceTaintRule, NoSchedule)",
            "Taints the devices (all of the node's, or --device) with patchbay.dev/maintenance, effect "
            "NoSchedule: the scheduler allocates them to no new claim; pods using them keep running.",
        ),
        "drain": (
            "evict the pods using a DRA profile's devices on a node (DeviceTaintRule, NoExecute)",
            "Taints the devices with patchbay.dev/maintenance, effect NoExecute: no new claims, and the "
            "pods using them are evicted (a pod that tolerates the taint for N seconds stays that long). "
            "--preview first: effect None, and the cluster says how many pods WOULD be evicted.",
        ),
        "uncordon": (
            "return a DRA profile's devices on a node to service (deletes the DeviceTaintRule)",
            "Deletes the DeviceTaintRule that cordon or drain wrote for the same devices.",
        ),
    }
    for command, (short, long) in helps.items():
        cmd = sub.add_parser(
            command,
            parents=[common],
            help=short,
            description=long + " Needs Kubernetes 1.37 (DeviceTaintRules) and a DRA profile.",
        )
        cmd.add_argument("profile", help="the DevicePluginProfile (mode DRA)")
        cmd.add_argument("--node", required=True, help="the node whose devices (its agent's pool)")
        cmd.add_argument(
            "--device",
            help="one device: its ID as `kubectl patchbay devices` shows it, or its ResourceSlice name "
            "(default: every device)",
        )
        if command != "uncordon":
            cmd.add_argument(
                "--reason", default="", help="the taint's value: why (a label value, <= 63 chars)"
            )
            cmd.add_argument(
                "--wait",
                type=float,
                default=30.0,
                metavar="SECONDS",
                help="how long to wait for the cluster's answer about the pods (default 30; 0: do not wait)",
            )
        if command == "drain":
            cmd.add_argument(
                "--preview",
                action="store_true",
                help="effect None: change nothing, print how many pods a drain would evict",
            )
    _rollout_parsers(sub, common)
    diff = sub.add_parser(
        "diff",
        parents=[common],
        help="what applying a profile would take from each node, before it is applied",
        description="The API server's dry run of the file (admission errors as it says them), then "
        "per node: selected before/after, node group before/after, the devices it serves now that "
        "the new settings would no longer serve (from its DeviceReport) and the pods holding them, "
        "a Static profile's capacity before/after. What only the node can know (files a new glob "
        "may match beyond its report, what a PCI/USB filter finds) is said as such. Exit codes, as "
        "kubectl diff's: 0 nothing would be lost, 1 something would be lost, 2 an error (a usage "
        "error, a refused dry run, an unreachable server).",
    )
    diff.add_argument(
        "-f",
        "--filename",
        required=True,
        help="the profile's YAML or JSON (several documents, or - for stdin)",
    )
    diff.add_argument(
        "--server-side",
        action="store_true",
        help="dry-run a server-side apply (as kubectl apply --server-side and Flux apply) instead of "
        "a replace: fields another field manager owns stay as they are",
    )
    diff.add_argument(
        "--field-manager",
        default="kubectl",
        help="with --server-side: the manager the apply is made as; use the one your pipeline applies "
        "with (kubectl: kubectl, Flux: kustomize-controller, Argo CD: argocd-controller) (default: kubectl)",
    )
    diff.add_argument(
        "--force-conflicts",
        action="store_true",
        help="with --server-side: take fields another manager owns, as kubectl apply --force-conflicts "
        "(without it a conflict is the server's error, exit 2)",
    )
    return parser


def _rollout_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    ro = sub.add_parser(
        "rollout",
        parents=[common],
        help="a profile's rollout: status, history, pause, resume, undo",
        description="kubectl rollout for a DevicePluginProfile: its revisions are ControllerRevisions "
        "<profile>-<hash> in the operator's namespace (-n).",
    )
    verbs = ro.add_subparsers(dest="verb", required=True, metavar="VERB")
    helps = {
        "status": (
            "wait for the rollout to finish",
            "Watch the profile until every node it selects serves the update revision and is ready "
            "(exit 0), the rollout halts (exit 1, the Stalled message), or --timeout passes (exit 1). "
            "A paused rollout is waited for, as kubectl waits for a paused Deployment.",
        ),
        "history": (
            "the profile's revisions and what each changed",
            "REVISION and CHANGE-CAUSE: the revision's kubernetes.io/change-cause annotation, else "
            "what it changed against the revision before. -o wide adds the ControllerRevision and "
            "whether the status serves it (current, update).",
        ),
        "pause": (
            "hold the rollout: no further node gets the update revision",
            "Sets spec.rollout.paused (a write of the profile's spec: under GitOps, commit it instead, "
            "or the next sync takes it back). Nodes keep the revision they serve.",
        ),
        "resume": (
            "let a paused rollout go on",
            "Removes spec.rollout.paused (a write of the profile's spec, as pause).",
        ),
        "undo": (
            "put an earlier revision's settings back into the spec",
            "Writes revision N's settings (default: the revision before the spec's) back into the "
            "profile's spec in one patch; the operator then rolls them out as any change. A USER "
            "action: the operator never writes the spec. Under GitOps, revert the commit in git "
            "instead: the next sync would undo this undo.",
        ),
    }
    cmds = {
        verb: verbs.add_parser(verb, parents=[common], help=short, description=long)
        for verb, (short, long) in helps.items()
    }
    cmds["status"].add_argument(
        "-w",
        "--watch",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        help="watch until done (default true); --watch=false prints the status once",
    )
    cmds["status"].add_argument(
        "--timeout", type=duration, default=0.0, help="stop waiting after this long (e.g. 5m; 0: never)"
    )
    cmds["history"].add_argument(
        "--revision", type=int, default=0, help="print this revision's settings as YAML"
    )
    cmds["undo"].add_argument(
        "--to-revision", type=int, default=0, help="the revision to go back to (default: the previous)"
    )
    cmds["undo"].add_argument(
        "--dry-run",
        choices=("none", "server", "client"),
        default="none",
        nargs="?",
        const="client",
        help="server: the API server checks the patch and stores nothing; client: only print the target",
    )
    for verb in verbs.choices.values():
        verb.add_argument("profile", help="the DevicePluginProfile")


def namespace_of(args: argparse.Namespace) -> str | None:
    """The agents' namespace, or None for every namespace (-A)."""
    if args.all_namespaces:
        return None
    return str(args.namespace or os.environ.get("PATCHBAY_NAMESPACE") or DEFAULT_NAMESPACE)
