"""Evaluate a checkpoint on the held-out data of scripts/build_data.py, with our engine on the CPU.
Prints one JSON object (and writes it with --out).

    .venv/bin/python training/evaluate.py --model assets/inkling-tiny --data data [--out eval.json]

- perplexity on held-out prose and stories (transformers' InklingForConditionalGeneration, fp32);
- MTP with 3 drafts, greedy, on held-out story openings: mean acceptance length, per-position
  acceptance, and wall time against no speculation in the same run (outputs must be identical);
  and the mean acceptance length on answers about held-out pictures and clips;
- images: held-out rendered shapes; correct when the answer names both the shape and the colour;
  alone, and as the second picture of a conversation (after the previous one, its question and answer);
- audio: held-out sentences in voices never used in training; word accuracy = 1 - word error rate;
  alone, and as the second clip of a conversation.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from backend import Request, SamplingParams, SpecConfig, load_engine  # noqa: E402
from backend.events import Finished, Step  # noqa: E402

IMAGE_PLACEHOLDER, AUDIO_PLACEHOLDER, PAD = 11, 12, 13


def generate(engine, requests):
    """Run requests to completion (one at a time, as a user would); returns [(tokens, Finished)]."""
    out = []
    for r in requests:
        tokens, finished = [], None
        for e in engine.stream(r):
            if isinstance(e, Step):
                tokens += e.emitted
            elif isinstance(e, Finished):
                finished = e
        out.append((tokens, finished))
    return out


def perplexity(model_dir: Path, pack: Path, windows: int, length: int = 256) -> dict:
    from transformers import InklingForConditionalGeneration
    model = InklingForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens = np.fromfile(pack / "text_val.bin", dtype=np.uint16).astype(np.int64)
    index = np.load(pack / "text_index.npz")
    sources = list(index["sources"])
    result = {}
    for group, names in (("prose", {"austen", "kjv", "moby_dick", "sotu", "web"}), ("stories", {"stories"})):
        docs = [(o, n) for o, n, s in zip(index["val_offsets"], index["val_lengths"], index["val_source"])
                if sources[s] in names and n > 32]
        rng = np.random.default_rng(0)
        nll, count = 0.0, 0
        for i in rng.choice(len(docs), size=min(windows, len(docs)), replace=False):
            offset, n = docs[i]
            ids = torch.tensor(tokens[offset:offset + min(n, length + 1)])[None]
            with torch.no_grad():
                logits = model(input_ids=ids[:, :-1]).logits[0].float()
            nll += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
        result[group] = {"perplexity": math.exp(nll / count), "tokens": count, "documents": min(windows, len(docs))}
    return result


def mtp_acceptance(engine, pack: Path, prompts: int, max_tokens: int) -> dict:
    tokens = np.fromfile(pack / "text_val.bin", dtype=np.uint16).astype(np.int64)
    index = np.load(pack / "text_index.npz")
    story = list(index["sources"]).index("stories")
    starts = [int(o) for o, s, n in zip(index["val_offsets"], index["val_source"], index["val_lengths"])
              if s == story and n > 64][:prompts]
    prompts_ids = [tokens[o:o + 32].tolist() for o in starts]
    runs = {}
    for spec in (SpecConfig("none"), SpecConfig("mtp", 3), SpecConfig("ngram", 3)):
        requests = [Request(prompt_ids=p, spec=spec, sampling=SamplingParams(max_tokens=max_tokens),
                            request_id=f"{spec.method}-{i}") for i, p in enumerate(prompts_ids)]
        start = time.perf_counter()
        results = generate(engine, requests)
        runs[spec.method] = (time.perf_counter() - start, results)
    base_wall, base = runs["none"]
    report = {"prompts": len(prompts_ids), "max_tokens": max_tokens}
    for method in ("mtp", "ngram"):
        wall, results = runs[method]
        drafts = sum(f.spec_summary["num_drafts"] for _, f in results)
        accepted = sum(f.spec_summary["num_accepted_tokens"] for _, f in results)
        per_pos = np.sum([f.spec_summary["num_accepted_tokens_per_pos"] for _, f in results], axis=0)
        drafted_pos = np.sum([f.spec_summary["num_drafted_per_pos"] for _, f in results], axis=0)
        report[method] = {"mean_acceptance_length": 1 + accepted / drafts if drafts else None,
                          "unconditional_acceptance_per_pos": (per_pos / np.maximum(drafted_pos, 1)).round(3).tolist(),
                          "wall_s": round(wall, 2), "none_wall_s": round(base_wall, 2),
                          "speedup": round(base_wall / wall, 3),
                          "identical_to_none": [t for t, _ in results] == [t for t, _ in base]}
    return report


def strip(ids: np.ndarray, placeholder: int) -> list[int]:
    return [int(t) for t in ids if t != placeholder]


def as_second_turn(items: list[dict], media_part, answers: list[str], max_tokens: int, name: str) -> list[Request]:
    """Each held-out item asked after the previous one (its media, question and reference answer) in one chat."""
    def ask(item):
        return {"role": "user", "content": [media_part(item), {"type": "text", "text": item["question"]}]}
    previous = zip(items[-1:] + items[:-1], answers[-1:] + answers[:-1])
    return [Request(messages=[ask(prev), {"role": "model", "content": answer}, ask(item)], request_id=f"{name}-{i}",
                    sampling=SamplingParams(max_tokens=max_tokens))
            for i, ((prev, answer), item) in enumerate(zip(previous, items))]


def image_accuracy(engine, data: Path) -> dict:
    labels = [json.loads(line) for line in (data / "images" / "heldout.jsonl").read_text().splitlines()]
    ids = np.load(data / "pack" / "images_heldout.npz")
    requests = [Request(prompt_ids=strip(ids["input_ids"][a:b], IMAGE_PLACEHOLDER), request_id=f"img-{i}",
                        media=[{"type": "image", "path": str(data / "images" / "heldout" / label["file"])}],
                        sampling=SamplingParams(max_tokens=16))
                for i, (label, a, b) in enumerate(zip(labels, ids["id_offsets"][:-1], ids["id_offsets"][1:]))]
    answers = [engine.tokenizer.decode(t).lower() for t, _ in generate(engine, requests)]
    correct = [label["shape"] in a and label["colour"] in a for label, a in zip(labels, answers)]
    # the same images as the second picture of a conversation
    picture = lambda label: {"type": "image", "path": str(data / "images" / "heldout" / label["file"])}  # noqa: E731
    second = as_second_turn(labels, picture, [str(a) for a in ids["answers"]], 16, "img2")
    answers2 = [engine.tokenizer.decode(t).lower() for t, _ in generate(engine, second)]
    correct2 = [label["shape"] in a and label["colour"] in a for label, a in zip(labels, answers2)]
    return {"images": len(labels), "accuracy": sum(correct) / len(labels),
            "accuracy_as_second_picture": sum(correct2) / len(labels),
            "examples": [{"label": f"{label['colour']} {label['shape']}", "answer": a}
                         for label, a in list(zip(labels, answers))[:5]]}


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def audio_accuracy(engine, data: Path) -> dict:
    report = {}
    for listing in sorted((data / "audio").glob("heldout_*.jsonl")):
        voice = listing.stem.removeprefix("heldout_")
        clips = [json.loads(line) for line in listing.read_text().splitlines()]
        ids = np.load(data / "pack" / f"audio_heldout_{voice}.npz")
        requests = [Request(prompt_ids=strip(ids["input_ids"][a:b], AUDIO_PLACEHOLDER), request_id=f"{voice}-{i}",
                            media=[{"type": "audio", "path": str(data / "audio" / clip["file"])}],
                            sampling=SamplingParams(max_tokens=32))
                    for i, (clip, a, b) in enumerate(zip(clips, ids["id_offsets"][:-1], ids["id_offsets"][1:]))]
        hyps = [engine.tokenizer.decode(t) for t, _ in generate(engine, requests)]
        errors = sum(word_errors(words(c["text"]), words(h)) for c, h in zip(clips, hyps))
        total = sum(len(words(c["text"])) for c in clips)
        # the same clips as the second of a conversation
        clip = lambda c: {"type": "audio", "path": str(data / "audio" / c["file"])}  # noqa: E731
        second = as_second_turn(clips, clip, [c["text"] for c in clips], 32, f"{voice}-2")
        hyps2 = [engine.tokenizer.decode(t) for t, _ in generate(engine, second)]
        errors2 = sum(word_errors(words(c["text"]), words(h)) for c, h in zip(clips, hyps2))
        report[voice] = {"sentences": len(clips), "word_accuracy": 1 - errors / total,
                         "word_accuracy_as_second_clip": 1 - errors2 / total,
                         "examples": [{"said": c["text"], "heard": h} for c, h in list(zip(clips, hyps))[:4]]}
    return report


def media_mtp_acceptance(engine, data: Path, count: int = 100) -> dict:
    """MTP with 3 drafts, greedy, on answers about held-out pictures and clips (the unseen espeak-ng voice)."""
    labels = [json.loads(line) for line in (data / "images" / "heldout.jsonl").read_text().splitlines()][:count]
    listing = next((data / "audio").glob("heldout_espeak*.jsonl"))
    clips = [json.loads(line) for line in listing.read_text().splitlines()][:count]
    asks = {"images": [({"type": "image", "path": str(data / "images" / "heldout" / label["file"])}, "Describe the image.")
                       for label in labels],
            "audio": [({"type": "audio", "path": str(data / "audio" / clip["file"])}, clip["question"]) for clip in clips]}
    report = {}
    for name, items in asks.items():
        requests = [Request(messages=[{"role": "user", "content": [media, {"type": "text", "text": question}]}],
                            request_id=f"mtp-{name}-{i}", spec=SpecConfig("mtp", 3), sampling=SamplingParams(max_tokens=32))
                    for i, (media, question) in enumerate(items)]
        finished = [f for _, f in generate(engine, requests)]
        accepted = sum(f.spec_summary["num_accepted_tokens"] for f in finished)
        drafts = sum(f.spec_summary["num_drafts"] for f in finished)
        report[name] = {"answers": len(finished), "mean_acceptance_length": 1 + accepted / drafts}
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path("assets/inkling-tiny"))
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--ppl-documents", type=int, default=60)
    parser.add_argument("--story-prompts", type=int, default=20)
    args = parser.parse_args()
    engine = load_engine(str(args.model))
    report = {"model": str(args.model), "machine": "CPU, torch " + torch.__version__,
              "perplexity": perplexity(args.model, args.data / "pack", args.ppl_documents),
              "speculation": mtp_acceptance(engine, args.data / "pack", args.story_prompts, 96),
              "speculation_on_media_answers": media_mtp_acceptance(engine, args.data),
              "images": image_accuracy(engine, args.data),
              "audio": audio_accuracy(engine, args.data)}
    engine.close()
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
