"""Inkling Playground: `python app.py` serves the web playground on the shipped model.

The page comes up at once; the engine loads in the background (the header shows progress) and every
browser tab shares it. Uploads and exports live in a temporary folder of our own, removed on exit.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEFAULT_MODEL = str(ROOT / "assets" / "inkling-tiny")
MAX_FILE_SIZE = "25mb"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Inkling Playground: chat with an Inkling model and watch "
                                                 "speculative decoding, speed and cache use live.")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint directory (default: the shipped tiny model)")
    parser.add_argument("--backend", default="native", choices=["native"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--spec", default="auto", choices=["auto", "none", "mtp", "ngram"],
                        help="speculation the page starts with (and the engine's default); changeable per message. "
                             "auto (default): mtp when the model has MTP heads, else none")
    parser.add_argument("--num-spec-tokens", type=int, default=3, choices=range(1, 9), metavar="1..8")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")
    parser.add_argument("--replay-only", action="store_true", help="load no model: only replay traces")
    return parser.parse_args(argv)


def own_temp_dir() -> str:
    """Gradio keeps uploads in GRADIO_TEMP_DIR, read when gradio is imported: point it at a fresh folder."""
    path = tempfile.mkdtemp(prefix="inkling-playground-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["GRADIO_TEMP_DIR"] = path
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    own_temp_dir()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from backend import SpecConfig, load_engine
    from ui.app import CSS_PATH, Playground
    from ui.hub import EngineHub
    from ui.presets import EXAMPLES_DIR

    # the model's folder name, not its path: the info is shown in the page and written into traces
    hub = EngineHub({"model": Path(args.model).name or args.model, "backend": args.backend, "device": args.device,
                     "dtype": args.dtype})
    if args.replay_only:
        hub.no_engine("started with --replay-only")
    else:
        spec = None if args.spec == "auto" else SpecConfig(args.spec, args.num_spec_tokens)
        hub.load_in_background(lambda: load_engine(args.model, backend=args.backend, device=args.device,
                                                   dtype=args.dtype, spec=spec))
    demo = Playground(hub, spec_method=args.spec, num_spec_tokens=args.num_spec_tokens).build()
    demo.queue(default_concurrency_limit=None)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, max_file_size=MAX_FILE_SIZE,
                allowed_paths=[str(EXAMPLES_DIR)], css_paths=[CSS_PATH], show_error=False,
                footer_links=["api"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
