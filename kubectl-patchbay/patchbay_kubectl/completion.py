"""Shell completion, by kubectl's plugin protocol (kubectl >= 1.26): kubectl runs
``kubectl_complete-patchbay`` with the words typed so far, the last one being completed, and reads
one candidate per line and a final ``:<directive>`` line (docs/facts.md#kubectl-plugin-completion).
``completions`` is pure; ``_lookup`` names live objects through the API."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from patchbay_kubectl import kube, output
from patchbay_kubectl.arguments import COMMANDS, MAINTENANCE, ROLLOUT
from patchbay_kubectl.kube import Kube, KubeError, Target
from patchbay_kubectl.views.objects import name_of

NO_FILE_COMP = 4
"""cobra's ShellCompDirectiveNoFileComp: the shell offers no file names."""
FILE_COMP = 0
"""cobra's ShellCompDirectiveDefault: the shell offers its file names."""
VALUE_FLAGS = {
    "--kubeconfig",
    "--context",
    "-n",
    "--namespace",
    "-o",
    "--output",
    "--node",
    "--profile",
    "--request-timeout",
    "--device",
    "--reason",
    "--wait",
    "--propose",
    "--mode",
    "--timeout",
    "--revision",
    "--to-revision",
    "-f",
    "--filename",
}


def completions(words: Sequence[str], lookup: Callable[[str], list[str]]) -> list[str]:
    """Candidates for the last word of ``words`` (the words after ``patchbay``). ``lookup(kind)``
    names live objects: ``profiles``, ``nodes``, ``contexts``, ``namespaces``; pure otherwise."""
    *before, current = words or [""]
    prev = before[-1] if before else ""
    command = next((w for w in before if w in COMMANDS), None)
    if prev in ("-o", "--output"):
        found = list(output.FORMATS)
    elif prev == "--profile":
        found = lookup("profiles")
    elif prev == "--node":
        found = lookup("nodes")
    elif prev == "--context":
        found = lookup("contexts")
    elif prev in ("-n", "--namespace"):
        found = lookup("namespaces")
    elif prev in VALUE_FLAGS:
        found = []
    elif current.startswith("-"):
        found = [
            "--kubeconfig",
            "--context",
            "--namespace",
            "--all-namespaces",
            "--output",
            "--request-timeout",
        ]
        if command in ("devices", "nodes"):
            found += ["--node", "--profile"]
        if command in MAINTENANCE:
            found += ["--node", "--device"] + (["--reason", "--wait"] if command != "uncordon" else [])
        if command == "drain":
            found.append("--preview")
        if command == "devices":
            found.append("--unhealthy")
        if command == "diff":
            found.append("--filename")
        verb = next((w for w in before if w in ROLLOUT), None) if command == "rollout" else None
        found += {
            "status": ["--watch", "--timeout"],
            "history": ["--revision"],
            "undo": ["--to-revision", "--dry-run"],
        }.get(verb or "", [])
    elif command is None:
        found = list(COMMANDS)
    elif command == "rollout" and not (verbs := [w for w in before if w in ROLLOUT]):
        found = list(ROLLOUT)
    elif (
        command == "rollout"
        and not [w for w in before[before.index(verbs[0]) + 1 :] if not w.startswith("-")]
    ) or (
        command in ("why", *MAINTENANCE)
        and not [w for w in before[before.index(command) + 1 :] if not w.startswith("-")]
    ):
        found = lookup("profiles")
    elif (
        command == "why"
        and len([w for w in before[before.index(command) + 1 :] if not w.startswith("-")]) == 1
    ):
        found = lookup("nodes")  # why PROFILE NODE
    else:
        found = []
    return sorted(c for c in found if c.startswith(current))


def _lookup(words: Sequence[str]) -> Callable[[str], list[str]]:
    def flag(*names: str) -> str | None:
        for i, w in enumerate(words[:-1]):
            if w in names:
                return words[i + 1]
            for n in names:
                if w.startswith(n + "="):
                    return w.split("=", 1)[1]
        return None

    def lookup(kind: str) -> list[str]:
        if kind == "contexts":
            return kube.contexts(flag("--kubeconfig"))
        paths = {"profiles": kube.PROFILES, "nodes": "/api/v1/nodes", "namespaces": "/api/v1/namespaces"}
        try:
            k = Kube(Target(flag("--kubeconfig"), flag("--context"), 5.0))
            try:
                return [name_of(o) for o in k.list(paths[kind])]
            finally:
                k.close()
        except KubeError:
            return []

    return lookup


def complete_main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    for c in completions(words, _lookup(words)):
        print(c)
    # `diff -f <TAB>`: the shell's own file names (cobra's ShellCompDirectiveDefault).
    files = len(words) >= 2 and words[-2] in ("-f", "--filename")
    print(f":{FILE_COMP if files else NO_FILE_COMP}")
    return 0
