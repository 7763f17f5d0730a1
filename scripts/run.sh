#!/usr/bin/env bash
# Start the playground on the shipped model (sets up .venv first). Extra arguments go to app.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python app.py "$@"
