"""What the input box holds, turned into a turn's text and media, or a sentence saying what to fix.

Only the file name's extension is judged here; the engine opens the file itself (it checks sizes from
the header before decoding), and its message is shown if the content is bad.
"""
from __future__ import annotations

import base64
import io
import warnings
from pathlib import Path

from PIL import Image

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"}
AUDIO_EXTENSIONS = {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".m4a", ".webm"}
MAX_FILES = 8
MAX_TEXT_CHARS = 100_000
THUMB_FORMATS = ["PNG", "JPEG", "WEBP", "GIF", "BMP"]
THUMB_MAX_PIXELS = 50_000_000      # the header says how big; larger images get no thumbnail
THUMB_SIZE = (240, 160)


def media_kind(path: str) -> str | None:
    suffix = Path(path).suffix.lower()
    return "image" if suffix in IMAGE_EXTENSIONS else "audio" if suffix in AUDIO_EXTENSIONS else None


def parse_input(value, modalities: list[str]) -> tuple[str, list[dict], str | None]:
    """(text, files [{"path", "name", "kind"}], problem). `value` is the MultimodalTextbox's
    {"text", "files"} (a plain string is accepted too, for API callers)."""
    if isinstance(value, str):
        value = {"text": value, "files": []}
    if not isinstance(value, dict):
        return "", [], "The message must be text, optionally with files attached."
    text = value.get("text") or ""
    paths = [f.get("path") if isinstance(f, dict) else f for f in value.get("files") or []]
    if not isinstance(text, str) or not all(isinstance(p, str) for p in paths):
        return "", [], "The message must be text, optionally with files attached."
    files = [{"path": p, "name": Path(p).name, "kind": media_kind(p)} for p in paths]
    for f in files:
        if f["kind"] == "image":
            f["thumb"] = thumbnail(f["path"])
    if not text.strip() and not files:
        return text, files, "The message is empty: type something, or attach an image or audio clip."
    if len(text) > MAX_TEXT_CHARS:
        return text, files, f"The message has {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}. Shorten it."
    if len(files) > MAX_FILES:
        return text, files, f"{len(files)} files are attached; send at most {MAX_FILES} at a time."
    for f in files:
        if f["kind"] is None:
            return text, files, (f"{f['name']} is not a file this playground reads. Attach images "
                                 f"({', '.join(sorted(e[1:] for e in IMAGE_EXTENSIONS))}) or audio "
                                 f"({', '.join(sorted(e[1:] for e in AUDIO_EXTENSIONS))}).")
        if f["kind"] not in modalities:
            return text, files, (f"This model reads {' and '.join(modalities)} only, so {f['name']} "
                                 f"({f['kind']}) cannot be sent. Remove it and send again.")
    return text, files, None


def thumbnail(path: str) -> str | None:
    """A small JPEG of the image as a data: URI for the conversation view, or None if it does not open
    cleanly (the engine then says what is wrong with it)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=THUMB_FORMATS) as image:
                if image.width * image.height > THUMB_MAX_PIXELS:
                    return None
                image.draft("RGB", THUMB_SIZE)
                image = image.convert("RGB")
                image.thumbnail(THUMB_SIZE)
                out = io.BytesIO()
                image.save(out, "JPEG", quality=85)
    except Exception:          # any decoder error: no thumbnail, the engine reports the problem
        return None
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()
