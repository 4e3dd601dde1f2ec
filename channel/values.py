"""Typed values from hostile bytes: the decoder every topic but the channel itself uses.

Snapshot chunks and manifests, broker load reports, top-bundle reports and events are msgspec types. A
value of any of them is accepted only if it passes the structure rules of :mod:`channel.strictjson` and
then has the type's shape; otherwise it is refused with one reason from a fixed set, and nothing a value
contains can make decoding raise. (Channel records have their own faster path in :mod:`channel.records`;
the rules are the same.)

Fast path: an ASCII value that msgspec decodes and that re-encodes to exactly the same bytes -- what
trimtab's own writers produce -- is accepted without the pure-Python parser. Anything else (another
writer's formatting, a repeated name, invalid UTF-8 in an unknown field, deep nesting...) is decided by
the strict parser and ``msgspec.convert``.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from trimtab.channel import strictjson

T = TypeVar("T")

#: The reasons :meth:`StrictDecoder.decode` can refuse a value for (a bounded set for metric labels).
REASONS = (*strictjson.REASONS, "invalid")


class Refused:
    """A value that was not decoded: ``reason`` is one of :data:`REASONS`; ``detail`` is for people."""

    __slots__ = ("detail", "reason")

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail

    def __repr__(self) -> str:
        return f"Refused({self.reason!r}, {self.detail!r})"


class StrictDecoder(Generic[T]):
    """Decode ``type_`` values from untrusted bytes; :meth:`decode` never raises on any input."""

    def __init__(self, type_: type[T], max_bytes: int) -> None:
        self.type = type_
        self.max_bytes = max_bytes
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type_)
        self._encoder = msgspec.json.Encoder()

    def decode(self, value: bytes | None) -> T | Refused:
        """``value`` may be None: ZooKeeper allows a znode without data (null, not empty)."""
        if value is None:
            return Refused(strictjson.MALFORMED, "no data at all (null)")
        if len(value) > self.max_bytes:
            return Refused(strictjson.TOO_LARGE, f"{len(value)} bytes > {self.max_bytes}")
        if value.isascii():
            try:
                obj = self._decoder.decode(value)
                if self._encoder.encode(obj) == value:
                    return obj
            except Exception:  # any refusal, whatever its type: the strict path decides, and says why
                pass
        return self.decode_strict(value)

    def decode_strict(self, value: bytes) -> T | Refused:
        """The reference: the structure rules, then the type's shape."""
        if len(value) > self.max_bytes:
            return Refused(strictjson.TOO_LARGE, f"{len(value)} bytes > {self.max_bytes}")
        parsed: Any = strictjson.parse(value)
        if isinstance(parsed, strictjson.Invalid):
            return Refused(parsed.reason, parsed.detail)
        try:
            # The structure rules bound the nesting, so this (recursive, in C) conversion stays shallow;
            # str_keys: JSON names are strings, also where the type has integer keys.
            return msgspec.convert(parsed, self.type, str_keys=True)
        except msgspec.ValidationError as e:
            return Refused("invalid", str(e))
