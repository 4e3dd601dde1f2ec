"""Properties of signed webhook calls (agent/adapters/signing.py): changing any signed field -- broker id,
method, path, query, body, timestamp, nonce -- breaks the signature; no forged header set verifies; the
framing is unambiguous; and against a model with unbounded memory, the Verifier accepts exactly the calls
that are in the window and not replays of a remembered call, with a bounded cache. Also the agent's
splitting of large renewals (agent/adapters/webhook.py)."""

from __future__ import annotations

import string

import orjson
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trimtab.agent.adapters.base import Lease
from trimtab.agent.adapters.signing import (
    BROKER,
    MAX_AGE_MS,
    MAX_AHEAD_MS,
    NONCE,
    SIGNATURE,
    TIMESTAMP,
    NonceCache,
    SignatureRefused,
    Verifier,
    canonical,
    sign,
)
from trimtab.agent.adapters.webhook import renew_batches

KEY = b"k" * 32
T0 = 1_732_400_000_000

brokers = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,20}", fullmatch=True)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE"])
_pchars = string.ascii_letters + string.digits + "-._~%!$&'()*+,;=:@/"
paths = st.text(_pchars, max_size=30).map(lambda p: "/" + p.replace("?", ""))
queries = st.none() | st.text(_pchars + "?", min_size=1, max_size=20)
bodies = st.binary(max_size=200)
timestamps = st.integers(min_value=T0 - 10_000, max_value=T0 + 10_000)
nonces = st.from_regex(r"[0-9a-f]{32}", fullmatch=True)


def target(path: str, query: str | None) -> str:
    return path + ("?" + query if query else "")


@st.composite
def calls(draw: st.DrawFn) -> dict[str, object]:
    return {
        "broker": draw(brokers),
        "method": draw(methods),
        "path": draw(paths),
        "query": draw(queries),
        "body": draw(bodies),
        "ts": draw(timestamps),
        "nonce": draw(nonces),
    }


def headers_of(c: dict[str, object]) -> dict[str, str]:
    return sign(
        KEY,
        str(c["broker"]),
        str(c["method"]),
        target(str(c["path"]), c["query"]),  # type: ignore[arg-type]
        c["body"],  # type: ignore[arg-type]
        ts_ms=c["ts"],  # type: ignore[arg-type]
        nonce=str(c["nonce"]),
    )


def verify(c: dict[str, object], h: dict[str, str], now: int) -> SignatureRefused | None:
    v = Verifier(KEY, str(c["broker"]), clock=lambda: now)
    try:
        v.verify(h, str(c["method"]), target(str(c["path"]), c["query"]), c["body"])  # type: ignore[arg-type]
    except SignatureRefused as e:
        return e
    return None


@settings(max_examples=300, deadline=None)
@given(calls(), st.data())
def test_changing_any_signed_field_breaks_the_signature(call: dict[str, object], data: st.DataObject) -> None:
    now = int(call["ts"])  # type: ignore[call-overload]
    h = headers_of(call)
    assert verify(call, h, now) is None
    field = data.draw(st.sampled_from(["broker", "method", "path", "query", "body", "ts", "nonce"]))
    strategy = {
        "broker": brokers,
        "method": methods,
        "path": paths,
        "query": queries,
        "body": bodies,
        # stay inside the window, so it is the signature that refuses
        "ts": st.integers(min_value=now - MAX_AGE_MS, max_value=now + MAX_AHEAD_MS),
        "nonce": nonces,
    }[field]
    changed = {**call, field: data.draw(strategy)}
    assume(changed[field] != call[field])
    assert headers_of(changed)[SIGNATURE] != h[SIGNATURE]
    if field == "broker":
        # Sent to another broker as is: not its id. With the header rewritten: not its signature.
        other = {**call, "broker": changed["broker"]}
        assert verify(other, h, now).reason == "wrong_broker"  # type: ignore[union-attr]
        assert verify(other, {**h, BROKER: str(changed["broker"])}, now).reason == "bad_signature"  # type: ignore[union-attr]
    elif field in ("ts", "nonce"):
        header = TIMESTAMP if field == "ts" else NONCE
        refused = verify(call, {**h, header: str(changed[field])}, now)
        assert refused is not None and refused.reason == "bad_signature"
    else:  # the request as received differs from the one signed
        refused = verify(changed, h, now)
        assert refused is not None and refused.reason == "bad_signature"


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(brokers, methods, paths, timestamps, nonces, bodies),
    st.tuples(brokers, methods, paths, timestamps, nonces, bodies),
)
def test_the_signed_string_tells_every_call_apart(
    a: tuple[str, str, str, int, str, bytes], b: tuple[str, str, str, int, str, bytes]
) -> None:
    assume(a != b)
    assert canonical(*a) != canonical(*b)


@settings(max_examples=300, deadline=None)
@given(
    calls(),
    st.dictionaries(
        st.sampled_from([BROKER, TIMESTAMP, NONCE, SIGNATURE]), st.text(max_size=80), min_size=0, max_size=4
    ),
)
def test_no_forged_header_set_verifies(call: dict[str, object], forged: dict[str, str]) -> None:
    genuine = headers_of(call)
    h = {**genuine, **forged}
    now = int(call["ts"])  # type: ignore[call-overload]
    assert (verify(call, h, now) is None) == (h == genuine)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3_000),  # the clock advances
            st.integers(min_value=-MAX_AGE_MS - 1_000, max_value=MAX_AHEAD_MS + 1_000),  # ts - now
            st.integers(min_value=0, max_value=5),  # a nonce from a small pool: collisions happen
            st.booleans(),  # replay an earlier accepted call byte for byte instead
        ),
        max_size=60,
    ),
    st.integers(min_value=1, max_value=8),
)
def test_the_verifier_accepts_new_calls_in_the_window_and_nothing_else(
    steps: list[tuple[int, int, int, bool]], cap: int
) -> None:
    now = T0
    v = Verifier(KEY, "b", clock=lambda: now, mono=lambda: now, cache=NonceCache(max_entries=cap))
    accepted: list[tuple[int, str]] = []  # (ts, nonce) of every accepted call: unbounded memory
    for advance, offset, pool, replay in steps:
        now += advance
        if replay and accepted:
            ts, n = accepted[pool % len(accepted)]
        else:
            ts, n = now + offset, f"{pool:032x}"
        h = sign(KEY, "b", "POST", "/p", b"{}", ts_ms=ts, nonce=n)
        in_window = now - MAX_AGE_MS <= ts <= now + MAX_AHEAD_MS
        remembered = any(t >= now - MAX_AGE_MS for t, m in accepted if m == n)
        live = sum(1 for t, _ in accepted if t >= now - MAX_AGE_MS)
        try:
            v.verify(h, "POST", "/p", b"{}")
        except SignatureRefused as e:
            if e.reason == "replay_cache_full":
                assert in_window and not remembered and live >= cap
            else:  # a nonce may be remembered past its window (RETAIN_MS): refused, never accepted twice
                assert not in_window or remembered or any(m == n for _, m in accepted), e
        else:
            assert in_window and not remembered and live < cap
            assert (ts, n) not in accepted  # never the same call twice
            accepted.append((ts, n))
        assert len(v.cache) <= cap


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=20_000),  # the monotonic clock advances
            st.integers(min_value=-120_000, max_value=20_000),  # the wall clock: any step, back or ahead
            st.integers(min_value=-MAX_AGE_MS - 1_000, max_value=MAX_AHEAD_MS + 1_000),  # ts - now
            st.integers(min_value=0, max_value=1_000_000),  # which nonce / which earlier call
            st.booleans(),  # replay an earlier accepted call byte for byte instead
        ),
        max_size=80,
    ),
    st.integers(min_value=1, max_value=8),
    st.sampled_from([0, 1_000, 60_000]),
)
def test_no_call_is_accepted_twice_whatever_the_wall_clock_does(
    steps: list[tuple[int, int, int, int, bool]], cap: int, retain_ms: int
) -> None:
    """Replay safety must not rest on the wall clock moving forward: with steps back of up to two minutes,
    retention or none, a full cache or not, the same signed call is never accepted twice."""
    now, mono = T0, 0
    v = Verifier(KEY, "b", clock=lambda: now, mono=lambda: mono, cache=NonceCache(cap, retain_ms))
    accepted: list[tuple[int, str]] = []
    for advance, step, offset, pick, replay in steps:
        mono += advance
        now += step
        if replay and accepted:
            ts, n = accepted[pick % len(accepted)]
        else:
            ts, n = now + offset, f"{pick:032x}"
        h = sign(KEY, "b", "POST", "/p", b"{}", ts_ms=ts, nonce=n)
        try:
            v.verify(h, "POST", "/p", b"{}")
        except SignatureRefused:
            continue
        assert (ts, n) not in accepted  # the same signed call (a fresh call may reuse a long-forgotten nonce)
        accepted.append((ts, n))
        assert len(v.cache) <= cap


@settings(max_examples=200, deadline=None)
@given(
    # names with characters JSON escapes (quote, backslash) or encodes on several bytes (é)
    st.lists(st.text(string.ascii_lowercase + '/_"\\é', min_size=1, max_size=40), max_size=60),
    st.integers(min_value=100, max_value=2_000),
)
def test_renewals_are_split_into_bodies_that_fit_in_order(bundles: list[str], max_bytes: int) -> None:
    lease = Lease(8.0, T0)
    batches = renew_batches(bundles, lease, max_bytes)
    assert [b for batch in batches for b in batch] == bundles
    assert all(batches) or batches == [[]]
    for batch in batches:
        body = orjson.dumps({"bundles": batch, **lease.to_json()})
        assert len(body) <= max_bytes or len(batch) == 1  # the size is computed exactly
    # Nothing is split that fitted in one call.
    if len(orjson.dumps({"bundles": bundles, **lease.to_json()})) <= max_bytes:
        assert batches == [bundles]


def test_renew_batches_edge_cases() -> None:
    assert renew_batches([], Lease(8.0, T0), 100) == [[]]  # one (empty) renewal, as before
    assert renew_batches(["a", "b"], Lease(8.0, T0), 1) == [["a"], ["b"]]  # too long alone: its own call
