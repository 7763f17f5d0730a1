#!/usr/bin/env bash
# The whole test suite, on a fresh machine: sets up .venv, then runs pytest (exit 5, "no tests", fails).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
# the playground's browser test drives Debian's chromium (never a browser downloaded by playwright)
if [ ! -x /usr/bin/chromium ]; then
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi
.venv/bin/python -m pytest "$@"
