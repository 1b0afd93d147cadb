"""The DeviceReport's flags on `patchbay-agent` as a process: every one in --help, errors that name
the flag (exit 2, no traceback), and an agent without --profile that never loads the API client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

AGENT = [sys.executable, "-m", "patchbay_agent.main"]
REPORT_FLAGS = (
    "--profile",
    "--report-namespace",
    "--pod-name",
    "--pod-resources-socket",
    "--pod-resources-period",
    "--kubeconfig",
)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("POD_NAMESPACE", "POD_NAME")}
    base.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [*AGENT, *args], capture_output=True, text=True, timeout=30, check=False, env={**base, **(env or {})}
    )


@pytest.fixture
def config(short_dir: Path) -> Path:
    path = short_dir / "c.yaml"
    path.write_text(
        yaml.safe_dump({"resourceName": "example.com/x", "plugin": {"discovery": {"virtual": {"count": 1}}}})
    )
    return path


def test_help_explains_the_report_flags() -> None:
    out = _run("--help", env={"COLUMNS": "200"})  # paths unbroken
    assert out.returncode == 0
    for flag in REPORT_FLAGS:
        assert flag in out.stdout
    text = " ".join(out.stdout.split())
    assert "/var/lib/kubelet/pod-resources/kubelet.sock" in text
    assert "$POD_NAMESPACE" in text
    assert "$POD_NAME" in text
    assert "/var/run/secrets/kubernetes.io/serviceaccount/" in text


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--profile", "serial"], {}, "--report-namespace"),
        (["--profile", "serial"], {"POD_NAMESPACE": "Not_A_Namespace"}, "$POD_NAMESPACE"),
        (["--profile", "Serial_1", "--report-namespace", "ns"], {}, "argument --profile"),
        (["--profile", "serial", "--report-namespace", "-ns"], {}, "argument --report-namespace"),
        (
            ["--profile", "serial", "--report-namespace", "ns", "--pod-resources-period", "0"],
            {},
            "--pod-resources-period",
        ),
        (
            ["--profile", "serial", "--report-namespace", "ns", "--pod-resources-period", "x"],
            {},
            "--pod-resources-period",
        ),
        (
            ["--profile", "p" * 63, "--report-namespace", "ns", "--node-name", "n" * 200],
            {},
            "--profile and --node-name",
        ),
    ],
)
def test_flag_errors_exit_2_naming_the_flag(
    config: Path, args: list[str], env: dict[str, str], names: str
) -> None:
    if "--node-name" not in args:
        args = [*args, "--node-name", "n1"]
    out = _run("--config", str(config), "--http-address", "off", *args, env=env)
    assert out.returncode == 2, out.stderr
    assert names in out.stderr
    assert "Traceback" not in out.stderr


def test_no_way_to_the_api_server_exits_2_naming_kubeconfig(config: Path, short_dir: Path) -> None:
    common = ["--config", str(config), "--node-name", "n1", "--http-address", "off", "--profile", "serial"]
    missing = _run(*common, "--kubeconfig", str(short_dir / "absent"), env={"POD_NAMESPACE": "patchbay"})
    assert missing.returncode == 2
    assert f"--kubeconfig {short_dir / 'absent'}" in missing.stderr
    assert "Traceback" not in missing.stderr
    # Not in a pod, and no --kubeconfig.
    outside = _run(*common, "--report-namespace", "patchbay")
    assert outside.returncode == 2
    assert "pass --kubeconfig FILE" in outside.stderr
    assert "Traceback" not in outside.stderr


def test_an_agent_without_profile_never_imports_the_api_client(short_dir: Path) -> None:
    """Its modules and a constructed ResourceAgent: not the API client (nor http.client under it),
    nor the report's own modules (their memory is the report's price)."""
    code = f"""
import sys
from pathlib import Path
from patchbay_agent import main
from patchbay_agent.options import AgentOptions
from patchbay_agent.resourceagent import ResourceAgent
from patchbay_agent.config import parse
ResourceAgent(
    parse({{"resourceName": "example.com/x", "plugin": {{"discovery": {{"virtual": {{"count": 1}}}}}}}}),
    AgentOptions(node_name="n", plugin_dir=Path({str(short_dir)!r}), host_root=Path("/")),
)
print(sorted(m for m in (
    "http.client", "kubernetes", "patchbay_agent.kubeclient", "patchbay_agent.kubeconfig",
    "patchbay_agent.core.holders", "patchbay_agent.report.reporter",
) if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "[]"


def test_report_flags_without_profile_are_ignored_with_a_warning(config: Path, short_dir: Path) -> None:
    """The agent starts as without them (here it fails later, on purpose, for a fast exit)."""
    plugin_dir = short_dir / "dp"
    plugin_dir.mkdir()
    (plugin_dir / "not-a-dir").write_text("")
    out = _run(
        "--config",
        str(config),
        "--node-name",
        "n1",
        "--http-address",
        "off",
        "--device-plugin-dir",
        str(plugin_dir / "not-a-dir"),
        "--kubeconfig",
        str(short_dir / "absent"),
        "--pod-resources-period",
        "3",
    )
    assert "--kubeconfig, --pod-resources-period ignored: there is no report without --profile" in out.stderr
    assert "--kubeconfig /" not in out.stderr  # no attempt to use it


def test_an_agent_with_a_report_is_given_its_api_client(short_dir: Path) -> None:
    """The command or the node agent builds the one API client and hands it in; a ResourceAgent
    asked for a report without one refuses, rather than building a second client of its own."""
    from patchbay_agent.config import parse
    from patchbay_agent.options import AgentOptions, ReportOptions
    from patchbay_agent.resourceagent import ResourceAgent

    options = AgentOptions(
        node_name="n",
        plugin_dir=short_dir,
        host_root=Path("/"),
        report=ReportOptions("serial", "patchbay", pod_resources_socket=short_dir / "absent.sock"),
    )
    with pytest.raises(ValueError, match="needs an API client"):
        ResourceAgent(
            parse({"resourceName": "example.com/x", "plugin": {"discovery": {"virtual": {"count": 1}}}}),
            options,
        )
