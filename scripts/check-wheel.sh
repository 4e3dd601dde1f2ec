#!/usr/bin/env bash
# The wheel a user installs: exactly one top-level import package (trimtab), no dev kit, and a CLI that
# runs from a fresh virtualenv with nothing but the wheel and its dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Built from the image's build context, reproduced from .dockerignore (the Dockerfile copies all of it), so
# what is tested here is what `docker build` would package.
.venv/bin/python -m trimtab.devkit.docker_context . "$out/context" >&2
(cd "$out/context" && "$OLDPWD/.venv/bin/python" -m pip wheel --quiet --no-deps --wheel-dir "$out/dist" .) >"$out/build.log" 2>&1 || {
  cat "$out/build.log" >&2; echo "building the wheel from the image's build context failed" >&2; exit 1; }
wheel=$(ls "$out"/dist/trimtab-*.whl)
.venv/bin/python - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
assert top == {"trimtab"}, f"the wheel installs these top-level names: {sorted(top)} (want only trimtab)"
dev = [n for n in names if n.startswith("trimtab/devkit")]
assert not dev, f"the dev kit is in the wheel: {dev[:5]}"
for needed in ("trimtab/cli/main.py", "trimtab/channel/records.py", "trimtab/agent/daemon.py", "trimtab/cli/pipeline.py",
               "trimtab/controller/daemon.py", "trimtab/config/settings.py", "trimtab/py.typed"):
    assert needed in names, f"{needed} is missing from the wheel"
print(f"wheel {sys.argv[1].rsplit('/', 1)[-1]}: top-level {sorted(top)}, {len(names)} files, no dev kit")
PY
python3 -m venv "$out/venv"
"$out/venv/bin/python" -m pip install --quiet "$wheel" >"$out/install.log" 2>&1 || {
  cat "$out/install.log" >&2; echo "installing the wheel into a fresh virtualenv failed" >&2; exit 1; }
cd "$out"  # away from the source tree, so nothing is imported from it
for cmd in "" agent controller admin pipeline sim sim-broker channel; do
  # shellcheck disable=SC2086  # an empty $cmd is no argument at all
  "$out/venv/bin/trimtab" $cmd --help >/dev/null || { echo "'trimtab $cmd --help' fails from the wheel" >&2; exit 1; }
done
"$out/venv/bin/python" -c "import trimtab.agent.daemon, trimtab.controller.daemon, trimtab.channel.client, trimtab.cli.pipeline, trimtab.sim.engine"
if msg=$("$out/venv/bin/trimtab" bench channel 2>&1); then
  echo "'trimtab bench' ran without the dev kit" >&2; exit 1
fi
case "$msg" in *"ships with the source repository"*) ;; *) echo "unexpected: $msg" >&2; exit 1 ;; esac
# The pipeline ships in the wheel, PySpark does not (the optional spark extra): its commands say how to get it.
if msg=$("$out/venv/bin/trimtab" pipeline compact --input "$wheel" 2>&1); then
  echo "'trimtab pipeline' ran without the spark extra" >&2; exit 1
fi
case "$msg" in *"trimtab[spark]"*) ;; *) echo "unexpected: $msg" >&2; exit 1 ;; esac
echo "every command's --help runs from a fresh virtualenv with the wheel of the image's build context; the dev kit and pipeline commands say where to get them"
