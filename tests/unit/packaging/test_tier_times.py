"""The session's wall time per tier (tests/support/tiertimes.py), what CI's log ends with."""

from __future__ import annotations

from support.tiertimes import TierTimes, tier_of


def test_a_node_id_names_its_tier() -> None:
    assert tier_of("tests/e2e/test_real_node.py::test_x") == "e2e"
    assert tier_of("tests/integration/operator/test_operator_static.py::test_y[a/b]") == "integration"
    assert tier_of("tests/unit/agent/test_agent_cdi.py") == "unit"
    assert tier_of("bench/test_z.py::t") == "bench"


def test_setup_call_and_teardown_add_up_per_tier_in_the_suites_order_and_the_rest_is_other() -> None:
    t = TierTimes(clock=100.0)
    t.add("tests/e2e/test_a.py::test_1", 30.0)  # setup: the cluster's start
    t.add("tests/e2e/test_a.py::test_1", 5.0)  # call
    t.add("tests/e2e/test_a.py::test_1", 1.5)  # teardown
    t.add("tests/unit/agent/test_b.py::test_2", 0.5)
    t.add("tests/unit/agent/test_b.py::test_3", 0.25)
    lines = t.lines(now=140.0)
    assert [line.split()[0] for line in lines] == ["unit", "e2e", "(other)", "(session)"]
    unit, e2e, other, session = (line.split() for line in lines)
    assert (unit[1], unit[5]) == ("0.8", "2")  # 0.75 s, two tests
    assert (e2e[1], e2e[5]) == ("36.5", "1")
    assert other[1] == "2.8"  # 40 s of wall time, 37.25 s held by tests
    assert session[1] == "40.0"


def test_a_new_session_starts_from_zero() -> None:
    t = TierTimes(clock=0.0)
    t.add("tests/fuzz/test_c.py::test_4", 9.0)
    t.start(clock=50.0)
    assert [line.split()[0] for line in t.lines(now=51.0)] == ["(other)", "(session)"]
