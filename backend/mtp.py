"""MTP draft heads: Inkling's multi-token-prediction depths, run over the paged cache.

Depth k at cache entry i reads the previous level's hidden state at i (the backbone's final normed
state for k = 0) and the token k+1 places after i, and predicts the token after that:
    z = input_proj(cat[hidden_norm(h_i), embed_norm(emb(t_{i+k+1}))])   (hidden first by default)
    g = decoder_block(z) at position i+k+1;  g = chain_norm(g) when configured;  logits = head(g)
Draft position j uses depth j mod D (depths reused cyclically, as vLLM does) with a cache of its own.
`emb` is the backbone-normed embedding (vLLM's convention, which the real depths were trained on)
or the raw embedding row (transformers' MtpModel), chosen per request.
"""
from __future__ import annotations

import torch

from .config import ModelConfig
from .model import DecoderLayer, ForwardBatch, InklingTextModel, LayerCache, rms_norm

MTP_GROUP = "mtp"
MTP_SLIDING_GROUP = "mtp_sliding"   # same block table as MTP_GROUP, keys limited to the window


class MtpDepth:
    def __init__(self, cfg: ModelConfig, depth: int, w: dict[str, torch.Tensor]):
        p = f"mtp.{depth}."
        self.eps = cfg.rms_norm_eps
        self.hidden_first = cfg.mtp_hidden_states_first
        self.hidden_norm, self.embed_norm, self.input_proj = (w[p + n] for n in ("hidden_norm", "embed_norm",
                                                                                  "input_proj"))
        sliding = depth in cfg.mtp_local_layer_ids
        self.block = DecoderLayer(cfg, p + "block.", w, sliding, dense=True,
                                  group=MTP_SLIDING_GROUP if sliding else MTP_GROUP)


class MtpHeads:
    def __init__(self, cfg: ModelConfig, model: InklingTextModel, w: dict[str, torch.Tensor]):
        self.cfg, self.model = cfg, model
        self.depths = [MtpDepth(cfg, k, w) for k in range(cfg.num_mtp_layers)]
        self.chain_norm = w.get("mtp.chain_norm")

    @torch.inference_mode()
    def forward_position(self, position: int, hidden: torch.Tensor, token_embeds: torch.Tensor,
                         batch: ForwardBatch, cache: LayerCache) -> torch.Tensor:
        """Run draft position `position` (depth position mod D) over the batch; returns its output
        hidden states [T, hidden], which feed both the head and the next position. `token_embeds` are
        emb(t_{i+position+1}) in the request's convention (see the module docstring)."""
        depth = self.depths[position % len(self.depths)]
        h = rms_norm(hidden, depth.hidden_norm, depth.eps)
        e = rms_norm(token_embeds, depth.embed_norm, depth.eps)
        z = torch.cat([h, e] if depth.hidden_first else [e, h], dim=-1) @ depth.input_proj.t()
        out = depth.block(z, batch, cache)
        if self.chain_norm is not None:
            out = rms_norm(out, self.chain_norm, self.cfg.rms_norm_eps)
        return out
