"""The operator's settings: one typed object, from command-line flags with environment fallbacks.

Every flag has an environment variable (``PATCHBAY_<NAME>``) so the Helm chart can set them
either way. A bad value raises ``ConfigError`` naming the setting, never a traceback from deep
inside kopf.
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

DEFAULT_AGENT_IMAGE = "ghcr.io/kube-patchbay/patchbay-agent:0.1.0"


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is accepted."""


@dataclass(frozen=True)
class Settings:
    namespace: str = "patchbay-system"
    """Where agent ConfigMaps and DaemonSets live (the operator's own namespace)."""

    agent_image: str = DEFAULT_AGENT_IMAGE
    """Agent image for profiles that do not set spec.agent.image."""

    log_format: Literal["text", "json"] = "text"
    """text for people, json for log pipelines."""

    verbose: bool = False
    """Debug logging (kopf's and ours)."""

    kubeconfig: str | None = None
    """Kubeconfig file; absent: $KUBECONFIG, ~/.kube/config, then the pod's service account."""

    peering: str | None = None
    """kopf peering name; absent runs standalone. With several replicas give each a distinct
    --priority: kopf freezes every replica when priorities are equal."""

    priority: int = 0
    """This replica's kopf peering priority (the highest runs, the others wait); random when
    peering without an explicit one, so replicas of one Deployment never tie."""

    concurrency: int = 16
    """Node patches in flight at once (and the client's connection pool size)."""

    status_debounce: float = 1.0
    """Seconds to gather changes before writing a profile's status (bounds status writes)."""

    liveness: str | None = None
    """kopf liveness endpoint, e.g. http://127.0.0.1:8080/healthz (absent: none)."""


def build_parser() -> argparse.ArgumentParser:
    d = Settings()
    p = argparse.ArgumentParser(
        prog="patchbay-operator",
        description=(
            "Patchbay operator: makes each DevicePluginProfile real.\n\n"
            "  Static        writes a fixed count into capacity and allocatable of every selected node\n"
            "                (one JSON patch per node, re-asserted on drift, removed with the profile)\n"
            "  DevicePlugin  runs a per-node agent DaemonSet with its ConfigMap (server-side applied)\n\n"
            "Every flag can also be set from the environment variable shown in brackets."
        ),
        epilog=(
            "examples:\n"
            "  patchbay-operator --kubeconfig ~/.kube/config --namespace patchbay-system\n"
            "  PATCHBAY_LOG_FORMAT=json PATCHBAY_PEERING=patchbay patchbay-operator   # in a pod, 2+ replicas"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    def flag(name: str, help_text: str, **kw: Any) -> None:
        env = "PATCHBAY_" + name.upper().replace("-", "_")
        p.add_argument(f"--{name}", default=None, help=f"{help_text} [{env}]", **kw)

    flag("namespace", f"namespace of the agents' ConfigMaps and DaemonSets (default {d.namespace})")
    flag("agent-image", f"agent image for profiles without spec.agent.image (default {d.agent_image})")
    flag("log-format", "text (default) or json", choices=["text", "json"])
    flag("verbose", "debug logging", action="store_true")
    flag("kubeconfig", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
    flag(
        "peering",
        "kopf peering name, for several replicas: the highest priority works, the others wait "
        "(needs crds/kopf.dev_clusterkopfpeerings.yaml; default: standalone)",
    )
    flag("priority", "peering priority (default: random when peering, so replicas never tie)")
    flag("concurrency", f"node patches in flight at once (default {d.concurrency})")
    flag(
        "status-debounce",
        f"seconds to gather changes before writing a profile's status (default {d.status_debounce})",
    )
    flag("liveness", "liveness endpoint, e.g. http://127.0.0.1:8080/healthz (default: none)")
    return p


def _int(name: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"--{name}: {raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"--{name}: must be >= {minimum}, got {value}")
    return value


def _priority(raw: str | None, peering: bool) -> int:
    """An explicit priority, else a random one when peering: kopf freezes EVERY replica whose
    priority equals another live one's, so identical replicas must not share the default."""
    if raw is not None:
        return _int("priority", raw, -(2**31))
    return secrets.randbelow(2**31 - 1) + 1 if peering else 0


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Flags win over PATCHBAY_* environment variables, which win over the defaults."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    d = Settings()

    def pick(flag: str) -> str | None:
        value = getattr(args, flag.replace("-", "_"))
        if value is None:
            value = env.get("PATCHBAY_" + flag.replace("-", "_").upper())
        return None if value is None else str(value)

    namespace = pick("namespace") or d.namespace
    if not namespace.replace("-", "").isalnum() or namespace != namespace.lower() or len(namespace) > 63:
        raise ConfigError(f"--namespace: {namespace!r} is not a valid namespace name")
    log_format = pick("log-format") or d.log_format
    if log_format not in ("text", "json"):
        raise ConfigError(f"--log-format: must be text or json, got {log_format!r}")
    debounce_raw = pick("status-debounce")
    try:
        debounce = float(debounce_raw) if debounce_raw is not None else d.status_debounce
    except ValueError:
        raise ConfigError(f"--status-debounce: {debounce_raw!r} is not a number") from None
    if not 0 <= debounce <= 60:
        raise ConfigError(f"--status-debounce: must be between 0 and 60 seconds, got {debounce}")
    verbose_raw = pick("verbose")
    return Settings(
        namespace=namespace,
        agent_image=pick("agent-image") or d.agent_image,
        log_format="json" if log_format == "json" else "text",
        verbose=verbose_raw is not None and verbose_raw.lower() in ("1", "true", "yes"),
        kubeconfig=pick("kubeconfig"),
        peering=pick("peering") or None,
        priority=_priority(pick("priority"), peering=bool(pick("peering"))),
        concurrency=_int("concurrency", pick("concurrency") or str(d.concurrency), 1),
        status_debounce=debounce,
        liveness=pick("liveness"),
    )
