#!/usr/bin/env bash
# The whole test suite, on a fresh machine: sets up .venv, then runs pytest (exit 5, "no tests", fails).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
.venv/bin/python -m pytest "$@"
