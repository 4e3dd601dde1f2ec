#!/usr/bin/env bash
# The setup-and-run command (README): install what is missing, then start the local cluster -- a real
# ZooKeeper server, the Kafka-protocol mock cluster, agents beside simulated brokers, two controllers --
# with a live view. Ctrl-C stops everything. Arguments go to `trimtab dev up` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/trimtab dev up "$@"
