#!/usr/bin/env bash
# Static validation of docker-compose.yml (no Docker engine runs here). Uses the Python docker-compose 1.29
# package, which validates offline against its bundled compose-spec schema, in its own small venv: it is a
# check, not a dependency of trimtab (its pinned libraries would conflict with ours).
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv-compose
if [ ! -x "$V/bin/docker-compose" ]; then
  python3 -m venv "$V"
  log="$V/install.log"
  # --no-deps: docker-compose 1.29 pins old versions (PyYAML<6 has no wheel for Python 3.11); the newer
  # ones below work for `config`, which is all we use.
  if ! { "$V/bin/pip" install --no-deps "docker-compose==1.29.2" &&
         "$V/bin/pip" install "PyYAML>=6" "jsonschema>=4" docopt texttable dockerpty python-dotenv "docker>=5" \
           distro "websocket-client>=1"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "could not install the docker-compose validator (see above)" >&2
    exit 1
  fi
fi
"$V/bin/docker-compose" -f docker-compose.yml config -q
echo "docker-compose.yml is valid ($("$V/bin/docker-compose" -f docker-compose.yml config --services | wc -l) services)"
