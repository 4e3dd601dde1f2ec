"""A throwaway certificate authority and a server certificate for 127.0.0.1: what the TLS tests serve HTTPS with.

The helper moved into the dev kit (``trimtab.devkit.pki``), where the SASL_SSL Kafka cluster of
``trimtab.devkit.kafka_server`` uses it too; this module keeps the tests' import path.
"""

from __future__ import annotations

from trimtab.devkit.pki import Pki, make_pki

__all__ = ["Pki", "make_pki"]
