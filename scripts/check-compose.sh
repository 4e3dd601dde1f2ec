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

# The compose Kafka is the Kafka the tests run: the kafka service's apache/kafka:<version> must be the version
# devkit/kafka/pom.xml pins (tests/integration/test_compose_processes.py runs compose's services against it).
pom_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' devkit/kafka/pom.xml)
compose_image=$("$V/bin/python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["services"]["kafka"]["image"])' docker-compose.yml)
if [ "$compose_image" != "apache/kafka:$pom_version" ]; then
  echo "docker-compose.yml's kafka service runs $compose_image, but the tests run Kafka $pom_version" \
    "(devkit/kafka/pom.xml): make it apache/kafka:$pom_version" >&2
  exit 1
fi
echo "docker-compose.yml's Kafka is $compose_image, the version the tests run"
