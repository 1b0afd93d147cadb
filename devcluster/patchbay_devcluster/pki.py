"""Certificates for the local cluster, generated the way envtest and kubeadm lay them out.

One CA signs everything: the API server's serving certificate (SANs localhost, 127.0.0.1 and the
addresses the cluster adds: the pod network's bridge address, where the relay lets pods reach the
API server; nothing here is reachable from elsewhere), one client certificate per identity (admin in
``system:masters``, the controller manager, the scheduler, kwok, and later kubelets as
``system:node:<name>`` in ``system:nodes`` so the Node authorizer applies), and a separate RSA pair
that signs service-account tokens.

Keys are EC P-256 (fast to generate: a cold ``up`` makes about a dozen) except the service-account
key, which the API server's defaults expect to be RSA. A client's identity is handed out as a
kubeconfig with its certificates embedded (:func:`write_kubeconfig`).

Certificates are kept between runs (``up`` after ``down --keep-state`` must not invalidate the
kubeconfigs handed out). A kept serving certificate that lacks a name now asked for (one of an
older version of the tool) is issued again, with the same key, so the state directory stays valid
and a running server that reloads its certificate file serves the new one.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger(__name__)

VALIDITY = dt.timedelta(days=365)
SERVER_DNS_NAMES = ("localhost",)
SERVER_IPS = ("127.0.0.1",)
"""The names every serving certificate carries; ``issue(ips=...)`` adds addresses."""


@dataclass(frozen=True)
class CertPair:
    """Paths of a PEM certificate and its private key."""

    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class CertificateAuthority:
    """A self-signed CA kept in ``<dir>/ca.crt`` and ``<dir>/ca.key``; loads it when present."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.pair = CertPair(directory / "ca.crt", directory / "ca.key")
        if self.pair.cert.exists() and self.pair.key.exists():
            self.cert = x509.load_pem_x509_certificate(self.pair.cert.read_bytes())
            loaded = serialization.load_pem_private_key(self.pair.key.read_bytes(), password=None)
            assert isinstance(loaded, ec.EllipticCurvePrivateKey)
            self.key = loaded
            return
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        subject = _name("patchbay-devcluster-ca")
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        _write_key(self.pair.key, self.key)
        self.pair.cert.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        orgs: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
        ips: Sequence[str] = (),
    ) -> CertPair:
        """Issue ``<dir>/<stem>.crt/.key``; reuse them if they already exist (``up`` is idempotent).

        A server certificate names localhost, 127.0.0.1 and ``ips``. An existing one that lacks
        any of them is issued again with its own key (written in one rename, so a server that
        reloads the file never reads half of it).
        """
        pair = CertPair(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        names = server_names(ips) if server else []
        key: ec.EllipticCurvePrivateKey | None = None
        if pair.cert.exists() and pair.key.exists():
            has = cert_names(x509.load_pem_x509_certificate(pair.cert.read_bytes()))
            missing = [n for n in names if n not in has]
            if not missing:
                return pair
            loaded = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
            if isinstance(loaded, ec.EllipticCurvePrivateKey):
                key = loaded
            log.info(
                "Issuing %s again: it does not name %s", pair.cert, ", ".join(str(n.value) for n in missing)
            )
        if key is None:
            key = ec.generate_private_key(ec.SECP256R1())
            _write_key(pair.key, key)
        now = dt.datetime.now(dt.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, orgs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        tmp = pair.cert.with_suffix(".tmp")
        tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        tmp.replace(pair.cert)
        return pair


def server_names(ips: Sequence[str] = ()) -> list[x509.GeneralName]:
    """The SANs of a serving certificate: ``SERVER_DNS_NAMES``, ``SERVER_IPS`` and ``ips``."""
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in SERVER_DNS_NAMES]
    for ip in (*SERVER_IPS, *ips):
        name = x509.IPAddress(ipaddress.ip_address(ip))
        if name not in names:
            names.append(name)
    return names


def cert_names(cert: x509.Certificate) -> list[x509.GeneralName]:
    """The SANs ``cert`` carries (none without the extension)."""
    try:
        return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return []


def service_account_keys(directory: Path) -> CertPair:
    """The RSA pair that signs service-account tokens (``cert`` holds the public key, PEM)."""
    pair = CertPair(directory / "sa.pub", directory / "sa.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pair.key, key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair


def write_kubeconfig(path: Path, server: str, ca: Path, client: CertPair) -> None:
    """A kubeconfig with the certificates embedded, so it can be copied and still work."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "patchbay-dev", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
        ],
        "users": [
            {
                "name": "patchbay-dev",
                "user": {
                    "client-certificate-data": b64(client.cert),
                    "client-key-data": b64(client.key),
                },
            }
        ],
        "contexts": [
            {"name": "patchbay-dev", "context": {"cluster": "patchbay-dev", "user": "patchbay-dev"}}
        ],
        "current-context": "patchbay-dev",
    }
    path.write_text(json.dumps(doc, indent=2))  # JSON is valid YAML; kubectl reads it as is
    path.chmod(0o600)
