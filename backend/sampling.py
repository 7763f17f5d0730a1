"""Greedy, temperature, top-k and top-p sampling with one random generator per request, so a
request's tokens depend on its seed alone, not on what else shares the batch."""
from __future__ import annotations

import torch

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .request import SamplingParams


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled token is drawn from: [V] fp32 logits -> [V] probabilities."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest head of the sorted distribution whose mass reaches top_p
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token id from a row of fp32 logits (on the CPU, where the request's generator lives)."""
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(filtered_probs(logits, params), 1, generator=generator))
