"""The one poll-until loop the tool, the demo and the tests share."""

from __future__ import annotations

import itertools

import pytest

from patchbay_devcluster.poll import poll_until


def test_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, [], {"ready": True}])
    assert poll_until("a value", lambda: next(values), timeout=5, interval=0) == {"ready": True}


def test_times_out_naming_what_and_the_last_value() -> None:
    counter = itertools.count()
    with pytest.raises(TimeoutError, match=r"timed out after 0.05s waiting for the answer; last=0") as err:
        poll_until("the answer", lambda: next(counter) * 0, timeout=0.05, interval=0.01)
    assert "last error" not in str(err.value)


def test_checks_at_least_once_and_once_more_at_the_deadline() -> None:
    calls = []
    with pytest.raises(TimeoutError):
        poll_until("nothing", lambda: calls.append(1), timeout=0.03, interval=10)
    assert len(calls) == 2


def test_error_type_and_detail_are_the_callers() -> None:
    with pytest.raises(AssertionError, match=r"waiting for nodes; only 3/5 Ready$"):
        poll_until("nodes", lambda: False, timeout=0, error=AssertionError, detail=lambda: "only 3/5 Ready")
    with pytest.raises(SystemExit, match=r"^demo: timed out after 0s waiting for x\nline 1\nline 2$"):
        poll_until(
            "x",
            lambda: False,
            timeout=0,
            error=lambda m: SystemExit(f"demo: {m}"),
            detail=lambda: "line 1\nline 2",
        )


def test_ignored_exceptions_mean_not_yet_and_are_reported() -> None:
    attempts = iter([ConnectionRefusedError("refused"), ConnectionRefusedError("refused"), "up"])

    def check() -> str:
        got = next(attempts)
        if isinstance(got, Exception):
            raise got
        return got

    assert poll_until("server", check, timeout=5, interval=0, ignore=(OSError,)) == "up"

    def refuse() -> bool:
        raise ConnectionRefusedError("refused")

    with pytest.raises(TimeoutError, match=r"last=None\nlast error: ConnectionRefusedError: refused"):
        poll_until("server", refuse, timeout=0, ignore=(OSError,))


def test_other_exceptions_propagate_at_once() -> None:
    calls = []

    def check() -> bool:
        calls.append(1)
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        poll_until("x", check, timeout=5, ignore=(OSError,))
    assert calls == [1]
