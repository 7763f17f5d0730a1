"""What a caller asks for (Request, SamplingParams, SpecConfig) and the engine's per-request state."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from .speculation import SpecDecodingStats

SPEC_METHODS = ("none", "mtp", "ngram")
_ids = itertools.count()


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0        # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0                  # 0 means no top-k cut
    max_tokens: int = 256
    seed: int | None = None

    def problem(self) -> str | None:
        """A sentence saying what to fix, or None when the settings are possible."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            return f"max_tokens must be a whole number of at least 1 (got {self.max_tokens!r})."
        if not (isinstance(self.temperature, (int, float)) and 0.0 <= self.temperature <= 100.0):
            return f"temperature must be between 0 and 100 (got {self.temperature!r}); 0 means greedy."
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            return f"top_p must be in (0, 1] (got {self.top_p!r})."
        if not isinstance(self.top_k, int) or self.top_k < 0:
            return f"top_k must be 0 (off) or a positive whole number (got {self.top_k!r})."
        if self.seed is not None and not isinstance(self.seed, int):
            return f"seed must be a whole number (got {self.seed!r})."
        return None


@dataclass(frozen=True)
class SpecConfig:
    method: str = "none"            # "none", "mtp" (the checkpoint's draft heads) or "ngram" (prompt lookup)
    num_tokens: int = 3             # drafts proposed per step, 1..8
    ngram_min: int = 1              # ngram: shortest and longest suffix to look up
    ngram_max: int = 3
    ngram_lookback: int = 1024      # ngram: how many recent tokens to search
    mtp_embedding: str = "vllm"     # mtp: "vllm" (backbone-normed token embedding) or "transformers" (raw)

    def __post_init__(self):
        if self.method not in SPEC_METHODS:
            raise ValueError(f"Speculation method {self.method!r} is unknown; use one of {', '.join(SPEC_METHODS)}.")
        if not (isinstance(self.num_tokens, int) and 1 <= self.num_tokens <= 8):
            raise ValueError(f"num_tokens must be between 1 and 8 (got {self.num_tokens!r}).")
        if not (isinstance(self.ngram_min, int) and isinstance(self.ngram_max, int)
                and 1 <= self.ngram_min <= self.ngram_max):
            raise ValueError(f"ngram sizes must satisfy 1 <= ngram_min <= ngram_max (got {self.ngram_min}, "
                             f"{self.ngram_max}).")
        if not (isinstance(self.ngram_lookback, int) and self.ngram_lookback >= 2):
            raise ValueError(f"ngram_lookback must be at least 2 tokens (got {self.ngram_lookback!r}).")
        if self.mtp_embedding not in ("vllm", "transformers"):
            raise ValueError(f"mtp_embedding must be 'vllm' or 'transformers' (got {self.mtp_embedding!r}).")


@dataclass
class Request:
    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    reasoning_effort: float | None = None
    spec: SpecConfig | None = None  # None: the engine's default
    media: list[dict] | None = None  # with prompt_ids: images/audio for the markers in the ids, in order


class Sequence:
    """One admitted request as the scheduler and runner see it."""

    def __init__(self, request: Request, prompt_ids: list[int], eos_ids: frozenset[int], spec: SpecConfig,
                 media_spans: list = (), media_embeds: torch.Tensor | None = None):
        self.request = request
        self.request_id = request.request_id
        self.sampling = request.sampling
        self.prompt_len = len(prompt_ids)
        self.media_spans = list(media_spans)       # prompt.MediaSpan, in order of position
        self.media_embeds = media_embeds           # [sum of span lengths, hidden] rows replacing placeholders
        self.token_ids = list(prompt_ids)          # prompt, then generated tokens
        self.num_computed = 0                      # tokens whose K/V and conv state are in the cache
        self.block_tables: dict[str, list[int | None]] = {}   # per group; None where a window block was freed
        self.block_hashes: list[bytes] = []        # chain hashes of full blocks of token_ids
        self.conv_slot: int | None = None
        self.num_cached_prompt = 0                 # prompt tokens found in the prefix cache
        self.eos_ids = eos_ids
        self.generator = torch.Generator()
        self.generator.manual_seed(request.sampling.seed if request.sampling.seed is not None
                                   else torch.seed() & 0x7FFF_FFFF)
        self.num_steps = 0
        self.finish_reason: str | None = None
        # speculation
        self.spec = spec
        self.draft_ids: list[int] = []             # proposed for the next verification
        self.draft_probs: torch.Tensor | None = None   # [k, V] distribution each draft came from (None: one-hot)
        self.mtp_frontier = 0                      # MTP cache entries valid at every draft position
        self.mtp_first_entry = 0                   # MTP entries before this were never computed (prefix reuse)
        self.stats = SpecDecodingStats()

    def media_key(self, block_index: int, block_size: int) -> bytes:
        """Content hashes of the media behind the block's placeholder tokens (b"" for text), so the
        same placeholders over different images never share cached blocks."""
        lo, hi = block_index * block_size, (block_index + 1) * block_size
        return b"".join(s.start.to_bytes(8, "little") + s.content_hash for s in self.media_spans
                        if s.start < hi and s.start + s.num_tokens > lo)

    def media_rows(self, start: int, end: int) -> list[tuple[int, int]]:
        """(position, row of media_embeds) for placeholder positions in [start, end)."""
        rows, offset = [], 0
        for s in self.media_spans:
            for p in range(max(start, s.start), min(end, s.start + s.num_tokens)):
                rows.append((p, offset + p - s.start))
            offset += s.num_tokens
        return rows

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_pending(self) -> int:
        """Committed tokens still to feed through the model before the next sample (drafts aside)."""
        return len(self.token_ids) - self.num_computed

    @property
    def uses_mtp(self) -> bool:
        return self.spec.method == "mtp"
