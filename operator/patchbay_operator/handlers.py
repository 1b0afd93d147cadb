"""Every kopf decorator, and nothing else: each handler is a thin call into the controller,
which hands a profile on to reconcile.py.

kopf handles profiles only: the usual level-based resume/create/update reconcile and a delete
handler behind kopf's finalizer. Nodes are not kopf's at all: the controller's own informer
watches them (informer.py), so kopf never puts a finalizer or an annotation on a Node, never
indexes thousands of them (super-linear; docs/facts.md#kopf-on-nodes) and never spends its
per-event machinery on node heartbeats.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, cast

import kopf

from patchbay_operator import metrics
from patchbay_operator.config import Settings
from patchbay_operator.constants import (
    API_GROUP,
    API_VERSION,
    FINALIZER,
    KOPF_STORAGE_PREFIX,
    PLURAL,
)
from patchbay_operator.controller import Controller
from patchbay_operator.kube import Kube, KubeError, in_cluster_server, load_configuration
from patchbay_operator.peering import Peering, StandingByError
from patchbay_operator.reconcile import CleanupPendingError

log = logging.getLogger(__name__)


def _ctl(memo: kopf.Memo) -> Controller:
    return cast(Controller, memo["controller"])


@kopf.on.login(id="login")
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own in-cluster or kubeconfig login, so it never guesses between client libraries.

    In a pod, kopf's service-account login always dials ``https://kubernetes.default.svc``; we
    dial what the kubelet (or the chart's ``apiServer`` value) announces in
    ``KUBERNETES_SERVICE_HOST``/``PORT``, as the official client (kube.py) and client-go do, so
    both of the operator's clients talk to the same server and no cluster DNS is needed.
    """
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
    server = in_cluster_server()
    if info is not None and server is not None:
        return dataclasses.replace(info, server=server)
    return info or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup(id="startup")
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = cast(Settings, memo["settings"])
    # kopf's finalizer and bookkeeping under our own domain, on profiles only (never on nodes).
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_STORAGE_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_STORAGE_PREFIX, key="last-handled-configuration"
    )
    # Handler successes are logged, not posted: an Event per reconcile is noise in the cluster.
    settings.posting.level = logging.WARNING
    # The liveness probe (`loops`) runs every probe period: its successes are not news.
    logging.getLogger("kopf.activities.probe").setLevel(logging.WARNING)
    settings.networking.request_timeout = 60.0
    # An unexpected handler error is retried after this long (kopf's default is 60 s): an API
    # hiccup should not leave a profile unapplied for a minute.
    settings.execution.default_backoff = 5.0
    # How soon a standby takes over a leader that died without a clean exit (config.py): kopf
    # starts its keep-alives after this handler, so they carry this lifetime from the first.
    settings.peering.lifetime = ours.peering_lifetime
    peer = None
    if ours.peering is not None:
        peer = Peering(ours.peering, cast(str, memo["identity"]), ours.priority)
    # One connection per patch worker, plus the node informer's long-lived watch.
    ctl = Controller(ours, Kube(load_configuration(ours.kubeconfig, ours.concurrency + 1)), peer)
    await ctl.start()
    await ctl.agents.unused_shared()  # no profile handler applies it when no profile uses it
    memo["controller"] = ctl
    if ours.metrics_address is not None:
        metrics.serve(ours.metrics_address, ctl.stats)
        log.info("Serving /metrics on %s:%d", *ours.metrics_address)


@kopf.on.probe(id="loops")
def loops(memo: kopf.Memo, **_: Any) -> int:
    """The liveness probe (``/healthz``) fails while one of the operator's own loops has ended with
    an error (``scheduler.Loops``): a restart beats an operator that is up and does nothing."""
    ctl = memo.get("controller")
    if not isinstance(ctl, Controller):
        return 0  # still starting: the startup probe's business
    if ctl.loops.failed:
        raise kopf.PermanentError(f"the operator's loop(s) ended: {', '.join(ctl.loops.failed)}")
    return ctl.loops.running()


@kopf.on.cleanup(id="cleanup")
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    ctl = memo.get("controller")
    if isinstance(ctl, Controller):
        await ctl.stop()


@kopf.on.resume(API_GROUP, API_VERSION, PLURAL, id="reconcile")
@kopf.on.create(API_GROUP, API_VERSION, PLURAL, id="reconcile")
@kopf.on.update(API_GROUP, API_VERSION, PLURAL, field="spec", id="reconcile")
async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Level-based and idempotent: the same spec gives the same nodes and objects."""
    try:
        await _ctl(memo).reconcile(body)
    except StandingByError as e:
        raise kopf.TemporaryError(str(e), delay=5) from e
    except KubeError as e:
        raise kopf.TemporaryError(f"API request failed, retrying: {e}", delay=5) from e


@kopf.on.delete(API_GROUP, API_VERSION, PLURAL, id="release")
async def release(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Remove the agents and every node value this profile set; promote the next in line."""
    try:
        await _ctl(memo).delete(body)
    except StandingByError as e:
        raise kopf.TemporaryError(str(e), delay=5) from e
    except CleanupPendingError as e:
        raise kopf.TemporaryError(str(e), delay=2) from e
    except KubeError as e:
        raise kopf.TemporaryError(f"API request failed, retrying: {e}", delay=5) from e
