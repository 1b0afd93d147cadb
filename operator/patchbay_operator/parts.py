"""What the composition root (controller.py) hands each part of the agents' work: the API, the one
way to call it (off the event loop, with its retries), the settings and the registry of profiles.
``Agents``, ``AgentWatch`` and ``Repairs`` are ``Part`` dataclasses that add what each needs
besides; their constructors take the four as before (three positional, the registry by name)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from patchbay_operator.config import Settings
from patchbay_operator.kube import KubeAPI
from patchbay_operator.profiles import Registry
from patchbay_operator.render import Stage

Call = Callable[..., Awaitable[Any]]


@dataclass(eq=False)
class Part:
    kube: KubeAPI
    call: Call
    settings: Settings
    _: KW_ONLY
    registry: Registry
    #: how the shared agents' config renders a profile mid-rollout (staging.py; None: unstaged)
    stage: Stage | None = None
