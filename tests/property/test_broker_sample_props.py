"""A broker's load report (``GET /trimtab/v1/load`` of the webhook contract, ``sample`` of the command
adapter) is the broker's bytes: ``decode_sample`` returns a BrokerSample or raises AdapterError, nothing
else, whatever the bytes -- before, invalid UTF-8 inside a bundle name escaped as UnicodeDecodeError."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.agent.adapters.base import BrokerSample, decode_sample
from trimtab.errors import AdapterError

VALID = msgspec.json.encode(
    {
        "cpu": {"usage": 0.5, "limit": 1.0},
        "bundles": [{"bundle": "t/ns/0x00000000_0x40000000", "msg_rate_in": 10.0, "msg_throughput_in": 5.0}],
    }
)


def _decodes_or_refuses(raw: bytes) -> None:
    try:
        got = decode_sample(raw, "the report")
    except AdapterError as e:
        assert str(e).startswith("sample: the report is not a valid BrokerSample"), e
    else:
        assert isinstance(got, BrokerSample)


def test_the_valid_report_decodes() -> None:
    got = decode_sample(VALID, "the report")
    assert got.bundles[0].msg_rate_in == 10.0 and got.cpu is not None


@pytest.mark.parametrize(
    "raw",
    [
        VALID.replace(b"t/ns", b"t/\xc3s"),  # invalid UTF-8 inside a string
        VALID.replace(b"t/ns", b"t/\xed\xa0\x80s"),  # an encoded surrogate
        b'{"bundles":[{"bundle":"\\ud800"}]}',  # a lone surrogate escape
        b"\xef\xbb\xbf" + VALID,
        b"[" * 100_000,
        b"",
    ],
)
def test_hostile_reports_are_refused_as_adapter_errors(raw: bytes) -> None:
    _decodes_or_refuses(raw)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_any_mutation_of_a_report_decodes_or_is_refused(data: st.DataObject) -> None:
    raw = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(raw)))
        kind = data.draw(st.sampled_from(["set", "insert", "delete"]))
        byte = data.draw(st.integers(0, 255))
        if kind == "insert" or not raw:
            raw[at:at] = bytes([byte])
        elif kind == "set":
            raw[min(at, len(raw) - 1)] = byte
        else:
            del raw[min(at, len(raw) - 1)]
    _decodes_or_refuses(bytes(raw))


@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_are_refused(raw: bytes) -> None:
    _decodes_or_refuses(raw)
