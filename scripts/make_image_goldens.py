"""Run transformers' InklingImageProcessor on the test images and save what it returns.

    python3 scripts/make_image_goldens.py [--out tests/data/image_goldens.npz]

Needs torch, torchvision, numpy, Pillow and transformers 5.23 (the processor imports torchvision,
which is why tests/test_media.py compares against these files instead of running it live). Uses
nothing else from the repo except tests/media_samples.py. The npz holds, per sample:
`<name>/file` (the encoded image bytes the processor read) and, per patch size P,
`<name>@<P>/pixel_values` ([N, 2, P, P, 3] float32) and `<name>@<P>/num_patches`.
"""
from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from media_samples import GOLDEN_PATCH_SIZES, make_image_samples  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "image_goldens.npz")
    args = parser.parse_args()

    import PIL
    import torch
    import torchvision
    import transformers
    from transformers.models.inkling.image_processing_inkling import InklingImageProcessor

    arrays: dict[str, np.ndarray] = {}
    samples = make_image_samples()
    for patch in GOLDEN_PATCH_SIZES:
        processor = InklingImageProcessor(size={"height": patch, "width": patch})
        for name, data in samples.items():
            image = Image.open(io.BytesIO(data))  # lazily opened, as a user's file would be
            out = processor(images=image, return_tensors="pt")
            pixels = out["pixel_values"].to(torch.float32).contiguous().numpy()
            num_patches = out["num_patches"].numpy()
            assert pixels.shape[1:] == (2, patch, patch, 3), (name, pixels.shape)
            assert int(num_patches.sum()) == pixels.shape[0], (name, num_patches)
            arrays[f"{name}@{patch}/pixel_values"] = pixels
            arrays[f"{name}@{patch}/num_patches"] = num_patches
            height, width = image.size[1], image.size[0]
            print(f"P={patch:2d} {name:20s} {image.mode:5s} {height}x{width} -> {pixels.shape[0]} patches")
    for name, data in samples.items():
        arrays[f"{name}/file"] = np.frombuffer(data, dtype=np.uint8)
    arrays["versions"] = np.array(f"transformers={transformers.__version__} torch={torch.__version__} "
                                  f"torchvision={torchvision.__version__} pillow={PIL.__version__} "
                                  f"numpy={np.__version__}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB): {arrays['versions']}")


if __name__ == "__main__":
    main()
