"""A throwaway certificate authority and a server certificate for 127.0.0.1, made with the ``openssl`` command.

Debian always has ``openssl``, and the ``cryptography`` package is not a dependency. The HTTPS tests serve
with these files and the dev kit's SASL_SSL Kafka cluster (``trimtab.devkit.kafka_server``) listens with
them: one helper, so both kinds of TLS are tested against certificates made the same way. (It used to live
in ``tests/support/tls.py``, which now re-exports it.)
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from trimtab.errors import DevKitError


class PkiError(DevKitError):
    """``openssl`` is missing or refused to make a key or a certificate; the message has its stderr."""


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate clients trust
    cert: Path  # the server certificate (127.0.0.1, localhost), signed by the CA
    key: Path  # its private key (PKCS#8, unencrypted, mode 0600)


def openssl(*args: str, cwd: Path) -> None:
    """Run ``openssl`` with ``args`` in ``cwd``; raise :class:`PkiError` with its stderr if it fails."""
    try:
        proc = subprocess.run(
            ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError:
        raise PkiError("the `openssl` command is missing: `apt-get install openssl`") from None
    if proc.returncode != 0:
        err = " ".join(proc.stderr.split())
        raise PkiError(f"openssl {' '.join(args[:2])} failed in {cwd}: {err}")


def make_pki(directory: Path) -> Pki:
    """A CA and a server certificate for 127.0.0.1 in ``directory`` (EC P-256 keys: fast to make)."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=trimtab test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip
    (d / "ca.key").chmod(0o600)
    openssl("req", *ec, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "node.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "node.pem", "-days", "2", "-extfile", "node.ext",
        cwd=d,
    )  # fmt: skip
    (d / "node.key").chmod(0o600)
    return Pki(ca=d / "ca.pem", cert=d / "node.pem", key=d / "node.key")
