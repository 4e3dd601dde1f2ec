#!/usr/bin/env bash
# Idempotent setup: everything trimtab needs on a fresh Debian/Ubuntu machine with Python >= 3.11.
#   - Java 17 (for the real ZooKeeper server the dev cluster and the tests start)
#   - Debian's zookeeper package (jars in /usr/share/java; the service itself is not used)
#   - Debian's prometheus package (prometheus and promtool: the dev cluster's Prometheus and the alert
#     rule tests; the service it installs is not used)
#   - a virtualenv in .venv with trimtab and its dev and simulator (sim: SciPy, matplotlib) dependencies
#     and the data pipeline's (spark: PySpark, pyarrow, pandas<3, matplotlib; Spark runs on the same Java 17)
# Re-running it is cheap: each step checks before it installs.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
fi

apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not found: install $* yourself (or set TRIMTAB_ZK_CLASSPATH to ZooKeeper jars)"
    return 1
  fi
  log "installing $* with apt-get"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1 || {
    $SUDO apt-get update >/dev/null 2>&1
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null
  }
}

if ! command -v java >/dev/null 2>&1; then
  apt_install openjdk-17-jre-headless
fi
if [ -z "${TRIMTAB_ZK_CLASSPATH:-}" ] && [ ! -f /usr/share/java/zookeeper.jar ]; then
  apt_install zookeeper
fi
if [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/promtool ]; then
  apt_install prometheus
fi

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  log "Python >= 3.11 is required (found $("$PY" --version 2>&1))"; exit 1
fi
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.trimtab-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing trimtab and its dependencies into .venv"
  log=.venv/install.log
  if ! { .venv/bin/python -m pip install --upgrade pip && .venv/bin/python -m pip install -e '.[dev,sim,spark]'; } >"$log" 2>&1; then
    cat "$log" >&2
    log "pip install failed (full output above, also in $log)"
    exit 1
  fi
  touch "$stamp"
fi
log "ready: $(.venv/bin/python --version), $(java -version 2>&1 | head -1)"
