"""The one deep merge of settings layers (``trimtab.config.merge.deep_merge``, issue 30 point 6): merging
never drops a sibling key, and the later layer wins on leaves -- at any depth, for any layers."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from trimtab.config.merge import deep_merge

# Few key names, so that layers collide often; a section is never empty (an empty table sets nothing).
keys = st.sampled_from(["broker", "adapter", "kind", "timeout_s"])
leaves = st.one_of(
    st.integers(-3, 3), st.text(max_size=3), st.booleans(), st.lists(st.integers(0, 2), max_size=2)
)
values = st.recursive(leaves, lambda sub: st.dictionaries(keys, sub, min_size=1, max_size=4), max_leaves=8)
layers = st.dictionaries(keys, values, max_size=4)

Path = tuple[str, ...]


def flatten(d: Mapping[str, Any], prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf (a value that is not a section) by its path."""
    out: dict[Path, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, (*prefix, k)))
        else:
            out[(*prefix, k)] = v
    return out


def sections(d: Mapping[str, Any], prefix: Path = ()) -> dict[Path, set[str]]:
    """Every section (the top level included) by its path, with its keys."""
    out: dict[Path, set[str]] = {prefix: set(d)}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(sections(v, (*prefix, k)))
    return out


def at(d: Any, path: Path) -> Any:
    for k in path:
        d = d[k]
    return d


def replaced_by(fb: dict[Path, Any], path: Path) -> bool:
    """Whether the layer whose leaves are ``fb`` puts a leaf at ``path`` or above it (the one way a layer
    may replace a section)."""
    return any(path[:i] in fb for i in range(len(path) + 1))


SETTINGS = settings(max_examples=200, deadline=None)
#: The case of the issue: a file's broker.adapter.{kind,url}, then --set broker.adapter.timeout_s=3.
FILE = {"broker": {"adapter": {"kind": "webhook", "url": "http://b:9"}}}
SET = {"broker": {"adapter": {"timeout_s": 3}}}


@SETTINGS
@given(layers, layers)
@example(FILE, SET)
def test_merging_never_drops_a_sibling_key(a: dict[str, Any], b: dict[str, Any]) -> None:
    merged = deep_merge(a, b)
    fb = flatten(b)
    for path, names in sections(a).items():
        if not replaced_by(fb, path):
            assert names <= set(at(merged, path)), (path, names)


@SETTINGS
@given(layers, layers)
def test_the_later_layer_wins_on_leaves(a: dict[str, Any], b: dict[str, Any]) -> None:
    merged = flatten(deep_merge(a, b))
    for path, value in flatten(b).items():
        assert merged[path] == value


@SETTINGS
@given(layers, layers)
@example(FILE, SET)
def test_the_merge_is_exactly_the_layers_leaves(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Nothing but the two rules: ``a``'s leaves that ``b`` neither sets nor replaces (with a leaf above
    them, or a section where ``a`` had a leaf), and all of ``b``'s."""
    fb = flatten(b)
    kept = {
        p: v
        for p, v in flatten(a).items()
        if not replaced_by(fb, p) and not any(q[: len(p)] == p for q in fb if len(q) > len(p))
    }
    assert flatten(deep_merge(a, b)) == {**kept, **fb}


@SETTINGS
@given(layers, layers, layers)
def test_layers_apply_left_to_right_and_change_no_layer(
    a: dict[str, Any], b: dict[str, Any], c: dict[str, Any]
) -> None:
    before = copy.deepcopy((a, b, c))
    merged = deep_merge(a, b, c)
    # Left to right, one layer at a time (not associative: a leaf that replaced a section is replaced in
    # turn by a later section, and the first section's keys are gone).
    assert merged == deep_merge(deep_merge(a, b), c)
    assert (a, b, c) == before
    layer_sections = [sections(layer) for layer in (a, b, c)]
    for path in sections(merged):  # the result shares no section with a layer: changing it changes none
        for layer, known in zip((a, b, c), layer_sections, strict=True):
            if path in known:
                assert at(merged, path) is not at(layer, path)
