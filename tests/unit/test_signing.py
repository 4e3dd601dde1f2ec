"""Signed webhook calls (agent/adapters/signing.py): the documented worked example, every refusal of the
Verifier with its status and reason, the window's boundaries at equality, the replay cache (a nonce once,
expiry on an injected clock, the cap, a clock that steps back), and that the key is never shown."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trimtab.agent.adapters.signing import (
    BROKER,
    MAX_AGE_MS,
    MAX_AHEAD_MS,
    NONCE,
    RETAIN_MS,
    SIGNATURE,
    TIMESTAMP,
    NonceCache,
    Signer,
    Verifier,
    canonical,
    new_nonce,
    sign,
    signature,
)
from trimtab.errors import ConfigError, RequestError, SignatureRefused

ROOT = Path(__file__).resolve().parents[2]

KEY = b"0123456789abcdef0123456789abcdef"
ME = "broker-1.example:6650"
T0 = 1_732_400_000_000
CLOSE = "/trimtab/v1/bundles/close"
BODY = b'{"bundle":"public/default/0x00000000_0x40000000","redirect_url":"pulsar://broker-2.example:6650"}'


class Clock:
    """A settable unix-ms clock for the Verifier."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def nonce(i: int) -> str:
    return f"{i:032x}"


def headers(
    ts: int = T0, n: str = nonce(1), broker: str = ME, target: str = CLOSE, body: bytes = BODY
) -> dict[str, str]:
    return sign(KEY, broker, "POST", target, body, ts_ms=ts, nonce=n)


def verifier(
    clock: Clock | None = None, cache: NonceCache | None = None, mono: Clock | None = None
) -> Verifier:
    """A verifier on ``clock`` (its wall clock) and ``mono`` (its monotonic clock; still unless given)."""
    return Verifier(KEY, ME, clock=clock or Clock(), mono=mono or Clock(0), cache=cache)


def refusal(v: Verifier, h: dict[str, str], target: str = CLOSE, body: bytes = BODY) -> SignatureRefused:
    with pytest.raises(SignatureRefused) as info:
        v.verify(h, "POST", target, body)
    return info.value


# ---------------------------------------------------------------------------------------------- the example
EXAMPLE_SIGNATURE = "v2=ceaa69b30fc762b79d9b3f3b0efca00b96168b86ba10bf6f7d4c8f7c82866e7d"


def test_the_documented_worked_example() -> None:
    """What docs/broker-adapter.md promises a broker author, computed by the code and found in the doc."""
    n = "00112233445566778899aabbccddeeff"
    assert canonical(ME, "POST", CLOSE, T0, n, BODY) == (
        b"trimtab-webhook-v2\nbroker-1.example:6650\nPOST\n/trimtab/v1/bundles/close\n1732400000000\n"
        b"00112233445566778899aabbccddeeff\n" + BODY
    )
    assert signature(KEY, ME, "POST", CLOSE, T0, n, BODY) == EXAMPLE_SIGNATURE
    doc = (ROOT / "docs/broker-adapter.md").read_text()
    for shown in (KEY.decode(), ME, CLOSE, str(T0), n, BODY.decode(), EXAMPLE_SIGNATURE):
        assert f"`{shown}`" in doc, shown
    # The openssl line of the doc prints the same digest.
    assert EXAMPLE_SIGNATURE.removeprefix("v2=") in doc.split("openssl dgst", 1)[1]
    Verifier(KEY, ME, clock=Clock(T0)).verify(
        {BROKER: ME, TIMESTAMP: str(T0), NONCE: n, SIGNATURE: EXAMPLE_SIGNATURE}, "POST", CLOSE, BODY
    )


# ---------------------------------------------------------------------------------------------- signing
def test_the_signer_signs_each_call_with_a_fresh_timestamp_and_nonce() -> None:
    ticks = iter([T0, T0 + 1])
    nonces = iter([nonce(1), nonce(2)])
    s = Signer(KEY, ME, clock=lambda: next(ticks), nonces=lambda: next(nonces))
    first, second = s.headers("POST", CLOSE, BODY), s.headers("POST", CLOSE, BODY)
    assert first == {
        BROKER: ME,
        TIMESTAMP: str(T0),
        NONCE: nonce(1),
        SIGNATURE: signature(KEY, ME, "POST", CLOSE, T0, nonce(1), BODY),
    }
    assert second[NONCE] == nonce(2) and second[SIGNATURE] != first[SIGNATURE]
    v = verifier(Clock(T0 + 1))
    v.verify(first, "POST", CLOSE, BODY)
    v.verify(second, "post", CLOSE, BODY)  # the method is upper-cased on both sides


def test_nonces_are_128_random_bits_in_hex() -> None:
    seen = {new_nonce() for _ in range(1000)}
    assert len(seen) == 1000 and all(re.fullmatch(r"[0-9a-f]{32}", n) for n in seen)


def test_the_signer_refuses_what_cannot_be_a_request_target_or_a_key() -> None:
    s = Signer(KEY, ME)
    for bad in ("trimtab/v1/load", "/a b", "/a\nb", "/é", "http://host/trimtab/v1/load"):
        with pytest.raises(ValueError, match="request target"):
            s.headers("GET", bad, b"")
    with pytest.raises(ConfigError, match="16 bytes"):
        Signer(b"short", ME)
    with pytest.raises(ConfigError, match="broker id"):
        Signer(KEY, "")
    with pytest.raises(ConfigError, match="16 bytes"):
        Verifier(b"short", ME)


# ---------------------------------------------------------------------------------------------- refusals
def test_a_call_verifies_once_and_any_change_is_refused() -> None:
    v = verifier()
    v.verify(headers(), "POST", CLOSE, BODY)
    assert refusal(v, headers()).reason == "replayed"
    h = headers(n=nonce(2))
    assert refusal(v, h, body=BODY + b" ").reason == "bad_signature"
    assert refusal(v, h, target="/trimtab/v1/bundles/fence").reason == "bad_signature"
    assert refusal(v, h, target=CLOSE + "?x=1").reason == "bad_signature"
    with pytest.raises(SignatureRefused, match="bad_signature"):
        v.verify(h, "GET", CLOSE, BODY)
    assert refusal(v, {**h, TIMESTAMP: str(T0 + 1)}).reason == "bad_signature"
    assert refusal(v, {**h, NONCE: nonce(3)}).reason == "bad_signature"
    assert refusal(Verifier(b"another key, long enough", ME, clock=Clock()), h).reason == "bad_signature"
    # The header names a broker, but the signature is checked against this broker's own id.
    other = headers(n=nonce(4), broker="broker-2.example:6650")
    assert refusal(v, other).reason == "wrong_broker"
    assert refusal(v, {**other, BROKER: ME}).reason == "bad_signature"
    # None of the refused calls used up its nonce: the genuine ones still go through.
    v.verify(h, "POST", CLOSE, BODY)


@pytest.mark.parametrize("missing", [BROKER, TIMESTAMP, NONCE, SIGNATURE])
def test_every_header_is_required(missing: str) -> None:
    h = {k: v for k, v in headers().items() if k != missing}
    refused = refusal(verifier(), h)
    assert (refused.status, refused.reason, refused.retryable) == (401, "missing_header", False)
    assert missing in str(refused)
    assert refusal(verifier(), {**headers(), missing: ""}).reason == "missing_header"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (TIMESTAMP, "1e12"),
        (TIMESTAMP, "-1732400000000"),
        (TIMESTAMP, "01732400000000"),  # leading zero: one timestamp, one spelling
        (TIMESTAMP, "1" * 16),
        (TIMESTAMP, "١٧٣٢٤٠٠٠٠٠٠٠٠"),  # digits, but not ASCII ones
        (NONCE, "00112233445566778899AABBCCDDEEFF"),
        (NONCE, nonce(1)[:-1]),
        (NONCE, nonce(1) + "0"),
        (SIGNATURE, "sha256=" + "0" * 64),  # scheme v1
        (SIGNATURE, "v2=" + "0" * 63),
        (SIGNATURE, "v2=" + "A" * 64),
    ],
)
def test_malformed_headers_are_refused(header: str, value: str) -> None:
    refused = refusal(verifier(), {**headers(), header: value})
    assert (refused.status, refused.reason) == (401, "malformed_header")


def test_header_names_are_case_insensitive() -> None:
    verifier().verify({k.lower(): v for k, v in headers().items()}, "POST", CLOSE, BODY)
    verifier().verify({k.upper(): v for k, v in headers().items()}, "POST", CLOSE, BODY)


def test_a_refusal_is_a_request_error_and_never_shows_the_key() -> None:
    v = verifier()
    reasons = []
    for h in (
        {},
        {**headers(), NONCE: "x"},
        headers(broker="b2:1"),
        headers(ts=T0 - MAX_AGE_MS - 1),
        headers(ts=T0 + MAX_AHEAD_MS + 1),
        {**headers(), SIGNATURE: "v2=" + "0" * 64},
    ):
        refused = refusal(v, h)
        assert isinstance(refused, RequestError) and refused.status == 401
        assert KEY.decode() not in str(refused) and KEY.decode() not in repr(refused)
        reasons.append(refused.reason)
    assert reasons == [
        "missing_header",
        "malformed_header",
        "wrong_broker",
        "stale",
        "early",
        "bad_signature",
    ]
    for shown in (repr(v), str(v), repr(Signer(KEY, ME))):
        assert KEY.decode() not in shown and "hidden" in shown


# ---------------------------------------------------------------------------------------------- the window
def test_the_window_is_inclusive_at_both_ends() -> None:
    assert (MAX_AGE_MS, MAX_AHEAD_MS) == (5_000, 2_000)  # what docs/broker-adapter.md states
    clock = Clock()
    v = verifier(clock)
    v.verify(headers(ts=T0 - MAX_AGE_MS, n=nonce(1)), "POST", CLOSE, BODY)
    v.verify(headers(ts=T0 + MAX_AHEAD_MS, n=nonce(2)), "POST", CLOSE, BODY)
    old = refusal(v, headers(ts=T0 - MAX_AGE_MS - 1, n=nonce(3)))
    assert (old.status, old.reason) == (401, "stale") and "5001 ms old" in str(old)
    ahead = refusal(v, headers(ts=T0 + MAX_AHEAD_MS + 1, n=nonce(4)))
    assert (ahead.status, ahead.reason) == (401, "early") and "2001 ms ahead" in str(ahead)


def test_a_captured_call_is_refused_once_its_timestamp_leaves_the_window() -> None:
    clock = Clock()
    v = verifier(clock)
    call = headers()
    v.verify(call, "POST", CLOSE, BODY)
    for now in (T0 + 1, T0 + MAX_AGE_MS):
        clock.now = now
        assert refusal(v, call).reason == "replayed"
    clock.now = T0 + MAX_AGE_MS + 1
    assert refusal(v, call).reason == "stale"


# ---------------------------------------------------------------------------------------------- the cache
def test_nonces_are_forgotten_when_their_calls_leave_the_window() -> None:
    clock = Clock()
    v = verifier(clock, NonceCache(retain_ms=0))
    for i in range(10):
        v.verify(headers(ts=T0 + i, n=nonce(i)), "POST", CLOSE, BODY)
    assert len(v.cache) == 10
    clock.now = T0 + MAX_AGE_MS + 5  # the calls stamped T0 .. T0+4 are out of the window
    v.verify(headers(ts=clock.now, n=nonce(100)), "POST", CLOSE, BODY)
    assert len(v.cache) == 10 - 5 + 1 and v.cache.floor_ms == T0 + 4
    clock.now += 10 * MAX_AGE_MS
    v.verify(headers(ts=clock.now, n=nonce(101)), "POST", CLOSE, BODY)
    assert len(v.cache) == 1


def test_a_full_cache_refuses_new_calls_rather_than_forget_live_ones() -> None:
    clock = Clock()
    v = verifier(clock, NonceCache(max_entries=3, retain_ms=0))
    for i in range(3):
        v.verify(headers(n=nonce(i)), "POST", CLOSE, BODY)
    full = refusal(v, headers(n=nonce(3)))
    assert (full.status, full.reason, full.retryable) == (503, "replay_cache_full", True)
    assert refusal(v, headers(n=nonce(0))).reason == "replayed"  # a replay is still told apart
    assert len(v.cache) == 3
    clock.now = T0 + MAX_AGE_MS + 1  # the three leave the window: room again
    v.verify(headers(ts=clock.now, n=nonce(3)), "POST", CLOSE, BODY)
    assert len(v.cache) == 1
    with pytest.raises(ConfigError):
        NonceCache(max_entries=0)


def test_a_clock_that_steps_back_cannot_reopen_the_window_for_a_forgotten_call() -> None:
    clock = Clock()
    v = verifier(clock, NonceCache(retain_ms=0))
    call = headers()
    v.verify(call, "POST", CLOSE, BODY)
    clock.now = T0 + MAX_AGE_MS + 1
    v.verify(headers(ts=clock.now, n=nonce(2)), "POST", CLOSE, BODY)  # forgets the first call
    assert len(v.cache) == 1
    clock.now = T0 + 1  # NTP stepped the broker's clock back: the captured call is "fresh" again
    refused = refusal(v, call)
    assert refused.reason == "stale" and "no longer remembers" in str(refused)
    # A call stamped after everything forgotten is fine.
    v.verify(headers(ts=T0 + 2, n=nonce(3)), "POST", CLOSE, BODY)


def test_nonces_are_kept_a_minute_by_the_monotonic_clock_unless_the_cache_fills() -> None:
    clock, mono = Clock(), Clock(0)
    v = verifier(clock, NonceCache(max_entries=10), mono)
    for i in range(4):
        v.verify(headers(ts=T0 + i, n=nonce(i)), "POST", CLOSE, BODY)
    clock.now, mono.now = T0 + MAX_AGE_MS + 10, MAX_AGE_MS + 10  # out of the window, accepted 5 s ago
    v.verify(headers(ts=clock.now, n=nonce(10)), "POST", CLOSE, BODY)
    assert len(v.cache) == 5 and v.cache.floor_ms == -1
    mono.now = RETAIN_MS + 1  # a minute later by the monotonic clock (the wall clock stood still)
    v.verify(headers(ts=clock.now + 1, n=nonce(11)), "POST", CLOSE, BODY)
    assert len(v.cache) == 2 and v.cache.floor_ms == T0 + 3
    # More than half full: the window's edge again, whatever the monotonic clock says.
    v = verifier(clock := Clock(), NonceCache(max_entries=4), Clock(0))
    for i in range(3):
        v.verify(headers(ts=T0 + i, n=nonce(i)), "POST", CLOSE, BODY)
    clock.now = T0 + MAX_AGE_MS + 10
    v.verify(headers(ts=clock.now, n=nonce(10)), "POST", CLOSE, BODY)
    assert len(v.cache) == 3 and v.cache.floor_ms == T0  # the oldest forgotten: down to half, plus the new


def test_a_step_back_of_half_a_minute_refuses_no_new_call_and_still_every_replay() -> None:
    """The chaos suite's ``clock_skew`` on the host of an agent and its broker: the wall clock steps back
    30 s, the monotonic clock goes on. Before, every call was refused as stale for ~25 s (the nonces of the
    calls the clock now revisits had been forgotten); now they are remembered, so new calls pass and a
    replay of any of those calls is still refused."""
    clock, mono = Clock(), Clock(0)
    v = verifier(clock, mono=mono)
    sent = []
    for second in range(90):  # a call a second for a minute and a half
        clock.now, mono.now = T0 + second * 1000, second * 1000
        call = headers(ts=clock.now, n=nonce(second))
        v.verify(call, "POST", CLOSE, BODY)
        sent.append(call)
    clock.now -= 30_000  # NTP steps the clock back half a minute
    mono.now += 1000
    # Every old call is refused: out of the window, or remembered -- the calls of the last half minute are
    # "fresh" again by the window, and refused only because their nonces are still known.
    reasons = [refusal(v, call).reason for call in sent]
    assert set(reasons) <= {"stale", "early", "replayed"}
    assert reasons.count("replayed") >= 5
    for second in range(40):  # and new calls are accepted from the first second on
        v.verify(headers(ts=clock.now, n=nonce(1000 + second)), "POST", CLOSE, BODY)
        clock.now += 1000
        mono.now += 1000


def test_a_step_back_longer_than_the_retention_still_fails_closed() -> None:
    clock, mono = Clock(), Clock(0)
    v = verifier(clock, mono=mono)
    for second in range(200):
        clock.now, mono.now = T0 + second * 1000, second * 1000
        v.verify(headers(ts=clock.now, n=nonce(second)), "POST", CLOSE, BODY)
    clock.now -= 120_000  # two minutes back: calls of that time were forgotten
    mono.now += 1
    refused = refusal(v, headers(ts=clock.now, n=nonce(5000)))
    assert refused.reason == "stale" and "more than a minute" in str(refused)
