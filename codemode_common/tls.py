"""TLS material for servers and for the registry's channel to runtimes, read from PEM files
when the settings are loaded (so a missing or unreadable file stops the service at start).

No grpc import: `grpc_server` and the runtime client turn these into credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ClientTls", "ServerTls", "TlsFileError", "client_tls", "server_tls"]


class TlsFileError(ValueError):
    """A TLS setting names a file that cannot be read, or an incomplete combination."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None
    """Set: every client must present a certificate this bundle signed (mutual TLS)."""


@dataclass(frozen=True, slots=True)
class ClientTls:
    root_ca: bytes
    """Trusted roots for the server's certificate."""
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str = ""
    """Name checked against the server's certificate instead of the target's host name."""


def _read(path: Path, setting: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsFileError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise TlsFileError(f"{setting}: {path} holds no PEM data")
    return data


def _pair(
    cert: Path | None, key: Path | None, names: tuple[str, str]
) -> tuple[bytes, bytes] | None:
    if (cert is None) != (key is None):
        raise TlsFileError(f"{names[0]} and {names[1]} go together")
    if cert is None or key is None:
        return None
    return _read(cert, names[0]), _read(key, names[1])


def server_tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> ServerTls | None:
    """The server's TLS from `tls_cert_file`, `tls_key_file`, `tls_client_ca_file`."""
    pair = _pair(cert, key, ("tls_cert_file", "tls_key_file"))
    if pair is None:
        if client_ca is not None:
            raise TlsFileError("tls_client_ca_file needs tls_cert_file and tls_key_file")
        return None
    ca = None if client_ca is None else _read(client_ca, "tls_client_ca_file")
    return ServerTls(certificate_chain=pair[0], private_key=pair[1], client_ca=ca)


def client_tls(
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    server_name: str = "",
    *,
    names: tuple[str, str, str, str] = ("ca", "cert", "key", "server name"),
) -> ClientTls | None:
    """A channel's TLS from a CA bundle, an optional client certificate and key (mutual TLS)
    and an optional name to check in the server's certificate; None (plaintext) when no file
    is given. `names` are the four settings' names, for errors."""
    pair = _pair(cert, key, (names[1], names[2]))
    if ca is None and pair is None:
        if server_name:
            raise TlsFileError(f"{names[3]} needs {names[0]}")
        return None
    if ca is None:
        raise TlsFileError(f"{names[1]} needs {names[0]} (the server's trust roots)")
    return ClientTls(
        root_ca=_read(ca, names[0]),
        certificate_chain=None if pair is None else pair[0],
        private_key=None if pair is None else pair[1],
        server_name=server_name,
    )
