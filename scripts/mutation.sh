#!/usr/bin/env bash
# Mutation testing of the decision core (channel/ and balance/) with mutmut 3: not part of CI, it takes
# minutes (docs/testing.md: the figures, and the mutants that are equivalent and why).
#   bash scripts/mutation.sh                          # every module; JSON report on stdout
#   bash scripts/mutation.sh balance/shed.py          # one module (or several)
#   bash scripts/mutation.sh --resume balance/shed.py # re-test only the last run's survivors
#   bash scripts/mutation.sh --json build/mutation/report.json
#   bash scripts/mutation.sh --report                 # no run: the scores the last runs left
# Per module, only the unit and property tests that import it run; mutmut gets one worker
# (--max-children N for more) and runs under nice. Scratch directories and mutmut's log are in
# build/mutation/ (devkit/mutation.py says why it does not run mutmut in the repository itself).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
exec nice -n 10 .venv/bin/python -m trimtab.devkit.mutation "$@"
