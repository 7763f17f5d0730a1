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
        vocab = text["vocab_size"]   # media token ids inside this small vocabulary
        config = InklingConfig(text_config=text, vision_config=dict(patch_size=4, num_hidden_layers=4,
                                                                    hidden_size=32), audio_config=dict(),
                               image_token_id=vocab - 1, audio_token_id=vocab - 2, image_bos_token_id=vocab - 3,
                               audio_bos_token_id=vocab - 4)
        model = InklingForConditionalGeneration(config)
    randomize(model, seed)
    model.eval()
    model.save_pretrained(path)
    return model


def add_mtp_depths(path: Path, model, depths: int, chain_norm: bool, local_ids=(), seed: int = 0) -> None:
    """Give a saved checkpoint `depths` random MTP depths in the original key layout (model.mtp.*) and
    declare them in config.json, as real Inkling checkpoints do."""
    import json

    from safetensors.torch import load_file, save_file
    text = model.config.text_config
    full = text.layer_types.index("hybrid")
    sliding = text.layer_types.index("hybrid_sliding") if "hybrid_sliding" in text.layer_types else full
    file = path / "model.safetensors"
    tensors = load_file(file)
    gen = torch.Generator().manual_seed(1000 + seed)
    hidden = text.hidden_size
    # a decoder block's shapes: a dense MLP of the backbone's width, full or sliding attention
    dense_mlp = {k.split(".mlp.")[1]: v for k, v in tensors.items() if ".mlp.w13_dn" in k or ".mlp.w2_md" in k}
    for k in range(depths):
        template = sliding if k in local_ids else full
        prefix = f"model.llm.layers.{template}."
        for key, value in list(tensors.items()):
            if key.startswith(prefix) and ".mlp." not in key:
                tensors[key.replace(prefix, f"model.mtp.layers.{k}.transformer_block.")] = (
                    value + 0.2 * torch.randn(value.shape, generator=gen) * value.std().clamp(min=0.1))
        for name, value in dense_mlp.items():
            tensors[f"model.mtp.layers.{k}.transformer_block.mlp.{name}"] = torch.randn(
                value.shape, generator=gen) / math.sqrt(value.shape[-1])
        tensors[f"model.mtp.layers.{k}.transformer_block.mlp.global_scale"] = torch.ones(1)
        for name in ("hidden_norm", "embed_norm"):
            tensors[f"model.mtp.layers.{k}.{name}.weight"] = 1.0 + 0.2 * torch.randn(hidden, generator=gen)
        tensors[f"model.mtp.layers.{k}.input_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=gen) / math.sqrt(
            2 * hidden)
    if chain_norm:
        tensors["model.mtp.chain_norm.weight"] = 1.0 + 0.2 * torch.randn(hidden, generator=gen)
    save_file(tensors, file, metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["mtp_config"] = {"num_nextn_predict_layers": depths, "chain_hidden_post_norm": chain_norm,
                            "local_layer_ids": list(local_ids) or None}
    for key in ("num_mtp_layers", "chain_hidden_post_norm", "mtp_local_layer_ids"):
        config["text_config"].pop(key, None)   # let mtp_config speak, as in real checkpoints
    (path / "config.json").write_text(json.dumps(config, indent=2))


def build_mtp_checkpoint(path: Path, name: str, depths: int, chain_norm: bool, local_ids=(), seed: int = 0):
    """A TEXT_CONFIGS model with MTP depths; needs a dense layer in the config for the MLP shapes."""
    from transformers import InklingForConditionalGeneration
    path = Path(path)
    build_checkpoint(path, name, seed=seed)
    model = InklingForConditionalGeneration.from_pretrained(path)
    add_mtp_depths(path, model, depths, chain_norm, local_ids, seed)
    return InklingForConditionalGeneration.from_pretrained(path).eval()
