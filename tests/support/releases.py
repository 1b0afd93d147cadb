"""The Kubernetes release a test session runs on, and skips for capabilities it lacks.

The release comes from the binaries the session runs (``PATCHBAY_KUBE_BIN``), never from a
version string in a test. A check that needs a capability calls ``require(capability, release)``:
on a release before the capability's first one (``patchbay_devcluster.releases.CAPABILITIES``,
the same table docs/compatibility.md shows) it skips, naming the release and the reason; on every
other release it runs. A skip is reported as a skip, never as a pass.
"""

from __future__ import annotations

import pytest

from patchbay_devcluster.releases import CAPABILITIES, matrix, minor


def require(capability: str, release: str) -> None:
    """Skip the calling test when ``release`` lacks ``capability``."""
    cap = CAPABILITIES[capability]
    if not cap.present(release):
        pytest.skip(
            f"Kubernetes {release} lacks {capability} (since {cap.since}): {cap.without} "
            "(docs/compatibility.md)"
        )


def has(capability: str, release: str) -> bool:
    """Whether the session's release has ``capability`` (for checks that differ, not skip)."""
    return CAPABILITIES[capability].present(release)


def newest(release: str) -> bool:
    """Whether ``release`` is the newest of the support matrix (what ``make test`` runs): a test
    that scales a long run down on the older releases (CI's test-oldest) keeps it whole there."""
    return minor(release) >= minor(matrix()[-1])
