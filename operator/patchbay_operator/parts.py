"""What the composition root (controller.py) hands each part of the agents' work: the API, the one
way to call it (off the event loop, with its retries), the settings and the registry of profiles.
``Agents``, ``AgentWatch`` and ``Repairs`` are ``Part`` dataclasses that add what each needs
besides; their constructors take the four as before (three positional, the registry by name).

``Writing`` is the one lock per agent (the shared node agent's, or a profile's own) that every
writer of its objects holds from the moment it renders them until the API server has them: the
profile handler, a rollout's wave and a repair each render the rollout's stanza as it stands when
they render, and without it an earlier rendering could land after a later one (each write goes to
the API in a thread of its own) and put the agents' config back a wave: a canary wave written and
then overwritten by the handler's older rendering leaves the canary never told, and the rollout
waits for its deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from patchbay_operator.config import Settings
from patchbay_operator.kube import KubeAPI
from patchbay_operator.profiles import Registry
from patchbay_operator.render import Stage

Call = Callable[..., Awaitable[Any]]


class Writing:
    """One ``asyncio.Lock`` per agent (``SHARED_KEY`` or a profile's name): held from rendering an
    agent's objects until they are written (see the module doc). One per profile ever seen: a few
    hundred bytes each, as many as the profiles."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def __call__(self, agent: str) -> asyncio.Lock:
        return self._locks.setdefault(agent, asyncio.Lock())


@dataclass(eq=False)
class Part:
    kube: KubeAPI
    call: Call
    settings: Settings
    _: KW_ONLY
    registry: Registry
    #: how the shared agents' config renders a profile mid-rollout (staging.py; None: unstaged)
    stage: Stage | None = None
    #: the agents' write locks, shared by every part that writes agents' objects (the controller
    #: gives ``Agents`` and ``Repairs`` the same one)
    writing: Writing = field(default_factory=Writing)
