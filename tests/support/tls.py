"""A throwaway certificate authority and a server certificate for 127.0.0.1, made with the ``openssl`` command
(Debian always has it; the ``cryptography`` package is not a dependency): what the TLS tests serve HTTPS with.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate clients trust
    cert: Path  # the server certificate (127.0.0.1, localhost), signed by the CA
    key: Path  # its private key


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed: {proc.stderr}")


def make_pki(directory: Path) -> Pki:
    """A CA and a server certificate for 127.0.0.1 in ``directory`` (EC P-256 keys: fast to make)."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=trimtab test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip
    _openssl("req", *ec, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "node.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "node.pem", "-days", "2", "-extfile", "node.ext",
        cwd=d,
    )  # fmt: skip
    (d / "node.key").chmod(0o600)
    return Pki(ca=d / "ca.pem", cert=d / "node.pem", key=d / "node.key")
