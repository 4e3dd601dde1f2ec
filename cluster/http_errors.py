"""The one error shape of every trimtab HTTP API, and the one place failures become it.

Every route *raises* (a :class:`~trimtab.errors.RequestError`, or another trimtab error); nothing builds an
error body by hand. :func:`install_error_handlers` gives an app one handler that renders every failure as
:class:`ErrorBody` -- ``{"error": "...", "retryable": ...}`` -- with its status and headers:

* a :class:`RequestError`: its status, ``retryable`` and headers (a ``Bearer`` challenge, ``Retry-After``);
  a :class:`NotLeader` with a leader becomes a 307 to it instead;
* another trimtab error with an HTTP meaning (:func:`refusal_of`): a write the bundle's record no longer
  allows (it moved since the request was planned) is a 409; ZooKeeper unavailable or contended is a
  retryable 503, a znode left unreadable or refused to this node a 500 naming it;
* malformed JSON and failed validation: 400 (FastAPI would say 422, in another shape), after the token
  check a malformed body must not skip; unknown routes and methods: their 404/405;
* anything else: 500, logged with its traceback.

The ASGI layers in front of an app (the HTTP guard, the webhook's signature check) refuse before any route
runs, so they cannot raise into the handler: they send :func:`error_response` / :func:`send_error`, which
render the same body from the same exception.
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import Send

from trimtab.channel.bundles import parse_bundle
from trimtab.channel.intents import IntentRefused
from trimtab.cluster.auth import SCHEME_NAME, authorize_early
from trimtab.errors import (
    AuthRefused,
    BundleError,
    NotLeader,
    RequestError,
    TrimtabError,
    ZkConflict,
    ZkUnavailable,
    ZnodeUnreadable,
    ZooKeeperError,
)

log = structlog.get_logger("trimtab.http")


class ErrorBody(BaseModel):
    """Every error any trimtab API answers: what went wrong, and whether the same request may succeed
    later (a timeout, no leader yet) or never will (bad input)."""

    error: str
    retryable: bool = False


# ------------------------------------------------------------------ what a failure answers
def refusal_of(exc: BaseException) -> RequestError | None:
    """The HTTP refusal for ``exc``, or None when it has no HTTP meaning (a bug, or an error that should
    not reach a route: the handler answers 500 and logs it).

    ZooKeeper's errors are mapped here, once, for every API: unavailable (no session, no answer after the
    command retries) and contended (a compare-and-set that kept losing) are temporary -- 503, retryable; a
    znode that does not decode is never overwritten -- 500, naming it; refused credentials are the
    operator's to fix -- 500, naming the znode and the setting."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, IntentRefused):  # the bundle moved since the request was planned: look again
        return RequestError(409, str(exc))
    if isinstance(exc, ZkConflict | ZkUnavailable):  # (their messages name ZooKeeper and what it did not do)
        return RequestError(503, str(exc), retryable=True)
    if isinstance(exc, ZnodeUnreadable):
        return RequestError(500, f"{exc}; it was left as it is")
    if isinstance(exc, ZooKeeperError):  # ZkAccessDenied: the message names the znode and the setting
        return RequestError(500, str(exc))
    if isinstance(exc, HTTPException):  # Starlette's own: an unknown route (404), a wrong method (405)
        return RequestError(
            exc.status_code, str(exc.detail), retryable=exc.status_code >= 500, headers=exc.headers
        )
    if isinstance(exc, RequestValidationError):
        return RequestError(400, _validation_message(exc))
    return None


def require_bundle(name: str) -> str:
    """``name``, if it is a bundle name (``tenant/namespace/0xLLLLLLLL_0xUUUUUUUU``, checked by the one
    parser, :func:`~trimtab.channel.bundles.parse_bundle`); else the one 400 every API answers a bad
    bundle name with, the parser's message."""
    try:
        parse_bundle(name)
    except BundleError as e:
        raise RequestError(400, str(e)) from None
    return name


def _validation_message(exc: RequestValidationError) -> str:
    """One line per problem, ``where: what`` -- the shape of a config error, not FastAPI's 422 list."""
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            parts.append(f"the request body is not valid JSON ({ctx.get('error', e.get('msg', ''))})")
        else:
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "bad request: " + "; ".join(parts)


# ------------------------------------------------------------------ rendering
def error_body(exc: RequestError) -> dict[str, Any]:
    """The one error shape, as JSON-ready data."""
    return ErrorBody(error=str(exc), retryable=exc.retryable).model_dump()


def error_response(exc: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    """``exc`` as a response: its status, its body, its headers (plus ``headers``)."""
    return JSONResponse(error_body(exc), status_code=exc.status, headers={**exc.headers, **(headers or {})})


async def send_error(send: Send, exc: RequestError, *, close: bool) -> None:
    """``exc`` sent straight on an ASGI ``send`` (the HTTP guard, before any app runs); ``close`` ends the
    connection after it, so an unread body is never read."""
    body = orjson.dumps(error_body(exc))
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in exc.headers.items()]
    if close:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def unexpected(path: str, exc: BaseException) -> RequestError:
    """A failure with no HTTP meaning (a bug): logged with its traceback, answered 500 (retryable)."""
    log.error("http_handler_failed", path=path, error=repr(exc), exc_info=exc)
    return RequestError(500, f"internal error ({type(exc).__name__}); see the node's log", retryable=True)


# ------------------------------------------------------------------ the handler
def install_error_handlers(app: FastAPI) -> None:
    """Make every failure of ``app`` answer :class:`ErrorBody` (the module docstring), and its OpenAPI
    spec document that: 400 with ErrorBody where FastAPI would document 422, 401/403 on protected
    operations.

    One handler; it is registered for each class Starlette dispatches on (trimtab's errors and FastAPI's
    validation and routing errors are handled inside the app; ``Exception`` only by the outermost
    middleware, which also re-raises it to the server after answering)."""

    async def refuse(request: Request, exc: Exception) -> Response:
        if isinstance(exc, NotLeader) and exc.leader_url is not None:
            # 307 keeps the method and the body: any controller address works for admin writes.
            # The query string goes along: it can change what a write does (?dry_run, ?unload_scope).
            query = f"?{request.url.query}" if request.url.query else ""
            return RedirectResponse(exc.leader_url + request.url.path + query, status_code=307)
        if isinstance(exc, RequestValidationError):
            try:
                authorize_early(request)  # a malformed body is parsed before the token is checked
            except AuthRefused as refused:
                return error_response(refused)
        refusal = refusal_of(exc)
        return error_response(refusal if refusal is not None else unexpected(request.url.path, exc))

    for cls in (TrimtabError, RequestValidationError, HTTPException, Exception):
        app.add_exception_handler(cls, refuse)

    def openapi() -> dict[str, Any]:
        """The spec as the API really answers: 400 with ErrorBody where FastAPI would document 422."""
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            schemas["ErrorBody"] = ErrorBody.model_json_schema()
            bad_request = {
                "description": "Bad request: malformed JSON, a missing or invalid field",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
            }
            for ops in spec.get("paths", {}).values():
                for op in ops.values():
                    responses = op.get("responses", {})
                    if responses.pop("422", None) is not None:
                        responses.setdefault("400", bad_request)
                    _document_auth(op)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }


def _document_auth(op: dict[str, Any]) -> None:
    """A protected operation documents its 401 (and, when it needs admin, its 403)."""
    scopes = {s for req in op.get("security") or [] for s in req.get(SCHEME_NAME, [])}
    if not scopes:
        return
    responses = op.setdefault("responses", {})
    responses.setdefault("401", _error("No bearer token, or one this node does not know"))
    if "admin" in scopes:
        responses.setdefault("403", _error("A read token: this operation needs an admin token"))
