"""A small kustomize, enough for ``deploy/kubernetes``: the test command renders the base and the example
overlay with it and validates every object, because the real kustomize is a Go binary that no package
registry this project uses ships (``kubectl kustomize`` gives the same objects where kubectl exists; a
test compares the two there).

Supported, as kustomize v5 does it: ``resources`` (files and directories holding a kustomization),
``namespace``, ``images`` (``newName``/``newTag``/``digest`` on the containers of the built-in
workloads) and ``patches`` with a ``path`` to a strategic-merge patch (the target is the patch's own
kind and name). Strategic merge merges maps, merges the lists of the built-in workload fields by their
merge keys (containers and env by name, volume mounts by mountPath, ...) and replaces every other list,
as kustomize does for custom resources. Anything else in a kustomization is refused, not ignored.

Also here: the operator's ``PrometheusRule`` made from ``deploy/prometheus/alerts.yml``, so the
Kubernetes manifests carry the very rules docker-compose and the dev cluster load
(``python -m trimtab.devkit.kustomize --write-prometheusrule`` rewrites it after the rules change).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from trimtab.devkit.prometheus import ALERT_RULES, DEPLOY_DIR
from trimtab.errors import DevKitError

KUBERNETES_DIR = DEPLOY_DIR / "kubernetes"
PROMETHEUS_RULE = KUBERNETES_DIR / "base" / "prometheusrule.yaml"
_SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
# Strategic-merge keys of the lists a patch of a built-in workload may touch (Kubernetes' patchMergeKey).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod"}
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


class KustomizeError(DevKitError):
    pass


Object = dict[str, Any]


def key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name): what identifies an object in a rendering."""
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def load_objects(path: Path) -> list[Object]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def build(directory: Path) -> list[Object]:
    """The objects ``kubectl kustomize <directory>`` would print (in the order of the resources)."""
    kfile = directory / "kustomization.yaml"
    k = yaml.safe_load(kfile.read_text())
    unknown = set(k) - _SUPPORTED
    if unknown:
        raise KustomizeError(f"{kfile}: not supported by this renderer: {sorted(unknown)}")
    objects: list[Object] = []
    for res in k.get("resources", []):
        path = (directory / res).resolve()
        objects += build(path) if path.is_dir() else load_objects(path)
    seen = [key(o) for o in objects]
    if len(set(seen)) != len(seen):
        raise KustomizeError(f"{directory}: an object is defined twice")
    for patch in k.get("patches", []):
        if set(patch) != {"path"}:
            raise KustomizeError(f"{kfile}: only `patches: - path: <file>` is supported, not {patch}")
        for p in load_objects(directory / patch["path"]):
            target = _find(objects, p)
            target.update(merge(target, p, in_workload=target["kind"] in _WORKLOADS))
    for obj in objects:
        if "namespace" in k and obj["kind"] not in _CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = k["namespace"]
        for image in k.get("images", []):
            _set_image(obj, image)
    return objects


def _find(objects: list[Object], patch: Mapping[str, Any]) -> Object:
    group = patch["apiVersion"].rpartition("/")[0]
    for o in objects:
        same = o["kind"] == patch["kind"] and o["metadata"]["name"] == patch["metadata"]["name"]
        if same and o["apiVersion"].rpartition("/")[0] == group:
            return o
    raise KustomizeError(f"no {patch['kind']} {patch['metadata']['name']} to patch")


def merge(base: Any, patch: Any, *, field: str = "", in_workload: bool = False) -> Any:
    """A strategic merge of ``patch`` onto ``base`` (both unchanged; a new value is returned)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)  # `field: null` deletes, as in a merge patch
            else:
                out[k] = (
                    merge(base[k], v, field=k, in_workload=in_workload) if k in base else copy.deepcopy(v)
                )
        return out
    merge_key = _MERGE_KEYS.get(field) if in_workload else None
    if isinstance(base, list) and isinstance(patch, list) and merge_key:
        out_list = copy.deepcopy(base)
        added = []
        for item in patch:
            at = next((i for i, b in enumerate(out_list) if b.get(merge_key) == item.get(merge_key)), None)
            if at is None:
                added.append(copy.deepcopy(item))
            else:
                out_list[at] = merge(out_list[at], item, in_workload=in_workload)
        return added + out_list  # kustomize puts the patch's new items first
    return copy.deepcopy(patch)


def _set_image(obj: Object, image: Mapping[str, str]) -> None:
    if obj["kind"] not in _WORKLOADS:
        return
    spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        name, _, tag = c["image"].partition(":")
        if name != image["name"]:
            continue
        new = image.get("newName", name)
        if "digest" in image:
            c["image"] = f"{new}@{image['digest']}"
        else:
            c["image"] = f"{new}:{image.get('newTag', tag)}" if image.get("newTag", tag) else new


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
        "#   .venv/bin/python -m trimtab.devkit.kustomize --write-prometheusrule\n"
        "# Runbooks: docs/operations.md.\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False, width=110, allow_unicode=True)


def main(argv: list[str]) -> int:
    """``--write-prometheusrule``, or a directory to render (YAML on stdout, as ``kubectl kustomize``)."""
    if argv == ["--write-prometheusrule"]:
        PROMETHEUS_RULE.write_text(prometheus_rule())
        print(f"wrote {PROMETHEUS_RULE}", file=sys.stderr)
        return 0
    if len(argv) != 1:
        print("usage: python -m trimtab.devkit.kustomize DIRECTORY | --write-prometheusrule", file=sys.stderr)
        return 2
    print(yaml.safe_dump_all(build(Path(argv[0])), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
