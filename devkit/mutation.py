"""Mutation testing of the decision core (``channel/`` and ``balance/``) with mutmut 3: ``scripts/mutation.sh``.

mutmut copies the code it mutates into ``mutants/`` under its working directory and puts that directory
first on ``sys.path``. Our folders are the package ``trimtab.<name>`` only through an import hook
(pyproject.toml's package-dir, :mod:`trimtab.devkit.layout`), which a copy of ``channel/`` would not
satisfy; so every module is tested in a scratch directory of its own, ``build/mutation/<module>/``
(``build/`` is in .gitignore), laid out the way an installed copy is: ``trimtab/`` with every package as a
real folder, ``tests/``, and a ``pyproject.toml`` whose ``[tool.mutmut]`` section names the one file to
mutate and the test files that import it. Per module only those tests run (speed): the unit and property
tests that import the module (or, for a module of a subpackage such as ``balance/placement/``, the
subpackage), less the files that start servers. mutmut runs one worker (``--max-children``, default 1),
and its pytest skips what is marked ``slow`` or ``integration``.

Not part of CI: a full run takes minutes (docs/testing.md has the command, the figures and the equivalent
mutants). Prints one JSON document on stdout: per module the mutants, killed, survived, the equivalent
mutants (listed with the reason in docs/testing.md: :func:`equivalent_mutants`) and the score ``killed / (mutants - equivalent)``, and every
surviving mutant with its diff.

``python -m trimtab.devkit.mutation [--max-children N] [--resume] [--quick] [--constants] [--json FILE]
[MODULE ...]``, MODULE as ``channel/resolve.py`` (default: every module of ``channel/`` and ``balance/``).
``--resume`` keeps the scratch directory of the previous run and re-tests only what did not die in it
against the current tests (mutants killed stay killed while the module's code is unchanged; after a change
to it, run afresh). ``--quick`` runs the unit tests only (a first pass; a ``--resume`` without it gives
the survivors the property tests too). ``--constants`` also mutates the module-level constants (see
:func:`constant_mutants`).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trimtab.devkit.layout import PACKAGE, ROOT, package_dirs

CORE = ("channel", "balance")
SCRATCH = ROOT / "build" / "mutation"
TEST_DIRS = ("tests/unit", "tests/property")

# The modules issue 34 named first, then the rest of the core in file order, balance/assign.py last.
FIRST = ("channel/resolve.py", "channel/records.py", "balance/heal.py", "balance/shed.py")
LAST = ("balance/assign",)

# Top-level entries of the repository not linked into mutants/: what mutmut makes there itself, and
# what would only be in the way.
KEEP_OUT = {PACKAGE, "tests", "mutants", "build", "pyproject.toml", "setup.cfg"}

# A test file that asks for one of these fixtures starts a server (tests/conftest.py): never in a run.
SERVER_FIXTURES = re.compile(
    r"def test_\w+\([^)]*\b(zk|zk_server|zk_hosts|zk_chroot|zk_client_factory|zk_server_factory|kafka|"
    r"kafka_cluster|procs|spark)\b",
    re.S,
)

# Tests that cannot run under mutmut's trampolines, each with the reason (they still run in CI).
DESELECT = {
    # Decodes at a small recursion limit in a subprocess: the trampolines' extra frames overflow it.
    "tests/property/test_decode_props.py::test_decoding_does_not_depend_on_the_environment",
}

# mutmut's exit codes (mutmut/stats.py): what counts as killed.
KILLED = {1, 3, 36, 37, -24, 24, 152, 255}  # a failing test, pytest's internal error, a timeout, a type error
SURVIVED = 0
NO_TESTS = {5, 33}

# Mutants that no test can kill because the program does the same thing with and without them: listed,
# each with the reason, in docs/testing.md ("## Equivalent mutants": a "### channel/x.py" heading per
# module, then a table whose first cell holds mutmut's names in backticks) -- one list, read by people and
# by this driver. Keyed by mutmut's name; a name whose function changed no longer matches the same mutant,
# so a stale entry shows up as a survivor again (and is reported as not surviving).
TESTING_DOC = ROOT / "docs" / "testing.md"
_NAME = re.compile(r"x\w*__mutmut_\d+|xǁ\w+ǁ\w+__mutmut_\d+")


def equivalent_mutants(text: str) -> dict[str, str]:
    """mutmut's full name -> the reason, from the text of docs/testing.md. Raises ValueError on a name that
    is not mutmut's or is listed twice: a typo must not quietly leave a survivor counted as equivalent."""
    section = text.partition("\n## Equivalent mutants\n")[2].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    module = None
    for line in section.splitlines():
        if line.startswith("### "):
            module = dotted(line.removeprefix("### ").strip())
        elif line.startswith("| `") and module is not None:
            cells = line.strip().strip("|").split(" | ")
            reason = " | ".join(cells[1:]).strip()
            for name in re.findall(r"`([^`]+)`", cells[0]):
                if not _NAME.fullmatch(name):
                    raise ValueError(f"docs/testing.md: {name!r} under {module} is not a mutmut name")
                full = f"{module}.{name}"
                if full in out:
                    raise ValueError(f"docs/testing.md: {full} is listed twice")
                out[full] = reason
    return out


def load_equivalent(path: Path = TESTING_DOC) -> dict[str, str]:
    return equivalent_mutants(path.read_text(encoding="utf-8"))


@dataclass
class ModuleResult:
    module: str
    tests: list[str]
    mutants: int = 0
    killed: int = 0
    survived: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    equivalent: list[str] = field(default_factory=list)
    diffs: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def score(self) -> float | None:
        """killed / (mutants - equivalent), in percent; None when no test imports the module -- nothing was
        measured, which is not a score of 100 %."""
        if not self.tests:
            return None
        judged = self.mutants - len(self.equivalent)
        return 100.0 * self.killed / judged if judged else 100.0

    def as_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "mutants": self.mutants,
            "killed": self.killed,
            "survived": len(self.survived),
            "no_tests": len(self.no_tests),
            "other": self.other,
            "equivalent": len(self.equivalent),
            "score_pct": None if self.score is None else round(self.score, 1),
            "seconds": round(self.seconds, 1),
            "tests": self.tests,
            "survivors": [{"name": n, "diff": self.diffs.get(n, "")} for n in self.survived + self.no_tests],
        }


# Modules of channel/ that are the imperative shell, not decisions, each with the reason it is left out.
SHELL: dict[str, str] = {
    "channel/kafka.py": "confluent-kafka's producer and consumers: every function talks to a Kafka broker, and "
    "its tests run against a real Apache Kafka (tests/integration/test_kafka_*.py) -- a broker started for "
    "each mutant's run is out of reach; its behaviour (the partitioner, positions, history gaps) is pinned by "
    "those tests",
}


def core_modules(root: Path = ROOT) -> list[str]:
    """Every module of the decision core, ``channel/x.py`` style, in the order issue 34 asks for (the
    shell's modules, :data:`SHELL`, left out)."""
    found = sorted(
        str(p.relative_to(root))
        for folder in CORE
        for p in (root / folder).rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts and str(p.relative_to(root)) not in SHELL
    )
    last = [m for m in found if m.startswith(LAST)]  # assign.py and its index, whatever they are called
    middle = [m for m in found if m not in FIRST and m not in last]
    return [m for m in FIRST if m in found] + middle + last


def dotted(module: str) -> str:
    """``balance/placement/core.py`` -> ``trimtab.balance.placement.core``."""
    return PACKAGE + "." + module.removesuffix(".py").replace("/", ".")


def tests_for(module: str, root: Path = ROOT, quick: bool = False) -> list[str]:
    """The unit and property test files that import the module (or, for a module of a subpackage, the
    subpackage that re-exports it), less those that start servers; ``quick``: the unit tests only."""
    name = dotted(module)
    parent, _, leaf = name.rpartition(".")
    patterns = [
        rf"\b(from|import)\s+{re.escape(name)}\b",
        rf"\bfrom\s+{re.escape(parent)}\s+import\s+(\([^)]*\b{leaf}\b[^)]*\)|[^\n]*\b{leaf}\b)",
    ]
    if parent.count(".") >= 2:  # trimtab.balance.placement: its __init__ re-exports the modules
        patterns.append(rf"\b(from|import)\s+{re.escape(parent)}(\s|$)")
    found = []
    for folder in TEST_DIRS[:1] if quick else TEST_DIRS:
        for path in sorted((root / folder).glob("test_*.py")):
            text = path.read_text(encoding="utf-8")
            if any(re.search(p, text, re.M) for p in patterns) and not SERVER_FIXTURES.search(text):
                found.append(str(path.relative_to(root)))
    return found


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in {"__pycache__", ".hypothesis", ".pytest_cache"}}


def prepare(module: str, tests: list[str], workdir: Path, root: Path = ROOT, links: str = "mutants") -> None:
    """Lay out ``workdir``: the package as installed (real folders), the tests, mutmut's configuration, and
    in ``workdir/links`` (where the tests run) links to the rest of the repository."""
    for name, src in package_dirs(root).items():
        dest = workdir.joinpath(*name.split("."))
        if dest.exists():
            shutil.rmtree(dest)
        if name == PACKAGE:  # the top package's own files only: its subpackages are mapped folders
            dest.mkdir(parents=True)
            for entry in src.iterdir():
                if entry.is_file():
                    shutil.copy2(entry, dest / entry.name)
        else:
            shutil.copytree(src, dest, ignore=_ignore)
    shutil.copytree(root / "tests", workdir / "tests", ignore=_ignore, dirs_exist_ok=True)
    # The tests run in mutants/ and some read the repository's files by path (docs, deploy, the sources as
    # text): there, every other top-level entry of the repository is a link to the original.
    where = workdir / links
    where.mkdir(exist_ok=True)
    for entry in root.iterdir():
        link = where / entry.name
        if entry.name not in KEEP_OUT and not entry.name.startswith(".") and not link.exists():
            link.symlink_to(entry)
    mutated = f"{PACKAGE}/{module}"
    config = root.joinpath("pyproject.toml").read_text(encoding="utf-8")
    config += (
        "\n# Written by trimtab.devkit.mutation for one module.\n[tool.mutmut]\n"
        f'source_paths = ["{PACKAGE}"]\n'
        f"only_mutate = [{json.dumps(mutated)}]\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-m", "not slow and not integration", '
        f'"--hypothesis-seed=0", {", ".join(json.dumps("--deselect=" + t) for t in sorted(DESELECT))}]\n'
        # A mutant that loops for ever is killed after 5 x (its tests' time + 1 s) of CPU, not mutmut's 30 x.
        "timeout_multiplier = 2.5\n"
        "use_git_change_detection = false\n"
        'on_dependency_change = "ignore"\n'
    )
    workdir.joinpath("pyproject.toml").write_text(config, encoding="utf-8")


def verdicts(module: str, workdir: Path) -> dict[str, int | None]:
    meta = workdir / "mutants" / PACKAGE / (module + ".meta")
    if not meta.exists():
        return {}
    codes: dict[str, int | None] = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    return codes


def diffs(names: Iterable[str], module: str, workdir: Path) -> dict[str, str]:
    """Each mutant's diff, from mutmut itself (run in the scratch directory: mutmut reads its
    configuration from the working directory when it is imported)."""
    wanted = list(names)
    if not wanted:
        return {}
    script = (
        "import json, sys\n"
        "from mutmut.mutation.diff_apply import get_diff_for_mutant\n"
        "names, path = json.load(sys.stdin)\n"
        "print(json.dumps({n: get_diff_for_mutant(n, path=path) for n in names}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps([wanted, f"{PACKAGE}/{module}"]),
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, str] = json.loads(out.stdout)
    return result


# ------------------------------------------------------------------------------------------ constants
# mutmut mutates code inside functions only. Module-level constants (the transition table, state sets,
# schema limits) and the defaults of the ``*Config`` dataclasses decide as much, so ``--constants`` mutates
# them too, one at a time, and runs the module's tests against each (``-x``, this repository's rule tests
# first, so a killed mutant costs a few seconds).

CONSTANT_NAME = re.compile(r"_?[A-Z][A-Z0-9_]*")


@dataclass(frozen=True)
class ConstantMutant:
    name: str  # e.g. TRANSITIONS[3], ShedConfig.target_std
    change: str  # the mutated statement
    line: int  # 1-based, first line of the statement
    end: int  # last line of the statement
    indent: int


def _changes(value: ast.expr) -> list[tuple[str, Callable[[], None]]]:
    """The changes one can make to ``value`` (what, how), in a fixed order: a number changed, a flag
    flipped, one member of a set, tuple or list left out, one entry of a dict left out."""
    out: list[tuple[str, Callable[[], None]]] = []

    def setter(node: ast.Constant, new: object) -> Callable[[], None]:
        return lambda: setattr(node, "value", new)

    def dropper(elts: list[Any], i: int) -> Callable[[], None]:
        return lambda: elts.pop(i)

    for node in ast.walk(value):
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            out.append((f"{node.value} -> {not node.value}", setter(node, not node.value)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            new = node.value + 1 if isinstance(node.value, int) else (node.value * 2 or 1.0)
            out.append((f"{node.value!r} -> {new!r}", setter(node, new)))
        elif isinstance(node, ast.Set | ast.Tuple | ast.List):
            for i, elt in enumerate(node.elts):
                out.append((f"without {ast.unparse(elt)}", dropper(node.elts, i)))
        elif isinstance(node, ast.Dict):
            for i, key in enumerate(node.keys):
                if key is not None and not isinstance(node.values[i], ast.Set | ast.Call):
                    d = node

                    def drop(d: ast.Dict = d, i: int = i) -> None:
                        del d.keys[i], d.values[i]

                    out.append((f"without the entry {ast.unparse(key)}", drop))
    return out


def _variants(value: ast.expr) -> Iterator[tuple[str, ast.expr]]:
    """(what changed, a mutated copy of ``value``) for each of :func:`_changes`."""
    for i in range(len(_changes(value))):
        copied = copy.deepcopy(value)
        what, apply = _changes(copied)[i]
        apply()
        yield what, copied


def constant_mutants(source: str) -> list[ConstantMutant]:
    """The constants of a module and the defaults of its ``*Config`` dataclasses, each change a mutant."""
    tree = ast.parse(source)
    found: list[tuple[str, ast.Assign | ast.AnnAssign, int]] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names and all(CONSTANT_NAME.fullmatch(n) for n in names) and stmt.value is not None:
                found.append((names[0], stmt, 0))
        elif isinstance(stmt, ast.ClassDef) and stmt.name.endswith("Config"):
            for item in stmt.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and item.value is not None
                    and isinstance(item.target, ast.Name)
                ):
                    found.append((f"{stmt.name}.{item.target.id}", item, item.col_offset))
    out: list[ConstantMutant] = []
    for name, stmt, indent in found:
        assert stmt.value is not None
        for i, (what, value) in enumerate(_variants(stmt.value)):
            mutated = copy_with_value(stmt, value)
            out.append(ConstantMutant(f"{name}#{i}: {what}", ast.unparse(mutated), stmt.lineno,
                                      stmt.end_lineno or stmt.lineno, indent))  # fmt: skip
    return out


def copy_with_value(stmt: ast.Assign | ast.AnnAssign, value: ast.expr) -> ast.Assign | ast.AnnAssign:
    new = copy.copy(stmt)
    new.value = value
    return new


def run_constants(module: str, tests: list[str], log: Path) -> list[dict[str, Any]]:
    """Each constant mutant of ``module`` against its tests: [{name, change, killed}]."""
    workdir = SCRATCH / "constants" / module.removesuffix(".py").replace("/", "-")
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    prepare(module, tests, workdir, links=".")
    target = workdir / PACKAGE / module
    original = target.read_text(encoding="utf-8")
    lines = original.splitlines(keepends=True)
    ordered = sorted(tests, key=lambda t: (not Path(t).name.startswith("test_rules_"), t))
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "-m", "not slow and not integration", "--hypothesis-seed=0", *ordered]  # fmt: skip
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out: list[dict[str, Any]] = []
    for m in constant_mutants(original):
        text = "".join(lines[: m.line - 1]) + " " * m.indent + m.change + "\n" + "".join(lines[m.end :])
        target.write_text(text, encoding="utf-8")
        with log.open("a", encoding="utf-8") as f:
            f.write(f"\n===== {module} constant {m.name}: {m.change}\n")
            f.flush()
            code = subprocess.run(
                command, cwd=workdir, stdout=f, stderr=subprocess.STDOUT, env=env, check=False
            ).returncode
        out.append({"name": m.name, "line": m.line, "change": m.change, "killed": code not in (0, 5)})
        print(f"[mutation] {module} constant {m.name}: {'killed' if code not in (0, 5) else 'SURVIVED'}",
              file=sys.stderr)  # fmt: skip
    target.write_text(original, encoding="utf-8")
    return out


def run_module(
    module: str,
    max_children: int,
    resume: bool,
    log: Path,
    quick: bool = False,
    equivalent: Mapping[str, str] | None = None,
) -> ModuleResult:
    tests = tests_for(module, quick=quick)
    result = ModuleResult(module=module, tests=tests)
    workdir = SCRATCH / module.removesuffix(".py").replace("/", "-")
    # The verdicts of the last run, merged (mutmut's own file forgets the mutants a resume did not name).
    merged = workdir / "verdicts.json"
    previous: dict[str, int | None] = {}
    if resume:
        previous = (
            json.loads(merged.read_text(encoding="utf-8")) if merged.exists() else verdicts(module, workdir)
        )
    if not tests:
        print(f"[mutation] {module}: no unit or property test imports it", file=sys.stderr)
    if not resume and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    prepare(module, tests, workdir)
    again = sorted(n for n, code in previous.items() if code not in KILLED)
    command = [str(Path(sys.executable).with_name("mutmut")), "run", "--max-children", str(max_children)]
    if previous:
        command += again
    started = time.monotonic()
    if tests and (again or not previous):
        print(f"[mutation] {module}: {len(tests)} test files, log {log}", file=sys.stderr)
        with log.open("a", encoding="utf-8") as out:
            out.write(f"\n===== {module}: {' '.join(command)}\n")
            out.flush()
            env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
            subprocess.run(command, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    result.seconds = time.monotonic() - started
    codes = {**previous, **{n: c for n, c in verdicts(module, workdir).items() if not previous or n in again}}
    if not tests:
        codes = dict.fromkeys(codes, 33)
    merged.write_text(json.dumps(codes, indent=0, sort_keys=True), encoding="utf-8")
    tally(result, codes, equivalent or {}, workdir)
    score = "not measured (no test imports it)" if result.score is None else f"{result.score:.1f} %"
    print(
        f"[mutation] {module}: {result.killed}/{result.mutants} killed, {len(result.equivalent)} equivalent, "
        f"{len(result.survived)} survived, {len(result.no_tests)} without tests: {score} "
        f"({result.seconds:.0f} s)",
        file=sys.stderr,
    )
    return result


def tally(
    result: ModuleResult, codes: Mapping[str, int | None], equivalent: Mapping[str, str], workdir: Path
) -> None:
    """Count a module's verdicts into ``result`` (equivalent survivors apart) with the survivors' diffs."""
    for name, code in sorted(codes.items()):
        result.mutants += 1
        if code in KILLED:
            result.killed += 1
        elif code == SURVIVED:
            if name in equivalent:
                result.equivalent.append(name)
            else:
                result.survived.append(name)
        elif code in NO_TESTS:
            # Code no test runs: equivalent when listed (a Protocol method's body, ``...``, never runs).
            (result.equivalent if name in equivalent else result.no_tests).append(name)
        else:
            result.other[str(code)] = result.other.get(str(code), 0) + 1
    try:
        result.diffs = diffs(result.survived + result.no_tests, result.module, workdir)
    except subprocess.CalledProcessError as e:
        print(f"[mutation] {result.module}: could not read the diffs: {e.stderr}", file=sys.stderr)


def stored_result(module: str, equivalent: Mapping[str, str]) -> ModuleResult | None:
    """A module's score from the verdicts its runs left in its scratch directory (every run and resume
    merged), against today's list of equivalent mutants; None if it was never run here."""
    workdir = SCRATCH / module.removesuffix(".py").replace("/", "-")
    merged = workdir / "verdicts.json"
    if not merged.exists():
        return None
    result = ModuleResult(module=module, tests=tests_for(module))
    tally(result, json.loads(merged.read_text(encoding="utf-8")), equivalent, workdir)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("modules", nargs="*", help="e.g. channel/resolve.py (default: the whole core)")
    parser.add_argument("--max-children", type=int, default=1, help="mutmut's workers (default 1)")
    parser.add_argument("--resume", action="store_true", help="re-test only the previous run's survivors")
    parser.add_argument("--json", type=Path, help="also write the JSON report to this file")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="unit tests only (then --resume without it re-tests the survivors with the property tests too)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="run nothing: the scores the last runs left in build/mutation/ (modules never run listed apart)",
    )
    parser.add_argument("--constants", action="store_true", help="also mutate module-level constants")
    parser.add_argument("--only-constants", action="store_true", help="mutate module-level constants only")
    args = parser.parse_args(argv)
    if not Path(sys.executable).with_name("mutmut").exists() and not (args.only_constants or args.report):
        parser.error("mutmut is not installed here: bash scripts/setup.sh installs the dev extra (mutmut>=3)")
    known = core_modules()
    modules = [m.removeprefix("./") for m in args.modules] or known
    unknown = [m for m in modules if m not in known]
    if unknown:
        parser.error(f"not modules of the decision core: {', '.join(unknown)} (known: {', '.join(known)})")
    equivalent = load_equivalent()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    log = SCRATCH / "mutmut.log"
    not_run: list[str] = []
    if args.report:
        stored = {m: stored_result(m, equivalent) for m in modules}
        results = [r for r in stored.values() if r is not None]
        not_run = [m for m, r in stored.items() if r is None]
    elif args.only_constants:
        results = []
    else:
        results = [
            run_module(m, args.max_children, args.resume, log, args.quick, equivalent) for m in modules
        ]
    constants: dict[str, list[dict[str, Any]]] = {}
    if args.constants or args.only_constants:
        constants = {m: run_constants(m, tests_for(m), log) for m in modules}
    seen = {n for r in results for n in r.equivalent}
    ran = {dotted(r.module) for r in results}
    unused = sorted(n for n in equivalent if n not in seen and n.rpartition(".x")[0] in ran)
    report = {
        "tool": "mutmut",
        "modules": [r.as_json() for r in results],
        "equivalent": {n: equivalent[n] for n in sorted(seen)},
        "equivalent_not_surviving": unused,
        "left_out": SHELL,
    }
    if args.report:
        report["not_run"] = not_run
    if constants:
        report["constants"] = [
            {
                "module": m,
                "mutants": len(found),
                "killed": sum(1 for c in found if c["killed"]),
                "survivors": [c for c in found if not c["killed"]],
            }
            for m, found in constants.items()
        ]
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
