"""What another node's published OpenAPI spec (``GET /openapi.json``) declares.

A caller that adds a field an older server does not know -- ``dry_run`` above all -- must ask first: the
server would ignore the field and *do* the change. Both such callers (``trimtab admin --dry-run`` and a
controller forwarding a dry-run split to an agent) ask here, so they agree on what "declares" means: a
query or path parameter of the operation, or a top-level property of its JSON request body (through
``$ref`` and ``allOf``/``anyOf``/``oneOf``). Pure functions over untrusted JSON: never raises on a
malformed spec, it just declares nothing.
"""

from __future__ import annotations

import re
from typing import Any

_PARAM = re.compile(r"\{[^}]*\}")
_MAX_DEPTH = 8  # $ref chains followed; a cycle in a hostile spec ends here


def operation(spec: Any, method: str, template: str) -> dict[str, Any] | None:
    """The operation ``method template`` of ``spec``, matching path parameters whatever their names; None
    if the spec has no such operation."""
    if not isinstance(spec, dict) or not isinstance(spec.get("paths"), dict):
        return None
    want = _PARAM.sub("{}", template)
    for path, ops in spec["paths"].items():
        if _PARAM.sub("{}", str(path)) == want and isinstance(ops, dict):
            op = ops.get(method.lower())
            return op if isinstance(op, dict) else None
    return None


def declares(spec: Any, method: str, template: str, field: str) -> bool | None:
    """Whether ``method template`` of ``spec`` takes ``field`` (a parameter, or a top-level property of its
    JSON body); None if the spec has no such operation."""
    op = operation(spec, method, template)
    if op is None:
        return None
    if any(isinstance(p, dict) and p.get("name") == field for p in op.get("parameters") or []):
        return True
    body = op.get("requestBody")
    content = (body.get("content") if isinstance(body, dict) else None) or {}
    media = (content.get("application/json") if isinstance(content, dict) else None) or {}
    schema = media.get("schema") if isinstance(media, dict) else None
    return field in _properties(spec, schema, depth=0)


def _properties(spec: dict[str, Any], schema: Any, depth: int) -> set[str]:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return set()
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = spec
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        return _properties(spec, node, depth + 1)
    props = schema.get("properties")
    out = set(props) if isinstance(props, dict) else set()
    for key in ("allOf", "anyOf", "oneOf"):
        subs = schema.get(key)
        for sub in subs if isinstance(subs, list) else []:
            out |= _properties(spec, sub, depth + 1)
    return out
