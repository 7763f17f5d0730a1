"""Decode throughput of the native engine at batch 1 and 8, beside transformers' generate (batch 1),
in one run. Prints JSON. Usage: .venv/bin/python scripts/bench_engine.py [--model DIR] [--device cpu]"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from backend import Request, SamplingParams, load_engine  # noqa: E402
from backend.events import Finished, Step  # noqa: E402


def engine_run(engine, batch: int, max_tokens: int) -> dict:
    requests = [Request(prompt_ids=[4] + list(range(100 + i, 132 + i)), request_id=f"b{batch}-{i}",
                        sampling=SamplingParams(max_tokens=max_tokens)) for i in range(batch)]
    for r in requests:
        engine.add_request(r)
    tokens, first = 0, None
    start = time.perf_counter()
    while engine.has_work():
        for e in engine.step():
            if isinstance(e, Step):
                tokens += len(e.emitted)
                first = first or time.perf_counter()
    end = time.perf_counter()
    return {"batch": batch, "tokens": tokens, "wall_s": round(end - start, 3),
            "tokens_per_s": round(tokens / (end - start), 1),
            "decode_tokens_per_s": round((tokens - batch) / (end - first), 1)}


def transformers_run(model_dir: str, max_tokens: int, device: str) -> dict:
    from transformers import InklingForConditionalGeneration
    model = InklingForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    ids = torch.tensor([[4] + list(range(100, 132))], device=device)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False)   # warm-up
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
        wall = time.perf_counter() - start
    n = out.shape[1] - ids.shape[1]
    return {"batch": 1, "tokens": n, "wall_s": round(wall, 3), "tokens_per_s": round(n / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="assets/inkling-tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    engine = load_engine(args.model, device=args.device)
    text_params = engine.num_text_params
    engine_run(engine, 1, 8)   # warm-up
    results = {
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "device": args.device},
        "model": args.model, "text_params": text_params, "max_tokens": args.max_tokens,
        "engine": [engine_run(engine, 1, args.max_tokens), engine_run(engine, 8, args.max_tokens)],
        "transformers_generate": transformers_run(args.model, args.max_tokens, args.device),
    }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
