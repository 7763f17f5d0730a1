"""Wall time of greedy decoding with and without speculation, in one run, on one engine. Prints JSON.
Usage: .venv/bin/python scripts/bench_spec.py [--model DIR] [--device cpu] [--max-tokens N] [--k K]"""
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
from backend import Request, SamplingParams, SpecConfig, load_engine  # noqa: E402
from backend.events import Finished, Step  # noqa: E402

PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog. The quick brown fox",
           "1, 2, 3, 4, 5, 6, 7, 8,", "Tell me about the sea."]


def run(engine, spec: SpecConfig, max_tokens: int) -> dict:
    outputs, drafts, accepted, steps_with_drafts = [], 0, 0, 0
    start = time.perf_counter()
    for i, prompt in enumerate(PROMPTS):
        request = Request(messages=[{"role": "user", "content": prompt}], spec=spec, request_id=f"{spec.method}-{i}",
                          sampling=SamplingParams(max_tokens=max_tokens))
        tokens = []
        for event in engine.stream(request):
            if isinstance(event, Step):
                tokens += event.emitted
            elif isinstance(event, Finished):
                drafts += event.spec_summary["num_draft_tokens"]
                accepted += event.spec_summary["num_accepted_tokens"]
                steps_with_drafts += event.spec_summary["num_drafts"]
        outputs.append(tokens)
    wall = time.perf_counter() - start
    n = sum(map(len, outputs))
    return {"method": spec.method, "num_tokens": spec.num_tokens, "wall_s": round(wall, 3), "tokens": n,
            "tokens_per_s": round(n / wall, 1),
            "mean_acceptance_length": round(1 + accepted / steps_with_drafts, 3) if steps_with_drafts else None,
            "acceptance_rate": round(accepted / drafts, 3) if drafts else None, "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="assets/inkling-tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=3)
    args = parser.parse_args()
    engine = load_engine(args.model, device=args.device)
    run(engine, SpecConfig("none"), 8)   # warm-up
    specs = [SpecConfig("none"), SpecConfig("ngram", args.k)]
    if "mtp" in engine.capabilities["spec_methods"]:
        specs.append(SpecConfig("mtp", args.k))
    results = [run(engine, spec, args.max_tokens) for spec in specs]
    baseline_wall, baseline_outputs = results[0]["wall_s"], results[0]["outputs"]
    for r in results:
        r["speedup_vs_none"] = round(baseline_wall / r["wall_s"], 3)
        r["identical_to_none"] = r.pop("outputs") == baseline_outputs
    engine.close()
    print(json.dumps({"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                  "torch": torch.__version__, "device": args.device},
                      "model": args.model, "max_tokens": args.max_tokens, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
