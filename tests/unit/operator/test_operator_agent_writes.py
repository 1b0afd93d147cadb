"""The agents' config is written in the order it is rendered: a profile handler's apply that renders
a rollout's stanza and is then held up on the API (its DELETE of an own agent's leftovers, slow)
never lands after a wave's write that rendered the next stanza. Without the agents' write lock
(parts.Writing) the handler's older stanza overwrote the canary wave's, the canary node was never
told to move, and the rollout waited for its deadline (seen in `make demo` and in the rollouts'
integration test under load).

The API is FAKE (fakekube.py: an in-memory KubeAPI) so that the interleaving is forced, not hoped
for; the integration and e2e rollout tests run the same code against a real API server."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import yaml
from fakekube import FakeKube

from patchbay_api.revisions import EVERYONE, NOBODY, Rollout
from patchbay_operator import render
from patchbay_operator.agents import Agents
from patchbay_operator.agentwatch import AgentWatch
from patchbay_operator.config import Settings
from patchbay_operator.deviceclasses import DeviceClasses
from patchbay_operator.kube import Pool, Ref
from patchbay_operator.parts import Writing
from patchbay_operator.profiles import Profile, Registry
from patchbay_operator.repairs import Repairs

SETTINGS = Settings(namespace="patchbay-test", agent_image="example.invalid/agent:1")


def serial(glob: str, generation: int) -> Profile:
    return Profile.from_body(
        {
            "metadata": {"name": "serial", "uid": "uid-serial", "generation": generation},
            "spec": {
                "resourceName": "example.com/serial",
                "mode": "DevicePlugin",
                "nodeSelector": {"matchLabels": {"serial": "yes"}},
                "plugin": {"discovery": {"paths": {"globs": [glob]}}},
            },
        }
    )


OLD, PROFILE = serial("/dev/ttyACM*", 1), serial("/dev/ttyUSB*", 2)
"""The profile's current revision (as a profile) and its spec now: a rollout from one to the other."""


class Slow(FakeKube):
    """The first call of `method` (``delete``; ``apply`` of a ConfigMap) waits until `release` is
    set: an API server slow to answer the handler."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method
        self.waiting = threading.Event()
        self.release = threading.Event()

    def _hold(self, method: str) -> None:
        if method == self.method and not self.waiting.is_set():
            self.waiting.set()
            if not self.release.wait(10):
                raise TimeoutError("the test never released the call")

    def delete(self, ref: Ref, uid: str = "", resource_version: str = "") -> bool:
        self._hold("delete")
        return super().delete(ref, uid, resource_version)

    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        if obj["kind"] == "ConfigMap":
            self._hold("apply")
        return super().apply(obj, force)


def threshold_written(kube: FakeKube) -> int:
    """The rollout stanza's threshold of the profile in the LAST shared ConfigMap applied."""
    cms = [
        o for o in kube.applied if o["kind"] == "ConfigMap" and o["metadata"]["name"] == render.SHARED_AGENT
    ]
    doc = yaml.safe_load(cms[-1]["data"]["node.yaml"])
    entry = next(e for e in doc["profiles"] if e["profile"] == PROFILE.name)
    return Rollout.from_dict(entry["rollout"]).threshold


def parts(kube: FakeKube, pool: Pool) -> tuple[Agents, Repairs, dict[str, Any]]:
    """Agents and Repairs as the controller wires them (one Writing shared), rendering the
    profile's rollout from `rollout["now"]` (what staging.py's state says at the moment)."""
    registry = Registry([PROFILE])
    watch = AgentWatch(kube, pool.call, SETTINGS, registry=registry, mark=lambda _n: None)
    classes = DeviceClasses(kube, pool.call, registry=registry, mark=lambda _n: None)
    rollout: dict[str, Any] = {}
    stage = lambda _p: (OLD, rollout["now"])  # noqa: E731
    writing = Writing()
    common: dict[str, Any] = {"registry": registry, "watch": watch, "classes": classes, "writing": writing}
    agents = Agents(kube, pool.call, SETTINGS, stage=stage, mark=lambda _n: None, **common)
    repairs = Repairs(kube, pool.call, SETTINGS, stage=stage, mark=lambda _n: None, **common)
    return agents, repairs, rollout


@pytest.mark.parametrize("slow", ["delete", "apply"])
def test_a_wave_written_while_the_handler_waits_on_the_api_is_not_overwritten_by_the_handler(
    slow: str,
) -> None:
    """`slow`: the handler is held up in its DELETE of the own agent's leftovers (before it writes
    the shared agent's objects), or in its write of the shared ConfigMap itself."""
    pending = Rollout("old", "new", None, NOBODY, {})  # the change seen, no node moved
    canary = Rollout("old", "new", None, EVERYONE, {})  # the canary wave: every node (one node)

    async def scenario() -> int:
        kube, pool = Slow(slow), Pool(4)
        try:
            agents, _repairs, rollout = parts(kube, pool)
            rollout["now"] = pending
            # The profile handler: deletes the profile's own agent's leftovers (held up), then
            # writes the shared agent's objects.
            handler = asyncio.ensure_future(agents.apply(PROFILE))
            assert await asyncio.to_thread(kube.waiting.wait, 10), "the handler never called the API"
            # Meanwhile the status computation moves the canary wave and writes it.
            rollout["now"] = canary
            wave = asyncio.ensure_future(agents.apply_wave(PROFILE.name))
            await asyncio.sleep(0.2)
            kube.release.set()
            await asyncio.wait_for(asyncio.gather(handler, wave), 10)
            return threshold_written(kube)
        finally:
            kube.release.set()
            pool.shutdown()

    assert asyncio.run(scenario()) == EVERYONE, "the handler's older stanza landed after the wave's"
