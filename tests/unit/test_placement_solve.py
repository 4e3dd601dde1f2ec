"""``trimtab placement solve``: the document, its answers, and every way a document is refused (exit 2, the
field named on stderr)."""

from __future__ import annotations

import copy
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from trimtab.cli.placement_solve import parse_document, solve, solve_main
from trimtab.devkit.bench.placement import bench

B_ORDERS = "acme/orders/0x00000000_0x80000000"
B_BILLING = "acme/billing/0x00000000_0xffffffff"
B_VIP = "vip/app/0x00000000_0xffffffff"

DOC: dict[str, Any] = {
    "brokers": [
        {"id": "b1:8080", "domain": "d1", "tags": {"zone": "a"}},
        {"id": "b2:8080", "domain": "d1", "tags": {"zone": "b"}},
        {"id": "b3:8080", "domain": "d2", "tags": {"zone": "a"}},
        {"id": "b4:8080", "domain": "d2", "tags": {"zone": "b"}},
        {"id": "iso1:8080", "tags": {"zone": "c"}},
    ],
    "failure_domains_enabled": True,
    "anti_affinity_groups": {"acme/orders": "payments", "acme/billing": "Payments"},
    "isolation_policies": {
        "gold": {"namespaces": ["vip/.*"], "primary": [r"iso\d+"], "secondary": ["b[12]"], "min_limit": 2}
    },
    "owned": {B_ORDERS: "b1:8080", B_VIP: "iso1:8080"},
    "standby": {"replicas": 1, "awareness": ["zone"], "forced": {}},
    "queries": [
        {"candidates": B_BILLING},
        {"may_unload": B_ORDERS},
        {"may_transfer": B_ORDERS, "to": "b3:8080"},
        {"may_transfer": B_ORDERS, "to": "iso1:8080"},
        {"candidates": B_VIP},
        {"standbys": [B_VIP, B_ORDERS, B_BILLING]},
        {"may_unload": B_BILLING},
    ],
}

EXPECTED = {
    "results": [
        # orders (same group, case-insensitively) sits in d1: billing goes to d2; iso1 is gold's primary
        {"candidates": ["b3:8080", "b4:8080"]},
        {"may_unload": True},
        {"may_transfer": True},
        {"may_transfer": False},
        # one live primary < min_limit 2: secondaries b1, b2 join
        {"candidates": ["b1:8080", "b2:8080", "iso1:8080"]},
        {
            "standbys": {
                B_BILLING: [],  # not owned
                B_ORDERS: ["b2:8080"],  # not zone a (b1's); b2 and b4 hold nothing, b2 has the lower id
                B_VIP: ["b1:8080"],  # isolation candidates b1, b2 only; both weigh 1 now, b1 has the lower id
            }
        },
        {"may_unload": False},
    ]
}


def run(capsys: pytest.CaptureFixture[str], path: str) -> tuple[int, str, str]:
    code = solve_main(path)
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, doc: Any) -> str:
    p = tmp_path / "doc.json"
    p.write_text(json.dumps(doc) if not isinstance(doc, (str, bytes)) else doc)  # type: ignore[arg-type]
    return str(p)


def test_example_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, write(tmp_path, DOC))
    assert (code, err) == (0, "")
    got = json.loads(out)
    assert got == EXPECTED
    assert list(got["results"][5]["standbys"]) == sorted([B_VIP, B_ORDERS, B_BILLING])


def test_stdin_text_and_binary(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(DOC)))
    code, out, _ = run(capsys, "-")
    assert code == 0 and json.loads(out) == EXPECTED
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(DOC).encode())))
    code, out, _ = run(capsys, "-")
    assert code == 0 and json.loads(out) == EXPECTED
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe{}")))
    code, out, err = run(capsys, "-")
    assert (code, out) == (2, "") and "UTF-8" in err


def test_an_empty_document_has_no_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, write(tmp_path, {})) == (0, '{"results": []}\n', "")


def test_queries_are_independent_and_in_order() -> None:
    doc = copy.deepcopy(DOC)
    q = {"standbys": [B_ORDERS]}
    doc["queries"] = [q, {"candidates": B_BILLING}, q]
    results = solve(parse_document(json.dumps(doc)))["results"]
    assert results[0] == results[2] == {"standbys": {B_ORDERS: ["b2:8080"]}}
    assert results[1] == {"candidates": ["b3:8080", "b4:8080"]}


def test_forced_awareness_in_the_document() -> None:
    doc = copy.deepcopy(DOC)
    doc["standby"] = {"replicas": 2, "awareness": [], "forced": {"zone": ["a", "b", "c", "d"]}}
    doc["queries"] = [{"standbys": [B_ORDERS]}]
    # 3 copies over 4 values: at most one per zone; b1 (zone a) owns it, iso1 is not a candidate
    assert solve(parse_document(json.dumps(doc)))["results"] == [{"standbys": {B_ORDERS: ["b2:8080"]}}]


def mutate(path: str, value: Any) -> dict[str, Any]:
    """DOC with ``value`` at the dotted ``path`` (an int segment indexes a list)."""
    doc = copy.deepcopy(DOC)
    *parents, last = path.split(".")
    node: Any = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


INVALID: list[tuple[Any, str]] = [
    (mutate("failure_domains_enabled", 1), "failure_domains_enabled"),
    (mutate("failure_domains_enabled", "true"), "failure_domains_enabled"),
    (mutate("standby.replicas", "1"), "standby.replicas"),
    (mutate("standby.replicas", -1), "standby.replicas"),
    (mutate("standby.replicas", 1.0), "standby.replicas"),
    (mutate("standby.bogus", 1), "standby.bogus"),
    (mutate("standby.awareness", "zone"), "standby.awareness"),
    (mutate("standby.forced", {"zone": "a"}), "standby.forced.zone"),
    (mutate("brokers.0.tags", {"zone": 1}), "brokers.0.tags.zone"),
    (mutate("brokers.2.id", ""), "brokers.2.id"),
    (mutate("brokers.2.id", "b1:8080"), "brokers.2.id"),
    (mutate("brokers.1.domain", ""), "brokers.1.domain"),
    (mutate("brokers.1.rack", "r1"), "brokers.1.rack"),
    (mutate("brokers", {"b1": {}}), "brokers"),
    (mutate("isolation_policies.gold.primary", ["ok", "(bad"]), "isolation_policies.gold.primary.1"),
    (mutate("isolation_policies.gold.namespaces", ["*"]), "isolation_policies.gold.namespaces.0"),
    (mutate("isolation_policies.gold.secondary", ["[z-a]"]), "isolation_policies.gold.secondary.0"),
    (mutate("isolation_policies.gold.primary", []), "isolation_policies.gold.primary"),
    (mutate("isolation_policies.gold.min_limit", -1), "isolation_policies.gold.min_limit"),
    (mutate("isolation_policies.gold.min_limit", True), "isolation_policies.gold.min_limit"),
    (mutate("isolation_policies.gold.usage_threshold", 80), "isolation_policies.gold.usage_threshold"),
    (mutate("anti_affinity_groups.acme/orders", None), "anti_affinity_groups.acme/orders"),
    (mutate("owned." + B_ORDERS, "ghost:1"), "owned." + B_ORDERS),
    (mutate("owned.nobundle", "b1:8080"), "owned.nobundle"),
    (mutate("queries.0", {"candidates": "no-range"}), "queries.0.candidates"),
    (mutate("queries.1", {"unload": B_ORDERS}), "queries.1"),
    (mutate("queries.1", [B_ORDERS]), "queries.1"),
    (mutate("queries.2", {"may_transfer": B_ORDERS}), "queries.2.to"),
    (mutate("queries.2", {"may_transfer": B_ORDERS, "to": "ghost:1"}), "queries.2.to"),
    (mutate("queries.2", {"may_transfer": B_ORDERS, "to": "b2:8080", "why": "x"}), "queries.2.why"),
    (mutate("queries.5", {"standbys": B_ORDERS}), "queries.5.standbys"),
    (mutate("surprise", True), "surprise"),
    ([], "(document)"),
    ('{"brokers": [', "(document)"),
    ('{"brokers": [], "brokers": []}', "duplicate key 'brokers'"),
    ('{"standby": {"replicas": NaN}}', "NaN"),
    ("", "(document)"),
    ("[" * 100_000, "(document)"),
]


@pytest.mark.parametrize(("doc", "field"), INVALID)
def test_invalid_documents_exit_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, field: str
) -> None:
    code, out, err = run(capsys, write(tmp_path, doc))
    assert (code, out) == (2, "")
    assert field in err, err
    assert err.startswith("placement solve: invalid document: ")


def test_invalid_utf8_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "doc.json"
    p.write_bytes(b'{"brokers": [{"id": "b\xc3"}]}')
    code, out, err = run(capsys, str(p))
    assert (code, out) == (2, "") and "not UTF-8" in err and "offset 22" in err


def test_a_lone_surrogate_does_not_crash_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, write(tmp_path, '{"owned": {"t/n/0x0_0x1": "\\ud800"}}'))
    assert (code, out) == (2, "") and "owned.t/n/0x0_0x1" in err
    code, out, err = run(capsys, write(tmp_path, '{"owned": {"t/\\ud800/0x0_0x1": "b"}}'))
    assert (code, out) == (2, "") and "owned.t/\\ud800/0x0_0x1" in err


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(tmp_path / "absent.json"))
    assert (code, out) == (2, "") and "absent.json" in err


def test_every_problem_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = mutate("standby.replicas", "x")
    doc["failure_domains_enabled"] = "no"
    _, _, err = run(capsys, write(tmp_path, doc))
    assert "standby.replicas" in err and "failure_domains_enabled" in err


def test_a_bom_is_tolerated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "doc.json"
    p.write_bytes(b"\xef\xbb\xbf{}")
    assert run(capsys, str(p))[0] == 0


def test_bench_runs_small() -> None:
    report = bench(2000)
    assert report["bundles"] == 2000 and report["candidates_warm_s"] >= 0


def test_the_example_in_docs_placement_md_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (Path(__file__).parents[2] / "docs" / "placement.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    monkeypatch.setattr(sys, "stdin", io.StringIO(blocks[0]))
    code, out, err = run(capsys, "-")
    assert (code, err) == (0, "")
    assert json.loads(out) == json.loads(blocks[1])
