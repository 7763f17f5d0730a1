"""Inkling Playground entry point.

The web playground is not built yet; until it is, this streams one reply from the native engine on
the shipped model so the run command shows the engine working end to end.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from backend.__main__ import main as backend_main

DEFAULT_MODEL = str(Path(__file__).resolve().parent / "assets" / "inkling-tiny")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Inkling Playground (engine preview)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--backend", default="native", choices=["native"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--spec", default="none", choices=["none", "mtp", "ngram"])
    parser.add_argument("--num-spec-tokens", type=int, default=3)
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    print(f"Inkling Playground engine preview: {args.model} on {args.device} ({args.dtype}).", file=sys.stderr)
    print(f"> {args.prompt}", file=sys.stderr)
    return backend_main(["generate", "--model", args.model, "--device", args.device, "--dtype", args.dtype,
                         "--spec", args.spec, "--num-spec-tokens", str(args.num_spec_tokens),
                         "--prompt", args.prompt, "--max-tokens", str(args.max_tokens)])


if __name__ == "__main__":
    sys.exit(main())
