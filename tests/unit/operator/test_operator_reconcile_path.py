"""A profile's reconcile flows one way: from kopf's handler down, no module entered more than twice.

The reconcile runs against the FAKE KubeAPI (fakekube.py) under a profiler that watches the
reconcile's own task and records, for every call from one operator module into another, whether
the flow passed on through the module called (it called on into a third module) or the call was
a leaf (an API request, a mark on the status writer, an add to the work queue, a timer set). A
module is *entered* by each call that passes the flow on through it; a hub that is called back
by its own parts (a thread pool, a change callback) is entered again each time.

The pure modules (parsing, rendering, status computation: the layers below ``kube`` in
pyproject.toml's contract, which cannot import what runs the flow) are computation inside the
module that calls them, not places the flow goes, so their calls count as the caller's own. A
request the FAKE KubeAPI answers counts as a leaf call into ``kube`` (the real ``Kube`` runs it in
the pool's threads, which the profiler does not follow).
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest
from fakekube import FakeKube

from patchbay_operator import handlers
from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings
from patchbay_operator.controller import Controller
from patchbay_operator.informer import Snapshot

PURE = {
    "agentpods",
    "backoff",
    "capacity",
    "config",
    "constants",
    "devicereports",
    "evaluation",
    "maintenance",
    "pluginspec",
    "profiles",
    "render",
    "status",
    "timestamps",
    "version",
}
"""The operator's pure modules (``status`` with its submodules)."""


def body(name: str, mode: str, *, own_agent: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceName": "example.com/dongle",
        "mode": mode,
        "nodeSelector": {"matchLabels": {"pool": "a"}},
    }
    if mode == "Static":
        spec["static"] = {"capacity": 2}
    else:
        spec["plugin"] = {"discovery": {"virtual": {"count": 2}}}
    if own_agent:
        spec["agent"] = {}
    meta = {"name": name, "uid": f"uid-{name}", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}
    return {"metadata": meta, "spec": spec}


@dataclass
class Call:
    caller: str
    callee: str
    passed_on: bool = False


@dataclass
class Trace:
    """The calls between modules, in order, and where the flow passed on."""

    calls: list[Call] = field(default_factory=list)

    @property
    def path(self) -> list[str]:
        """The modules the flow passed through, in the order it entered them."""
        return [c.callee for c in self.calls if c.passed_on]

    @property
    def entries(self) -> Counter[str]:
        return Counter(self.path)

    @property
    def leaves(self) -> Counter[str]:
        return Counter(c.callee for c in self.calls if not c.passed_on)


def _module(frame: FrameType) -> str | None:
    """The operator module a frame runs in (None outside the operator or in a pure module)."""
    name = str(frame.f_globals.get("__name__", ""))
    if name == "fakekube":
        return "kube"
    if not name.startswith("patchbay_operator."):
        return None
    module = name.removeprefix("patchbay_operator.")
    return None if module.split(".")[0] in PURE else module


async def trace_reconcile(profile: dict[str, Any], *before: dict[str, Any]) -> Trace:
    """Reconcile ``profile`` through kopf's handler on a controller that knows one node and has
    reconciled the profiles ``before`` (not traced)."""
    kube = FakeKube()
    kube.add_node("n0", {"pool": "a"})
    ctl = Controller(Settings(concurrency=2, status_debounce=0.02), kube)  # type: ignore[arg-type]
    ctl.nodes.resync(Snapshot([NodeState.from_node(kube.nodes["n0"])], "1"))
    for other in before:
        await ctl.reconcile(other)
    trace = Trace()
    seen: set[int] = set()
    alive: list[FrameType] = []  # so that no frame id is reused while the trace runs
    entered: dict[int, Call] = {}  # frame that entered a module -> that call
    task: asyncio.Future[None] | None = None

    def record(frame: FrameType | None, callee: str) -> Call | None:
        """A call into ``callee`` made from ``frame``'s chain, unless it stays in one module."""
        up, caller = frame, None
        while up is not None and caller is None:
            caller = _module(up)
            up = up.f_back if caller is None else up
        if caller == callee:
            return None
        call = Call(caller or "kopf", callee)
        trace.calls.append(call)
        while up is not None:  # the call that entered the caller's module passed the flow on
            if id(up) in entered:
                entered[id(up)].passed_on = True
                break
            up = up.f_back
        return call

    def profile_(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or id(frame) in seen:  # a coroutine resumed is not a new call
            return
        try:
            if asyncio.current_task() is not task:
                return
        except RuntimeError:
            return
        seen.add(id(frame))
        alive.append(frame)
        if frame.f_code.co_name == "run_in_executor":
            owner = getattr(frame.f_locals.get("func"), "__self__", None)
            if isinstance(owner, FakeKube):
                record(frame.f_back, "kube")  # a request: a leaf
            return
        module = _module(frame)
        if module is not None and (call := record(frame.f_back, module)) is not None:
            entered[id(frame)] = call

    async def run() -> None:
        sys.setprofile(profile_)
        try:
            await handlers.reconcile(body=profile, memo={"controller": ctl})
        finally:
            sys.setprofile(None)

    try:
        task = asyncio.ensure_future(run())
        await task
    finally:
        await ctl.stop()
    return trace


CASES: dict[str, tuple[dict[str, Any], ...]] = {
    "Static": (body("s", "Static"),),
    "DevicePlugin, shared agent": (body("p", "DevicePlugin"),),
    "DevicePlugin, own agent": (body("o", "DevicePlugin", own_agent=True),),
    "DRA, shared agent": (body("d", "DRA"),),
    "DRA, own agent": (body("e", "DRA", own_agent=True),),
    # The DRA profile of the same resource follows: its agents are applied again without the
    # nodes the DevicePlugin profile now selects (KEP-5004).
    "DevicePlugin with a DRA twin": (body("p", "DevicePlugin"), body("d", "DRA", own_agent=True)),
    # Lost the resource name to an older profile: nothing of its own is applied.
    "Static, conflicting": (
        {
            **body("z", "Static"),
            "metadata": {**body("z", "Static")["metadata"], "creationTimestamp": "2026-02-01T00:00:00Z"},
        },
        body("s", "Static"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_reconcile_enters_no_module_more_than_twice(case: str) -> None:
    trace = await trace_reconcile(*CASES[case])
    path = " -> ".join(["kopf", *trace.path])
    assert trace.path[:3] == ["handlers", "controller", "reconcile"], path
    assert trace.entries.most_common(1)[0][1] <= 2, f"{path}; entries {dict(trace.entries)}"
