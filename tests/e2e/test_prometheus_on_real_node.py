"""The chart's alerts and dashboard against a REAL Prometheus scraping the real node.

Debian's ``prometheus`` (installed by hack/host-packages.sh) runs for this test only: on 127.0.0.1
(a free port), its own storage in the test's temp dir, stopped by PID at the end, every wait
bounded. It finds the operator and agent pods with the scrape config docs/observability.md gives
(its job and labels; Debian's build lacks Kubernetes discovery, so the test lists the pods from the
API server and hands them over as a discovery file: see `scrape_config`), and loads the alert rules
exactly as ``helm template`` renders the chart's PrometheusRule, with the chart's own
``metrics.prometheusRule.deviceUnhealthyFor`` set to 2s so the test need not wait the default 10m.
One thing differs from a cluster's Prometheus: targets are kept to pods on the real node (kwok's
pods have made-up addresses that must never be dialled). The operator and the agents are scraped
at their pod IPs on the cluster's own bridge, as the chart's defaults run them (an operator on
the node's network, `operator.hostNetwork`, at 127.0.0.1).

Then: a device the agent serves vanishes -> ``PatchbayDeviceUnhealthy`` fires for it; every
query of the chart's dashboard returns at least one series (those that can only be empty on this
cluster are listed with the reason); the device returns -> the alert resolves. The timings are
printed (no timing assertions).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.alerts import prometheus_rule
from support.clusters import Cluster
from support.processes import http_ok
from support.realnode import REPO, Installed, add_fake_device, busybox_pod, limits, serial_profile, wait_for

from patchbay_devcluster.procs import free_port

CHART = REPO / "charts" / "patchbay"
DASHBOARD = CHART / "files" / "dashboard.json"
ALERT = "PatchbayDeviceUnhealthy"

#: Dashboard queries that return nothing on this cluster however it runs, and why.
EMPTY_HERE = {
    # A counter that only gets series once the operator re-asserts a static capacity or restarts a
    # watch; neither happens in this test (the alerts test covers their expressions with promtool).
    "sum by (kind) (increase(patchbay_operator_watch_restarts_total[1h]))": "no watch restarted",
}


class Prometheus:
    """One prometheus process; `query`/`alerts` over its HTTP API on loopback."""

    def __init__(self, binary: str, workdir: Path, config: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = workdir / "prometheus.log"
        #: rewrites the file the scrape job discovers its targets from
        self.refresh: Any = lambda: None
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-3000:]}")
        return http_ok(f"{self.url}/-/ready", timeout=2)

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def alerts(self, name: str, state: str) -> list[dict[str, Any]]:
        return [
            a
            for a in self.get("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == state
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def rendered_rules(bin_dir: Path, workdir: Path) -> Path:
    """The chart's PrometheusRule as `helm template` renders it -> a rules file."""
    rule = prometheus_rule(bin_dir / "helm", "metrics.prometheusRule.deviceUnhealthyFor=2s")
    path = workdir / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


def sd_targets(installed: Installed, node: str) -> list[dict[str, Any]]:
    """What the documented ``kubernetes_sd_configs`` + relabel rules yield, computed from the API
    server's pod list: pods of the operator (app.kubernetes.io/name=patchbay) and of the agents
    (=patchbay-agent) with a container port named metrics, labelled namespace, pod and
    instance_node. Kept to the real node (kwok's pods have made-up addresses that must never be
    dialled); a pod on the node's network (hostNetwork) at 127.0.0.1, where it listens then."""
    out = []
    for pod in installed.core.list_namespaced_pod(installed.namespace).items:
        app = (pod.metadata.labels or {}).get("app.kubernetes.io/name")
        if app not in ("patchbay", "patchbay-agent") or pod.spec.node_name != node or not pod.status.pod_ip:
            continue
        ports = [p.container_port for c in pod.spec.containers for p in c.ports or [] if p.name == "metrics"]
        if not ports or pod.metadata.deletion_timestamp:
            continue
        host = "127.0.0.1" if pod.spec.host_network else pod.status.pod_ip
        labels = {"namespace": pod.metadata.namespace, "pod": pod.metadata.name, "instance_node": node}
        out.append({"targets": [f"{host}:{ports[0]}"], "labels": labels})
    return out


def scrape_config(workdir: Path) -> dict[str, Any]:
    """docs/observability.md's job, with its discovery given as a file: Debian's prometheus is
    built without Kubernetes service discovery (its config parser refuses
    ``kubernetes_sd_configs``), so the test lists the pods itself (`sd_targets`) with the labels the
    documented relabel rules produce; the documented config is still read, and its keep rule's
    regex is the one `sd_targets` applies."""
    documented = yaml.safe_load(_documented_config())["scrape_configs"][0]
    keep = documented["relabel_configs"][0]
    assert keep["action"] == "keep" and keep["regex"] == "(patchbay|patchbay-agent);metrics", keep
    return {
        "job_name": documented["job_name"],
        "file_sd_configs": [{"files": [str(workdir / "targets.json")]}],
    }


def _documented_config() -> str:
    """The first ```yaml block of docs/observability.md after its scrape-config heading."""
    text = (REPO / "docs" / "observability.md").read_text()
    section = text[text.index("## Metrics and the scrape config") :]
    start = section.index("```yaml") + len("```yaml")
    return section[start : section.index("```", start)]


@pytest.fixture
def prometheus(patchbay: Installed, real_node: str, bin_dir: Path, tmp_path: Path) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "prometheus is missing: `make setup` installs Debian's prometheus (hack/host-packages.sh)"
        )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rendered_rules(bin_dir, tmp_path))],
        "scrape_configs": [scrape_config(tmp_path)],
    }
    (tmp_path / "targets.json").write_text(json.dumps(sd_targets(patchbay, real_node)))
    prom = Prometheus(binary, tmp_path, config)
    prom.refresh = lambda: (tmp_path / "targets.json").write_text(json.dumps(sd_targets(patchbay, real_node)))
    try:
        wait_for("prometheus ready", prom.ready, 60)
        yield prom
    finally:
        prom.stop()


def test_a_vanished_device_fires_the_alert_and_its_return_resolves_it_and_the_dashboard_has_data(
    prometheus: Prometheus,
    patchbay: Installed,
    cluster: Cluster,
    real_node: str,
    namespace: str,
    fake_dev: Path,
) -> None:
    name, resource = serial_profile(cluster, fake_dev, real_node)
    try:
        (agent,) = wait_for("the agent pod Ready", lambda: patchbay.ready_agents(name), 120)

        def up() -> list[dict[str, Any]] | None:
            prometheus.refresh()  # the file discovery: new pods (prometheus reloads it on change)
            targets = prometheus.get("/api/v1/targets")["activeTargets"]
            healthy = [t for t in targets if t["health"] == "up"]
            pods = {t["labels"].get("pod") for t in healthy}
            operator = {p.metadata.name for p in patchbay.operator_pods()}
            return healthy if agent.metadata.name in pods and operator & pods else None

        targets = wait_for("the operator and the agent scraped (targets up)", up, 90)
        agent_target = next(t for t in targets if t["labels"]["pod"] == agent.metadata.name)
        assert agent_target["scrapeUrl"].startswith(f"http://{agent.status.pod_ip}:9464/"), agent_target

        # A pod takes a device (the dashboard's allocation panels then have data).
        pod = limits(busybox_pod("holder", real_node, "sleep 3600"), resource, 1)
        cluster.core.create_namespaced_pod(namespace, pod)
        # The agent exports the total (holders' names stay off its open port by default); the
        # scrape's own namespace/pod labels are the agent's, which the dashboard joins on.
        (held,) = wait_for(
            "the allocation in Prometheus",
            lambda: [
                r
                for r in prometheus.query(f'patchbay_agent_allocated_devices{{pod="{agent.metadata.name}"}}')
                if r["value"][1] == "1"
            ],
            90,
        )
        assert not {"exported_pod", "holder_pod"} & set(held["metric"]), held
        healthy = wait_for(
            "every device healthy in Prometheus",
            lambda: (
                (r := prometheus.query(f'patchbay_agent_device_healthy{{pod="{agent.metadata.name}"}}'))
                and all(s["value"][1] == "1" for s in r)
                and r
            ),
            60,
        )
        assert len(healthy) == 4, healthy

        victim = sorted(fake_dev.iterdir())[-1]
        vanished = time.monotonic()
        victim.unlink()

        def firing() -> list[dict[str, Any]]:
            return [
                a for a in prometheus.alerts(ALERT, "firing") if a["labels"]["device"].endswith(victim.name)
            ]

        (alert,) = wait_for(f"{ALERT} firing for {victim.name}", firing, 90, 0.2)
        fired = time.monotonic() - vanished
        assert alert["labels"]["node"] == real_node and alert["labels"]["resource"] == resource, alert
        assert victim.name in alert["annotations"]["summary"], alert

        # Every query of the chart's dashboard, while a device is unhealthy and a pod holds one.
        exprs = [
            t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets") or []
        ]
        assert exprs
        time.sleep(3)  # two scrapes at least, for the rate() panels
        empty = [e for e in exprs if not prometheus.query(e)]
        assert set(empty) <= set(EMPTY_HERE), f"dashboard queries without data: {empty}"

        add_fake_device(fake_dev, victim.name)
        returned = time.monotonic()
        wait_for(
            f"{ALERT} resolved",
            lambda: (
                not firing()
                and not [
                    a for a in prometheus.alerts(ALERT, "pending") if victim.name in a["labels"]["device"]
                ]
            ),
            90,
            0.2,
        )
        resolved = time.monotonic() - returned
        print(
            f"\n{ALERT} (for: 2s; scrape and evaluation every 1s): vanish -> firing {fired:.1f}s, "
            f"return -> resolved {resolved:.1f}s; dashboard: {len(exprs) - len(empty)} of {len(exprs)} "
            f"queries returned series, empty: {[EMPTY_HERE[e] for e in empty]}"
        )
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})
