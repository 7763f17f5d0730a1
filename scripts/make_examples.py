"""Render the playground's example pictures and speech clip into assets/examples/ (what the presets use).

    .venv/bin/python scripts/make_examples.py

The pictures are fresh renders from the data builder's own drawing code (seed "examples"), of the kinds
inkling-tiny was trained on; the clip is espeak-ng's en-gb-x-rp+f4, the voice held out from training.
"""
from __future__ import annotations

import random
import subprocess
import sys
import tempfile
from pathlib import Path

import soundfile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import build_data  # noqa: E402

OUT = ROOT / "assets" / "examples"
SENTENCE = "Thank you for the red hat."


def main() -> None:
    rng = random.Random("examples")   # the pictures are the 5th position render and the 3rd shape render of this seed
    positions = [build_data.render_position(rng) for _ in range(6)]
    shapes = [build_data.render_shape(rng, size=48) for _ in range(4)]
    for (image, label), name in ((positions[4], "two-shapes.png"), (shapes[2], "star.png")):
        image.save(OUT / name)
        print(name, image.size, label)
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "clip.wav"
        subprocess.run(["espeak-ng", "-v", "en-gb-x-rp+f4", "-w", str(wav), SENTENCE], check=True)
        samples, rate = soundfile.read(wav)
        soundfile.write(OUT / "hat.flac", samples, rate, format="FLAC")
    print("hat.flac:", SENTENCE)


if __name__ == "__main__":
    main()
