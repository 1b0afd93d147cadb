"""The kubelet Device Plugin API v1beta1: `api.proto` and the stubs grpcio-tools generates from it.

Regenerate with `make generate`; `make verify` fails when the stubs are stale.
"""
