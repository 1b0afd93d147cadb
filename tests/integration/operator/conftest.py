"""The operator fixtures (the CRD, the operator subprocess, the Cluster helper) live in
tests/conftest.py, shared with the e2e tests on the real node: one operator per session."""
