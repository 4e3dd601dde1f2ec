"""The decoders and the rule behind the admin plane's security (docs/security.md), property-tested:

* a token file decodes to exactly its tokens, in order, whatever comments, blank lines and surrounding
  whitespace are around them; a line that is not a usable token is refused naming its line number and never
  its content;
* who is who: a token is admin iff it is one of the admin tokens, read iff one of the read tokens and not an
  admin one, nobody otherwise -- and a read token never passes where admin is needed;
* a Kafka client properties file decodes to exactly the ``key=value`` pairs written, whatever comments and
  blank lines sit between them.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from trimtab.cluster.auth import Authenticator, StaticToken, parse_token_lines
from trimtab.cluster.wiring import parse_properties
from trimtab.errors import AuthRefused, ConfigError

URLSAFE = string.ascii_letters + string.digits + "-_"
tokens = st.text(URLSAFE, min_size=16, max_size=64)
blank = st.sampled_from(["", " ", "\t", "   \t "])
comment = st.text(string.printable.replace("\n", "").replace("\r", ""), max_size=30).map(lambda c: "#" + c)
pad = st.sampled_from(["", " ", "\t", "  "])


@given(
    st.lists(
        st.one_of(
            tokens.map(lambda t: ("token", t)),
            blank.map(lambda b: ("noise", b)),
            comment.map(lambda c: ("noise", c)),
        ),
        max_size=20,
    ),
    pad,
    pad,
)
def test_a_token_file_decodes_to_exactly_its_tokens(
    lines: list[tuple[str, str]], left: str, right: str
) -> None:
    text = "\n".join(f"{left}{v}{right}" if kind == "token" else v for kind, v in lines)
    want = tuple(v.encode() for kind, v in lines if kind == "token")
    assert parse_token_lines(text, "f") == want
    assert parse_token_lines(text.replace("\n", "\r\n"), "f") == want


# Upper-case letters only: nothing in the refusal's fixed wording could contain such a line by chance.
bad_lines = st.one_of(
    st.text(string.ascii_uppercase, min_size=3, max_size=15),  # too short
    st.tuples(
        st.text(string.ascii_uppercase, min_size=8, max_size=20),
        st.sampled_from([" ", "\t"]),
        st.text(string.ascii_uppercase, min_size=8, max_size=20),
    ).map("".join),  # whitespace inside
)


@given(st.lists(tokens, max_size=5), bad_lines, st.lists(tokens, max_size=5))
@example(before=["admin_tokens_fil"], bad="ABC", after=[])  # a token inside the caller's label (CI found it)
def test_a_line_that_is_not_a_token_is_refused_by_number_never_by_content(
    before: list[str], bad: str, after: list[str]
) -> None:
    text = "\n".join([*before, bad, *after])
    where = "security.admin_tokens_file (/etc/trimtab/admin.tokens)"
    with pytest.raises(ConfigError) as refused:
        parse_token_lines(text, where)
    # The caller's label is the caller's words (a token may be a substring of it, e.g. "admin_tokens_fil"):
    # what must never carry a line's content is the rest.
    assert str(refused.value).startswith(where)
    message = str(refused.value).removeprefix(where)
    assert f"line {len(before) + 1}:" in message
    assert bad not in message and not any(part in message for part in bad.split())
    assert not any(t in message for t in (*before, *after))


@given(st.sets(tokens, max_size=4), st.sets(tokens, max_size=4), tokens)
def test_a_token_has_exactly_the_role_it_was_given(admin: set[str], read: set[str], probe: str) -> None:
    auth = Authenticator(
        required=True,
        admin=[StaticToken(t.encode()) for t in sorted(admin)],
        read=[StaticToken(t.encode()) for t in sorted(read)],
    )
    for token in (*admin, *read, probe):
        want = "admin" if token in admin else "read" if token in read else None
        assert auth.role_of(token) == want
        for need in ("read", "admin"):
            allowed = want == "admin" or (want == "read" and need == "read")
            if allowed:
                auth.check(token, need, method="GET", path="/p", client=None)  # type: ignore[arg-type]
            else:
                with pytest.raises(AuthRefused) as refused:
                    auth.check(token, need, method="GET", path="/p", client=None)  # type: ignore[arg-type]
                assert refused.value.status == (401 if want is None else 403)
                assert token not in str(refused.value)


keys = st.text(string.ascii_lowercase + ".", min_size=1, max_size=30).filter(lambda k: k.strip(".") == k)
values = st.text(string.ascii_letters + string.digits + "=:/+.,-_ ", max_size=40).map(str.strip)


@given(
    st.dictionaries(keys, values, max_size=10),
    st.lists(st.one_of(blank, comment, st.just("! a comment")), max_size=5),
    pad,
)
def test_a_properties_file_decodes_to_exactly_its_pairs(
    pairs: dict[str, str], noise: list[str], space: str
) -> None:
    lines = [f"{k}{space}={space}{v}" for k, v in pairs.items()]
    text = "\n".join(noise + lines + noise)
    assert parse_properties(text, "f") == pairs


@given(st.text(string.ascii_lowercase + ". ", min_size=1, max_size=20).filter(lambda s: s.strip() != ""))
def test_a_properties_line_without_an_equals_sign_is_refused_by_number(line: str) -> None:
    with pytest.raises(ConfigError, match=r"line 2: expected key=value"):
        parse_properties(f"a=b\n{line}\n", "f")
