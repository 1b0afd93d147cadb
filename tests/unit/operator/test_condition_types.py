"""The condition types the operator writes are exactly those the CRD allows (an enum in its status
schema): a type added on one side only is refused by the API server, or never mapped by the Argo
CD health check (tests/conformance/test_gitops_health.py holds the check to the CRD)."""

from __future__ import annotations

from pathlib import Path

import yaml

from patchbay_operator.constants import ConditionType

CRD = Path(__file__).resolve().parents[3] / "crds" / "patchbay.dev_devicepluginprofiles.yaml"


def test_the_operator_writes_exactly_the_condition_types_the_crd_allows() -> None:
    crd = yaml.safe_load(CRD.read_text())
    for version in crd["spec"]["versions"]:
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        allowed = status["conditions"]["items"]["properties"]["type"]["enum"]
        assert sorted(allowed) == sorted(t.value for t in ConditionType), version["name"]
