"""Presets from assets/examples/presets.json: a message (text, example files) and the settings to run it."""
from __future__ import annotations

import json
from pathlib import Path

from .session import DEFAULT_SETTINGS

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "assets" / "examples"


def load_presets(directory: Path = EXAMPLES_DIR) -> dict[str, dict]:
    """name -> {"text", "files" (absolute paths inside `directory`), "settings" (complete)}."""
    path = directory / "presets.json"
    if not path.is_file():
        return {}
    presets = {}
    for entry in json.loads(path.read_text()):
        files = [directory / name for name in entry.get("files", [])]
        if any(f.parent != directory or not f.is_file() for f in files):
            continue    # a preset names a file that is not in the examples folder: skip it
        unknown = set(entry.get("settings", {})) - set(DEFAULT_SETTINGS)
        assert not unknown, f"presets.json: {entry['name']!r} has unknown settings {unknown}"
        presets[entry["name"]] = {"text": entry["text"], "files": [str(f) for f in files],
                                  "settings": {**DEFAULT_SETTINGS, **entry.get("settings", {})}}
    return presets
