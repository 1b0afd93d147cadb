"""``patchbay-operator``: parse the settings, configure logging, run kopf cluster-wide."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Sequence

import kopf

from patchbay_operator.config import ConfigError, Settings, load
from patchbay_operator.kube import Kube, KubeError, load_configuration


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

    # Our own identity for kopf's peering record, so the controller can tell its own record
    # from the other replicas' (peering.py): host name, PID and a random part, like kopf's.
    identity = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    kopf.run(
        clusterwide=True,
        standalone=settings.peering is None,
        peering_name=settings.peering,
        priority=settings.priority,
        identity=identity,  # type: ignore[arg-type]  # kopf.Identity, a NewType of str, is not exported
        liveness_endpoint=settings.liveness,
        memo=kopf.Memo(settings=settings, identity=identity),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
