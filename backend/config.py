"""Inkling checkpoint config.json -> a flat, validated ModelConfig.

Resolves the same defaults and aliases as transformers' InklingTextConfig (layer types from
`local_layer_ids`, `dense_mlp_idx`, `dense_intermediate_size`, the top-level `mtp_config`), so one
config.json means the same model to both.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("inkling_mm_model", "inkling_text")


class ConfigError(ValueError):
    """config.json describes something this engine cannot run."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    unpadded_vocab_size: int
    hidden_size: int
    num_layers: int
    layer_types: tuple[str, ...]          # "hybrid" (full) or "hybrid_sliding"
    mlp_layer_types: tuple[str, ...]      # "dense" or "sparse"
    # full-attention layers
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # sliding-window layers
    swa_num_heads: int
    swa_num_kv_heads: int
    swa_head_dim: int
    sliding_window: int
    d_rel: int
    rel_extent: int
    log_scaling_n_floor: int | None
    log_scaling_alpha: float
    max_position_embeddings: int
    rms_norm_eps: float
    conv_kernel_size: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    route_scale: float
    logits_mup_width_multiplier: float
    eos_token_ids: tuple[int, ...]
    # MTP (speculative draft heads)
    num_mtp_layers: int = 0
    chain_hidden_post_norm: bool = False
    mtp_hidden_states_first: bool = True
    mtp_local_layer_ids: tuple[int, ...] = ()
    # multimodal ids (the text-only config keeps the defaults)
    image_token_id: int = 200054
    audio_token_id: int = 200053
    image_bos_token_id: int = 200005
    audio_bos_token_id: int = 200020
    vision: dict = field(default_factory=dict)
    audio: dict = field(default_factory=dict)
    is_multimodal: bool = True

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "hybrid_sliding"

    def is_mtp_sliding(self, position: int) -> bool:
        """Whether the MTP depth used at draft position `position` (depths reused cyclically) is sliding."""
        return self.num_mtp_layers > 0 and (position % self.num_mtp_layers) in self.mtp_local_layer_ids

    def attn_shape(self, sliding: bool) -> tuple[int, int, int]:
        """(heads, kv_heads, head_dim) of a sliding or full layer."""
        if sliding:
            return self.swa_num_heads, self.swa_num_kv_heads, self.swa_head_dim
        return self.num_heads, self.num_kv_heads, self.head_dim


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def parse_config(raw: dict) -> ModelConfig:
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"config.json describes a model of type {model_type!r}; this engine runs Inkling checkpoints "
            f"(model_type {' or '.join(SUPPORTED_MODEL_TYPES)}). Point --model at an Inkling checkpoint.")
    is_mm = model_type == "inkling_mm_model"
    quant = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config")
    if quant:
        method = quant.get("quant_method", quant.get("format", "?")) if isinstance(quant, dict) else quant
        raise ConfigError(f"config.json describes a quantized checkpoint ({method}); the native engine loads "
                          "float32/bfloat16 weights only. Use a bf16 checkpoint, or the vLLM backend.")
    text = dict(raw["text_config"]) if is_mm else dict(raw)
    if is_mm and not isinstance(raw.get("text_config"), dict):
        raise ConfigError("config.json of type inkling_mm_model has no `text_config` block; add it.")
    mtp = raw.get("mtp_config") or {}
    text.setdefault("num_mtp_layers", mtp.get("num_nextn_predict_layers"))
    text.setdefault("chain_hidden_post_norm", mtp.get("chain_hidden_post_norm", False))
    text.setdefault("mtp_local_layer_ids", mtp.get("local_layer_ids"))

    def get(name, default=None, *aliases):
        for key in (name, *aliases):
            if text.get(key) is not None:
                return text[key]
        return default

    num_layers = int(get("num_hidden_layers", 66))
    layer_types = get("layer_types")
    if layer_types is None:
        local = get("local_layer_ids")
        local = set(local) if local is not None else {i for i in range(num_layers) if (i + 1) % 6}
        layer_types = ["hybrid_sliding" if i in local else "hybrid" for i in range(num_layers)]
    mlp_types = get("mlp_layer_types")
    if mlp_types is None:
        dense_idx = int(get("dense_mlp_idx", 0))
        mlp_types = ["dense" if i < dense_idx else "sparse" for i in range(num_layers)]
    intermediate, moe_intermediate = int(get("intermediate_size", 24576)), int(get("moe_intermediate_size", 3072))
    if text.get("dense_intermediate_size") is not None:
        # there `intermediate_size` is the experts' width and the dense MLP has its own
        moe_intermediate, intermediate = intermediate, int(text["dense_intermediate_size"])
    for name, types, allowed in (("layer_types", layer_types, {"hybrid", "hybrid_sliding"}),
                                 ("mlp_layer_types", mlp_types, {"dense", "sparse"})):
        if len(types) != num_layers or not set(types) <= allowed:
            raise ConfigError(f"`{name}` must list one of {sorted(allowed)} for each of the {num_layers} layers; "
                              f"got {types!r}.")
    if get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act {get('hidden_act')!r} is not supported; Inkling uses 'silu'.")
    vocab = int(get("vocab_size", 201024))
    unpadded = get("unpadded_vocab_size")
    num_mtp = get("num_mtp_layers")
    cfg = ModelConfig(
        vocab_size=vocab,
        unpadded_vocab_size=min(int(unpadded), vocab) if unpadded is not None else vocab,
        hidden_size=int(get("hidden_size", 6144)),
        num_layers=num_layers,
        layer_types=tuple(layer_types),
        mlp_layer_types=tuple(mlp_types),
        num_heads=int(get("num_attention_heads", 64)),
        num_kv_heads=int(get("num_key_value_heads", 8)),
        head_dim=int(get("head_dim", 128)),
        swa_num_heads=int(get("swa_num_attention_heads", 64)),
        swa_num_kv_heads=int(get("swa_num_key_value_heads", 16)),
        swa_head_dim=int(get("swa_head_dim", 128)),
        sliding_window=int(get("sliding_window_size", 512, "sliding_window")),
        d_rel=int(get("d_rel", 16)),
        rel_extent=int(get("rel_extent", 1024)),
        log_scaling_n_floor=get("log_scaling_n_floor"),
        log_scaling_alpha=float(get("log_scaling_alpha", 0.1)),
        max_position_embeddings=int(get("max_position_embeddings", 131072, "model_max_length")),
        rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
        conv_kernel_size=int(get("conv_kernel_size", 4, "sconv_kernel_size")),
        intermediate_size=intermediate,
        moe_intermediate_size=moe_intermediate,
        n_routed_experts=int(get("n_routed_experts", 256, "num_local_experts")),
        num_experts_per_tok=int(get("num_experts_per_tok", 6)),
        n_shared_experts=int(get("n_shared_experts", 2)),
        route_scale=float(get("route_scale", 8.0)),
        logits_mup_width_multiplier=float(get("logits_mup_width_multiplier", 24.0, "embedding_multiplier")),
        eos_token_ids=_ids(text.get("eos_token_id", raw.get("eos_token_id"))),
        num_mtp_layers=int(num_mtp or 0),
        chain_hidden_post_norm=bool(get("chain_hidden_post_norm", False)),
        mtp_hidden_states_first=bool(get("mtp_hidden_states_first", True)),
        mtp_local_layer_ids=tuple(get("mtp_local_layer_ids") or ()),
        image_token_id=int(raw.get("image_token_id", 200054)),
        audio_token_id=int(raw.get("audio_token_id", 200053)),
        image_bos_token_id=int(raw.get("image_bos_token_id", 200005)),
        audio_bos_token_id=int(raw.get("audio_bos_token_id", 200020)),
        vision=dict(raw.get("vision_config") or {}) if is_mm else {},
        audio=dict(raw.get("audio_config") or {}) if is_mm else {},
        is_multimodal=is_mm,
    )
    for sliding in (False, True):
        heads, kv_heads, _ = cfg.attn_shape(sliding)
        if heads % kv_heads:
            raise ConfigError(f"attention heads ({heads}) must be a multiple of key/value heads ({kv_heads}).")
    if "sparse" in cfg.mlp_layer_types and cfg.num_experts_per_tok > cfg.n_routed_experts:
        raise ConfigError(f"num_experts_per_tok ({cfg.num_experts_per_tok}) exceeds n_routed_experts "
                          f"({cfg.n_routed_experts}).")
    return cfg


def load_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; --model must be a checkpoint directory with a config.json.")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); restore the file from the checkpoint.") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object.")
    return parse_config(raw)
