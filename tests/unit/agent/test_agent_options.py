"""The agent's options are defined once (`options.OPTIONS`): argparse, the environment variables
and the options objects' defaults all come from that table, and every flag the operator's
DaemonSets pass is one of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from patchbay_agent.options import (
    DEFAULTS,
    OPTIONS,
    AgentOptions,
    DraOptions,
    ReportOptions,
    Values,
    build_parser,
)

REPO = Path(__file__).resolve().parents[3]
REQUIRED = ["--config", "c.yaml", "--node-name", "n1"]


def _values(argv: list[str], env: dict[str, str] | None = None) -> Values:
    return Values(build_parser().parse_args([*REQUIRED, *argv]), env or {})


def test_options_built_by_hand_default_to_what_the_command_line_gives() -> None:
    values = _values(["--profile", "p", "--report-namespace", "ns", "--dra-driver", "d.example.com"])
    by_hand = AgentOptions(
        node_name="n1",
        plugin_dir=DEFAULTS["device_plugin_dir"],
        host_root=DEFAULTS["host_root"],
        report=ReportOptions("p", "ns"),
        dra=DraOptions("d.example.com"),
    )
    from_flags = AgentOptions(
        **values.section("agent"),
        report=ReportOptions(**values.section("report")),
        dra=DraOptions(**values.section("dra")),
    )
    assert from_flags == by_hand
    assert by_hand.http_address == ("127.0.0.1", 9464)
    assert by_hand.report is not None and by_hand.report.pod_resources_period == 10.0


def test_a_flag_wins_over_its_environment_variable_which_wins_over_the_default() -> None:
    env = {"POD_NAMESPACE": "from-env", "POD_NAME": "pod-1"}
    assert _values([], env)["report_namespace"] == "from-env"
    assert _values(["--report-namespace", "flag"], env)["report_namespace"] == "flag"
    assert _values([])["report_namespace"] is None
    assert _values([], env)["pod_name"] == "pod-1"
    assert _values(["--pod-name", ""])["pod_name"] is None
    with pytest.raises(ValueError, match=r"\$POD_NAMESPACE \(the default of --report-namespace\)"):
        _values([], {"POD_NAMESPACE": "Not_A_Namespace"})["report_namespace"]


def test_a_value_that_means_none_is_not_taken_for_a_missing_flag() -> None:
    assert _values(["--http-address", "off"])["http_address"] is None
    assert _values([])["http_address"] == ("127.0.0.1", 9464)


def test_flags_that_need_another_are_ignored_without_it() -> None:
    assert _values(["--kubeconfig", "k", "--pod-resources-period", "3"]).ignored() == [
        "--pod-resources-period",
        "--kubeconfig",
    ]
    assert _values(["--kubeconfig", "k", "--dra-driver", "d.example.com"]).ignored() == []


def test_every_default_is_one_its_flag_accepts() -> None:
    for option in OPTIONS:
        if option.default is not None and option.parse is not None:
            assert DEFAULTS[option.dest] == option.parse(option.default), option.flag


def test_every_flag_the_operator_renders_is_an_option() -> None:
    template = (REPO / "operator" / "patchbay_operator" / "templates" / "daemonset.yaml.j2").read_text()
    rendered = set(re.findall(r"^\s*- (--[a-z-]+)\s*$", template, re.M))
    assert rendered, "no flag found in the template"
    assert rendered <= {o.flag for o in OPTIONS}
