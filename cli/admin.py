"""``trimtab admin``: operator commands over the controllers' (and, for ``lookup``, an agent's) HTTP API, in
the spirit of ``pulsar-admin`` (docs/admin-cli.md).

Exit codes scripts can rely on (:class:`Exit`): 0 done; 1 the server refused (a 4xx, its ``error`` message
on stderr); 2 a usage error (click's own); 3 unavailable, worth retrying (no connection, a timeout, a 503 or
an answer marked ``retryable``); 4 an unexpected answer (a 5xx not marked retryable, a body that is not
JSON, a redirect that cannot be followed).

Only click is imported up front: httpx (about 0.1 s) is imported by the first request, so ``trimtab
--help`` and the daemons do not pay for it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import click

from trimtab.errors import TrimtabError

if TYPE_CHECKING:
    import ssl

    import httpx

F = TypeVar("F", bound=Callable[..., Any])


class Exit:
    """The exit codes of ``trimtab admin`` (docs/admin-cli.md)."""

    OK = 0
    REFUSED = 1  # the server said no (4xx): retrying the same request will not help
    USAGE = 2  # click's usage errors: a bad option, a missing argument
    UNAVAILABLE = 3  # no connection, timeout, 503, or an answer marked retryable: worth retrying
    UNEXPECTED = 4  # a 5xx not marked retryable, an answer that is not JSON, a redirect we cannot follow


URL_ENV = "TRIMTAB_ADMIN_URL"
LEGACY_URL_ENV = "TRIMTAB_CONTROLLER_URL"  # what `trimtab admin --controller` read before
AGENT_URL_ENV = "TRIMTAB_AGENT_URL"
TOKEN_ENV = "TRIMTAB_ADMIN_TOKEN"
SHORT_TOKEN_ENV = "TRIMTAB_TOKEN"
TOKEN_FILE_ENV = "TRIMTAB_TOKEN_FILE"
CACERT_ENV = "TRIMTAB_CACERT"
DEFAULT_URL = "http://127.0.0.1:8080"
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
_TIME_KEYS = frozenset(
    {"ts", "since", "paused_at", "first_failure", "start_time", "updated_at", "reported_at"}
)


class AdminError(TrimtabError, click.ClickException):
    """A failed admin call: printed as ``Error: <message>`` on stderr, exiting with ``exit_code`` (click
    does both, being a ``ClickException``; a ``TrimtabError`` like every error trimtab raises)."""

    exit_code = Exit.UNEXPECTED


class Refused(AdminError):
    """The server said no (4xx): the same request will not succeed."""

    exit_code = Exit.REFUSED


class Unavailable(AdminError):
    """No answer, or a temporary refusal (503, retryable): worth retrying."""

    exit_code = Exit.UNAVAILABLE


class Unexpected(AdminError):
    """An answer the CLI cannot trust: a 5xx not marked retryable, not JSON, a redirect it cannot follow."""

    exit_code = Exit.UNEXPECTED


# ---------------------------------------------------------------------------------------------- the client
@dataclass
class Target:
    """Where a request goes, and what to tell the user when it cannot get there."""

    base: str
    role: str  # "controller" | "agent"
    hint: str  # how to point the CLI elsewhere


@dataclass
class AdminClient:
    """The options of ``trimtab admin`` and one HTTP client for the whole command."""

    url: str
    agent_url: str | None
    output: str
    timeout: float
    token: str | None = field(repr=False)  # never printed, not even in a traceback's locals
    cacert: str | None = None
    _http: httpx.Client | None = field(default=None, repr=False)

    @property
    def controller(self) -> Target:
        return Target(self.url, "controller", f"point --url (or ${URL_ENV}) at a running controller")

    def agent(self, base: str, discovered: bool) -> Target:
        how = (
            f"found through the controller's /v1/brokers; set --agent-url (or ${AGENT_URL_ENV}) to choose one"
            if discovered
            else f"point --agent-url (or ${AGENT_URL_ENV}) at a running agent"
        )
        return Target(base, "agent", how)

    def http(self) -> httpx.Client:
        if self._http is None:
            import httpx

            headers = {"accept": "application/json", "user-agent": "trimtab-admin"}
            if self.token:
                headers["authorization"] = f"Bearer {self.token}"
            verify: ssl.SSLContext | bool = True
            if self.cacert:
                import ssl

                verify = ssl.create_default_context(cafile=self.cacert)
            self._http = httpx.Client(
                timeout=self.timeout, headers=headers, follow_redirects=False, verify=verify
            )
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # ------------------------------------------------------------------ one call
    def call(
        self,
        method: str,
        template: str,
        *,
        path: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        target: Target | None = None,
    ) -> Any:
        """Send one request and return the answer's JSON (None for an empty 2xx), or raise
        :class:`AdminError` with the exit code its outcome deserves.

        ``template`` is the route as the API documents it (``/v1/isolation-policies/{name}``); ``path``
        fills its ``{...}`` parts, each percent-encoded as one path segment. Redirects (a follower sends
        admin writes to the leader with 307) are followed here rather than by httpx, so that the method,
        the body, the bearer token (httpx drops it across hosts) and the query (``?dry_run=true``) all
        reach the leader."""
        import httpx

        target = target or self.controller
        route = template.format(**{k: _segment(k, v) for k, v in (path or {}).items()})
        url = httpx.URL(target.base + route, params=dict(params) if params else None)
        origin = url
        what = f"{method} {route}"
        for _ in range(MAX_REDIRECTS + 1):
            try:
                r = self.http().request(method, url, json=body)
            except httpx.TimeoutException as e:
                raise Unavailable(
                    f"{_at(target, url, origin)} did not answer {what} within {self.timeout:g}s "
                    f"({type(e).__name__}). Worth retrying (or raise --timeout)"
                    + (
                        "; the change may have been made anyway: check before repeating it"
                        if method != "GET"
                        else ""
                    )
                    + "."
                ) from None
            except httpx.TransportError as e:
                raise Unavailable(
                    f"cannot reach {_at(target, url, origin)}: {_reason(e)}. Is it running? Worth retrying; "
                    f"or {target.hint}."
                ) from None
            if r.status_code not in _REDIRECTS or "location" not in r.headers:
                return _outcome(r, what, target, origin)
            nxt = url.join(r.headers["location"])
            if r.status_code in (301, 302, 303) and method != "GET":
                raise Unexpected(
                    f"{url} answered {what} with {r.status_code} to {nxt}, which would turn the write into a "
                    f"GET; not followed. Point --url at {_base(nxt)} instead."
                )
            if not nxt.query and url.query:
                nxt = nxt.copy_with(query=url.query)  # the server's 307 keeps the path, not the query
            if _base(nxt) != _base(url):
                self._check_leader_redirect(url, nxt, what)
            url = nxt
        raise Unexpected(f"more than {MAX_REDIRECTS} redirects for {what} from {origin}")

    def _check_leader_redirect(self, url: httpx.URL, nxt: httpx.URL, what: str) -> None:
        """Follow a redirect to another host only to the leader the redirecting controller itself names in
        ``GET /v1/leader``, over the same scheme: the CLI sends its token along, and a ``Location`` is
        whatever the answering server (or anyone on the path of a plain-HTTP answer) wrote."""
        if nxt.scheme != url.scheme:
            raise Unexpected(
                f"{_base(url)} redirected {what} from {url.scheme}:// to {nxt.scheme}://; not followed "
                f"(the token would travel over another scheme). Point --url at the leader instead."
            )
        try:
            r = self.http().get(url.copy_with(path="/v1/leader", query=None))
            leader = r.json().get("leader") if r.status_code == 200 else None
            leader_url = leader.get("http_url") if isinstance(leader, dict) else None
        except Exception:  # an unreachable or odd answer: cannot confirm, so do not follow
            leader_url = None
        if not isinstance(leader_url, str) or _base(url.join(leader_url)) != _base(nxt):
            raise Unexpected(
                f"{_base(url)} redirected {what} to {_base(nxt)}, which its /v1/leader does not name as the "
                f"leader ({leader_url or 'no leader named'}); not followed, the token stays here. Point "
                f"--url at the leader instead."
            )

    def require_dry_run(self, method: str, template: str) -> None:
        """Refuse (exit 1, nothing sent) unless the controller's API declares ``dry_run`` for this
        operation: a server that does not know the field would ignore it and *do* the change."""
        from trimtab.cluster.openapi import declares

        found = declares(self.call("GET", "/openapi.json"), method, template, "dry_run")
        if found is None:
            raise Refused(
                f"the controller at {self.url} has no {method} {template} (an older version?); nothing was sent"
            )
        if not found:
            raise Refused(
                f"the controller at {self.url} does not support --dry-run for {method} {template} (its API "
                f"has no dry_run field; it would ignore it and make the change); nothing was sent"
            )

    # ------------------------------------------------------------------ output
    def show(self, payload: Any, render: Callable[[Any], str] | None = None) -> None:
        """Print the answer: the server's JSON as it is (``--output json``), or a readable rendering."""
        if self.output == "json":
            if payload is not None:  # an empty answer stays empty
                click.echo(dump_json(payload))
            return
        if payload is None:
            click.echo("ok")
            return
        try:
            text = render(payload) if render is not None else render_generic(payload)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            text = render_generic(payload)  # a shape this CLI does not know: still readable
        click.echo(text)


def _segment(name: str, value: str) -> str:
    """``value`` as one path segment: percent-encoded, and never ``.`` or ``..`` (which URLs resolve away)."""
    if not value:
        raise click.BadParameter(f"the {name} must not be empty")
    seg = quote(value, safe="")
    return seg.replace(".", "%2E") if seg in (".", "..") else seg


def _at(target: Target, url: httpx.URL, origin: httpx.URL) -> str:
    where = f"the {target.role} at {url.copy_with(query=None)}"
    if _base(url) != _base(origin):
        where += f" (redirected from {_base(origin)})"
    return where


def _base(url: httpx.URL) -> str:
    """scheme://host:port of ``url``."""
    return str(url.copy_with(path="/", query=None, fragment=None)).rstrip("/")


def _reason(e: Exception) -> str:
    text = str(e)
    low = text.lower()
    if "refused" in low:
        return "connection refused"
    if "name or service not known" in low or "nodename nor servname" in low or "name resolution" in low:
        return f"unknown host ({text})"
    return text or type(e).__name__


_NOT_JSON = object()


def _outcome(r: httpx.Response, what: str, target: Target, origin: httpx.URL) -> Any:
    """The JSON of a 2xx, or the :class:`AdminError` its status and ``{"error", "retryable"}`` body call for."""
    where = f"HTTP {r.status_code} from {r.request.method} {r.url}"
    if r.is_success and not r.content.strip():
        return None
    try:
        payload = r.json()
    except ValueError:
        payload = _NOT_JSON
    if r.is_success:
        if payload is _NOT_JSON:
            raise Unexpected(
                f"{where}: the answer is not JSON ({_snippet(r)}); is {_base(origin)} "
                f"a trimtab {target.role}? If not, {target.hint}."
            )
        return payload
    body = payload if isinstance(payload, dict) else {}
    message = body.get("error") if isinstance(body.get("error"), str) else None
    retryable = body.get("retryable") is True
    if r.status_code == 503 or retryable:
        raise Unavailable(f"{message or _snippet(r)} ({where}). Temporary: worth retrying.")
    if 400 <= r.status_code < 500 and payload is not _NOT_JSON:
        if message is None:  # JSON, but not trimtab's error shape
            raise Refused(f"refused: {_snippet(r)} ({where})")
        if r.status_code == 401:
            raise Refused(
                f"{message} ({where}). Pass a token: --token-file FILE, --token TOKEN, "
                f"${SHORT_TOKEN_ENV} or ${TOKEN_FILE_ENV} (docs/security.md)."
            )
        if r.status_code == 403:
            raise Refused(f"{message} ({where}). Use an admin token for this command.")
        if r.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            raise Refused(
                f"the {target.role} at {_base(origin)} does not serve {what} (HTTP {r.status_code} "
                f"{message}): an older version, or not a trimtab {target.role}?"
            )
        raise Refused(f"{message} ({where})")
    if payload is _NOT_JSON or message is None:
        raise Unexpected(
            f"unexpected answer, {where}: {_snippet(r)}; is {_base(origin)} a trimtab {target.role}?"
        )
    raise Unexpected(f"server error: {message} ({where})")


def _snippet(r: httpx.Response, limit: int = 200) -> str:
    ctype = r.headers.get("content-type", "no content type")
    text = " ".join(r.text.split())
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{ctype}: {_printable(text)}" if text else f"{ctype}, empty body"


# ---------------------------------------------------------------------------------------------- rendering
def dump_json(payload: Any) -> str:
    """The server's JSON, indented; characters a terminal could act on are escaped (the JSON is the same)."""
    text = json.dumps(payload, indent=2, ensure_ascii=False)
    if text.replace("\n", "").isprintable():  # the usual case, checked at C speed
        return text
    return "".join(c if c.isprintable() or c == "\n" else json.dumps(c)[1:-1] for c in text)


def _printable(text: str) -> str:
    """``text`` with control characters shown escaped: ids come from the channel and ZooKeeper, where
    anyone can write, and must never send escape sequences to the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def fmt(value: Any, key: str | None = None) -> str:
    """One value as a cell: ``-`` for null, timestamps (ms) as UTC times, lists comma-separated."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if key in _TIME_KEYS and isinstance(value, int) and value > 10**11:
        t = dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
        return t.strftime("%Y-%m-%d %H:%M:%S") + "Z"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value) if value else "-"
    if isinstance(value, dict):
        if not value:
            return "-"
        return _printable(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return _printable(str(value))


def kv(pairs: Iterable[tuple[str, Any]]) -> str:
    """``key: value`` lines, values aligned."""
    rows = [
        (_printable(k), _printable(v) if isinstance(v, str) else fmt(v, k.rsplit(".", 1)[-1]))
        for k, v in pairs
    ]
    if not rows:
        return ""
    width = max(len(k) for k, _ in rows) + 1
    return "\n".join(f"{k + ':':<{width}} {v}".rstrip() for k, v in rows)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str = "(none)") -> str:
    """Aligned columns (two spaces apart), an upper-case header line; ``empty`` when there are no rows."""
    body = [list(r) for r in rows]
    if not body:
        return empty
    heads = [_printable(h).upper() for h in headers]
    widths = [max(len(str(c)) for c in col) for col in zip(heads, *body, strict=False)]
    lines = [
        "  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=False)).rstrip() for row in [heads, *body]
    ]
    return "\n".join(lines)


def flatten(obj: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested objects as dotted keys (``leader.term``)."""
    out: list[tuple[str, Any]] = []
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not _is_records(v):
            out.extend(flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def _is_records(v: Any) -> bool:
    """A map of objects (name -> {...}) or a list of objects: shown as a table."""
    if isinstance(v, dict):
        return bool(v) and all(isinstance(x, dict) for x in v.values())
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def records_table(v: Mapping[str, Any] | Sequence[Any], name: str = "name") -> str:
    """A map name -> object, or a list of objects, as a table: one column per (flattened) field."""
    if isinstance(v, Mapping):
        rows = [{name: k, **dict(flatten(x))} for k, x in v.items()]
    else:
        rows = [dict(flatten(x)) for x in v]
    cols: list[str] = []
    for r in rows:
        cols.extend(c for c in r if c not in cols)
    return table(cols, ([fmt(r.get(c), c.rsplit(".", 1)[-1]) for c in cols] for r in rows))


def render_generic(payload: Any) -> str:
    """Any answer: an object as ``key: value`` lines, its maps of objects and lists of objects as tables."""
    if _is_records(payload):
        return records_table(payload)
    if isinstance(payload, list):
        return "\n".join(fmt(x) for x in payload) if payload else "(none)"
    if not isinstance(payload, dict):
        return fmt(payload)
    plain = [(k, v) for k, v in flatten(payload) if not _is_records(v)]
    parts = [kv(plain)] if plain else []
    for k, v in flatten(payload):
        if _is_records(v):
            parts.append(f"{_printable(k)}:\n" + records_table(v))
    return "\n\n".join(parts) if parts else "(none)"


def _record_pairs(rec: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    if rec is None:
        return [("state", "init (no record)")]
    pairs = [(k, rec.get(k)) for k in ("state", "dst", "src", "version", "force", "writer", "ts")]
    if rec.get("children"):
        pairs.append(("children", sorted(rec["children"])))
    return pairs


def render_leader(p: Mapping[str, Any]) -> str:
    lead = p.get("leader") or {}
    return kv(
        [
            ("leader", lead.get("id") if lead else "none elected"),
            ("term", lead.get("term")),
            ("leader url", lead.get("http_url")),
            ("since", lead.get("since")),
            ("this controller", p["me"]),
            ("is leader", p["is_leader"]),
            ("safe mode", p.get("safe_mode")),
        ]
    )


def _msg_rate(load: Mapping[str, Any]) -> float | None:
    rates = [load.get(k) for k in ("msg_rate_in", "msg_rate_out")]
    nums = [float(r) for r in rates if isinstance(r, (int, float))]
    return sum(nums) if nums else None


def _brokers_rows(brokers: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for b, v in brokers.items():
        info, load = v.get("info") or {}, v.get("load") or {}
        rows.append(
            [
                fmt(b),
                fmt(info.get("http_url")),
                fmt(info.get("service_url")),
                fmt(info.get("failure_domain")),
                fmt(info.get("draining")),
                fmt(load.get("weighted_max_ema")),
                fmt(load.get("bundles")),
                fmt(load.get("topics")),
                fmt(_msg_rate(load)),
            ]
        )
    return rows


def render_brokers(p: Mapping[str, Any]) -> str:
    heads = [
        "broker",
        "http_url",
        "service_url",
        "domain",
        "draining",
        "load",
        "bundles",
        "topics",
        "msg_rate",
    ]
    return table(heads, _brokers_rows(p["brokers"]), empty="no live brokers")


def render_ownership(p: Mapping[str, Any]) -> str:
    rows = [
        [fmt(b), fmt(r.get("state")), fmt(r.get("dst")), fmt(r.get("src")), fmt(r.get("version"))]
        for b, r in p["bundles"].items()
    ]
    n = p.get("count", len(rows))
    return table(["bundle", "state", "owner", "src", "version"], rows, empty="no bundles") + (
        f"\n{n} bundle{'s' if n != 1 else ''}" if rows else ""
    )


def render_bundle(p: Mapping[str, Any]) -> str:
    return kv([("bundle", p["bundle"]), *_record_pairs(p.get("record"))])


def render_move(p: Mapping[str, Any]) -> str:
    """transfer / unload: the record the controller published (the move goes on asynchronously), or for
    a dry run what it would publish and why."""
    extra = [(k, v) for k, v in flatten(p) if k not in {"bundle", "record"} and not k.startswith("record.")]
    record = _record_pairs(p.get("record")) if "record" in p else []
    return kv([("bundle", p["bundle"]), *record, *extra])


def render_status(p: Mapping[str, Any]) -> str:
    lead = p.get("leader") or {}
    ch, load, shed, heal = p["channel"], p["load"], p["shedding"], p["healing"]
    last = shed.get("last") or {}
    failed = heal.get("failed") or {}
    head = kv(
        [
            ("controller", f"{fmt(p['controller'])} ({'leader' if p['is_leader'] else 'follower'})"),
            ("leader", f"{fmt(lead.get('id'))}, term {fmt(lead.get('term'))}" if lead else "none elected"),
            ("safe mode", p.get("safe_mode")),
            ("zookeeper", p.get("zookeeper")),
            (
                "channel",
                f"{'ready' if ch.get('ready') else 'NOT READY'}, lag {fmt(ch.get('lag'))}, "
                f"{fmt(ch.get('bundles'))} bundles",
            ),
            (
                "load",
                f"avg {fmt(load.get('avg'))}, std {fmt(load.get('std'))} (target {fmt(load.get('target_std'))})",
            ),
            (
                "shedding",
                ("PAUSED" if shed.get("paused") else "running" if shed.get("enabled") else "disabled")
                + f", {fmt(shed.get('strategy'))}"
                + (f", last: {fmt(last.get('result'))} ({fmt(last.get('reason'))})" if last else ""),
            ),
            (
                "operations",
                ", ".join(
                    f"{fmt(o['id'])} {fmt(o['state'])} {o['progress']['done']}/{o['progress']['total']}"
                    for o in (p.get("operations") or {}).get("operations", [])
                )
                or "none running",
            ),
            (
                "healing",
                (f"PAUSED ({fmt(heal.get('paused'))}), " if heal.get("paused") else "")
                + (f"{len(failed)} failed: {', '.join(map(fmt, failed))}" if failed else "no failed brokers")
                + (
                    f", {fmt(heal.get('pending_bundles'))} bundles pending"
                    if heal.get("pending_bundles")
                    else ""
                ),
            ),
        ]
    )
    brokers = table(
        ["broker", "bundles", "load", "msg_rate", "draining"],
        (
            [
                fmt(b),
                fmt(v.get("bundles")),
                fmt(v.get("load")),
                fmt(v.get("msg_rate")),
                fmt(v.get("draining")),
            ]
            for b, v in p["brokers"].items()
        ),
        empty="no live brokers",
    )
    recent = table(
        ["time", "kind", "details"],
        (
            [
                fmt(e.get("ts"), "ts"),
                fmt(e.get("kind")),
                " ".join(
                    f"{_printable(str(k))}={fmt(v, k)}" for k, v in e.items() if k not in ("ts", "kind")
                ),
            ]
            for e in p.get("recent") or []
        ),
        empty="(none)",
    )
    return f"{head}\n\n{brokers}\n\nrecent decisions:\n{recent}"


def render_healing(p: Mapping[str, Any]) -> str:
    failed = p.get("failed") or {}
    head = kv([(k, v) for k, v in flatten(p) if not k.startswith("failed")])
    rows = [
        [fmt(b), fmt(f.get("first_failure"), "first_failure"), fmt(f.get("age_s"))] for b, f in failed.items()
    ]
    return f"{head}\n\n" + table(["failed broker", "first_failure", "age_s"], rows, empty="no failed brokers")


def render_shedding(p: Mapping[str, Any]) -> str:
    return kv(
        [
            ("shedding", "paused" if p["shedding_paused"] else "running"),
            ("paused by", p.get("paused_by")),
            ("paused at", fmt(p.get("paused_at"), "paused_at")),
        ]
    )


# ---------------------------------------------------------------------------------------------- the group
_OUTPUTS = click.Choice(["table", "json"])


def _client(ctx: click.Context) -> AdminClient:
    client = ctx.find_object(AdminClient)
    assert client is not None, "trimtab admin's options were not parsed"
    return client


def _set_output(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _client(ctx).output = value


def command(group: click.Group, name: str, **kw: Any) -> Callable[[F], click.Command]:
    """``group.command(name)`` with ``-o/--output`` also accepted after the command (``status -o json``)."""

    def wrap(fn: F) -> click.Command:
        fn = click.option(
            "-o",
            "--output",
            type=_OUTPUTS,
            default=None,
            expose_value=False,
            callback=_set_output,
            help="table or json (same as the admin option).",
        )(fn)
        return group.command(name, **kw)(fn)

    return wrap


def _check_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", value):
        raise click.BadParameter(f"{value!r} is not an http:// or https:// address (e.g. {DEFAULT_URL})")
    return value


def _token(ctx: click.Context, token: str | None, token_file: str | None) -> str | None:
    """The token to send: --token, or the first token of --token-file. When both are set, the command line
    beats the environment (and between two environment variables the token beats the file); both on the
    command line is a usage error."""
    from click.core import ParameterSource

    def explicit(name: str) -> bool:
        return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE

    if token and token_file:
        if explicit("token") and explicit("token_file"):
            raise click.UsageError("give --token or --token-file, not both")
        if explicit("token_file"):
            token = None
    if token:
        return token.strip() or None
    if not token_file:
        return None
    try:
        with open(token_file, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
    except OSError as e:
        raise click.BadParameter(
            f"cannot read {token_file}: {e.strerror or type(e).__name__}", param_hint="--token-file"
        ) from None
    first = next((ln for ln in lines if ln and not ln.startswith("#")), None)
    if first is None:
        raise click.BadParameter(f"{token_file} holds no token", param_hint="--token-file")
    return first


def _cacert(path: str | None) -> str | None:
    if path is None:
        return None
    import ssl

    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as e:
        raise click.BadParameter(
            f"cannot load {path} as a PEM CA bundle ({type(e).__name__})", param_hint="--cacert"
        ) from None
    return path


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option(
    "--url",
    "--controller",
    "url",
    envvar=[URL_ENV, LEGACY_URL_ENV],
    default=DEFAULT_URL,
    show_default=True,
    callback=_check_url,
    help=f"Any controller's HTTP address (a follower redirects writes to the leader). ${URL_ENV}",
)
@click.option(
    "--agent-url",
    envvar=AGENT_URL_ENV,
    default=None,
    callback=_check_url,
    help=f"An agent's HTTP address, for `lookup` (default: one the controller lists). ${AGENT_URL_ENV}",
)
@click.option(
    "-o",
    "--output",
    type=_OUTPUTS,
    default="table",
    show_default=True,
    help="table: aligned columns and key: value lines; json: the server's JSON as it answered.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds to wait for a connection and for each answer.",
)
@click.option(
    "--token",
    envvar=[TOKEN_ENV, SHORT_TOKEN_ENV],
    default=None,
    help=f"A read or admin token, sent as 'Authorization: Bearer TOKEN' (and again to the leader when a "
    f"follower redirects). Prefer --token-file: a command line is visible to other users. ${TOKEN_ENV} or "
    f"${SHORT_TOKEN_ENV}",
)
@click.option(
    "--token-file",
    envvar=TOKEN_FILE_ENV,
    default=None,
    type=click.Path(dir_okay=False),
    help=f"Read the token from FILE (its first line that is not blank or a # comment: a servers' token "
    f"file works as is). ${TOKEN_FILE_ENV}",
)
@click.option(
    "--cacert",
    envvar=CACERT_ENV,
    default=None,
    type=click.Path(dir_okay=False),
    help=f"PEM CA bundle to verify https:// servers with (default: the system's). ${CACERT_ENV}",
)
@click.pass_context
def admin(
    ctx: click.Context,
    url: str,
    agent_url: str | None,
    output: str,
    timeout: float,
    token: str | None,
    token_file: str | None,
    cacert: str | None,
) -> None:
    """Operator commands against the controllers' HTTP API (docs/admin-cli.md).

    \b
    Exit codes: 0 done; 1 refused by the server (its message on stderr); 2 usage error;
    3 unavailable, worth retrying (no connection, timeout, 503, retryable); 4 unexpected answer.
    """
    client = AdminClient(
        url=url,
        agent_url=agent_url,
        output=output,
        timeout=timeout,
        token=_token(ctx, token, token_file),
        cacert=_cacert(cacert),
    )
    ctx.obj = client
    ctx.call_on_close(client.close)


# ---------------------------------------------------------------------------------------------- views
@command(admin, "lookup")
@click.argument("topic")
@click.pass_context
def lookup(ctx: click.Context, topic: str) -> None:
    """Who owns TOPIC (a full name, persistent://tenant/ns/topic)? Assigns its bundle if nobody does.

    Asks --agent-url, or else the live agents the controller lists, in turn."""
    c = _client(ctx)
    if c.agent_url:
        targets = [c.agent(c.agent_url, discovered=False)]
    else:
        hint = (
            f"point --url (or ${URL_ENV}) at a controller, or --agent-url (or ${AGENT_URL_ENV}) at an agent"
        )
        listed = c.call("GET", "/v1/brokers", target=Target(c.url, "controller", hint))
        brokers = (listed.get("brokers") if isinstance(listed, dict) else None) or {}
        infos = sorted(
            ((v.get("info") or {}) for v in brokers.values()),
            key=lambda i: (bool(i.get("draining")), str(i.get("id"))),
        )
        targets = [
            c.agent(str(i["http_url"]).rstrip("/"), discovered=True) for i in infos if i.get("http_url")
        ]
        if not targets:
            raise Unavailable(
                f"the controller at {c.url} lists no live agents to ask; set --agent-url (or ${AGENT_URL_ENV})"
            )
    last: Unavailable | None = None
    for t in targets:
        try:
            answer = c.call("GET", "/v1/lookup", params={"topic": topic}, target=t)
        except Unavailable as e:
            last = e  # this agent is down or not ready: the next one may answer
            continue
        c.show(answer, lambda p: kv(flatten(p)))
        return
    assert last is not None
    if len(targets) > 1:
        raise Unavailable(f"{last.message} (tried {len(targets)} agents)")
    raise last


@command(admin, "ownership")
@click.option("--broker", default=None, help="Only the bundles this broker owns (or is receiving).")
@click.option("--namespace", default=None, metavar="TENANT/NS", help="Only this namespace's bundles.")
@click.pass_context
def ownership(ctx: click.Context, broker: str | None, namespace: str | None) -> None:
    """Every bundle with its state and owner, optionally of one broker or namespace."""
    c = _client(ctx)
    params = {k: v for k, v in (("broker", broker), ("namespace", namespace)) if v}
    c.show(c.call("GET", "/v1/ownership", params=params), render_ownership)


@command(admin, "brokers")
@click.pass_context
def brokers(ctx: click.Context) -> None:
    """Live brokers with their registration and latest load report."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/brokers"), render_brokers)


@command(admin, "leader")
@click.pass_context
def leader(ctx: click.Context) -> None:
    """The leader, its term, and whether the controller asked is it."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/leader"), render_leader)


@command(admin, "status")
@click.pass_context
def status(ctx: click.Context) -> None:
    """Leader, channel, brokers with load and bundle counts, load spread, shedding, healing, decisions."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/status"), render_status)


@command(admin, "bundle")
@click.argument("bundle")
@click.pass_context
def bundle(ctx: click.Context, bundle: str) -> None:
    """One bundle's channel record (tenant/ns/0xLLLLLLLL_0xUUUUUUUU)."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/bundles", params={"bundle": bundle}), render_bundle)


@command(admin, "healing")
@click.pass_context
def healing(ctx: click.Context) -> None:
    """Failed brokers, healing progress and pause reason."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/healing"), render_healing)


# ---------------------------------------------------------------------------------------------- writes
dry_run_option = click.option(
    "--dry-run",
    is_flag=True,
    help="Ask the controller what would happen, change nothing (refused, nothing sent, if it cannot).",
)


def _write(
    c: AdminClient,
    method: str,
    template: str,
    body: dict[str, Any] | None,
    *,
    dry_run: bool,
    in_query: bool = False,
    path: Mapping[str, str] | None = None,
    render: Callable[[Any], str] | None = None,
) -> None:
    params = None
    if dry_run:
        c.require_dry_run(method, template)
        if in_query:
            params = {"dry_run": "true"}
        elif body is not None:
            body["dry_run"] = True
    c.show(c.call(method, template, path=path, params=params, body=body), render)


_reason_option = click.option("--reason", default="", help="Why (kept with the operation).")
_by_option = click.option(
    "--by", default="admin", show_default=True, help="Who asks (kept with the operation)."
)


@command(admin, "transfer")
@click.argument("bundle")
@click.argument("broker")
@dry_run_option
@_reason_option
@_by_option
@click.pass_context
def transfer(ctx: click.Context, bundle: str, broker: str, dry_run: bool, reason: str, by: str) -> None:
    """Move BUNDLE to BROKER (fenced on its owner, acquired on BROKER, then clients are redirected).

    Accepted means started, as an operation of one move: `trimtab admin ops show ID` follows it, and
    `trimtab admin bundle BUNDLE` shows when BROKER owns it."""
    c = _client(ctx)
    _write(
        c,
        "POST",
        "/v1/admin/transfer",
        {"bundle": bundle, "broker": broker, "reason": reason, "by": by},
        dry_run=dry_run,
        render=render_move,
    )


@command(admin, "unload")
@click.argument("bundle")
@dry_run_option
@_reason_option
@_by_option
@click.pass_context
def unload(ctx: click.Context, bundle: str, dry_run: bool, reason: str, by: str) -> None:
    """Unload BUNDLE from its owner; the next lookup assigns it (an operation of one move, as transfer)."""
    c = _client(ctx)
    body = {"bundle": bundle, "reason": reason, "by": by}
    _write(c, "POST", "/v1/admin/unload", body, dry_run=dry_run, render=render_move)


def _hex_boundaries(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for b in value:
        try:
            int(b, 16)
        except ValueError:
            raise click.BadParameter(f"{b!r} is not a hex position like 0x40000000") from None
    return value


@command(admin, "split")
@click.argument("bundle")
@click.option(
    "--algorithm",
    default=None,
    help="range_equally_divide | topic_count_equally_divide | specified_positions_divide | "
    "flow_or_qps_equally_divide (default: the agents' split.algorithm; with --boundary, specified_positions_divide).",
)
@click.option(
    "--boundary",
    "boundaries",
    multiple=True,
    metavar="0xHEX",
    callback=_hex_boundaries,
    help="A split position, for specified_positions_divide (repeatable).",
)
@dry_run_option
@click.pass_context
def split(
    ctx: click.Context, bundle: str, algorithm: str | None, boundaries: tuple[str, ...], dry_run: bool
) -> None:
    """Split BUNDLE (done by its owner's agent; the children stay on that broker)."""
    c = _client(ctx)
    body: dict[str, Any] = {"bundle": bundle, "algorithm": algorithm, "boundaries": list(boundaries)}
    _write(c, "POST", "/v1/admin/split", body, dry_run=dry_run, render=lambda p: kv(flatten(p)))


@command(admin, "merge")
@click.argument("bundle_a")
@click.argument("bundle_b")
@dry_run_option
@_by_option
@click.pass_context
def merge(ctx: click.Context, bundle_a: str, bundle_b: str, dry_run: bool, by: str) -> None:
    """Merge two adjacent bundles of one namespace, owned by one broker, into one (the owner serves the
    merged bundle in place; no client is disconnected). Bundles owned by two brokers: `transfer` one first.

    Accepted means started: `trimtab admin bundle MERGED` shows when the merged bundle is owned."""
    c = _client(ctx)
    body = {"bundles": [bundle_a, bundle_b], "by": by}
    _write(c, "POST", "/v1/admin/merge", body, dry_run=dry_run, render=lambda p: kv(flatten(p)))


def _default_by() -> str:
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # no user name in a bare container: still say it was the CLI
        return "trimtab-admin"


@command(admin, "shedding")
@click.argument("action", type=click.Choice(["pause", "resume"]))
@click.option("--by", default=None, help="Who asks (recorded with the switch). [default: USER@HOST]")
@click.pass_context
def shedding(ctx: click.Context, action: str, by: str | None) -> None:
    """Pause or resume shedding (persisted in ZooKeeper: survives a failover)."""
    c = _client(ctx)
    body = {"paused": action == "pause", "by": by or _default_by()}
    c.show(c.call("POST", "/v1/admin/shedding", body=body), render_shedding)


@command(admin, "drain")
@click.argument("broker")
@dry_run_option
@click.pass_context
def drain(ctx: click.Context, broker: str, dry_run: bool) -> None:
    """Move every bundle off BROKER (with --dry-run: where they would go)."""
    c = _client(ctx)
    _write(c, "POST", "/v1/admin/drain", {"broker": broker, "dry_run": False}, dry_run=dry_run)


# ---------------------------------------------------------------------------------------------- placement
@admin.group("failure-domains")
def failure_domains() -> None:
    """Failure domains: named sets of brokers that anti-affinity groups are spread over."""


@command(failure_domains, "list")
@click.pass_context
def failure_domains_list(ctx: click.Context) -> None:
    """Every failure domain with its brokers."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/failure-domains"))


@command(failure_domains, "get")
@click.argument("name")
@click.pass_context
def failure_domains_get(ctx: click.Context, name: str) -> None:
    """One failure domain."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/failure-domains/{name}", path={"name": name}))


@command(failure_domains, "set")
@click.argument("name")
@click.option(
    "--broker", "brokers", multiple=True, required=True, metavar="ID", help="A member (repeatable)."
)
@click.pass_context
def failure_domains_set(ctx: click.Context, name: str, brokers: tuple[str, ...]) -> None:
    """Create or replace failure domain NAME with exactly these brokers."""
    c = _client(ctx)
    body = {"brokers": list(brokers)}
    c.show(c.call("PUT", "/v1/failure-domains/{name}", path={"name": name}, body=body))


@command(failure_domains, "delete")
@click.argument("name")
@click.pass_context
def failure_domains_delete(ctx: click.Context, name: str) -> None:
    """Delete failure domain NAME."""
    c = _client(ctx)
    c.show(c.call("DELETE", "/v1/failure-domains/{name}", path={"name": name}))


@admin.group("anti-affinity")
def anti_affinity() -> None:
    """Namespace anti-affinity groups: a group's bundles are spread over brokers and failure domains."""


def _namespace(ctx: click.Context, param: click.Parameter, value: str) -> dict[str, str]:
    parts = value.split("/")
    if len(parts) != 2 or not all(parts):
        raise click.BadParameter(f"{value!r} is not a namespace TENANT/NS")
    return {"tenant": parts[0], "namespace": parts[1]}


_NS_ROUTE = "/v1/namespaces/{tenant}/{namespace}/anti-affinity"


@command(anti_affinity, "get")
@click.argument("namespace", metavar="TENANT/NS", callback=_namespace)
@click.pass_context
def anti_affinity_get(ctx: click.Context, namespace: dict[str, str]) -> None:
    """The anti-affinity group of a namespace."""
    c = _client(ctx)
    c.show(c.call("GET", _NS_ROUTE, path=namespace))


@command(anti_affinity, "set")
@click.argument("namespace", metavar="TENANT/NS", callback=_namespace)
@click.argument("group")
@click.pass_context
def anti_affinity_set(ctx: click.Context, namespace: dict[str, str], group: str) -> None:
    """Put a namespace in anti-affinity GROUP."""
    c = _client(ctx)
    c.show(c.call("PUT", _NS_ROUTE, path=namespace, body={"group": group}))


@command(anti_affinity, "clear")
@click.argument("namespace", metavar="TENANT/NS", callback=_namespace)
@click.pass_context
def anti_affinity_clear(ctx: click.Context, namespace: dict[str, str]) -> None:
    """Take a namespace out of its anti-affinity group."""
    c = _client(ctx)
    c.show(c.call("DELETE", _NS_ROUTE, path=namespace))


@command(anti_affinity, "list")
@click.argument("group")
@click.pass_context
def anti_affinity_list(ctx: click.Context, group: str) -> None:
    """The namespaces of anti-affinity GROUP."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/anti-affinity/{group}", path={"group": group}))


@admin.group("isolation-policies")
def isolation_policies() -> None:
    """Namespace isolation policies: which brokers (primary, then secondary) may own which namespaces."""


@command(isolation_policies, "list")
@click.pass_context
def isolation_list(ctx: click.Context) -> None:
    """Every isolation policy."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/isolation-policies"))


@command(isolation_policies, "get")
@click.argument("name")
@click.pass_context
def isolation_get(ctx: click.Context, name: str) -> None:
    """One isolation policy."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/isolation-policies/{name}", path={"name": name}))


@command(isolation_policies, "set")
@click.argument("name")
@click.option(
    "--namespaces", multiple=True, required=True, metavar="RE", help="Namespace regex (repeatable)."
)
@click.option(
    "--primary", multiple=True, required=True, metavar="RE", help="Primary broker host regex (repeatable)."
)
@click.option("--secondary", multiple=True, metavar="RE", help="Secondary broker host regex (repeatable).")
@click.option(
    "--min-limit",
    type=click.IntRange(min=0),
    default=None,
    help="Fewer live primaries than this: use the secondaries too. [server default: 1]",
)
@click.option(
    "--unload-scope",
    type=click.Choice(["changed", "all_matching", "none"]),
    default=None,
    help="Which namespaces' bundles to unload so they are placed again. [server default]",
)
@dry_run_option
@click.pass_context
def isolation_set(
    ctx: click.Context,
    name: str,
    namespaces: tuple[str, ...],
    primary: tuple[str, ...],
    secondary: tuple[str, ...],
    min_limit: int | None,
    unload_scope: str | None,
    dry_run: bool,
) -> None:
    """Create or replace isolation policy NAME."""
    c = _client(ctx)
    body: dict[str, Any] = {"namespaces": list(namespaces), "primary": list(primary)}
    if secondary:
        body["secondary"] = list(secondary)
    if min_limit is not None:
        body["min_limit"] = min_limit
    if unload_scope is not None:
        body["unload_scope"] = unload_scope
    _write(
        c, "PUT", "/v1/isolation-policies/{name}", body, dry_run=dry_run, in_query=True, path={"name": name}
    )


@command(isolation_policies, "delete")
@click.argument("name")
@click.option(
    "--unload-scope",
    type=click.Choice(["changed", "all_matching", "none"]),
    default=None,
    help="none: unload nothing; changed or all_matching: unload the policy's namespaces. [server default]",
)
@dry_run_option
@click.pass_context
def isolation_delete(ctx: click.Context, name: str, unload_scope: str | None, dry_run: bool) -> None:
    """Delete isolation policy NAME (and unload its namespaces' bundles so they are placed again)."""
    c = _client(ctx)
    template = "/v1/isolation-policies/{name}"
    params = {"unload_scope": unload_scope} if unload_scope else {}
    if dry_run:
        c.require_dry_run("DELETE", template)
        params["dry_run"] = "true"
    c.show(c.call("DELETE", template, path={"name": name}, params=params))


@command(isolation_policies, "brokers")
@click.argument("broker", required=False)
@click.pass_context
def isolation_brokers(ctx: click.Context, broker: str | None) -> None:
    """Which policies each broker is primary or secondary for (or one BROKER's)."""
    c = _client(ctx)
    if broker is None:
        c.show(c.call("GET", "/v1/isolation-policies/brokers"))
    else:
        c.show(c.call("GET", "/v1/isolation-policies/brokers/{broker}", path={"broker": broker}))


# ---------------------------------------------------------------------------------------------- namespaces
@admin.group("namespaces")
def namespaces_group() -> None:
    """Namespaces: lookups create none unless the agents' namespace.auto_create allows it (docs/security.md)."""


def render_namespaces(p: Mapping[str, Any]) -> str:
    rows = [[fmt(ns), fmt(v.get("bundles")), fmt(v.get("owned"))] for ns, v in p["namespaces"].items()]
    n = p.get("count", len(rows))
    return table(["namespace", "bundles", "owned"], rows, empty="no namespaces") + (
        f"\n{n} namespace{'s' if n != 1 else ''}" if rows else ""
    )


def render_namespace_created(p: Mapping[str, Any]) -> str:
    bundles = p["bundles"]
    head = "would create" if p.get("dry_run") else "created"
    return kv([("namespace", p["namespace"]), (head, f"{len(bundles)} bundles"), ("bundles", bundles)])


def render_namespace_deleted(p: Mapping[str, Any]) -> str:
    dry = bool(p.get("dry_run"))
    unloaded, in_flight, failed = p["unloaded"], p.get("in_flight") or {}, p.get("failed") or {}
    pairs: list[tuple[str, Any]] = [
        ("namespace", p["namespace"]),
        ("dry run", dry),
        (
            "znode",
            ("would be deleted" if dry else "deleted")
            if p["existed"]
            else "none (deleted before: only the channel is cleaned up)",
        ),
        ("would unload" if dry else "unloaded", f"{len(unloaded)} bundles"),
    ]
    if unloaded:
        pairs.append(("bundles", unloaded))
    if in_flight:
        pairs.append(
            (
                "in flight",
                ", ".join(f"{b} ({s})" for b, s in sorted(in_flight.items())) + ": delete again once settled",
            )
        )
    if failed:
        pairs.append(("failed", ", ".join(f"{b}: {e}" for b, e in sorted(failed.items()))))
    return kv(pairs)


@command(namespaces_group, "list")
@click.pass_context
def namespaces_list(ctx: click.Context) -> None:
    """Every namespace with its bundle count and how many of its bundles are owned."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/namespaces"), render_namespaces)


@command(namespaces_group, "create")
@click.argument("namespace", metavar="TENANT/NS", callback=_namespace)
@click.option(
    "--bundles",
    type=click.IntRange(min=1),
    default=None,
    help="Equal bundles to start with (at most split.max_bundles_per_namespace). [server default: "
    "namespace.default_bundles]",
)
@dry_run_option
@click.pass_context
def namespaces_create(
    ctx: click.Context, namespace: dict[str, str], bundles: int | None, dry_run: bool
) -> None:
    """Create namespace TENANT/NS; the first lookups of its topics assign its bundles."""
    c = _client(ctx)
    body: dict[str, Any] = dict(namespace)
    if bundles is not None:
        body["bundles"] = bundles
    _write(c, "POST", "/v1/admin/namespaces", body, dry_run=dry_run, render=render_namespace_created)


@command(namespaces_group, "delete")
@click.argument("namespace", metavar="TENANT/NS", callback=_namespace)
@dry_run_option
@click.pass_context
def namespaces_delete(ctx: click.Context, namespace: dict[str, str], dry_run: bool) -> None:
    """Delete namespace TENANT/NS: its znode first (no lookup can assign its bundles again), then every
    bundle it owns is unloaded. Bundles in flight are listed: run it again once they settle."""
    c = _client(ctx)
    _write(
        c,
        "DELETE",
        "/v1/admin/namespaces/{tenant}/{namespace}",
        None,
        dry_run=dry_run,
        in_query=True,
        path=namespace,
        render=render_namespace_deleted,
    )


@admin.group("ops")
def ops_group() -> None:
    """Operations: drains and maintenance the leader carries out, persisted and
    resumed by a new leader (docs/operations.md, "Operations")."""


def render_ops(p: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            fmt(o["id"]),
            fmt(o["kind"]),
            fmt(o["state"]),
            f"{o['progress']['done']}/{o['progress']['total']}",
            fmt(o["reason"]),
        ]
        for o in p
    ]
    return table(["id", "kind", "state", "progress", "reason"], rows, empty="no operations")


def render_op(p: Mapping[str, Any]) -> str:
    progress = f"{p['progress']['done']}/{p['progress']['total']}"
    pairs: list[tuple[str, Any]] = [
        ("id", p["id"]),
        ("kind", p["kind"]),
        ("state", p["state"] + (f" ({p['state_reason']})" if p.get("state_reason") else "")),
        ("progress", progress),
        ("reason", p["reason"]),
        ("requested by", p["requested_by"]),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(p["outcomes"].items())) or "none yet"),
    ]
    moves = [
        [fmt(m["bundle"]), fmt(m["src"]), fmt(m.get("dst") or "(unload)"), fmt(m.get("outcome") or "")]
        for m in p["moves"]
    ]
    shown = f"\nfirst {p['moves_shown']} of {p['progress']['total']} moves" if moves else ""
    return kv(pairs) + "\n\n" + table(["bundle", "from", "to", "outcome"], moves, empty="no moves") + shown


@command(ops_group, "list")
@click.pass_context
def ops_list(ctx: click.Context) -> None:
    """Every operation the leader holds (the newest finished ones too), with its progress."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/admin/ops"), render_ops)


@command(ops_group, "show")
@click.argument("op_id", metavar="ID")
@click.option("--moves", default=100, show_default=True, help="How many of its moves to show.")
@click.pass_context
def ops_show(ctx: click.Context, op_id: str, moves: int) -> None:
    """One operation: who asked and why, its state, how its moves ended so far."""
    c = _client(ctx)
    c.show(
        c.call("GET", "/v1/admin/ops/{op_id}", path={"op_id": op_id}, params={"moves": str(moves)}), render_op
    )


def _ops_verb(ctx: click.Context, op_id: str, verb: str, reason: str | None) -> None:
    c = _client(ctx)
    body = {"reason": reason} if reason else {}
    c.show(
        c.call("POST", "/v1/admin/ops/{op_id}/{verb}", path={"op_id": op_id, "verb": verb}, body=body),
        lambda p: render_ops([p]),
    )


@command(ops_group, "pause")
@click.argument("op_id", metavar="ID")
@click.option("--reason", default=None, help="Why (shown with the state).")
@click.pass_context
def ops_pause(ctx: click.Context, op_id: str, reason: str | None) -> None:
    """Pause an operation: moves already started finish, no new one starts."""
    _ops_verb(ctx, op_id, "pause", reason)


@command(ops_group, "resume")
@click.argument("op_id", metavar="ID")
@click.pass_context
def ops_resume(ctx: click.Context, op_id: str) -> None:
    """Resume a paused operation."""
    _ops_verb(ctx, op_id, "resume", None)


@command(ops_group, "cancel")
@click.argument("op_id", metavar="ID")
@click.option("--reason", default=None, help="Why (shown with the state).")
@click.pass_context
def ops_cancel(ctx: click.Context, op_id: str, reason: str | None) -> None:
    """Cancel an operation: moves already started finish (a move cannot be taken back half made), the rest
    are not made."""
    _ops_verb(ctx, op_id, "cancel", reason)


@admin.group("settings")
def settings_group() -> None:
    """Settings changeable at run time without a restart: the operations' limits (docs/operations.md,
    "Operations")."""


def _live_value(text: str) -> Any:
    """A value as JSON when it is JSON (``10``, ``2.5``, ``null``), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@command(settings_group, "show")
@click.pass_context
def settings_show(ctx: click.Context) -> None:
    """The keys that may change at run time, the overrides stored, the values in force."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/admin/settings"))


@command(settings_group, "set")
@click.argument("pairs", nargs=-1, required=True, metavar="KEY=VALUE...")
@click.option("--by", default="admin", show_default=True, help="Who asks (stored with the override).")
@click.pass_context
def settings_set(ctx: click.Context, pairs: tuple[str, ...], by: str) -> None:
    """Override live settings, e.g. ``operations.max_in_flight=50``; the leader's next pass uses them."""
    changes = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE")
        changes[key] = _live_value(value)
    c = _client(ctx)
    c.show(c.call("PUT", "/v1/admin/settings", body={"set": changes, "by": by}))


@command(settings_group, "reset")
@click.argument("keys", nargs=-1, required=True, metavar="KEY...")
@click.option("--by", default="admin", show_default=True, help="Who asks (stored with the override).")
@click.pass_context
def settings_reset(ctx: click.Context, keys: tuple[str, ...], by: str) -> None:
    """Drop overrides: those keys go back to their configured value."""
    c = _client(ctx)
    c.show(c.call("PUT", "/v1/admin/settings", body={"reset": list(keys), "by": by}))


def render_explain(p: Mapping[str, Any]) -> str:
    cluster = p.get("cluster", p)
    lines = []
    if "bundle" in p:
        rec = p.get("record") or {}
        lines.append(
            kv(
                [
                    ("bundle", p["bundle"]),
                    ("state", f"{fmt(rec.get('state'))} v{fmt(rec.get('version'))}" if rec else "no record"),
                    ("owner", p.get("owner")),
                    ("placement", p.get("placement")),
                    ("could go to", ", ".join(p.get("candidates") or []) or "nowhere"),
                ]
            )
        )
        why = p.get("why_not_moved") or []
        lines.append(
            table(
                ["why it did not move", "detail"],
                ([fmt(r["reason"]), fmt(r["detail"])] for r in why),
                empty="",
            )
            if why
            else "nothing holds it here: it moves when the balance calls for it"
        )
    state = "balanced" if cluster.get("balanced") else "not balanced"
    lines.append(f"cluster: {state} (std {fmt(cluster.get('std'))}, target {fmt(cluster.get('target_std'))})")
    lines.append(
        table(
            ["reason", "detail"],
            ([fmt(r["reason"]), fmt(r["detail"])] for r in cluster["reasons"]),
            empty="no reasons",
        )
    )
    return "\n".join(lines)


@command(admin, "explain")
@click.argument("bundle", required=False)
@click.pass_context
def explain_cmd(ctx: click.Context, bundle: str | None) -> None:
    """Why the cluster is not balanced; with BUNDLE, why that bundle is on its broker and did not move --
    from the leader's last decisions."""
    c = _client(ctx)
    params = {"bundle": bundle} if bundle else None
    c.show(c.call("GET", "/v1/admin/explain", params=params), render_explain)


@admin.group("maintenance")
def maintenance_group() -> None:
    """Planned maintenance of a broker: drained before a deadline, out of service until ended -- not a
    failure (docs/operations.md, "Maintenance")."""


@command(maintenance_group, "list")
@click.pass_context
def maintenance_list(ctx: click.Context) -> None:
    """Brokers in maintenance, with their operation and deadline."""
    c = _client(ctx)
    c.show(c.call("GET", "/v1/admin/maintenance"))


@command(maintenance_group, "start")
@click.argument("broker")
@click.option("--deadline", "deadline_s", type=float, required=True, help="Seconds to drain it in.")
@click.option("--reason", default="", help="Why (kept with the operation).")
@click.option("--by", default="admin", show_default=True, help="Who asks.")
@click.pass_context
def maintenance_start(ctx: click.Context, broker: str, deadline_s: float, reason: str, by: str) -> None:
    """Drain BROKER before the deadline and keep it out of service until `maintenance end`."""
    c = _client(ctx)
    body = {"broker": broker, "deadline_s": deadline_s, "reason": reason, "by": by}
    c.show(c.call("POST", "/v1/admin/maintenance", body=body))


@command(maintenance_group, "end")
@click.argument("broker")
@click.option("--by", default="admin", show_default=True, help="Who asks.")
@click.pass_context
def maintenance_end(ctx: click.Context, broker: str, by: str) -> None:
    """Return BROKER to service: it takes bundles again, as balance requires."""
    c = _client(ctx)
    c.show(c.call("POST", "/v1/admin/maintenance/{broker}/end", path={"broker": broker}, params={"by": by}))
