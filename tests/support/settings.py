"""The one place where tests that build daemons in-process opt out of token authentication, and say which
namespaces their lookups may create.

``security.auth`` is "required" by default and a daemon with no token refuses to start (docs/security.md).
Tests about something else build their settings with :data:`NO_AUTH` (a settings tree to merge) or
:data:`NO_AUTH_SETS` (``--set`` assignments), so the opt-out is explicit and greppable. The security tests
(tests/integration/test_security.py) run with tokens, and the local cluster (LocalCluster, ``dev up``)
always does.

Lookups create no namespace by default (``namespace.auto_create`` is empty, docs/security.md): tests whose
lookups use namespaces nobody created allow their tenants explicitly with :data:`AUTO_CREATE`. The local
cluster (LocalCluster) configures its own.
"""

from __future__ import annotations

from typing import Any

NO_AUTH: dict[str, Any] = {"security": {"auth": "disabled"}}
NO_AUTH_SETS: list[str] = ["security.auth=disabled"]

#: The tenants the in-process tests look topics up in.
TEST_TENANTS: list[str] = ["acme", "public"]
AUTO_CREATE: dict[str, Any] = {"namespace": {"auto_create": TEST_TENANTS}}
