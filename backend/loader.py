"""Read Inkling safetensors checkpoints into the engine's tensor names.

Accepts the original key names (`model.llm.*`, what `save_pretrained` writes) and transformers' own
module names (`model.language_model.*`, `lm_head.weight`, or `model.*` for the text-only model).
Tensors are read one at a time from the memory-mapped files, converted, and placed, so loading never
holds a second full copy of the model.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import ModelConfig
from .towers import tower_name


class CheckpointError(ValueError):
    """The weight files do not match what config.json describes."""


# per-layer suffix -> (engine name(s), conversion); conversions are defined in `_convert`
_LAYER_KEYS_ORIGINAL = {
    "attn_norm.weight": ("attn_norm", "copy"),
    "mlp_norm.weight": ("mlp_norm", "copy"),
    "attn_sconv.weight": ("attn_sconv", "conv"),
    "mlp_sconv.weight": ("mlp_sconv", "conv"),
    "attn.wq_du.weight": ("attn.wq", "copy"),
    "attn.wk_dv.weight": ("attn.wk", "copy"),
    "attn.wv_dv.weight": ("attn.wv", "copy"),
    "attn.wr_du.weight": ("attn.wr", "copy"),
    "attn.wo_ud.weight": ("attn.wo", "copy"),
    "attn.q_norm.weight": ("attn.q_norm", "copy"),
    "attn.k_norm.weight": ("attn.k_norm", "copy"),
    "attn.k_sconv.weight": ("attn.k_sconv", "conv"),
    "attn.v_sconv.weight": ("attn.v_sconv", "conv"),
    "attn.rel_logits_proj.proj": ("attn.rel_proj", "copy"),
    "mlp.w13_dn.weight": (("mlp.w_gate", "mlp.w_up"), "deinterleave0"),
    "mlp.w2_md.weight": ("mlp.w_down", "copy"),
    "mlp.global_scale": ("mlp.global_scale", "copy"),
    "mlp.gate.weight": ("mlp.router", "copy"),
    "mlp.gate.bias": ("mlp.router_bias", "fp32"),
    "mlp.gate.global_scale": ("mlp.router_scale", "fp32"),
    "mlp.experts.w13_weight": (("mlp.experts_gate", "mlp.experts_up"), "deinterleave1"),
    "mlp.experts.w2_weight": ("mlp.experts_down", "copy"),
    "mlp.shared_experts.shared_w13_weight": (("mlp.shared_gate", "mlp.shared_up"), "deinterleave1"),
    "mlp.shared_experts.shared_w2_weight": ("mlp.shared_down", "copy"),
}
_LAYER_KEYS_TRANSFORMERS = {
    "input_layernorm.weight": ("attn_norm", "copy"),
    "post_attention_layernorm.weight": ("mlp_norm", "copy"),
    "attn_sconv.conv1d.weight": ("attn_sconv", "conv"),
    "mlp_sconv.conv1d.weight": ("mlp_sconv", "conv"),
    "self_attn.q_proj.weight": ("attn.wq", "copy"),
    "self_attn.k_proj.weight": ("attn.wk", "copy"),
    "self_attn.v_proj.weight": ("attn.wv", "copy"),
    "self_attn.r_proj.weight": ("attn.wr", "copy"),
    "self_attn.o_proj.weight": ("attn.wo", "copy"),
    "self_attn.q_norm.weight": ("attn.q_norm", "copy"),
    "self_attn.k_norm.weight": ("attn.k_norm", "copy"),
    "self_attn.k_sconv.conv1d.weight": ("attn.k_sconv", "conv"),
    "self_attn.v_sconv.conv1d.weight": ("attn.v_sconv", "conv"),
    "self_attn.rel_logits_proj.proj": ("attn.rel_proj", "copy"),
    "mlp.gate_proj.weight": ("mlp.w_gate", "copy"),
    "mlp.up_proj.weight": ("mlp.w_up", "copy"),
    "mlp.down_proj.weight": ("mlp.w_down", "copy"),
    "mlp.global_scale": ("mlp.global_scale", "copy"),
    "mlp.gate.weight": ("mlp.router", "copy"),
    "mlp.gate.e_score_correction_bias": ("mlp.router_bias", "fp32"),
    "mlp.gate.global_scale": ("mlp.router_scale", "fp32"),
    "mlp.experts.gate_up_proj": (("mlp.experts_gate", "mlp.experts_up"), "halves1"),
    "mlp.experts.down_proj": ("mlp.experts_down", "copy"),
    "mlp.shared_experts.gate_proj": ("mlp.shared_gate", "copy"),
    "mlp.shared_experts.up_proj": ("mlp.shared_up", "copy"),
    "mlp.shared_experts.down_proj": ("mlp.shared_down", "copy"),
}
_TOP_KEYS = {
    # original names
    "model.llm.embed.weight": "embed", "model.llm.embed_norm.weight": "embed_norm",
    "model.llm.norm.weight": "norm", "model.llm.unembed.weight": "unembed",
    # transformers, multimodal
    "model.language_model.embed_tokens.weight": "embed",
    "model.language_model.embed_tokens.embed_norm.weight": "embed_norm",
    "model.language_model.norm.weight": "norm", "lm_head.weight": "unembed",
    # transformers, text-only
    "model.embed_tokens.weight": "embed", "model.embed_tokens.embed_norm.weight": "embed_norm",
    "model.norm.weight": "norm",
}
_LAYER_PREFIX = re.compile(r"^(model\.llm\.layers|model\.language_model\.layers|model\.layers)\.(\d+)\.(.+)$")
# MTP depths: per-depth extras, and a decoder block under `transformer_block` (original names)
_MTP_BLOCK = re.compile(r"^model\.mtp\.layers\.(\d+)\.transformer_block\.(.+)$")
_MTP_EXTRA = re.compile(r"^model\.mtp\.layers\.(\d+)\.(hidden_norm|embed_norm|input_proj)\.weight$")

# computed in fp32 whatever the model dtype (INKLING.md: fp32 islands)
_FP32 = {"conv", "fp32"}


def _convert(tensor: torch.Tensor, how: str) -> list[torch.Tensor]:
    if how == "conv":  # [C, 1, K] -> [C, K]
        return [tensor.reshape(tensor.shape[0], tensor.shape[-1])]
    if how == "deinterleave0":  # rows: gate 0, up 0, gate 1, up 1, ...
        return [tensor[0::2].contiguous(), tensor[1::2].contiguous()]
    if how == "deinterleave1":
        return [tensor[:, 0::2].contiguous(), tensor[:, 1::2].contiguous()]
    if how == "halves1":  # transformers keeps gate rows then up rows
        half = tensor.shape[1] // 2
        return [tensor[:, :half].contiguous(), tensor[:, half:].contiguous()]
    return [tensor]


def engine_name(key: str) -> tuple[tuple[str, ...], str] | None:
    """Map a checkpoint key to engine tensor name(s) and conversion, or None for an unknown key."""
    if key in _TOP_KEYS:
        return (_TOP_KEYS[key],), "copy"
    if tower_name(key):
        return (tower_name(key),), "copy"
    if key == "model.mtp.chain_norm.weight":
        return ("mtp.chain_norm",), "copy"
    match = _MTP_EXTRA.match(key)
    if match:
        return (f"mtp.{match.group(1)}.{match.group(2)}",), "copy"
    match = _MTP_BLOCK.match(key)
    if match:
        entry = _LAYER_KEYS_ORIGINAL.get(match.group(2))
        if entry is None:
            return None
        names, how = entry
        names = (names,) if isinstance(names, str) else names
        return tuple(f"mtp.{match.group(1)}.block.{n}" for n in names), how
    match = _LAYER_PREFIX.match(key)
    if not match:
        return None
    table = _LAYER_KEYS_ORIGINAL if match.group(1) == "model.llm.layers" else _LAYER_KEYS_TRANSFORMERS
    entry = table.get(match.group(3))
    if entry is None:
        return None
    names, how = entry
    names = (names,) if isinstance(names, str) else names
    return tuple(f"layers.{match.group(2)}.{n}" for n in names), how


def _layer_names(p: str, dense: bool) -> set[str]:
    names = {p + n for n in ("attn_norm", "mlp_norm", "attn_sconv", "mlp_sconv")}
    names |= {p + "attn." + n for n in ("wq", "wk", "wv", "wr", "wo", "q_norm", "k_norm", "k_sconv", "v_sconv",
                                         "rel_proj")}
    if dense:
        return names | {p + "mlp." + n for n in ("w_gate", "w_up", "w_down", "global_scale")}
    return names | {p + "mlp." + n for n in ("router", "router_bias", "router_scale", "experts_gate", "experts_up",
                                              "experts_down", "shared_gate", "shared_up", "shared_down")}


def expected_names(cfg: ModelConfig, with_mtp: bool) -> set[str]:
    names = {"embed", "embed_norm", "norm", "unembed"}
    for i in range(cfg.num_layers):
        names |= _layer_names(f"layers.{i}.", cfg.mlp_layer_types[i] == "dense")
    if with_mtp:
        for k in range(cfg.num_mtp_layers):
            names |= _layer_names(f"mtp.{k}.block.", dense=True)   # MTP depths always have a dense MLP
            names |= {f"mtp.{k}.{n}" for n in ("hidden_norm", "embed_norm", "input_proj")}
        if cfg.chain_hidden_post_norm:
            names.add("mtp.chain_norm")
    return names


def checkpoint_files(model_dir: Path) -> dict[str, Path]:
    """key -> file holding it, from the shard index or from every *.safetensors file."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is not a valid shard index ({exc}); restore it from the checkpoint.")
        files = {key: model_dir / name for key, name in weight_map.items()}
        for path in set(files.values()):
            if not path.is_file():
                raise CheckpointError(f"The shard index lists {path.name}, which is missing from {model_dir}; "
                                      "copy the complete checkpoint.")
        return files
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"No *.safetensors weights in {model_dir}; a checkpoint needs model.safetensors "
                              "or shards with model.safetensors.index.json.")
    files = {}
    for path in shards:
        with _open(path) as f:
            files.update({key: path for key in f.keys()})
    return files


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path} cannot be read as safetensors ({exc}); the file is truncated or not a "
                              "safetensors file - copy it again.") from exc


def load_weights(model_dir: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: str | torch.device
                 ) -> dict[str, torch.Tensor]:
    """All weights by engine name: backbone, MTP depths ("mtp.*"), vision ("vision.*") and audio
    ("audio.*") towers. A config that declares MTP depths whose checkpoint has no `model.mtp.*` tensors
    loads without them (transformers does the same), and a checkpoint may lack either tower; the
    engine then reports what it cannot do."""
    model_dir = Path(model_dir)
    files = checkpoint_files(model_dir)
    weights: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for key, path in files.items():
        by_file.setdefault(path, []).append(key)
    for path, keys in sorted(by_file.items()):
        with _open(path) as f:
            available = set(f.keys())
            for key in sorted(keys):
                if key not in available:
                    raise CheckpointError(f"{path.name} does not hold {key}, though the shard index says so; "
                                          "the checkpoint is incomplete.")
                try:
                    tensor = f.get_tensor(key)
                except (SafetensorError, OSError, RuntimeError) as exc:
                    raise CheckpointError(f"Reading {key} from {path} failed ({exc}); the file is truncated - "
                                          "copy it again.") from exc
                mapped = engine_name(key)
                if mapped is None:
                    raise CheckpointError(f"Unexpected tensor {key!r} in {path.name}: this engine does not know "
                                          "it. Is this an Inkling checkpoint of a supported version?")
                names, how = mapped
                target = torch.float32 if how in _FP32 else dtype
                for name, part in zip(names, _convert(tensor, how)):
                    weights[name] = part.to(device=device, dtype=target)
                del tensor
    with_mtp = any(name.startswith("mtp.") for name in weights)
    if with_mtp and cfg.num_mtp_layers == 0:
        raise CheckpointError("The checkpoint holds MTP tensors (model.mtp.*) but config.json declares no MTP "
                              "depths; add mtp_config.num_nextn_predict_layers (or num_mtp_layers).")
    expected = expected_names(cfg, with_mtp) | {n for n in weights if n.startswith(("vision.", "audio."))}
    missing = sorted(expected - weights.keys())
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"The checkpoint in {model_dir} lacks {missing[0]!r}{more}, which config.json "
                              "requires; the weights and config.json do not belong together.")
    extra = sorted(weights.keys() - expected)
    if extra:
        raise CheckpointError(f"The checkpoint holds {extra[0]!r}, which config.json does not describe "
                              "(check mlp_layer_types and num_hidden_layers).")
    _check_shapes(weights, cfg)
    return weights


def _check_shapes(w: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    hidden = cfg.hidden_size
    expect = {"embed": (cfg.vocab_size, hidden)}
    if tuple(w["unembed"].shape) not in ((cfg.vocab_size, hidden), (cfg.unpadded_vocab_size, hidden)):
        raise CheckpointError(f"unembed has shape {tuple(w['unembed'].shape)}; config.json implies "
                              f"({cfg.vocab_size}, {hidden}) or ({cfg.unpadded_vocab_size}, {hidden}).")
    for i in range(cfg.num_layers):
        heads, kv_heads, head_dim = cfg.attn_shape(cfg.is_sliding(i))
        extent = cfg.sliding_window if cfg.is_sliding(i) else cfg.rel_extent
        p = f"layers.{i}.attn."
        expect.update({p + "wq": (heads * head_dim, hidden), p + "wk": (kv_heads * head_dim, hidden),
                       p + "wr": (heads * cfg.d_rel, hidden), p + "rel_proj": (cfg.d_rel, extent),
                       p + "k_sconv": (kv_heads * head_dim, cfg.conv_kernel_size)})
    for name, shape in expect.items():
        if tuple(w[name].shape) != shape:
            raise CheckpointError(f"{name} has shape {tuple(w[name].shape)} but config.json implies {shape}; "
                                  "the weights and config.json do not belong together.")
