"""The list of equivalent mutants is docs/testing.md itself (devkit/mutation.py reads it): what people
read is what the mutation score leaves out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trimtab.devkit.mutation import core_modules, dotted, equivalent_mutants, load_equivalent

DOC = """# Testing
## Equivalent mutants
Intro.

### balance/heal.py

| mutants | why |
|---|---|
| `x_orphaned__mutmut_2`, `xǁPlanǁrun__mutmut_7` | a reason |
| `x_orphaned__mutmut_4` | as x_orphaned__mutmut_2 |

## Constants
| `x_not_a_listing__mutmut_1` | after the section |
"""


def test_names_are_read_under_their_module_with_their_reason() -> None:
    assert equivalent_mutants(DOC) == {
        "trimtab.balance.heal.x_orphaned__mutmut_2": "a reason",
        "trimtab.balance.heal.xǁPlanǁrun__mutmut_7": "a reason",
        "trimtab.balance.heal.x_orphaned__mutmut_4": "as x_orphaned__mutmut_2",
    }


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ("| `x_orphaned__mutmut_9`, `_23` | shorthand |", "not a mutmut name"),
        ("| `x_orphaned__mutmut_2` | listed again |", "listed twice"),
    ],
)
def test_a_typo_or_a_repeat_is_refused(row: str, error: str) -> None:
    """A name that is not mutmut's would never match a survivor (the survivor would count as killed by
    nobody and the entry as unused): refused, like one listed twice."""
    with pytest.raises(ValueError, match=error):
        equivalent_mutants(DOC.replace("\n\n## Constants", f"\n{row}\n\n## Constants"))


def test_the_repository_list_names_modules_of_the_core() -> None:
    listed = load_equivalent()
    modules = {dotted(m) for m in core_modules()}
    assert listed
    assert {name.rpartition(".x")[0] for name in listed} <= modules
    assert all(reason for reason in listed.values())


def test_a_stored_run_is_scored_against_the_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--report`` scores what the last runs left (every resume merged): an equivalent survivor is left
    out of the score, a killed mutant counts whatever its exit code, a module never run is not scored."""
    from trimtab.devkit import mutation

    monkeypatch.setattr(mutation, "SCRATCH", tmp_path)
    monkeypatch.setattr(mutation, "diffs", lambda names, module, workdir: dict.fromkeys(names, "diff"))
    work = tmp_path / "balance-heal"
    work.mkdir()
    h = "trimtab.balance.heal."
    codes = {
        h + "x_a__mutmut_1": 1,
        h + "x_a__mutmut_2": 36,
        h + "x_a__mutmut_3": 0,
        h + "x_a__mutmut_4": 0,
        h + "x_a__mutmut_5": 33,  # no test runs it: equivalent when listed
    }
    (work / "verdicts.json").write_text(json.dumps(codes))
    result = mutation.stored_result(
        "balance/heal.py", {h + "x_a__mutmut_4": "why", h + "x_a__mutmut_5": "why"}
    )
    assert result is not None
    assert (result.mutants, result.killed, result.survived, result.equivalent) == (
        5,
        2,
        [h + "x_a__mutmut_3"],
        [h + "x_a__mutmut_4", h + "x_a__mutmut_5"],
    )
    assert result.score == pytest.approx(100 * 2 / 3)
    assert result.diffs == {h + "x_a__mutmut_3": "diff"}
    assert mutation.stored_result("balance/shed.py", {}) is None
