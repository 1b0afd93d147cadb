"""Patchbay's API as its programs read it: one small, pure package, the standard library only.

The operator, the agent and the kubectl plugin import it and never each other (import-linter):
``constants`` (the API's names, label and annotation keys, condition types and reasons),
``selectors`` (label selectors and node selector terms, with the API server's semantics),
``quantity`` (``resource.Quantity`` strings), ``agentpods`` (why an agent pod does not work) and
``models`` (the profile and the DeviceReport as typed dictionaries, checked against ``crds/``).
Nothing here does I/O or imports a third-party package: the agent runs on every node.
"""
