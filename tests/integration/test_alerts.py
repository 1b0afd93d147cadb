"""The chart's alerts, as the chart renders them, unit-tested by Prometheus's own ``promtool``.

``helm template`` renders the PrometheusRule (metrics.prometheusRule.enabled=true), its
``spec.groups`` become a rules file, and ``promtool test rules`` evaluates
tests/integration/alerts/patchbay-alerts.test.yaml against it (Debian's prometheus package,
installed by hack/host-packages.sh). The same test file against thresholds rendered differently
must fail: the test can fail, and the thresholds are really the values'.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.alerts import prometheus_rule

# No Kubernetes component runs here: `make test` runs it once, `make test-release` does not again.
pytestmark = pytest.mark.release_independent

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "patchbay"
TESTS = Path(__file__).parent / "alerts" / "patchbay-alerts.test.yaml"
ALERTS = {
    "PatchbayAgentNotRegistered",
    "PatchbayDeviceUnhealthy",
    "PatchbayProfileStalled",
    "PatchbayProfileDegraded",
    "PatchbayRolloutHalted",
    "PatchbayNodeCapacityDrift",
    "PatchbayOperatorWatchRestarts",
    "PatchbayDRAPrepareErrors",
}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is missing: `make setup` installs Debian's prometheus package (hack/host-packages.sh)"
        )
    return path


def render(bin_dir: Path, *sets: str) -> dict[str, Any]:
    return prometheus_rule(bin_dir / "helm", *sets)


def run_tests(promtool: str, rule: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    tests = yaml.safe_load(TESTS.read_text())
    tests["rule_files"] = [str(rules)]
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=True)
    return subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)


def test_every_alert_is_rendered_and_passes_promtools_tests(
    bin_dir: Path, promtool: str, tmp_path: Path
) -> None:
    rule = render(bin_dir)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert names == ALERTS
    tested = {
        t["alertname"] for case in yaml.safe_load(TESTS.read_text())["tests"] for t in case["alert_rule_test"]
    }
    assert tested == ALERTS, "every alert has a promtool test"
    result = run_tests(promtool, rule, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_thresholds_come_from_the_values(bin_dir: Path, promtool: str, tmp_path: Path) -> None:
    rule = render(bin_dir, "metrics.prometheusRule.deviceUnhealthyFor=30m")
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert rules["PatchbayDeviceUnhealthy"]["for"] == "30m"
    result = run_tests(promtool, rule, tmp_path)
    assert result.returncode != 0 and "PatchbayDeviceUnhealthy" in result.stdout + result.stderr


def test_the_rule_is_off_by_default(bin_dir: Path) -> None:
    args = [str(bin_dir / "helm"), "template", "t", str(CHART)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert "kind: PrometheusRule" not in out


def test_the_dashboard_ships_in_a_sidecar_configmap_and_every_query_parses(
    bin_dir: Path, promtool: str, tmp_path: Path
) -> None:
    """The ConfigMap carries the generated JSON and the sidecar's label; every panel's PromQL is
    valid for Prometheus's own parser (as recording rules, which `promtool check rules` parses).
    That the queries return series is checked against a real Prometheus on the real node."""
    import json
    import sys

    sys.path.insert(0, str(REPO / "hack"))
    import dashboard

    args = [str(bin_dir / "helm"), "template", "t", str(CHART), "--show-only", "templates/dashboard.yaml"]
    out = subprocess.run(
        [*args, "--set", "metrics.dashboard.enabled=true"], capture_output=True, text=True, check=True
    )
    cm = yaml.safe_load(out.stdout)
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(cm["data"]["patchbay.json"])
    assert board == json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets") or []]
    assert exprs == [q for _, q in dashboard.queries()] and len(exprs) == 12
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"panel_{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    off = subprocess.run(
        [str(bin_dir / "helm"), "template", "t", str(CHART)], capture_output=True, text=True, check=True
    )
    assert "grafana_dashboard" not in off.stdout
