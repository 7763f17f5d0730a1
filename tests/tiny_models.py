"""Tiny random Inkling checkpoints written by transformers 5.23 itself, for parity tests."""
from __future__ import annotations

import math
from pathlib import Path

import torch

# Each config differs in what it exercises; all keep CPU tests quick.
TEXT_CONFIGS = {
    # log scaling on, full layers 1 and 3 among sliding ones, window 8 shorter than prompts,
    # dense + sparse MLPs, unpadded vocab < vocab, GQA 2 kv heads (full) and 1 (sliding)
    "logscale_mixed": dict(
        vocab_size=320, unpadded_vocab_size=300, hidden_size=64, num_hidden_layers=4,
        layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=24,
        sliding_window_size=8, d_rel=4, rel_extent=48, log_scaling_n_floor=4, log_scaling_alpha=0.3,
        intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, mlp_layer_types=["dense", "sparse", "sparse", "dense"], max_position_embeddings=1024),
    # no log scaling, every MLP sparse with two shared experts, GQA 2 kv heads everywhere
    "moe_only": dict(
        vocab_size=256, hidden_size=48, num_hidden_layers=3,
        layer_types=["hybrid", "hybrid_sliding", "hybrid"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=12,
        swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=12,
        sliding_window_size=16, d_rel=8, rel_extent=20, log_scaling_n_floor=None,
        intermediate_size=64, moe_intermediate_size=24, n_routed_experts=6, num_experts_per_tok=3,
        n_shared_experts=2, mlp_layer_types=["sparse"] * 3, max_position_embeddings=1024),
    # the default layer pattern (full every 6th), dense MLPs only, 1 kv head, window 5
    "default_pattern_dense": dict(
        vocab_size=200, unpadded_vocab_size=190, hidden_size=32, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        swa_num_attention_heads=4, swa_num_key_value_heads=1, swa_head_dim=8,
        sliding_window_size=5, d_rel=4, rel_extent=64, log_scaling_n_floor=16,
        intermediate_size=64, mlp_layer_types=["dense"] * 6, max_position_embeddings=1024),
    # all sliding, window 12, sparse with one shared expert
    "all_sliding": dict(
        vocab_size=256, hidden_size=40, num_hidden_layers=2, layer_types=["hybrid_sliding"] * 2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=10,
        swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=10,
        sliding_window_size=12, d_rel=4, rel_extent=32, intermediate_size=48, moe_intermediate_size=16,
        n_routed_experts=4, num_experts_per_tok=1, n_shared_experts=1, mlp_layer_types=["dense", "sparse"],
        max_position_embeddings=1024),
}


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights with enough spread that logits are far from ties (the default init is nearly flat)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "global_scale" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif p.dim() >= 2 and "sconv" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def build_checkpoint(path: Path, name: str, seed: int = 0, text_only: bool = False):
    """Save a random model of TEXT_CONFIGS[name] with save_pretrained; returns the transformers model."""
    from transformers import InklingConfig, InklingForCausalLM, InklingForConditionalGeneration, InklingTextConfig
    torch.manual_seed(seed)
    text = dict(TEXT_CONFIGS[name], eos_token_id=None, bos_token_id=None)
    if text_only:
        model = InklingForCausalLM(InklingTextConfig(**text))
    else:
        config = InklingConfig(text_config=text, vision_config=dict(patch_size=4, num_hidden_layers=4,
                                                                    hidden_size=32), audio_config=dict())
        model = InklingForConditionalGeneration(config)
    randomize(model, seed)
    model.eval()
    model.save_pretrained(path)
    return model
