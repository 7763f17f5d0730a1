"""Deterministic test images of odd sizes and modes, as encoded files.

Shared by tests/test_media.py and scripts/make_image_goldens.py; needs only numpy and Pillow.
Names say the mode and (height x width). The goldens store these exact bytes too, so a
Pillow whose encoder output differs cannot silently change what the goldens describe.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

GOLDEN_PATCH_SIZES = (40, 8)


def _smooth(rng: np.random.Generator, height: int, width: int, channels: int) -> np.ndarray:
    """Gradients plus a little noise: covers 0..255 yet compresses well in the goldens."""
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    x = np.linspace(0.0, 1.0, width)[None, :, None]
    phase = rng.uniform(0, 2 * np.pi, size=(1, 1, channels))
    base = 127.5 + 127.5 * np.sin(3.0 * x + 2.0 * y + phase)
    noise = rng.integers(-6, 7, size=(height, width, channels))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _encode(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def make_image_samples(seed: int = 1234) -> dict[str, bytes]:
    """name -> encoded image file; same bytes on every call with the same Pillow."""
    rng = np.random.default_rng(seed)
    out: dict[str, bytes] = {}

    out["rgb_37x53.png"] = _encode(Image.fromarray(_smooth(rng, 37, 53, 3), "RGB"), "PNG")

    rgba = _smooth(rng, 81, 40, 4)  # width an exact multiple of 40: the last patch column is all padding
    rgba[..., 3] = np.linspace(0, 255, 40, dtype=np.uint8)[None, :]  # alpha from clear to opaque
    rgba[:5, :, 3] = 0  # some fully transparent rows
    out["rgba_81x40.png"] = _encode(Image.fromarray(rgba, "RGBA"), "PNG")

    out["l_40x40.png"] = _encode(Image.fromarray(_smooth(rng, 40, 40, 1)[..., 0], "L"), "PNG")

    la = _smooth(rng, 33, 41, 2)
    out["la_33x41.png"] = _encode(Image.fromarray(la, "LA"), "PNG")

    grey16 = (rng.integers(0, 600, size=(17, 23))).astype(np.uint16)  # values above 255 get clipped
    out["i16_17x23.png"] = _encode(Image.fromarray(grey16), "PNG")

    palette = Image.fromarray(_smooth(rng, 13, 97, 3), "RGB").quantize(colors=17, method=Image.Quantize.MEDIANCUT)
    out["p_13x97.png"] = _encode(palette, "PNG")
    out["p_trns_13x97.png"] = _encode(palette, "PNG", transparency=3)  # tRNS: one palette entry is clear

    cmyk = Image.fromarray(_smooth(rng, 64, 30, 4), "CMYK")
    out["cmyk_64x30.jpg"] = _encode(cmyk, "JPEG", quality=95)

    out["rgb_1x1.png"] = _encode(Image.new("RGB", (1, 1), (12, 200, 99)), "PNG")

    first = Image.fromarray(_smooth(rng, 20, 45, 3), "RGB").quantize(colors=32)
    second = Image.new("RGB", (45, 20), (0, 0, 255)).quantize(colors=2)
    gif = io.BytesIO()
    first.save(gif, format="GIF", save_all=True, append_images=[second], duration=100, loop=0)
    out["anim_20x45.gif"] = gif.getvalue()

    photo = _smooth(rng, 50, 77, 3)
    out["rgb_50x77.jpg"] = _encode(Image.fromarray(photo, "RGB"), "JPEG", quality=90)

    out["rgb_41x80.webp"] = _encode(Image.fromarray(_smooth(rng, 41, 80, 3), "RGB"), "WEBP", lossless=True)

    out["rgb_29x31.bmp"] = _encode(Image.fromarray(_smooth(rng, 29, 31, 3), "RGB"), "BMP")

    out["rgb_123x250.png"] = _encode(Image.fromarray(_smooth(rng, 123, 250, 3), "RGB"), "PNG")
    return out


if __name__ == "__main__":
    for name, data in make_image_samples().items():
        img = Image.open(io.BytesIO(data))
        print(f"{name:20s} {img.format:5s} {img.mode:5s} {img.size} {len(data)} bytes")
