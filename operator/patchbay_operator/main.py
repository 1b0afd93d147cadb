"""``patchbay-operator``: parse the settings, configure logging, run kopf cluster-wide."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import kopf

from patchbay_operator.config import ConfigError, Settings, load
from patchbay_operator.kube import Kube, KubeError, load_configuration


class _QuietEventHandlers(logging.Filter):
    """Drop kopf's per-event "Handler 'nodes' succeeded." lines: one per node heartbeat is noise
    (and measurable CPU at thousands of nodes); failures are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (
            msg.startswith("Handler '") and msg.endswith("' succeeded.") and record.levelno <= logging.INFO
        )


def prepare_peering(settings: Settings) -> None:
    kube = Kube(load_configuration(settings.kubeconfig, 1))
    try:
        assert settings.peering is not None
        kube.ensure_cluster_peering(settings.peering)
    finally:
        kube.close()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load(argv)
    except ConfigError as e:
        print(f"patchbay-operator: {e}", file=sys.stderr)
        return 2
    kopf.configure(
        verbose=settings.verbose,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger("kopf.objects").addFilter(_QuietEventHandlers())
    if settings.kubeconfig:
        # kopf logs in on its own (not through kube.py); both read the same file this way.
        os.environ["KUBECONFIG"] = settings.kubeconfig
    if settings.peering:
        try:
            prepare_peering(settings)
        except (KubeError, OSError) as e:
            print(
                f"patchbay-operator: --peering {settings.peering}: cannot create the ClusterKopfPeering "
                f"object (is crds/kopf.dev_clusterkopfpeerings.yaml applied?): {e}",
                file=sys.stderr,
            )
            return 2
    from patchbay_operator import handlers  # noqa: F401 - importing registers the handlers

    kopf.run(
        clusterwide=True,
        standalone=settings.peering is None,
        peering_name=settings.peering,
        priority=settings.priority,
        liveness_endpoint=settings.liveness,
        memo=kopf.Memo(settings=settings),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
