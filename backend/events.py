"""Events an engine streams for a request (DESIGN.md's contract). All JSON-ready via to_dict()."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


class _Event:
    def to_dict(self) -> dict:
        return {"type": type(self).__name__, **asdict(self)}


@dataclass(frozen=True)
class Started(_Event):
    request_id: str
    prompt_tokens: int
    image_tokens: int = 0
    audio_tokens: int = 0
    cached_tokens: int = 0          # prompt tokens served from the prefix cache
    notes: tuple[str, ...] = ()     # what was changed to fit limits, e.g. an image downscaled


@dataclass(frozen=True)
class Step(_Event):
    request_id: str
    step: int                       # this request's step number, from 0
    drafted: list[int]              # draft token ids proposed this step (empty without speculation)
    accepted: int                   # how many of them were accepted
    emitted: list[int]              # token ids emitted this step: accepted drafts, then the target's own
    text: str                       # their text (a character split across tokens waits for its last byte)
    time: float                     # wall-clock time of the step (time.time())


@dataclass(frozen=True)
class Metrics(_Event):
    time: float
    tokens_per_s: float             # tokens emitted per second, engine-wide, over the last few seconds
    running: int
    waiting: int
    kv: dict                        # {"groups": {group: {"used", "total"}}, "use_fraction", "prefix_hit_rate", ...}
    spec: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Finished(_Event):
    request_id: str
    reason: str                     # "stop", "length", "abort" or "error"
    usage: dict                     # prompt_tokens, completion_tokens, cached_tokens
    spec_summary: dict
    timings: dict                   # ttft_s, decode_s, total_s, tokens_per_s (decode)


@dataclass(frozen=True)
class Error(_Event):
    request_id: str
    message: str


Event = Started | Step | Metrics | Finished | Error
