"""The real kustomize, for ``deploy/kubernetes``: ``kustomize build <dir>`` with the pinned release, its
YAML parsed into objects (the test command validates every one of them, ``tests/unit/test_kubernetes.py``).

kustomize is a Go program and no package registry this project uses ships its binary, so
``scripts/setup.sh`` builds it once from the Go module proxy (``go install
sigs.k8s.io/kustomize/kustomize/v5@<KUSTOMIZE_VERSION>``, version read from this file) into
``${XDG_CACHE_HOME:-~/.cache}/trimtab/kustomize-<KUSTOMIZE_VERSION>/kustomize``; later runs find it there
and need no network. ``$TRIMTAB_KUSTOMIZE`` names another binary (it must be the same version).

Also here: the operator's ``PrometheusRule`` made from ``deploy/prometheus/alerts.yml``, so the
Kubernetes manifests carry the very rules docker-compose and the dev cluster load
(``trimtab docs`` rewrites it after the rules change).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from trimtab.devkit.prometheus import ALERT_RULES, DEPLOY_DIR
from trimtab.errors import DevKitError

# docs/dependencies.md says why this one; scripts/setup.sh reads it from this line.
KUSTOMIZE_VERSION = "v5.8.2"
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
BINARY_ENV = "TRIMTAB_KUSTOMIZE"
KUBERNETES_DIR = DEPLOY_DIR / "kubernetes"
PROMETHEUS_RULE = KUBERNETES_DIR / "base" / "prometheusrule.yaml"


class KustomizeError(DevKitError):
    pass


Object = dict[str, Any]


def default_binary() -> Path:
    """Where ``scripts/setup.sh`` installs the pinned kustomize."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "trimtab" / f"kustomize-{KUSTOMIZE_VERSION}" / "kustomize"


def find_binary() -> Path:
    """``$TRIMTAB_KUSTOMIZE``, else the cache's; a one-line error naming the fix if it is not there."""
    explicit = os.environ.get(BINARY_ENV, "").strip()
    path = Path(explicit) if explicit else default_binary()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise KustomizeError(
            f"kustomize {KUSTOMIZE_VERSION} not found at {path}: run `bash scripts/setup.sh` "
            f"(it builds it once with `go install {KUSTOMIZE_MODULE}@{KUSTOMIZE_VERSION}`)"
        )
    _check_version(str(path))
    return path


@functools.cache
def _check_version(binary: str) -> None:
    out = _run([binary, "version"]).strip()
    if out != KUSTOMIZE_VERSION:
        raise KustomizeError(
            f"{binary} is kustomize {out or '(unknown version)'}, not {KUSTOMIZE_VERSION}: "
            f"run `bash scripts/setup.sh` or point ${BINARY_ENV} at kustomize {KUSTOMIZE_VERSION}"
        )


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except OSError as e:
        raise KustomizeError(f"cannot run {argv[0]}: {e}") from None
    if done.returncode != 0:
        detail = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise KustomizeError(f"`kustomize {' '.join(argv[1:])}` failed: {detail}")
    return done.stdout


def render(directory: Path) -> str:
    """``kustomize build <directory>``: the YAML stream, as kustomize prints it."""
    return _run([str(find_binary()), "build", str(directory)])


def build(directory: Path) -> list[Object]:
    """The objects of ``kustomize build <directory>``, in kustomize's order."""
    return [d for d in yaml.safe_load_all(render(directory)) if d]


def key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name): what identifies an object in a rendering."""
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def prometheus_rule() -> str:
    """``deploy/kubernetes/base/prometheusrule.yaml``: the alert rules as a ``PrometheusRule``."""
    alerts = yaml.safe_load(ALERT_RULES.read_text())
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "trimtab", "labels": {"app.kubernetes.io/name": "trimtab"}},
        "spec": {"groups": alerts["groups"]},
    }
    head = (
        "# trimtab's alert rules for the Prometheus operator: deploy/prometheus/alerts.yml as they are (the test\n"
        "# command checks that they are equal). After editing alerts.yml, regenerate this file with\n"
        "#   .venv/bin/trimtab docs\n"
        "# Runbooks: docs/operations.md.\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False, width=110, allow_unicode=True)


def main(argv: list[str]) -> int:
    """``--binary`` (print the binary's path), or a directory to render. (The PrometheusRule is written by
    ``trimtab docs``, the one generator.)"""
    try:
        if argv == ["--binary"]:
            print(find_binary())
            return 0
        if len(argv) != 1:
            print(
                "usage: python -m trimtab.devkit.kustomize DIRECTORY | --binary",
                file=sys.stderr,
            )
            return 2
        print(render(Path(argv[0])), end="")
    except KustomizeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
