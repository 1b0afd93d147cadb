"""Bad input, tried: the DRA agent's kubelet plugin service (NodePrepareResources and
NodeUnprepareResources over a real Unix socket), with the claims it is asked for shaped at random
in the stand-in API server (tests/support/draapi.py): missing or mistyped allocation results,
other drivers and pools, unknown and odd device names, huge and odd claim names, replaced claims
(another UID under the name), and well-formed claims among them.

Every claim gets an answer keyed by its UID, and the call itself never fails (one bad claim must
not fail the others). A claim answered as prepared must be the claim it was asked for: the API
server's object has that UID, the devices are exactly its allocation results of the agent's
driver and pool (request, pool, device), each CDI device ID names the claim's UID and is in the
claim's CDI spec file. A plainly good claim (valid names, a UUID, allocated, every result of ours
a device of the node) must be prepared. Unprepare succeeds for every claim whose UID can be a
Kubernetes UID, prepared or not (docs/dra.md#prepare: the kubelet may unprepare a claim this
agent never prepared, or prepared before a restart; absent is fine), and afterwards the claim's
CDI spec and its copy are gone.

The last test runs the same fuzzer against claim preparers broken on purpose (each the agent's
own `ClaimPreparer`, built through its constructor with the agent's inventory, with one thing
wrong, served by a `DraPlugin` of its own) and sees each judge fail."""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.agentparts import dra_of
from support.agentrun import make_config
from support.draapi import InMemoryApi
from support.fuzzing import NODE, PROVE, LoopThread, fuzzed_agent_options, tally

from patchbay_agent.api import dra_v1_pb2, dra_v1_pb2_grpc
from patchbay_agent.config import Allocation
from patchbay_agent.core.inventory import Inventory
from patchbay_agent.dra.preparer import ClaimPreparer
from patchbay_agent.dra.slices import device_name
from patchbay_agent.kubelet.draplugin import ClaimRef, ClaimResult, DraPlugin, service_dir
from patchbay_agent.metrics import Metrics
from patchbay_agent.options import DraOptions
from patchbay_agent.resourceagent import ResourceAgent
from patchbay_devcluster.poll import poll_until

DRIVER = "fuzz.patchbay.dev"
NAMES = [device_name(f"ttyUSB{i}") for i in range(4)]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
Claim = tuple[tuple[str, str, str], Any]


class _Api(InMemoryApi):
    """The stand-in API server, which also takes the claims' status writes (counted), so that
    the agent's status writer does not retry them in the background (with random jitter, which
    Hypothesis warns about while it draws)."""

    def __init__(self) -> None:
        super().__init__()
        self.status_writes = 0

    def apply_claim_status(self, doc: Mapping[str, Any], field_manager: str) -> None:
        self.status_writes += 1


class Target(NamedTuple):
    """A DRA service to fuzz and where its answers can be checked."""

    stub: dra_v1_pb2_grpc.DRAPluginStub
    api: InMemoryApi
    #: the CDI spec directory the runtime reads
    cdi: Path
    #: where the agent keeps a copy of each claim's spec (None: no copies)
    copies: Path | None


class Dra(NamedTuple):
    target: Target
    inventory: Inventory
    dir: Path


@pytest.fixture(scope="module")
def dra(loop_thread: LoopThread, module_dir: Path) -> Iterator[Dra]:
    api = _Api()
    options = fuzzed_agent_options(
        module_dir,
        serials=4,
        cdi_spec_dir=module_dir / "cdi",
        dra=DraOptions(DRIVER, module_dir / "k"),
    )
    config = make_config({"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}})
    with loop_thread.agent(lambda: ResourceAgent(config, options, client=api)) as agent:
        dra_of(agent)  # a DRA agent (asserts it)
        channel = grpc.insecure_channel(f"unix://{dra_of(agent).service_socket}")
        copies = service_dir(module_dir / "k", DRIVER) / "cdi"
        try:
            yield Dra(
                Target(dra_v1_pb2_grpc.DRAPluginStub(channel), api, module_dir / "cdi", copies),
                agent.inventory,
                module_dir,
            )
        finally:
            channel.close()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_result = st.fixed_dictionaries(
    {},
    optional={
        "request": st.one_of(st.text(max_size=30), _json),
        "driver": st.one_of(st.just(DRIVER), st.text(max_size=30), _json),
        "pool": st.one_of(st.just(NODE), st.text(max_size=30), _json),
        "device": st.one_of(st.sampled_from(NAMES), st.text(max_size=70), _json),
        "adminAccess": st.one_of(st.booleans(), _json),
    },
)
#: A result as the scheduler writes it: a request name, and a device of this node, of another
#: driver or of another pool.
_request_name = st.sampled_from(["r", "gpu", "gpu/fast", "a-1"])
_well_formed_result = st.fixed_dictionaries(
    {
        "request": _request_name,
        "driver": st.sampled_from([DRIVER, DRIVER, "other.example.com"]),
        "pool": st.sampled_from([NODE, NODE, "node-2"]),
        "device": st.sampled_from(NAMES),
    }
)


def _claim_doc(uid: str, results: Any, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, **(extra or {})},
        "status": {"allocation": {"devices": {"results": results}}},
    }


_doc = st.one_of(
    _json,
    st.builds(
        _claim_doc,
        st.text(max_size=40),
        st.one_of(st.lists(st.one_of(_result, _well_formed_result), max_size=5), _json),
        st.dictionaries(st.text(max_size=10), _json, max_size=2),
    ),
    st.builds(_claim_doc, st.just(""), st.lists(_well_formed_result, min_size=1, max_size=3)),
)
_label = st.text(alphabet="abcxyz0189", min_size=1, max_size=12)
_ref = st.tuples(
    st.one_of(_label, _label, st.text(max_size=63)),
    st.one_of(_label, _label, st.text(max_size=253)),
    st.one_of(st.uuids().map(str), st.uuids().map(str), st.text(max_size=40)),
)


@st.composite
def _claims(draw: st.DrawFn) -> list[Claim]:
    """1 to 4 claims, each under its own UID, with what the API server holds under its name: the
    claim the kubelet means (its UID), or another object (replaced, or not a claim at all)."""
    drawn = draw(
        st.lists(
            st.tuples(_ref, _doc, st.sampled_from([True, True, False])),
            min_size=1,
            max_size=4,
            unique_by=lambda c: c[0][2],
        )
    )
    claims = []
    for ref, doc, matching in drawn:
        if matching and isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
            doc["metadata"]["uid"] = ref[2]  # the claim the kubelet means: its results decide
        claims.append((ref, doc))
    return claims


@st.composite
def _good_claims(draw: st.DrawFn, *, replaced: bool = False) -> list[Claim]:
    """1 to 4 plainly good claims (valid names, a UUID, allocated devices of the node and maybe
    of other drivers and pools); `replaced`: the API server holds another UID under each name."""
    claims = []
    for i in range(draw(st.integers(min_value=1, max_value=4))):
        uid = str(draw(st.uuids()))
        results = draw(st.lists(_well_formed_result, min_size=1, max_size=3))
        held = str(draw(st.uuids())) if replaced else uid
        claims.append((("ns", f"claim-{i}", uid), _claim_doc(held, results)))
    return claims


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL.pattern}(\.{_DNS_LABEL.pattern})*")
_REQUEST = re.compile(rf"{_DNS_LABEL.pattern}(/{_DNS_LABEL.pattern})?")
#: What the agent takes for a claim UID (docs/dra.md#prepare: letters, digits, '.', '-', '_';
#: at most 128; it names a file): the kubelet only ever sends the API server's UUIDs.
_CLAIM_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _may_be_uid(uid: str) -> bool:
    return bool(_CLAIM_UID.fullmatch(uid)) and ".." not in uid


def _is_uuid(uid: str) -> bool:
    try:
        return str(uuid.UUID(uid)) == uid
    except ValueError:
        return False


def _get(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _ours(doc: Any) -> list[Mapping[str, Any]] | None:
    """The claim's allocation results of the agent's driver and pool; None when its results are
    not a list of objects."""
    results = _get(doc, "status", "allocation", "devices", "results") or []  # absent or empty: none
    if not isinstance(results, list) or not all(isinstance(r, Mapping) for r in results):
        return None
    return [r for r in results if r.get("driver") == DRIVER and r.get("pool") == NODE]


def _plainly_good(ref: tuple[str, str, str], doc: Any) -> bool:
    """The kubelet's claim, well-formed, allocated devices of this node: it must be prepared."""
    namespace, name, uid = ref
    ours = _ours(doc)
    return (
        bool(_DNS_LABEL.fullmatch(namespace))
        and len(name) <= 253
        and bool(_DNS_SUBDOMAIN.fullmatch(name))
        and _is_uuid(uid)
        and _get(doc, "metadata", "uid") == uid
        and isinstance(_get(doc, "status", "allocation"), Mapping)
        and bool(_get(doc, "status", "allocation"))
        and ours is not None
        and all(
            r.get("device") in NAMES
            and isinstance(r.get("request"), str)
            and _REQUEST.fullmatch(r["request"])
            for r in ours
        )
    )


def _spec_path(target: Target, uid: str) -> Path:
    return target.cdi / f"patchbay_{DRIVER}_{uid}.json"


def _prepared_wrong(target: Target, ref: tuple[str, str, str], doc: Any, result: Any) -> str:
    """What is wrong with one claim's prepare answer ("" when nothing)."""
    namespace, name, uid = ref
    where = f"ResourceClaim {namespace[:40]!r}/{name[:40]!r} ({uid[:40]!r})"
    if result.error:
        if len(result.error) >= 4096:
            return f"{where}: an error of {len(result.error)} characters"
        if _plainly_good(ref, doc):
            return f"refused a good claim: {where}: {result.error[:300]}"
        return ""
    held = _get(doc, "metadata", "uid")
    if held != uid:
        return f"prepared a claim whose object has UID {str(held)[:40]!r}, not the UID asked for: {where}"
    ours = _ours(doc)
    want = sorted(
        ([str(r.get("request", "")).split("/", 1)[0]], NODE, str(r.get("device", ""))) for r in ours or []
    )
    got = sorted((list(d.request_names), d.pool_name, d.device_name) for d in result.devices)
    mismatch = "prepared claim does not match the claim it was asked for"
    if ours is None or got != want:
        return (
            f"{mismatch}: {where}: devices {got[:4]!r}, its results of {DRIVER} in pool {NODE}: {want[:4]!r}"
        )
    try:
        spec = json.loads(_spec_path(target, uid).read_text())
        in_spec = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{mismatch}: {where}: prepared, but its CDI spec cannot be read: {e}"
    for d in result.devices:
        own = f"{DRIVER}/device={uid}-{d.device_name}"
        if not d.cdi_device_ids or d.cdi_device_ids[0] != own:
            ids = list(d.cdi_device_ids)
            return f"{mismatch}: {where}: device {d.device_name} has CDI IDs {ids!r}, not {own!r} first"
        if stray := [i for i in d.cdi_device_ids if i not in in_spec]:
            return f"{mismatch}: {where}: CDI IDs {stray!r} are not in the claim's spec file"
    return ""


def _unprepared_wrong(target: Target, uid: str, error: str) -> str:
    """What is wrong with one claim's unprepare answer ("" when nothing): a UID that can be a
    claim's unprepares, whether it was prepared or not, and its spec and the spec's copy go."""
    if not _may_be_uid(uid):
        return ""  # never sent by a kubelet; refusing it (it would name a file) is fine
    if error:
        return f"unprepare of claim {uid!r} failed: {error[:300]}"
    left = [
        p
        for p in (
            _spec_path(target, uid),
            target.copies / _spec_path(target, uid).name if target.copies else None,
        )
        if p is not None and p.exists()
    ]
    if left:
        return f"claim {uid!r} still has its CDI spec after unprepare: {[str(p) for p in left]}"
    return ""


def _fuzz_claims(target: Target, claims: Sequence[Claim], surface: str) -> None:
    target.api.claims.clear()
    for (namespace, name, _), doc in claims:
        target.api.claims[namespace, name] = doc
    refs = [dra_v1_pb2.Claim(namespace=ns, name=name, uid=uid) for (ns, name, uid), _ in claims]
    answer = target.stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=refs), timeout=30)
    assert set(answer.claims) == {uid for (_, _, uid), _ in claims}
    for ref, _ in claims:
        result = answer.claims[ref[2]]
        # What the API server holds under the name now (a later claim of the same name replaced it).
        why = _prepared_wrong(target, ref, target.api.claims[ref[0], ref[1]], result)
        outcome = (
            "error" if result.error else ("prepared" if result.devices else "prepared, no device of ours")
        )
        tally(f"dra NodePrepareResources{surface}", "wrong" if why else outcome)
        assert not why, why
    un = target.stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=refs), timeout=30)
    assert set(un.claims) == {uid for (_, _, uid), _ in claims}
    for ref, _ in claims:
        error = un.claims[ref[2]].error
        why = _unprepared_wrong(target, ref[2], error)
        tally(f"dra NodeUnprepareResources{surface}", "wrong" if why else ("error" if error else "ok"))
        assert not why, why


@FUZZ
@given(claims=_claims())
def test_prepare_and_unprepare(dra: Dra, claims: list[Claim]) -> None:
    _fuzz_claims(dra.target, claims, "")


def test_a_good_claim_still_prepares(dra: Dra) -> None:
    stub, api = dra.target.stub, dra.target.api
    results = [{"request": "r", "driver": DRIVER, "pool": NODE, "device": NAMES[1]}]
    api.claims["ns", "good"] = _claim_doc("u-good", results)
    answer = stub.NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace="ns", name="good", uid="u-good")]
        ),
        timeout=30,
    )
    assert answer.claims["u-good"].error == ""
    assert [d.device_name for d in answer.claims["u-good"].devices] == [NAMES[1]]
    # Its spec (before the answer), and the spec's copy (written after it), which the unprepare
    # judge sees go.
    assert _spec_path(dra.target, "u-good").exists()
    copies = dra.target.copies
    assert copies is not None
    poll_until("the spec's copy", (copies / _spec_path(dra.target, "u-good").name).exists, timeout=10)


class _OutOfOrder(ClaimPreparer):
    """Broken on purpose: each claim answered with the next claim's outcome (as if the answers
    were matched to the claims in the order they were read, not the order asked)."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        results = list((await super().prepare(claims)).values())
        return {c.uid: results[(i + 1) % len(results)] for i, c in enumerate(claims)}


class _NoUidCheck(ClaimPreparer):
    """Broken on purpose: prepares whatever claim the API server holds under the name, whatever
    its UID (a claim deleted and created again gets the old one's answer)."""

    def __init__(self, api: InMemoryApi, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._api = api

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        out = {}
        for c in claims:
            held = _get(self._api.claims.get((c.namespace, c.name)), "metadata", "uid")
            as_held = ClaimRef(
                c.namespace, held if isinstance(held, str) and _may_be_uid(held) else c.uid, c.name
            )
            out[c.uid] = (await super().prepare([as_held]))[as_held.uid]
        return out


class _KeepsSpecs(ClaimPreparer):
    """Broken on purpose: unprepare answers done and deletes nothing."""

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return {c.uid: "" for c in claims}


class _RefusesAll(ClaimPreparer):
    """Broken on purpose: every claim refused."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        return {c.uid: ClaimResult(error="cannot prepare anything today") for c in claims}


class _EveryResultOurs:
    """Broken on purpose, the claim reader (given through `ClaimPreparer`'s constructor): every
    allocation result read as one of the agent's driver and pool."""

    def __init__(self, api: InMemoryApi) -> None:
        self._api = api

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        doc = copy.deepcopy(self._api.resource_claim(namespace, name, timeout=timeout))
        for result in _get(doc, "status", "allocation", "devices", "results") or []:
            result.update(driver=DRIVER, pool=NODE)
        return doc


@pytest.mark.parametrize(
    ("broken", "replaced", "says"),
    [
        ("out of order", False, "does not match the claim it was asked for"),
        ("no UID check", True, "prepared a claim whose object has UID"),
        ("every result ours", False, "does not match the claim it was asked for"),
        ("keeps specs", False, "still has its CDI spec after unprepare"),
        ("refuses all", False, "refused a good claim"),
    ],
)
def test_the_judges_fail_a_broken_preparer(
    dra: Dra, loop_thread: LoopThread, broken: str, replaced: bool, says: str
) -> None:
    """The fuzzer (PROVE, plainly good claims) against the agent's ClaimPreparer with one thing
    broken, served by a DraPlugin of its own: each judge fails with its message. Then the agent
    itself passes three such claims (one of another driver)."""
    api = dra.target.api
    name = broken.replace(" ", "-").lower()
    cdi = dra.dir / f"cdi-{name}"
    kinds: dict[str, Any] = {
        "out of order": (_OutOfOrder, api),
        "no UID check": (lambda *a, **k: _NoUidCheck(api, *a, **k), api),
        "every result ours": (ClaimPreparer, _EveryResultOurs(api)),
        "keeps specs": (_KeepsSpecs, api),
        "refuses all": (_RefusesAll, api),
    }
    make, reader = kinds[broken]
    preparer = make(DRIVER, NODE, reader, dra.inventory, allocation=Allocation(), cdi_spec_dir=cdi)
    plugin = DraPlugin(
        DRIVER,
        dra.dir / "kb",
        re.sub(r"[^a-z0-9]", "", name)[:16],
        preparer,
        Metrics("example.com/fuzz", NODE),
    )
    loop_thread.run(plugin.start())
    channel = grpc.insecure_channel(f"unix://{plugin.service_socket}")
    target = Target(dra_v1_pb2_grpc.DRAPluginStub(channel), api, cdi, None)

    @PROVE
    @given(claims=_good_claims(replaced=replaced))
    def fuzz_broken(claims: list[Claim]) -> None:
        _fuzz_claims(target, claims, ", broken on purpose")

    try:
        with pytest.raises(AssertionError, match=says):
            fuzz_broken()
    finally:
        channel.close()
        loop_thread.run(plugin.shutdown(0))
    good = [
        (
            ("ns", f"claim-{i}", str(uuid.uuid4())),
            _claim_doc("", [{"request": "r", "driver": d, "pool": NODE, "device": NAMES[i]}]),
        )
        for i, d in enumerate([DRIVER, "other.example.com", DRIVER])
    ]
    for (_, _, uid), doc in good:
        doc["metadata"]["uid"] = uid if not replaced else str(uuid.uuid4())
    _fuzz_claims(dra.target, good, "")
