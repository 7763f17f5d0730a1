#!/usr/bin/env bash
# Create .venv at the repository root and install the project (and, with "test", its test tools).
# Without a CUDA GPU, torch is pinned to 2.13.0: pip takes the CPU build from this machine's disk.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
py=.venv/bin/python
if ! $py -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        $py -m pip install -q torch
    else
        $py -m pip install -q torch==2.13.0
    fi
fi
spec="."
[ -n "$extra" ] && spec=".[$extra]"
stamp=".venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)-${extra:-base}"
if [ ! -f "$stamp" ]; then
    $py -m pip install -q -e "$spec"
    touch "$stamp"
fi
