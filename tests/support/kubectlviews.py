"""Recording what `kubectl patchbay` was checked against on the real node
(tests/e2e/test_kubectl_views_on_real_node.py), trimmed to what the plugin reads, as the unit
fixtures of tests/unit/kubectl (tests/data/kubectl/<state>.json)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

DATA = Path(__file__).resolve().parents[1] / "data" / "kubectl"
"""Where the recording of one run is kept (the unit tests read it)."""

_META = ("name", "namespace", "labels", "generation", "creationTimestamp", "deletionTimestamp")


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {k: meta[k] for k in _META if k in meta}


def _ours(values: Mapping[str, Any]) -> Obj:
    """Only the e2e tests' extended resources (the node's cpu, memory and pods say nothing here)."""
    return {k: v for k, v in values.items() if "patchbay" in k}


def trim(kind: str, obj: Obj) -> Obj:
    """``obj`` with what the plugin reads (and a reader needs to follow it), without the rest
    (managed fields, the pod spec's containers and volumes, the node's images and addresses)."""
    out: Obj = {"metadata": _meta(obj)}
    if kind == "pods":
        st = obj.get("status") or {}
        out["spec"] = {"nodeName": (obj.get("spec") or {}).get("nodeName")}
        out["status"] = {
            "phase": st.get("phase"),
            "conditions": [
                {k: c[k] for k in ("type", "status", "reason", "message") if k in c}
                for c in st.get("conditions") or []
            ],
            "containerStatuses": [
                {k: c[k] for k in ("name", "ready", "restartCount", "state", "lastState") if k in c}
                for c in st.get("containerStatuses") or []
            ],
        }
    elif kind == "nodes":
        st = obj.get("status") or {}
        out["status"] = {
            "capacity": _ours(st.get("capacity") or {}),
            "allocatable": _ours(st.get("allocatable") or {}),
        }
    elif kind == "profiles":
        st = obj.get("status") or {}
        keep = ("observedGeneration", "conditions", "nodesDesired", "nodesReady", "problems", "problemCount")
        out["spec"] = obj.get("spec")
        out["status"] = {k: st[k] for k in keep if k in st}
    elif kind == "configmaps":
        out["data"] = obj.get("data")
    elif kind == "slices":
        out["spec"] = obj.get("spec")
    else:  # DeviceReports: the whole document (small, and every field is the plugin's input)
        out.update({k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")})
    return out


def record(
    directory: Path, state: str, objects: Mapping[str, Sequence[Obj]], answers: Mapping[str, Any]
) -> Path:
    """``<directory>/<state>.json``: the objects (trimmed) and the plugin's answers to them."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = {
        "state": state,
        "objects": {kind: [trim(kind, o) for o in items if o] for kind, items in objects.items()},
        "answers": answers,
    }
    path = directory / f"{state}.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def load(state: str) -> Obj:
    """A recorded state (see `record`)."""
    doc: Obj = json.loads((DATA / f"{state}.json").read_text())
    return doc
