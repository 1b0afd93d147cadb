"""Settings: flags over environment over defaults; bad values name the setting."""

from __future__ import annotations

from dataclasses import fields

import pytest

from patchbay_operator.config import FLAGS, ConfigError, Settings, build_parser, load


def test_defaults() -> None:
    assert load([], {}) == Settings()


def test_flags_win_over_environment() -> None:
    s = load(["--namespace", "flag-ns"], {"PATCHBAY_NAMESPACE": "env-ns", "PATCHBAY_LOG_FORMAT": "json"})
    assert s.namespace == "flag-ns"
    assert s.log_format == "json"


def test_environment_fills_every_setting() -> None:
    s = load(
        [],
        {
            "PATCHBAY_AGENT_IMAGE": "img:1",
            "PATCHBAY_PEERING": "patchbay",
            "PATCHBAY_PRIORITY": "100",
            "PATCHBAY_CONCURRENCY": "4",
            "PATCHBAY_STATUS_DEBOUNCE": "0.5",
            "PATCHBAY_VERBOSE": "true",
        },
    )
    assert (s.agent_image, s.peering, s.priority, s.concurrency, s.status_debounce, s.verbose) == (
        "img:1",
        "patchbay",
        100,
        4,
        0.5,
        True,
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"PATCHBAY_NAMESPACE": "Bad_NS"}, "--namespace"),
        ({"PATCHBAY_LOG_FORMAT": "xml"}, "--log-format"),
        ({"PATCHBAY_CONCURRENCY": "0"}, "--concurrency"),
        ({"PATCHBAY_CONCURRENCY": "many"}, "--concurrency"),
        ({"PATCHBAY_STATUS_DEBOUNCE": "-1"}, "--status-debounce"),
        ({"PATCHBAY_PRIORITY": "high"}, "--priority"),
        ({"PATCHBAY_NODE_AGENT_NODE_SELECTOR": "a=1,b"}, "--node-agent-node-selector"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load([], env)


def test_the_node_agents_node_selector_is_key_value_pairs_sorted() -> None:
    s = load([], {"PATCHBAY_NODE_AGENT_NODE_SELECTOR": "zone=b, patchbay.dev/devices=true"})
    assert s.node_agent_node_selector == (("patchbay.dev/devices", "true"), ("zone", "b"))
    assert load([], {}).node_agent_node_selector == ()


def test_help_mentions_every_setting() -> None:
    text = build_parser().format_help()
    for flag in ("--namespace", "--agent-image", "--log-format", "--peering", "--priority", "--kubeconfig"):
        assert flag in text


def test_peering_without_priority_gets_a_random_nonzero_one() -> None:
    prios = {load([], {"PATCHBAY_PEERING": "p"}).priority for _ in range(5)}
    assert 0 not in prios
    assert len(prios) > 1
    assert load(["--peering", "p", "--priority", "7"], {}).priority == 7


def test_every_setting_has_one_flag_and_its_environment_variable() -> None:
    """Declared once: each Settings attribute has exactly one row in FLAGS, and its variable
    sets it (a value other than the default, read back through the flag's own parser)."""
    assert sorted(f.field for f in FLAGS) == sorted(f.name for f in fields(Settings))
    given = {"namespace": "ns", "log_format": "json", "concurrency": "3", "kubelet_root_dir": "/k",
             "node_agent_node_selector": "a=1", "metrics_address": "0.0.0.0:9", "verbose": "yes"}  # fmt: skip
    s = load([], {f"PATCHBAY_{k.upper()}": v for k, v in given.items()})
    assert (s.namespace, s.log_format, s.concurrency, s.kubelet_root_dir) == ("ns", "json", 3, "/k")
    assert (s.node_agent_node_selector, s.metrics_address, s.verbose) == ((("a", "1"),), ("0.0.0.0", 9), True)
