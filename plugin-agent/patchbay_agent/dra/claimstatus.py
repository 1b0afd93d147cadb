"""DRA mode: what each prepared device is, in its ResourceClaim's `status.devices` (KEP-4817).

A claim's allocation names a device (`driver/pool/device`) and nothing else; users, dashboards
and other controllers then ask the node what they got. The claim status API (GA in 1.37, beta and
on since 1.33, docs/dra.md#claim-status) lets the driver say it in the claim itself, one entry per
allocated device:

* conditions `Ready` (the device was prepared on the node; CDI device named in the message) and
  `Healthy` (the agent's health of the device now, with the same reason as its ResourceSlice
  taint and the DeviceReport);
* `data`: the physical device ID, its device files on the node and in the container, and the CDI
  device name.

Rules this module keeps:

* never on the prepare path: the kubelet's NodePrepareResources is answered first; the status is
  written by a background task, the one change-writer loop (`changewriter.py`; a claim whose
  status cannot be written is still prepared), and only once prepare calls have been quiet for a
  moment (`kubelet.draplugin.CallActivity.quiet`: a burst of pod starts is not slowed by its own status
  writes);
* server-side apply on the `status` subresource with a field manager of our driver, so entries of
  other drivers in the same claim are never touched, and applying no entry (after unprepare)
  removes exactly ours; the claim's UID is in the applied object, so a claim deleted and
  created again under the same name is never written;
* health changes of a prepared device are written again (each claim once per change, coalesced);
* write failures retry with backoff, except those that cannot heal by retrying (the claim is gone
  or replaced: 404/409; a refusal: 403/422, logged once per claim with the API server's words).

* which claims are prepared here is kept in one small file per claim beside the driver's lock
  file (`claim-<uid>.json`: namespace, name, devices), so a NEW agent (a rollout, a crash) keeps
  the status of claims an earlier one prepared true: the kubelet does not prepare a running pod's
  claims again (docs/dra.md#claim-status).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from patchbay_agent.backoff import Backoff
from patchbay_agent.changewriter import ChangeWriter
from patchbay_agent.constants import DRA_GROUP_VERSION
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.dra.claims import check_claim_uid
from patchbay_agent.metrics import Metrics

log = logging.getLogger(__name__)

#: At most this many bytes of a condition message (the API allows 32 KiB; ours are short).
_MAX_MESSAGE = 1024


class ClaimStatusClient(Protocol):
    """What writing claim status needs of the API (synchronous; `kubeclient.KubeClient`)."""

    def apply_claim_status(self, doc: Mapping[str, Any], field_manager: str) -> None:
        """Server-side apply of `doc` to the claim's `status` subresource; raise on failure
        (`kubeclient.ApiError` with the HTTP status)."""


@dataclass(frozen=True)
class PreparedClaim:
    """A claim prepared on this node: which of its devices are ours, and since when."""

    namespace: str
    name: str
    uid: str
    #: (slice device name, physical device ID, CDI device name, share ID or "") per allocated
    #: device of ours
    devices: tuple[tuple[str, str, str, str], ...]
    #: RFC 3339 time of the (first) prepare: the Ready condition's lastTransitionTime
    prepared_at: str


def field_manager(driver: str) -> str:
    """One field manager per driver (at most 9 + 63 characters; the API allows 128)."""
    return f"patchbay-{driver}"


def rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_document(
    driver: str, pool: str, claim: PreparedClaim | None, ref: tuple[str, str, str], snap: Snapshot
) -> dict[str, Any]:
    """The object to apply: `ref` is (namespace, name, uid); `claim` None applies no entry (all
    of ours removed)."""
    namespace, name, uid = ref
    return {
        "apiVersion": DRA_GROUP_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "status": {
            "devices": [] if claim is None else [_entry(driver, pool, claim, d, snap) for d in claim.devices]
        },
    }


def _entry(
    driver: str, pool: str, claim: PreparedClaim, device: tuple[str, str, str, str], snap: Snapshot
) -> dict[str, Any]:
    name, physical, cdi, share = device
    st = snap.status_of(physical)
    if physical not in snap.physical:
        health = ("False", "Vanished", "the device is gone from the node")
    elif st is not None and st.healthy:
        health = ("True", "Healthy", "the agent's checks pass")
    else:
        reason = (st.reason if st is not None else "") or "Unhealthy"
        health = ("False", reason, (st.message if st is not None else "") or reason)
    since = rfc3339(st.since) if st is not None and st.since > 0 else claim.prepared_at
    entry: dict[str, Any] = {
        "driver": driver,
        "pool": pool,
        "device": name,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": f"prepared on the node as CDI device {cdi}"[:_MAX_MESSAGE],
                "lastTransitionTime": claim.prepared_at,
            },
            {
                "type": "Healthy",
                "status": health[0],
                "reason": health[1],
                "message": health[2][:_MAX_MESSAGE],
                "lastTransitionTime": since,
            },
        ],
        "data": {
            "id": physical,
            "cdiDevice": cdi,
            "paths": [
                {"host": s.host_path, "container": s.container_path} for s in snap.specs.get(physical, ())
            ],
        },
    }
    if share:
        # A shared device's entry names its share: the API server matches it to the allocation
        # result by driver, pool, device AND shareID.
        entry["shareID"] = share
    return entry


def _health_key(claim: PreparedClaim, snap: Snapshot) -> tuple[Any, ...]:
    """What of a snapshot shows in a claim's status (written again when it changes)."""
    out: list[Any] = []
    for _device, physical, _cdi, _share in claim.devices:
        st = snap.status_of(physical)
        out.append(
            (
                physical in snap.physical,
                st.healthy if st else None,
                st.reason if st else "",
                snap.specs.get(physical),
            )
        )
    return tuple(out)


class ClaimStatusWriter(ChangeWriter):
    """Keeps the `status.devices` entries of the claims prepared here true (see the module doc), on
    the one change-writer loop (`changewriter.py`): a claim prepared, unprepared or with a device
    whose health changed is marked and `notify()`s; `settle()` waits until prepare calls are quiet;
    `sync()` writes every marked claim, and one that failed stays marked for the retry."""

    def __init__(
        self,
        driver: str,
        pool: str,
        client: ClaimStatusClient,
        inventory: Inventory,
        metrics: Metrics,
        *,
        state_dir: Path | None = None,
        backoff: Backoff | None = None,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`state_dir`: where the prepared claims are recorded (None: in memory only). `quiet`:
        awaited before each round of writes (`kubelet.draplugin.CallActivity.quiet`: prepare calls
        first); None: no wait."""
        super().__init__(coalesce=0.0, backoff=backoff or Backoff(initial=0.5, maximum=30.0))
        self.driver = driver
        self.state_dir = state_dir
        self.pool = pool
        self._client = client
        self._inventory = inventory
        self._metrics = metrics
        self._quiet = quiet
        #: claim UID -> the claim while prepared here
        self.claims: dict[str, PreparedClaim] = {}
        #: claim UID -> (namespace, name, uid) of claims whose status must be written
        self._dirty: dict[str, tuple[str, str, str]] = {}
        #: claim UID -> the health key last written
        self._written: dict[str, tuple[Any, ...]] = {}
        #: claim UIDs whose refusal was logged (a warning once per claim, not per retry)
        self._refused: set[str] = set()
        self.what = f"status of the ResourceClaims prepared for {driver}"
        inventory.subscribe(self._on_snapshot)

    def prepared(self, namespace: str, name: str, uid: str, devices: Sequence[tuple[str, ...]]) -> None:
        """A claim was prepared (again: the first time's Ready time is kept). `devices`: (slice
        device name, physical ID, CDI device name[, share ID])."""
        old = self.claims.get(uid)
        at = old.prepared_at if old is not None else rfc3339(datetime.datetime.now(datetime.UTC).timestamp())
        entries = tuple((d[0], d[1], d[2], d[3] if len(d) > 3 else "") for d in devices)
        claim = PreparedClaim(namespace, name, uid, entries, at)
        if old == claim and uid not in self._dirty and uid in self._written:
            return
        self.claims[uid] = claim
        self._mark(uid, (namespace, name, uid))

    def unprepared(self, namespace: str, name: str, uid: str) -> None:
        """A claim was unprepared: our entries go (if the claim is still there)."""
        self.claims.pop(uid, None)
        self._written.pop(uid, None)
        self._mark(uid, (namespace, name, uid))

    def _mark(self, uid: str, ref: tuple[str, str, str]) -> None:
        self._dirty[uid] = ref
        self.notify()

    def _on_snapshot(self, snap: Snapshot) -> None:
        for uid, claim in self.claims.items():
            if uid not in self._dirty and self._written.get(uid) != _health_key(claim, snap):
                self._mark(uid, (claim.namespace, claim.name, uid))

    def _record(self, uid: str) -> Path | None:
        return None if self.state_dir is None else self.state_dir / f"claim-{uid}.json"

    def _save(self, uid: str, claim: PreparedClaim | None) -> None:
        """Record (or forget) a prepared claim: written whole to a temporary name, then renamed."""
        path = self._record(uid)
        if path is None:
            return
        if claim is None:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(claim)))
        os.replace(tmp, path)

    def load(self) -> int:
        """The claims an earlier agent recorded as prepared here: each is written again (its
        devices' health may have changed meanwhile). Returns how many; unreadable records go."""
        if self.state_dir is None or not self.state_dir.is_dir():
            return 0
        n = 0
        for path in self.state_dir.glob("claim-*.json"):
            try:
                raw = json.loads(path.read_text())
                claim = PreparedClaim(
                    str(raw["namespace"]),
                    str(raw["name"]),
                    str(raw["uid"]),
                    # Records of agents before shares have three fields per device.
                    tuple(
                        (str(a), str(b), str(c), str(rest[0]) if rest else "")
                        for a, b, c, *rest in raw["devices"]
                    ),
                    str(raw["prepared_at"]),
                )
                if check_claim_uid(claim.uid) is not None or path.name != f"claim-{claim.uid}.json":
                    raise ValueError("the file does not name its claim's UID")
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("Removing an unreadable record of a prepared claim %s: %s", path, e)
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if claim.uid not in self.claims:
                self.claims[claim.uid] = claim
                self._mark(claim.uid, (claim.namespace, claim.name, claim.uid))
                n += 1
        return n

    async def run(self, stop: asyncio.Event) -> None:
        """Write what is marked until `stop` is set (first: the claims recorded by earlier agents)."""
        loaded = await asyncio.to_thread(self.load)
        if loaded:
            log.info("%d claim(s) prepared by an earlier agent: keeping their status", loaded)
        await super().run(stop)

    async def settle(self, stop: asyncio.Event) -> None:
        """Prepare calls first: wait until they have been quiet for a moment (bounded), instead of
        a fixed coalescing time (see the module doc)."""
        if self._quiet is not None:
            await self._quiet()

    async def sync(self) -> bool:
        """Write every marked claim; True when one was written. A claim whose write failed stays
        marked and the retry is scheduled (`failed()`)."""
        retry = written = False
        for uid, ref in list(self._dirty.items()):
            if self._dirty.get(uid) != ref:
                continue
            del self._dirty[uid]
            if await self._write(uid, ref):
                written = True
            else:
                self._dirty.setdefault(uid, ref)
                retry = True
        if retry:
            self.failed()
        else:
            self.succeeded()
        return written

    async def _write(self, uid: str, ref: tuple[str, str, str]) -> bool:
        """One apply; False when it should be retried."""
        from patchbay_agent.kubeclient import ApiError  # imported with the client, in DRA mode only

        snap = self._inventory.current
        claim = self.claims.get(uid)
        try:
            await asyncio.to_thread(self._save, uid, claim)
        except OSError as e:
            log.warning("Cannot record prepared claim %s: %s", uid, e)  # the status is still written
        doc = status_document(self.driver, self.pool, claim, ref, snap)
        try:
            await asyncio.to_thread(self._client.apply_claim_status, doc, field_manager(self.driver))
        except ApiError as e:
            replaced = e.status == 409 or (e.status == 422 and "metadata.uid" in str(e))
            if e.status == 404 or replaced or (claim is None and e.status in (403, 422)):
                # Gone, or replaced by a claim of the same name (the UID differs), or (removing
                # ours) no longer allocated: nothing to do.
                self._metrics.claim_status_writes.labels("gone").inc()
                self.claims.pop(uid, None)
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(self._save, uid, None)
                return True
            if e.status in (403, 422):
                self._metrics.claim_status_writes.labels("refused").inc()
                if uid not in self._refused:
                    self._refused.add(uid)
                    log.warning(
                        "Cannot write the status of ResourceClaim %s/%s (HTTP %d: %s)%s",
                        ref[0],
                        ref[1],
                        e.status,
                        e,
                        "; the agent's ServiceAccount needs patch on resourceclaims/status and, "
                        "from Kubernetes 1.36, associated-node:patch on resourceclaims/driver"
                        if e.status == 403
                        else "",
                    )
                return e.status == 422  # a refusal of what we wrote: retrying writes it again
            self._metrics.claim_status_writes.labels("error").inc()
            log.warning("Writing the status of ResourceClaim %s/%s failed: %s; retrying", ref[0], ref[1], e)
            return False
        except Exception as e:
            self._metrics.claim_status_writes.labels("error").inc()
            log.warning("Writing the status of ResourceClaim %s/%s failed: %s; retrying", ref[0], ref[1], e)
            return False
        self._metrics.claim_status_writes.labels("success").inc()
        self.writes += 1
        self._refused.discard(uid)
        if claim is not None:
            self._written[uid] = _health_key(claim, snap)
        return True
