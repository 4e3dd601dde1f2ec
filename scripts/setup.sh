#!/usr/bin/env bash
# Idempotent setup: everything trimtab needs on a fresh Debian/Ubuntu machine with Python >= 3.11.
#   - Java 17 (for the real ZooKeeper server the dev cluster and the tests start)
#   - Debian's zookeeper package (jars in /usr/share/java; the service itself is not used)
#   - Debian's prometheus package (prometheus and promtool: the dev cluster's Prometheus and the alert
#     rule tests; the service it installs is not used)
#   - Debian's wrk (the load generator of `trimtab bench lookup`'s one-core phase)
#   - a virtualenv in .venv with trimtab and its dev and simulator (sim: SciPy, matplotlib) dependencies
#     and the data pipeline's (spark: PySpark, pyarrow, pandas<3, matplotlib; Spark runs on the same Java 17)
#   - Apache Kafka's server jars (KRaft, the version devkit/kafka/pom.xml pins) from Maven Central with Maven,
#     into ${XDG_CACHE_HOME:-~/.cache}/trimtab/kafka-<version>/libs, for devkit/kafka_server.py
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
# wrk: the external load generator of `trimtab bench lookup`'s one-core phase (and its test).
command -v wrk >/dev/null 2>&1 || apt_install wrk
# gcc: `trimtab bench compiled` compiles the replay loop with mypyc (and its test); Python's headers come
# with the interpreter the venv is made from.
command -v gcc >/dev/null 2>&1 || apt_install gcc

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  log "Python >= 3.11 is required (found $("$PY" --version 2>&1))"; exit 1
fi
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.trimtab-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  log "installing trimtab and its dependencies into .venv"
  log=.venv/install.log
  if ! { .venv/bin/python -m pip install --upgrade pip && .venv/bin/python -m pip install -e '.[dev,sim,spark]'; } >"$log" 2>&1; then
    cat "$log" >&2
    log "pip install failed (full output above, also in $log)"
    exit 1
  fi
  touch "$stamp"
fi

# The runtime jars a pom in the repository declares, copied by Maven into a directory of the cache: Maven
# first offline (-o, from what ~/.m2 already has), then from Maven Central; the directory is replaced only
# when the copy succeeded. $1 pom, $2 directory, $3 what it is (for the messages).
maven_jars() {
  local pom=$1 dest=$2 what=$3 mode
  local mvn_log="$dest.maven.log"
  for mode in -o ""; do
    rm -rf "$dest.new"
    # shellcheck disable=SC2086  # an empty $mode is no argument at all
    if mvn -B -q -C $mode -f "$pom" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
        "-DoutputDirectory=$dest.new" >"$mvn_log" 2>&1; then
      rm -rf "$dest" && mv "$dest.new" "$dest"
      return 0
    fi
  done
  cat "$mvn_log" >&2
  log "fetching $what with Maven failed (full output above, also in $mvn_log)"
  exit 1
}

# Apache Kafka (KRaft) for devkit/kafka_server.py: the server jars and their declared runtime dependencies
# from Maven Central (devkit/kafka/pom.xml pins the version), once, into a cache outside git. The stamp
# holds the pom's checksum: an unchanged pom never calls Maven again, so later runs work offline; Maven
# itself first tries offline (-o), from what ~/.m2 already has. $TRIMTAB_KAFKA_CLASSPATH (jars of your
# own) skips the step. Right after a fetch, one broker is started and stopped: it proves the jars run on
# this Java and leaves the class-data-sharing archive that makes later starts faster.
kafka_pom=devkit/kafka/pom.xml
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$kafka_pom")
kafka_home="${XDG_CACHE_HOME:-$HOME/.cache}/trimtab/kafka-$kafka_version"
kafka_sum=$(sha256sum "$kafka_pom" | cut -d' ' -f1)
if [ -z "${TRIMTAB_KAFKA_CLASSPATH:-}" ] && [ "$(cat "$kafka_home/.complete" 2>/dev/null)" != "$kafka_sum" ]; then
  if ! command -v mvn >/dev/null 2>&1; then
    apt_install maven
  fi
  log "fetching Apache Kafka $kafka_version (server jars) from Maven Central into $kafka_home/libs"
  mkdir -p "$kafka_home"
  maven_jars "$kafka_pom" "$kafka_home/libs" "Apache Kafka $kafka_version"
  if ! .venv/bin/python -m trimtab.devkit.kafka_server --check >"$kafka_home/check.log" 2>&1; then
    cat "$kafka_home/check.log" >&2
    log "Apache Kafka $kafka_version does not start here (output above, also in $kafka_home/check.log)"
    exit 1
  fi
  log "$(tail -1 "$kafka_home/check.log")"
  echo "$kafka_sum" >"$kafka_home/.complete"
fi

# kustomize, for the Kubernetes manifests' tests (devkit/kustomize.py pins the version): built once from the
# Go module proxy with `go install` into the cache, skipped when the binary is there (offline afterwards).
kustomize_version=$(sed -n 's/^KUSTOMIZE_VERSION = "\(.*\)"$/\1/p' devkit/kustomize.py)
kustomize_dir="${XDG_CACHE_HOME:-$HOME/.cache}/trimtab/kustomize-$kustomize_version"
if [ -z "${TRIMTAB_KUSTOMIZE:-}" ] && [ ! -x "$kustomize_dir/kustomize" ]; then
  go_bin=$(command -v go || echo /usr/local/go/bin/go)
  if [ ! -x "$go_bin" ]; then
    log "Go is needed once to build kustomize $kustomize_version (go install); install Go and re-run"; exit 1
  fi
  log "building kustomize $kustomize_version with go install into $kustomize_dir"
  rm -rf "$kustomize_dir.new" && mkdir -p "$kustomize_dir.new"
  if ! GOBIN="$kustomize_dir.new" "$go_bin" install "sigs.k8s.io/kustomize/kustomize/v5@$kustomize_version" \
      >"$kustomize_dir.log" 2>&1; then
    cat "$kustomize_dir.log" >&2
    log "go install of kustomize $kustomize_version failed (full output above, also in $kustomize_dir.log)"
    exit 1
  fi
  rm -rf "$kustomize_dir" && mv "$kustomize_dir.new" "$kustomize_dir"
fi

# Spark's Kafka connector for `trimtab pipeline --reader connector` (devkit/spark/pom.xml pins it; only the
# jars PySpark lacks): once from Maven Central into the cache, as the Kafka jars above (pom checksum stamp,
# Maven offline first). $TRIMTAB_SPARK_KAFKA_JARS (a directory of your own) skips the step.
spark_pom=devkit/spark/pom.xml
spark_kafka_version=$(sed -n 's:.*<connector.version>\(.*\)</connector.version>.*:\1:p' "$spark_pom")
spark_kafka_home="${XDG_CACHE_HOME:-$HOME/.cache}/trimtab/spark-kafka-$spark_kafka_version"
spark_kafka_sum=$(sha256sum "$spark_pom" | cut -d' ' -f1)
if [ -z "${TRIMTAB_SPARK_KAFKA_JARS:-}" ] \
    && [ "$(cat "$spark_kafka_home/.complete" 2>/dev/null)" != "$spark_kafka_sum" ]; then
  command -v mvn >/dev/null 2>&1 || apt_install maven
  log "fetching Spark's Kafka connector $spark_kafka_version from Maven Central into $spark_kafka_home/jars"
  mkdir -p "$spark_kafka_home"
  maven_jars "$spark_pom" "$spark_kafka_home/jars" "the Spark Kafka connector $spark_kafka_version"
  echo "$spark_kafka_sum" >"$spark_kafka_home/.complete"
fi
log "ready: $(.venv/bin/python --version), $(java -version 2>&1 | head -1)"
