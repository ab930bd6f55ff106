"""Test certificates made at test time with `cryptography`: one CA, a `localhost`/127.0.0.1
server certificate, and client certificates carrying the URI or DNS SAN a test names."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        cert.write_bytes(self.cert)
        key.write_bytes(self.key)
        return cert, key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Authority:
    """A CA that signs server and client certificates valid for a day."""

    def __init__(self, name: str = "codemode test CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self._cert.public_bytes(serialization.Encoding.PEM)

    def _issue(self, common_name: str, sans: list[x509.GeneralName], *, server: bool) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = (
            x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
            if server
            else (x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def server(self) -> Pem:
        return self._issue(
            "localhost",
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
            server=True,
        )

    def client(self, *, uri: str | None = None, dns: str | None = None) -> Pem:
        sans: list[x509.GeneralName] = []
        if uri is not None:
            sans.append(x509.UniformResourceIdentifier(uri))
        if dns is not None:
            sans.append(x509.DNSName(dns))
        return self._issue(uri or dns or "client", sans, server=False)
