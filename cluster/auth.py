"""Bearer tokens on the agent's and the controller's HTTP APIs (docs/security.md).

Two roles. A ``read`` token may call the views (status, ownership, brokers, load, placement documents,
drain plans...); an ``admin`` token may call everything, writes included, and satisfies ``read``. Probes,
``/metrics``, client lookups and the API spec stay public: orchestrators, Prometheus and the brokers'
clients must reach them without a secret, and they change nothing.

Every route declares its access with exactly one of :data:`PUBLIC`, :data:`READ` or :data:`ADMIN` (a FastAPI
dependency, usually on its router), and :func:`secure_app` refuses to finish building an app in which a
route declares none, or a write declares less than admin: a new route can never be open by accident. The
declaration also lands in the OpenAPI spec (``security: [{"bearer": ["admin"]}]``).

Tokens come from files (one per line; re-read whenever the file changes, so rotation needs no restart) and
from the settings (usually the environment). They are compared in constant time and never logged, echoed
in an error or shown in the configuration. Refusals answer the one error shape with 401 (and a ``Bearer``
challenge) or 403, and are counted in ``trimtab_http_auth_failures_total{reason}``.
"""

from __future__ import annotations

import hmac
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import structlog
from fastapi import Depends, FastAPI, Request, Security
from fastapi import routing as fastapi_routing
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer, SecurityScopes
from fastapi.security.utils import get_authorization_scheme_param
from prometheus_client import CollectorRegistry, Counter

from trimtab.cluster.logs import RefusalLog
from trimtab.config.settings import SecuritySettings, valid_token
from trimtab.errors import AuthRefused, ConfigError

log = structlog.get_logger("trimtab.auth")

Role = Literal["read", "admin"]
#: The labels of ``trimtab_http_auth_failures_total``.
REASONS = ("missing", "invalid", "forbidden")
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# ---------------------------------------------------------------------------------------------- token sources
class TokenSource(Protocol):
    def tokens(self) -> tuple[bytes, ...]: ...


@dataclass(frozen=True)
class StaticToken:
    """One token from the settings (``security.admin_token``, usually from the environment)."""

    token: bytes

    def tokens(self) -> tuple[bytes, ...]:
        return (self.token,)


def parse_token_lines(text: str, where: str) -> tuple[bytes, ...]:
    """The tokens of a token file: one per line, blank lines and ``#`` comments ignored. A line that is not
    a usable token raises :class:`ConfigError` naming ``where`` and the line number -- never its content."""
    out: list[bytes] = []
    # Only real line ends end a line (not the form feeds and separators str.splitlines also splits on).
    for n, raw in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not valid_token(line):
            raise ConfigError(
                f"{where}, line {n}: not a usable token (at least 16 characters, no whitespace inside)"
            )
        out.append(line.encode())
    return tuple(out)


class TokenFile:
    """A token file, re-read whenever it changes (modification time, size or inode: an atomic rename
    counts), so tokens rotate without a restart. At start-up (:meth:`load`) a missing, unreadable or empty
    file is a :class:`ConfigError` naming the setting and the path. Later, a file that is deleted, emptied,
    unreadable or holds a line that is not a token grants nothing until it is fixed (fail closed, logged as
    ``token_file_revoked``): deleting or emptying a token file is how an operator revokes its tokens, so
    it must not leave them valid. Write token files by renaming a complete file over them."""

    def __init__(self, setting: str, path: str) -> None:
        self.setting = setting
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._tokens: tuple[bytes, ...] = ()
        self.reloads = 0
        self.loose_permissions = False  # group or others may read it (reported by describe())

    def _read(self) -> tuple[tuple[int, int, int], tuple[bytes, ...]]:
        where = f"{self.setting} ({self.path})"
        try:
            st = self.path.stat()
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{where}: the file does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{where}: cannot read the file ({type(e).__name__})") from None
        tokens = parse_token_lines(text, where)
        if not tokens:
            raise ConfigError(f"{where}: the file holds no token (one per line; # starts a comment)")
        self.loose_permissions = bool(st.st_mode & (stat.S_IRWXG | stat.S_IRWXO))
        return (st.st_mtime_ns, st.st_size, st.st_ino), tokens

    def load(self) -> None:
        """Read the file now; raise :class:`ConfigError` if it is not a usable token file."""
        with self._lock:
            self._stamp, self._tokens = self._read()

    def tokens(self) -> tuple[bytes, ...]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp is not None and stamp == self._stamp:
            return self._tokens
        with self._lock:
            if stamp is not None and stamp == self._stamp:
                return self._tokens
            try:
                self._stamp, self._tokens = self._read()
                self.reloads += 1
                log.info("token_file_reloaded", setting=self.setting, path=str(self.path))
            except ConfigError as e:
                # Remember the stamp of the bad version: warn once per change, not once per request.
                if self._tokens or stamp != self._stamp:
                    log.warning(
                        "token_file_revoked", error=str(e), granting="nothing until the file is fixed"
                    )
                self._stamp, self._tokens = stamp, ()
            return self._tokens


# ---------------------------------------------------------------------------------------------- the checker
def auth_failures(registry: CollectorRegistry) -> Counter:
    """``trimtab_http_auth_failures_total{reason}``: requests refused for want of a (good enough) token."""
    c = Counter(
        "trimtab_http_auth_failures",
        "HTTP requests refused by token authentication: missing (no bearer token), invalid (unknown "
        "token), forbidden (a read token on an admin endpoint)",
        ["reason"],
        registry=registry,
    )
    for r in REASONS:
        c.labels(r)
    return c


class Authenticator:
    """Decides whether a request's bearer token may call a route that needs ``read`` or ``admin``."""

    def __init__(
        self,
        *,
        required: bool,
        admin: Sequence[TokenSource] = (),
        read: Sequence[TokenSource] = (),
        failures: Counter | None = None,
    ) -> None:
        self.required = required
        self._admin = tuple(admin)
        self._read = tuple(read)
        self._failures = failures
        self._log = RefusalLog("http_auth_refused")

    @classmethod
    def disabled(cls) -> Authenticator:
        """No checks (``security.auth = "disabled"``): demos and tests only."""
        return cls(required=False)

    @classmethod
    def from_settings(cls, sec: SecuritySettings, *, failures: Counter | None = None) -> Authenticator:
        """The authenticator ``sec`` describes, token files read now. Raises :class:`ConfigError` when a
        file is missing, unreadable or empty, or when authentication is required and no token is configured
        at all: a daemon must not start with an admin API nobody can use -- or anybody can. Logs nothing
        (it runs before logging is configured, too); :meth:`log_startup` does."""
        if sec.auth == "disabled":
            return cls(required=False, failures=failures)
        admin: list[TokenSource] = []
        read: list[TokenSource] = []
        for target, secret, setting, path in (
            (admin, sec.admin_token, "security.admin_tokens_file", sec.admin_tokens_file),
            (read, sec.read_token, "security.read_tokens_file", sec.read_tokens_file),
        ):
            if secret is not None:
                target.append(StaticToken(secret.get_secret_value().encode()))
            if path:
                f = TokenFile(setting, path)
                f.load()
                target.append(f)
        if not admin and not read:
            raise ConfigError(
                'security.auth is "required" but no token is configured: set security.admin_tokens_file '
                "(a file with one token per line, e.g. from `python3 -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`) and/or security.read_tokens_file, or "
                "TRIMTAB_SECURITY__ADMIN_TOKEN / TRIMTAB_SECURITY__READ_TOKEN; or, for a demo on a private "
                'machine only, set security.auth = "disabled" explicitly (docs/security.md)'
            )
        return cls(required=True, admin=admin, read=read, failures=failures)

    @classmethod
    def for_daemon(cls, sec: SecuritySettings, registry: CollectorRegistry) -> Authenticator:
        """A daemon's authenticator: :meth:`from_settings`, counting refusals in ``registry``
        (:func:`auth_failures`) and saying at start how the node authenticates (:meth:`log_startup`)."""
        auth = cls.from_settings(sec, failures=auth_failures(registry))
        auth.log_startup()
        return auth

    def log_startup(self) -> None:
        """One line saying how this node authenticates (never a token), and a warning per token file other
        users can read."""
        if not self.required:
            log.warning(
                "http_auth", auth="disabled", advice="every endpoint is open: never on a shared network"
            )
            return
        files = [s for s in (*self._admin, *self._read) if isinstance(s, TokenFile)]
        log.info(
            "http_auth",
            auth="required",
            admin_sources=len(self._admin),
            read_sources=len(self._read),
            token_files=[str(f.path) for f in files],
        )
        for f in files:
            if f.loose_permissions:
                log.warning(
                    "token_file_permissions",
                    setting=f.setting,
                    path=str(f.path),
                    advice="chmod 600: other users can read the tokens",
                )

    def role_of(self, token: str) -> Role | None:
        """The role ``token`` has (admin wins), or None. Every configured token is compared, each in
        constant time, so the answer's timing does not tell which one (nearly) matched."""
        given = token.encode()
        is_admin = is_read = False
        for src in self._admin:
            for t in src.tokens():
                is_admin |= hmac.compare_digest(given, t)
        for src in self._read:
            for t in src.tokens():
                is_read |= hmac.compare_digest(given, t)
        return "admin" if is_admin else "read" if is_read else None

    def own_token(self) -> str | None:
        """The token this node presents when it calls its peers (a controller forwarding a split or a drain
        to an agent): the first admin token -- ``security.admin_token``, else the first line of
        ``security.admin_tokens_file`` as it reads now. None when authentication is disabled."""
        if not self.required:
            return None
        for src in self._admin:
            tokens = src.tokens()
            if tokens:
                return tokens[0].decode()
        return None

    def check(
        self, token: str | None, need: Role, *, method: str, path: str, client: str | None
    ) -> Role | None:
        """Let the request through (returning the caller's role, None when checks are off) or raise
        :class:`AuthRefused`: 401 without a token or with an unknown one, 403 with a read token where admin
        is needed."""
        if not self.required:
            return None
        if not token:
            self._refuse("missing", method, path, client)
            raise AuthRefused(
                401,
                "authentication required: send 'Authorization: Bearer <token>' (a read or admin token; "
                "docs/security.md)",
                reason="missing",
            )
        role = self.role_of(token)
        if role is None:
            self._refuse("invalid", method, path, client)
            raise AuthRefused(401, "the bearer token is not valid on this node", reason="invalid")
        if need == "admin" and role != "admin":
            self._refuse("forbidden", method, path, client)
            raise AuthRefused(
                403, f"{method} {path} needs an admin token; this one may only read", reason="forbidden"
            )
        return role

    def _refuse(self, reason: str, method: str, path: str, client: str | None) -> None:
        if self._failures is not None:
            self._failures.labels(reason).inc()
        self._log(reason, method=method, path=path, client=client)


# ---------------------------------------------------------------------------------------------- FastAPI
#: The OpenAPI security scheme every protected operation names; scopes carry the role it needs.
SCHEME_NAME = "bearer"
_bearer = HTTPBearer(
    auto_error=False,
    scheme_name=SCHEME_NAME,
    description="A read or an admin token (docs/security.md). The operation's scopes say which role it "
    "needs: read (an admin token also has it) or admin.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def _public() -> None:
    """Marks a route public on purpose (probes, metrics, client lookups): no token is asked for."""


def _check(request: Request, need: Role, token: str | None) -> None:
    auth: Authenticator | None = getattr(request.app.state, "auth", None)
    if auth is None:  # an app built without an authenticator: fail closed
        auth = NO_TOKENS
    client = request.client.host if request.client is not None else None
    auth.check(token, need, method=request.method, path=request.url.path, client=client)


async def _authorize(request: Request, scopes: SecurityScopes, credentials: Credentials) -> None:
    token = credentials.credentials if credentials is not None else None
    _check(request, "admin" if "admin" in scopes.scopes else "read", token)


def authorize_early(request: Request) -> None:
    """The token check of the route ``request`` matched, for a request refused before its dependencies ran
    (FastAPI parses a JSON body first): a malformed body must not tell a caller without a token more than
    a 401 does. Raises :class:`AuthRefused`; a public route, an undeclared or an unmatched one passes."""
    route = request.scope.get("route")
    if route is None:
        return
    access = access_of(route)
    if not access or access == {"public"}:
        return  # public, or an app that does not use these declarations (secure_app refuses that)
    _check(
        request, "read" if access == {"read"} else "admin", bearer_token(request.headers.get("authorization"))
    )


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, token = get_authorization_scheme_param(header)
    return token if scheme.lower() == "bearer" and token else None


NO_TOKENS = Authenticator(required=True)

#: No token needed: probes, /metrics, the lookups brokers' clients make.
PUBLIC = Depends(_public)
#: A read or an admin token: views.
READ = Security(_authorize, scopes=["read"])
#: An admin token: everything that changes something (and its dry run).
ADMIN = Security(_authorize, scopes=["admin"])


def iter_routes(app: FastAPI) -> Iterator[Any]:
    """Every route ``app`` serves, included routers flattened, each as FastAPI serves it (with its
    routers' dependencies). FastAPI >= 0.160 keeps included routers as such in ``app.routes``."""
    flatten = getattr(fastapi_routing, "iter_route_contexts", None)
    yield from flatten(app.routes) if flatten is not None else app.routes


def access_of(route: Any) -> set[str]:
    """What an API route declares: a subset of {"public", "read", "admin"} (exactly one in a sound app)."""
    out: set[str] = set()
    dependant = getattr(route, "dependant", None)
    for dep in dependant.dependencies if dependant is not None else ():
        if dep.call is _public:
            out.add("public")
        elif dep.call is _authorize:
            out.update(dep.own_oauth_scopes or ["read"])
    return out


def _is_api_route(route: Any) -> bool:
    return isinstance(getattr(route, "original_route", route), APIRoute)


def secure_app(app: FastAPI, auth: Authenticator | None) -> None:
    """Give ``app`` its authenticator (None: no token is accepted anywhere -- fail closed) and check, once
    every route is registered, that each declares its access: exactly one of PUBLIC, READ or ADMIN, and
    ADMIN for every write. A route that does not is a bug, refused when the app is built, not found later
    by someone calling it without a token."""
    app.state.auth = auth
    plain = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url} - {None}
    problems: list[str] = []
    for route in iter_routes(app):
        if _is_api_route(route):
            access = access_of(route)
            what = f"{','.join(sorted(route.methods))} {route.path_format}"
            if len(access) != 1:
                problems.append(f"{what} declares {sorted(access) or 'no'} access")
            elif route.methods & _WRITES and access != {"admin"}:
                problems.append(f"{what} changes things but declares {access.pop()} access")
        elif getattr(route, "path", None) not in plain:
            problems.append(
                f"{getattr(route, 'path', route)!r} is not a FastAPI route: its access is unknown"
            )
    if problems:
        raise RuntimeError(
            "routes without a sound access declaration (use trimtab.cluster.auth.PUBLIC, READ or ADMIN): "
            + "; ".join(problems)
        )


def route_table(app: FastAPI) -> list[tuple[str, str, str]]:
    """(method, path, access) of every API route: what tests and docs walk."""
    out = []
    for route in iter_routes(app):
        if _is_api_route(route):
            for m in sorted(route.methods):
                out.append((m, route.path_format, ",".join(sorted(access_of(route)))))
    return out
