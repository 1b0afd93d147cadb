"""Certificates for the local cluster, generated the way envtest and kubeadm lay them out.

One CA signs everything: the API server's serving certificate (SANs localhost and 127.0.0.1 only:
nothing here is reachable from elsewhere), one client certificate per identity (admin in
``system:masters``, the controller manager, the scheduler, kwok, and later kubelets as
``system:node:<name>`` in ``system:nodes`` so the Node authorizer applies), and a separate RSA pair
that signs service-account tokens.

Keys are EC P-256 (fast to generate: a cold ``up`` makes about a dozen) except the service-account
key, which the API server's defaults expect to be RSA. A client's identity is handed out as a
kubeconfig with its certificates embedded (:func:`write_kubeconfig`).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)


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
    ) -> CertPair:
        """Issue ``<dir>/<stem>.crt/.key``; reuse them if they already exist (``up`` is idempotent)."""
        pair = CertPair(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        key = ec.generate_private_key(ec.SECP256R1())
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
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        _write_key(pair.key, key)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair


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
