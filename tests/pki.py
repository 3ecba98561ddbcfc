"""Real certificates for the TLS tests: a CA (trustme) and PEM files on disk.

`Pki(tmp_path)` makes a CA and a server certificate for 127.0.0.1 and
localhost; `client(name)` issues a client certificate whose first SAN (the
identity rsgw reads from it) is `name`. Every file is PEM, as an operator's
would be, so the product loads them by path exactly as in production.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class PemPair:
    """A certificate chain and its key, as files."""

    cert: str
    key: str

    def read(self) -> tuple[bytes, bytes]:
        return Path(self.cert).read_bytes(), Path(self.key).read_bytes()


class Pki:
    """A CA with its certificate in `ca_file`, issuing into `directory`."""

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self.directory = directory
        self.name = name
        self.ca = trustme.CA()
        self.ca_file = str(directory / f"{name}.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        self.server = self.issue("server", "127.0.0.1", "localhost")

    def issue(self, stem: str, *identities: str) -> PemPair:
        """A certificate for `identities` (DNS names, IPs or e-mail addresses)."""
        cert = self.ca.issue_cert(*identities)
        pair = PemPair(
            str(self.directory / f"{self.name}-{stem}.pem"),
            str(self.directory / f"{self.name}-{stem}.key"),
        )
        cert.cert_chain_pems[0].write_to_path(pair.cert)
        for extra in cert.cert_chain_pems[1:]:
            extra.write_to_path(pair.cert, append=True)
        cert.private_key_pem.write_to_path(pair.key)
        return pair

    def client(self, name: str) -> PemPair:
        """A client certificate whose identity is `name` (a DNS-style name)."""
        return self.issue(f"client-{name}", name)

    def ca_bytes(self) -> bytes:
        return Path(self.ca_file).read_bytes()
