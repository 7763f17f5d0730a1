"""python -m backend generate ...: one request through an engine, for scripts and checks."""
from __future__ import annotations

import argparse
import json
import sys
import time

from . import Request, SamplingParams, SpecConfig, load_engine
from .events import Error, Finished, Started, Step


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated whole numbers, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m backend")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a reply to one prompt")
    gen.add_argument("--model", required=True, help="checkpoint directory")
    gen.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text, wrapped as one user message with a generation prompt")
    prompt.add_argument("--prompt-ids", type=_parse_ids, help="token ids fed raw, e.g. 1,2,3")
    gen.add_argument("--image", action="append", default=[], help="image file (repeatable)")
    gen.add_argument("--audio", action="append", default=[], help="audio file (repeatable)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--spec", default="none", choices=["none", "mtp", "ngram"])
    gen.add_argument("--num-spec-tokens", type=int, default=3)
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    return parser


def generate(args) -> int:
    try:
        spec = SpecConfig(method=args.spec, num_tokens=args.num_spec_tokens)
        engine = load_engine(args.model, backend="native", device=args.device, dtype=args.dtype, spec=spec)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_tokens=args.max_tokens, seed=args.seed)
    media = [{"type": "image", "path": p} for p in args.image] + [{"type": "audio", "path": p} for p in args.audio]
    if args.prompt is not None:
        request = Request(messages=[{"role": "user", "content": [{"type": "text", "text": args.prompt}, *media]}],
                          sampling=sampling)
    else:   # each image/audio marker id in the ids takes the next --image/--audio file
        request = Request(prompt_ids=args.prompt_ids, media=media, sampling=sampling)
    token_ids, steps, pieces = [], [], []
    finished = started = None
    for event in engine.stream(request):
        if isinstance(event, Started):
            started = event
        if isinstance(event, Error):
            print(f"error: {event.message}", file=sys.stderr)
            engine.close()
            return 1
        if isinstance(event, Step):
            token_ids += event.emitted
            pieces.append(event.text)
            steps.append({"drafted": event.drafted, "accepted": event.accepted, "emitted": event.emitted})
            if not args.json:
                print(event.text, end="", flush=True)
        elif isinstance(event, Finished):
            finished = event
    engine.close()
    summary = {"reason": finished.reason, "ttft_s": finished.timings["ttft_s"],
               "tokens_per_s": finished.timings["tokens_per_s"], "decode_s": finished.timings["decode_s"],
               **finished.usage, **finished.spec_summary}
    if args.json:
        text = "".join(pieces)
        print(json.dumps({"prompt_ids": engine.prompt_ids(request), "image_tokens": started.image_tokens,
                          "audio_tokens": started.audio_tokens, "notes": list(started.notes), "token_ids": token_ids, "text": text, "steps": steps,
                          "summary": summary}))
    else:
        print(f"\n[{finished.reason}; {summary['completion_tokens']} tokens; "
              f"{summary['tokens_per_s'] or 0:.1f} tok/s decode; ttft {summary['ttft_s'] or 0:.3f}s]",
              file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return generate(args)


if __name__ == "__main__":
    sys.exit(main())
