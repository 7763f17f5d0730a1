"""Speculative decoding: n-gram drafts, the acceptance rule, and the figures that describe it.

Every engine step of a speculating request verifies its k drafts in one target forward over k+1
positions. Greedy requests accept drafts while they equal the target's argmax; sampled requests use
the standard rule (accept d with probability min(1, p(d)/q(d)); on rejection draw from the
normalised max(0, p - q); after k acceptances draw a bonus token from p), so the output follows the
target's distribution exactly. MTP drafts come from `mtp.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .request import SamplingParams
from .sampling import filtered_probs, sample_token


def propose_ngram(token_ids: list[int], k: int, min_n: int = 1, max_n: int = 3, lookback: int = 1024
                  ) -> list[int]:
    """Prompt lookup: find an earlier occurrence of the last n tokens within `lookback` tokens and
    propose the (up to) k tokens that followed it. Longer suffixes are tried first; the first match
    (latest first) with a full k-token continuation wins, else the longest continuation found."""
    context = token_ids[-lookback:]
    best: list[int] = []
    for n in range(min(max_n, len(context) - 1), min_n - 1, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == tail:
                follow = context[start + n:start + n + k]
                if len(follow) == k:
                    return follow
                if len(follow) > len(best):
                    best = follow
    return best


def accept_standard(p: torch.Tensor, q: torch.Tensor, draft: int, generator: torch.Generator) -> bool:
    """Accept the draft with probability min(1, p(d) / q(d))."""
    u = torch.rand((), generator=generator)
    return bool(u * q[draft] < p[draft])


def verify(target_logits: torch.Tensor, drafts: list[int], draft_probs: torch.Tensor | None,
           params: SamplingParams, generator: torch.Generator, accept_rule=accept_standard) -> tuple[list[int], int]:
    """Check drafts against the target. target_logits [k+1, V] fp32 (row i scores the token after
    draft i-1); draft_probs [k, V] the distribution each draft was drawn from (None: drawn
    deterministically, i.e. one-hot). Returns (emitted ids: accepted drafts then the target's own
    token, number accepted)."""
    if params.temperature == 0.0:
        choice = target_logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == choice[accepted]:
            accepted += 1
        return drafts[:accepted] + [choice[accepted]], accepted
    for i, draft in enumerate(drafts):
        p = filtered_probs(target_logits[i], params)
        q = draft_probs[i] if draft_probs is not None else torch.nn.functional.one_hot(
            torch.tensor(draft), p.shape[-1]).to(p.dtype)
        if not accept_rule(p, q, draft, generator):
            residual = (p - q).clamp(min=0.0)
            total = residual.sum()
            fallback = p if float(total) <= 0.0 else residual / total
            return drafts[:i] + [int(torch.multinomial(fallback, 1, generator=generator))], i
    return drafts + [sample_token(target_logits[len(drafts)], params, generator)], len(drafts)


@dataclass
class SpecDecodingStats:
    """Counts over verification steps that carried drafts (vLLM's names). The derived figures:
    acceptance length = accepted + 1 per step (the target always adds one token); acceptance rate =
    accepted / drafted; unconditional acceptance at position i = steps accepting draft i / steps that
    drafted position i; conditional at i = steps accepting draft i / steps accepting draft i-1."""
    num_drafts: int = 0                      # verification steps that carried at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=lambda: [0] * 8)
    num_drafted_per_pos: list[int] = field(default_factory=lambda: [0] * 8)
    accepted_histogram: list[int] = field(default_factory=lambda: [0] * 9)   # steps by accepted count

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        for i in range(num_drafted):
            self.num_drafted_per_pos[i] += 1
        for i in range(num_accepted):
            self.num_accepted_tokens_per_pos[i] += 1
        self.accepted_histogram[num_accepted] += 1

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def unconditional_acceptance_per_pos(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.num_accepted_tokens_per_pos, self.num_drafted_per_pos)]

    @property
    def conditional_acceptance_per_pos(self) -> list[float | None]:
        reached = [self.num_drafts] + self.num_accepted_tokens_per_pos[:-1]
        # of the steps that accepted up to position i-1 and drafted position i, the share accepting i
        return [a / r if r and d else None
                for a, r, d in zip(self.num_accepted_tokens_per_pos, reached, self.num_drafted_per_pos)]

    def to_dict(self) -> dict:
        last = max((i + 1 for i, d in enumerate(self.num_drafted_per_pos) if d), default=0)
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_pos": self.num_accepted_tokens_per_pos[:last],
                "num_drafted_per_pos": self.num_drafted_per_pos[:last],
                "accepted_histogram": self.accepted_histogram[:last + 1],
                "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate": self.acceptance_rate,
                "unconditional_acceptance_per_pos": self.unconditional_acceptance_per_pos[:last],
                "conditional_acceptance_per_pos": self.conditional_acceptance_per_pos[:last]}
