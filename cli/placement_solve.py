"""``trimtab placement solve FILE``: answer placement questions about a cluster described in one JSON document.

The document (docs/placement.md) lists the live brokers, the policies, who owns what and the standby
configuration, plus the questions; the answers come out as ``{"results": [...]}`` in question order. The
command exists so operators (and the acceptance tests) can ask the pure core of
:mod:`trimtab.balance.placement` what it would decide, without a running cluster.

The input is treated as hostile: it must be UTF-8 JSON without duplicate keys or NaN, every object is
closed (unknown fields are refused), types are strict (``"1"`` is not a number, ``1`` is not ``true``),
regexes must compile, broker ids must be unique and every owner or transfer destination must be a listed
broker. A refusal prints one line per problem naming the field (``isolation_policies.p1.primary.0: ...``)
to stderr and exits 2.

``python -m trimtab.cli.placement_solve --bench [BUNDLES]`` prints the placement benchmark as JSON.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from trimtab.balance.placement import (
    Broker,
    IsolationPolicy,
    Placement,
    PlacementConfigError,
    PlacementPolicy,
    StandbySpec,
)
from trimtab.errors import TrimtabError

EXIT_OK = 0
EXIT_INVALID = 2


# ---------------------------------------------------------------------------------------------- document


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise PydanticCustomError(
            "regex", "not a valid regular expression: {error}", {"error": str(e)}
        ) from None
    return text


def _bundle(text: str) -> str:
    namespace, sep, rng = text.rpartition("/")
    if not sep or not namespace or not rng:
        raise PydanticCustomError(
            "bundle", "a bundle name is <namespace>/<range>, e.g. t/ns/0x00000000_0xffffffff"
        )
    return text


Regex = Annotated[str, AfterValidator(_regex)]
BundleName = Annotated[str, AfterValidator(_bundle)]
BrokerId = Annotated[str, Field(min_length=1, max_length=256)]
NonEmpty = Annotated[str, Field(min_length=1)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BrokerDoc(_Closed):
    id: BrokerId
    domain: NonEmpty | None = None
    tags: dict[NonEmpty, str] = Field(default_factory=dict)


class IsolationDoc(_Closed):
    namespaces: Annotated[list[Regex], Field(min_length=1)]
    primary: Annotated[list[Regex], Field(min_length=1)]
    secondary: list[Regex] = Field(default_factory=list)
    min_limit: Annotated[int, Field(ge=0)]


class StandbyDoc(_Closed):
    replicas: Annotated[int, Field(ge=0, le=16)] = 0
    awareness: list[NonEmpty] = Field(default_factory=list)
    forced: dict[NonEmpty, list[str]] = Field(default_factory=dict)


class CandidatesQuery(_Closed):
    candidates: BundleName


class MayUnloadQuery(_Closed):
    may_unload: BundleName


class MayTransferQuery(_Closed):
    may_transfer: BundleName
    to: BrokerId


class StandbysQuery(_Closed):
    standbys: list[BundleName]


_QUERY_KINDS = ("candidates", "may_unload", "may_transfer", "standbys")


def _query_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        for kind in _QUERY_KINDS:
            if kind in value:
                return kind
    return None


Query = Annotated[
    Annotated[CandidatesQuery, Tag("candidates")]
    | Annotated[MayUnloadQuery, Tag("may_unload")]
    | Annotated[MayTransferQuery, Tag("may_transfer")]
    | Annotated[StandbysQuery, Tag("standbys")],
    Discriminator(
        _query_kind,
        custom_error_type="query",
        custom_error_message="a query is an object with one of the keys candidates, may_unload, may_transfer, standbys",
    ),
]


class SolveDocument(_Closed):
    """The whole ``solve`` input; every field may be left out (an empty cluster, no questions)."""

    brokers: list[BrokerDoc] = Field(default_factory=list)
    failure_domains_enabled: bool = False
    anti_affinity_groups: dict[NonEmpty, str] = Field(default_factory=dict)
    isolation_policies: dict[NonEmpty, IsolationDoc] = Field(default_factory=dict)
    owned: dict[BundleName, BrokerId] = Field(default_factory=dict)
    standby: StandbyDoc = Field(default_factory=StandbyDoc)
    queries: list[Query] = Field(default_factory=list)


class DocumentError(TrimtabError):
    """A document that cannot be answered; ``problems`` are ``(field path, message)`` pairs."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{loc}: {msg}" for loc, msg in problems))
        self.problems = list(problems)


def _loc(parts: Sequence[int | str]) -> str:
    # a discriminated query puts its tag after the index (queries.0.may_transfer.to): drop it
    items = list(parts)
    if len(items) >= 3 and items[0] == "queries" and isinstance(items[1], int) and items[2] in _QUERY_KINDS:
        del items[2]
    return ".".join(str(p) for p in items) or "(document)"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in an object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_document(data: bytes | str) -> SolveDocument:
    """Decode, parse and validate a document; :class:`DocumentError` names every field that is wrong."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DocumentError([("(document)", f"not UTF-8: invalid byte at offset {e.start}")]) from None
    else:
        text = data
    text = text.removeprefix("\ufeff")
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise DocumentError(
            [("(document)", f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}")]
        ) from None
    except (ValueError, RecursionError) as e:
        raise DocumentError([("(document)", f"invalid JSON: {e}")]) from None
    try:
        doc = SolveDocument.model_validate(raw)
    except ValidationError as e:
        raise DocumentError([(_loc(err["loc"]), err["msg"]) for err in e.errors()]) from None
    _cross_check(doc)
    return doc


def _cross_check(doc: SolveDocument) -> None:
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, b in enumerate(doc.brokers):
        if b.id in seen:
            problems.append((f"brokers.{i}.id", f"duplicate broker id {b.id!r}"))
        seen.add(b.id)
    for bundle, owner in doc.owned.items():
        if owner not in seen:
            problems.append((f"owned.{bundle}", f"owner {owner!r} is not a listed broker"))
    for i, q in enumerate(doc.queries):
        if isinstance(q, MayTransferQuery) and q.to not in seen:
            problems.append((f"queries.{i}.to", f"{q.to!r} is not a listed broker"))
    if problems:
        raise DocumentError(problems)


# ---------------------------------------------------------------------------------------------- answers


def build_placement(doc: SolveDocument) -> Placement:
    """The core objects a validated document describes."""
    try:
        policy = PlacementPolicy(
            [Broker(b.id, b.domain, b.tags) for b in doc.brokers],
            failure_domains_enabled=doc.failure_domains_enabled,
            anti_affinity_groups=doc.anti_affinity_groups,
            isolation_policies=[IsolationPolicy.of(name, p) for name, p in doc.isolation_policies.items()],
        )
    except PlacementConfigError as e:  # the document checks should have caught it; never a traceback
        raise DocumentError([("(document)", str(e))]) from None
    return Placement(policy, doc.owned)


def standby_spec(doc: SolveDocument) -> StandbySpec:
    s = doc.standby
    return StandbySpec(s.replicas, tuple(s.awareness), {k: frozenset(v) for k, v in s.forced.items()})


def solve(doc: SolveDocument) -> dict[str, list[dict[str, Any]]]:
    """Answer every query, in order. Queries do not affect each other (standbys included)."""
    placement = build_placement(doc)
    spec = standby_spec(doc)
    results: list[dict[str, Any]] = []
    for q in doc.queries:
        if isinstance(q, CandidatesQuery):
            results.append({"candidates": sorted(placement.candidates(q.candidates))})
        elif isinstance(q, MayUnloadQuery):
            results.append({"may_unload": placement.may_unload(q.may_unload)})
        elif isinstance(q, MayTransferQuery):
            results.append({"may_transfer": placement.may_transfer(q.may_transfer, q.to)})
        else:
            results.append({"standbys": placement.standbys(q.standbys, spec)})
    return {"results": results}


def _read(path: str) -> bytes | str:
    if path == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        return buffer.read() if buffer is not None else sys.stdin.read()
    with open(path, "rb") as f:
        return f.read()


def _say(line: str) -> None:
    # field names and values come from the input: never let an odd character (a lone surrogate) crash stderr
    sys.stderr.write(line.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")


def solve_main(path: str) -> int:
    """Read the document at ``path`` (``-``: stdin), print ``{"results": [...]}`` and return 0; or print
    what is wrong, naming the field, to stderr and return 2."""
    try:
        data = _read(path)
    except OSError as e:
        _say(f"placement solve: cannot read {path}: {e.strerror or e}")
        return EXIT_INVALID
    try:
        answer = solve(parse_document(data))
    except DocumentError as e:
        for loc, msg in e.problems:
            _say(f"placement solve: invalid document: {loc}: {msg}")
        return EXIT_INVALID
    sys.stdout.write(json.dumps(answer) + "\n")
    return EXIT_OK


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        _say("usage: python -m trimtab.cli.placement_solve FILE|-")
        return EXIT_INVALID
    return solve_main(argv[0])


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
