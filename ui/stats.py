"""Figures derived from a turn's recorded events: speed, latency, speculation counts, provenance.
Pure functions of event dicts (as `to_dict()` makes them), shared by the renderers and the plots.

Speculation counts use vLLM's names and definitions (backend/speculation.py), over steps that carried
drafts: acceptance length = accepted + 1; unconditional acceptance at position i = steps accepting
draft i / steps that drafted position i; conditional at i = steps accepting draft i / steps that
accepted draft i-1 and drafted position i (i = 0: all steps with drafts).
"""
from __future__ import annotations

SPEED_WINDOW_S = 0.5

# How a token came: the legend's four kinds (see render.LEGEND).
ACCEPTED, BONUS, CORRECTED, TARGET = "accepted", "bonus", "corrected", "target"


def has_draft_detail(steps: list[dict]) -> bool:
    """True when steps name their draft tokens (an engine with per_token_drafts)."""
    return any(s["drafted"] for s in steps)


def token_kinds(step: dict) -> list[str]:
    """The kind of each emitted token of a step: accepted drafts, then the target's own token, which is a
    bonus (every draft accepted), a correction (a draft was rejected) or plain (nothing drafted, or the
    engine did not say what it drafted)."""
    emitted, drafted, accepted = step["emitted"], step["drafted"], step["accepted"]
    kinds = [ACCEPTED] * min(accepted, len(emitted))
    if len(kinds) < len(emitted):
        if not drafted:
            last = TARGET
        else:
            last = BONUS if accepted == len(drafted) else CORRECTED
        kinds += [last] * (len(emitted) - len(kinds))
    return kinds


def spec_counts(steps: list[dict]) -> dict:
    """vLLM-style counts and rates over steps that name their drafts (has_draft_detail)."""
    drafted_steps = [s for s in steps if s["drafted"]]
    k = max((len(s["drafted"]) for s in drafted_steps), default=0)
    accepted_pos, drafted_pos, histogram = [0] * k, [0] * k, [0] * (k + 1)
    for s in drafted_steps:
        for i in range(len(s["drafted"])):
            drafted_pos[i] += 1
        for i in range(s["accepted"]):
            accepted_pos[i] += 1
        histogram[s["accepted"]] += 1
    return _figures(len(drafted_steps), accepted_pos, drafted_pos, histogram)


def _figures(num_drafts: int, accepted_pos: list[int], drafted_pos: list[int], histogram: list[int]) -> dict:
    num_draft_tokens, num_accepted = sum(drafted_pos), sum(accepted_pos)
    reached = [num_drafts] + accepted_pos[:-1]
    return {
        "num_drafts": num_drafts, "num_draft_tokens": num_draft_tokens, "num_accepted_tokens": num_accepted,
        "num_accepted_tokens_per_pos": accepted_pos, "num_drafted_per_pos": drafted_pos,
        "accepted_histogram": histogram,
        "mean_acceptance_length": 1 + num_accepted / num_drafts if num_drafts else None,
        "acceptance_rate": num_accepted / num_draft_tokens if num_draft_tokens else None,
        "unconditional_acceptance_per_pos": [a / d if d else None for a, d in zip(accepted_pos, drafted_pos)],
        "conditional_acceptance_per_pos": [a / r if r and d else None
                                           for a, r, d in zip(accepted_pos, reached, drafted_pos)],
    }


def _spec_delta(first: dict, last: dict) -> dict:
    """Engine-wide counts accumulated between two Metrics.spec snapshots."""
    def sub(key):
        a, b = first.get(key) or [], last.get(key) or []
        return [y - (a[i] if i < len(a) else 0) for i, y in enumerate(b)]
    num_drafts = last.get("num_drafts", 0) - first.get("num_drafts", 0)
    return _figures(num_drafts, sub("num_accepted_tokens_per_pos"), sub("num_drafted_per_pos"),
                    sub("accepted_histogram"))


def request_spec(events: list[dict]) -> tuple[dict | None, str]:
    """The best speculation figures the events hold for this request, and where they came from:
    per-step drafts (exact), the Finished summary (exact, at the end), or the change in the
    engine-wide Metrics counts while the request ran (includes any concurrent requests)."""
    steps = [e for e in events if e["type"] == "Step"]
    if has_draft_detail(steps):
        return spec_counts(steps), "this answer's steps"
    finished = next((e for e in events if e["type"] == "Finished"), None)
    if finished and finished.get("spec_summary", {}).get("num_drafts"):
        return finished["spec_summary"], "the engine's summary of this answer"
    metrics = [e for e in events if e["type"] == "Metrics" and e.get("spec")]
    if len(metrics) >= 2:
        delta = _spec_delta(metrics[0]["spec"], metrics[-1]["spec"])
        if delta["num_drafts"] > 0:
            return delta, "engine-wide counts while this answer ran (the engine reports no per-step drafts)"
    return None, ""


def speed_series(steps: list[dict], t0: float) -> tuple[list[float], list[float]]:
    """(seconds since t0, tokens/s over the trailing SPEED_WINDOW_S) at each step."""
    xs, ys = [], []
    lo, tokens = 0, 0              # steps[lo..i] lie in the window; `tokens` counts steps[lo+1..i]
    for i, s in enumerate(steps):
        if i > 0:
            tokens += len(s["emitted"])
        while lo < i and s["time"] - steps[lo]["time"] > SPEED_WINDOW_S:
            lo += 1
            tokens -= len(steps[lo]["emitted"])
        span = s["time"] - steps[lo]["time"]   # tokens after steps[lo] took this long
        if span > 0:
            xs.append(s["time"] - t0)
            ys.append(tokens / span)
    return xs, ys


def step_gaps_ms(steps: list[dict], t0: float | None) -> list[float | None]:
    """Milliseconds from the previous step (the first: from the request being sent) to each step."""
    gaps, previous = [], t0
    for s in steps:
        gaps.append((s["time"] - previous) * 1000 if previous is not None else None)
        previous = s["time"]
    return gaps


def summary(events: list[dict], t0: float | None) -> dict:
    """Headline numbers for a turn, live or finished."""
    steps = [e for e in events if e["type"] == "Step"]
    finished = next((e for e in events if e["type"] == "Finished"), None)
    started = next((e for e in events if e["type"] == "Started"), None)
    metrics = [e for e in events if e["type"] == "Metrics"]
    num_tokens = sum(len(s["emitted"]) for s in steps)
    timings = (finished or {}).get("timings") or {}
    ttft = timings.get("ttft_s")
    if ttft is None and steps and t0 is not None:
        ttft = steps[0]["time"] - t0
    rate = timings.get("tokens_per_s")
    if rate is None and len(steps) > 1 and steps[-1]["time"] > steps[0]["time"]:
        rate = (num_tokens - len(steps[0]["emitted"])) / (steps[-1]["time"] - steps[0]["time"])
    gaps = [g for g in step_gaps_ms(steps, t0)[1:] if g is not None]
    decode_tokens = num_tokens - (len(steps[0]["emitted"]) if steps else 0)
    spec, spec_source = request_spec(events)
    return {
        "num_tokens": num_tokens, "num_steps": len(steps), "ttft_s": ttft, "tokens_per_s": rate,
        "itl_ms": sum(gaps) / decode_tokens if gaps and decode_tokens else None,
        "prompt_tokens": (started or {}).get("prompt_tokens"),
        "cached_tokens": (started or {}).get("cached_tokens"),
        "image_tokens": (started or {}).get("image_tokens", 0), "audio_tokens": (started or {}).get("audio_tokens", 0),
        "notes": list((started or {}).get("notes") or []),
        "reason": (finished or {}).get("reason"), "total_s": timings.get("total_s"),
        "spec": spec, "spec_source": spec_source,
        "kv_use": metrics[-1]["kv"].get("use_fraction") if metrics else None,
    }
