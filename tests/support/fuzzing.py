"""What the fuzz suites (tests/fuzz) share: an asyncio loop in a thread, so Hypothesis can drive a
long-lived agent with blocking calls; the tally of what was tried (printed by
tests/fuzz/conftest.py at the end of the run); and `PROVE`, the settings under which each suite
runs its fuzzer once more against an agent broken on purpose, to show that its judge fails."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hypothesis import HealthCheck, Phase, settings
from support.fakehw import FakeHardware

from patchbay_agent.options import AgentOptions

if TYPE_CHECKING:
    from patchbay_agent.resourceagent import ResourceAgent

T = TypeVar("T")

#: A fuzzer run against an agent broken on purpose: the judge must fail it. Few examples, the same
#: ones every run (derandomized, no example database) and no shrinking: the first failure is the
#: proof, so the run stays short and fails the same way in CI as here.
PROVE = settings(
    max_examples=50,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

#: surface -> what happened to its inputs: tried, and how they were answered
TALLY: dict[str, Counter[str]] = {}


#: The node a fuzzed agent runs on (its DRA pool).
NODE = "node-1"


def fuzzed_agent_options(module_dir: Path, serials: int, **more: Any) -> AgentOptions:
    """The options of an agent to fuzz on ``NODE``: ``serials`` fake USB serial adapters under
    ``module_dir/host``, its device-plugin directory ``module_dir/dp``, no /metrics; ``more``:
    the rest of its AgentOptions."""
    hw = FakeHardware(module_dir / "host")
    hw.add_serials(serials)
    plugins = module_dir / "dp"
    plugins.mkdir()
    return AgentOptions(
        node_name=NODE, plugin_dir=plugins, host_root=hw.root, http_address=None, shutdown_grace=1.0, **more
    )


def tally(surface: str, outcome: str) -> None:
    counts = TALLY.setdefault(surface, Counter())
    counts["tried"] += 1
    counts[outcome] += 1


class LoopThread:
    """An asyncio loop in a daemon thread; `run` a coroutine on it and wait for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @contextlib.contextmanager
    def agent(self, make: Callable[[], ResourceAgent]) -> Iterator[ResourceAgent]:
        """The agent ``make`` builds, running on this loop from its start (its first round done)
        to the end of the block; then stopped, at most 15 s."""
        stop = asyncio.Event()

        async def start() -> tuple[ResourceAgent, asyncio.Task[None]]:
            agent = make()
            task = asyncio.create_task(agent.run(stop))
            await asyncio.wait_for(agent.started.wait(), 10)
            return agent, task

        agent, task = self.run(start())
        try:
            yield agent
        finally:
            self.loop.call_soon_threadsafe(stop.set)
            self.run(asyncio.wait_for(asyncio.shield(task), 15))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
