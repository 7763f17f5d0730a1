"""Build assets/inkling-tiny/: a small random-weight Inkling checkpoint plus a byte-level BPE tokenizer.

It is a placeholder for tests and development; a trained model replaces it later.
Everything is seeded and every input list is sorted, so reruns on the same Python
install give byte-identical tokenizer.json and model weights.

    .venv/bin/python scripts/make_tiny_random.py [--out assets/inkling-tiny] [--patch-size 4]
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# Wire-format markers first (fixed low ids), then padding.
SPECIAL_TOKENS = [
    "<|message_user|>",
    "<|message_model|>",
    "<|message_system|>",
    "<|message_tool|>",
    "<|content_text|>",
    "<|content_image|>",
    "<|content_audio_input|>",
    "<|audio_end|>",
    "<|content_thinking|>",
    "<|end_message|>",
    "<|content_model_end_sampling|>",
    "<|image_placeholder|>",
    "<|audio_placeholder|>",
    "<|pad|>",
]
# Deliberately not a multiple of 64 so the padded-vocab path (unpadded_vocab_size) is exercised.
TOKENIZER_VOCAB_SIZE = 2000
# Cap on training text so the run stays fast and the result does not depend on the tail of the file list.
CORPUS_CHAR_BUDGET = 4_000_000
SEED = 0
REPO_ROOT = Path(__file__).resolve().parent.parent


def corpus_texts(budget: int = CORPUS_CHAR_BUDGET) -> list[str]:
    """Python stdlib sources, sorted by path and capped: plain text that exists on every machine offline."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        # site-packages differs between machines; keep only the stdlib proper.
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text[: budget - total])
        total += len(texts[-1])
        if total >= budget:
            break
    if total == 0:
        raise SystemExit(f"no training text found under {stdlib}")
    return texts


def train_tokenizer(texts: list[str]) -> Tokenizer:
    """Byte-level BPE: every unicode string round-trips because the base alphabet is all 256 bytes."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build_config(tokenizer: Tokenizer, patch_size: int = 8):
    from transformers import InklingConfig

    def tid(token: str) -> int:
        return tokenizer.token_to_id(token)

    n_tokens = tokenizer.get_vocab_size(with_added_tokens=True)
    n_layers = 6
    text_config = dict(
        vocab_size=(n_tokens + 63) // 64 * 64,
        unpadded_vocab_size=n_tokens,
        hidden_size=256,
        num_hidden_layers=n_layers,
        layer_types=["hybrid" if i in (2, 5) else "hybrid_sliding" for i in range(n_layers)],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        swa_num_attention_heads=4,
        swa_num_key_value_heads=1,
        swa_head_dim=64,
        sliding_window_size=128,
        d_rel=16,
        rel_extent=1024,
        log_scaling_n_floor=512,
        intermediate_size=768,
        moe_intermediate_size=256,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        mlp_layer_types=["dense"] + ["sparse"] * (n_layers - 1),
        max_position_embeddings=4096,
        eos_token_id=tid("<|content_model_end_sampling|>"),
        bos_token_id=None,
        pad_token_id=tid("<|pad|>"),
    )
    # 5 layers >= the planned scale count (5 for patch 8) keeps transformers off its scipy path;
    # the tower's size is set by its last temporal stage (patch**2 * 3 * 2 * 64 wide), not by the layer count.
    vision_config = dict(patch_size=patch_size, num_hidden_layers=5)
    return InklingConfig(
        text_config=text_config,
        vision_config=vision_config,
        audio_config=dict(),
        image_token_id=tid("<|image_placeholder|>"),
        audio_token_id=tid("<|audio_placeholder|>"),
        image_bos_token_id=tid("<|content_image|>"),
        audio_bos_token_id=tid("<|content_audio_input|>"),
    )


def cast_to_bf16_except_fp32_islands(model: torch.nn.Module) -> None:
    """bf16 everywhere except the parameters transformers always runs in fp32 (convs, router bias/scale)."""
    keep_fp32 = tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not any(key in name for key in keep_fp32):
                param.data = param.data.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16


def param_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


MODEL_CARD = """\
# inkling-tiny (random-weight placeholder)

**This model is untrained.** Its weights are random (`torch.manual_seed({seed})`);
it produces gibberish. It exists so the engine, loader and tests have a small
real checkpoint in the Inkling format. A trained model replaces it later.

Made with:

    .venv/bin/python scripts/make_tiny_random.py

## Tokenizer
Byte-level BPE (`tokenizers`), {n_tokens} tokens, trained on the first
{budget:,} characters of the Python {pyver} standard library sources (sorted by path).
Special tokens (ids {first_special}-{last_special}): {specials}.

## Config summary
- parameters: {n_params:,} total (text {n_text:,}, vision {n_vision:,}, audio {n_audio:,}), stored as {dtype}
  (the short convolutions and router bias/global_scale stay float32, as transformers runs them)
- text: hidden 256, 6 layers (full attention at 2 and 5, sliding window 128 elsewhere),
  4 heads / 2 kv heads (full), 4 heads / 1 kv head (sliding), head_dim 64,
  d_rel 16, rel_extent 1024, log scaling n_floor 512
- MLP: layer 0 dense (768), layers 1-5 MoE with 8 routed experts (top-2, width 256) + 1 shared
- vocab_size {vocab_size} (padded to a multiple of 64), unpadded_vocab_size {n_tokens}
- eos `<|content_model_end_sampling|>` = {eos}, pad `<|pad|>` = {pad}, no bos
- vision: patch_size {patch}, 5 layers; audio: defaults (80 mel bins x 256)
- max_position_embeddings 4096; no MTP heads
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "inkling-random")
    parser.add_argument("--patch-size", type=int, default=4, help="vision patch size (4 shrinks the tower ~7x)")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(corpus_texts())
    config = build_config(tokenizer, args.patch_size)

    from transformers import InklingForConditionalGeneration

    torch.manual_seed(SEED)
    model = InklingForConditionalGeneration(config).to(torch.float32).eval()
    inner = model.model
    counts = {
        "total": param_count(model),
        "text": param_count(inner.language_model) + param_count(model.lm_head),
        "vision": param_count(inner.vision_tower),
        "audio": param_count(inner.audio_tower),
    }
    print("parameters:", ", ".join(f"{k} {v:,}" for k, v in counts.items()))

    # fp32 unless that makes the asset too large for the repository.
    dtype = torch.float32
    if counts["total"] * 4 > 60e6:
        dtype = torch.bfloat16
        cast_to_bf16_except_fp32_islands(model)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="15MB")
    add_random_mtp_depths(out, config, dtype)
    tokenizer.save(str(out / "tokenizer.json"))

    import platform

    text_cfg = config.text_config
    (out / "README.md").write_text(
        MODEL_CARD.format(
            seed=SEED,
            n_tokens=tokenizer.get_vocab_size(),
            budget=CORPUS_CHAR_BUDGET,
            pyver=platform.python_version(),
            first_special=tokenizer.token_to_id(SPECIAL_TOKENS[0]),
            last_special=tokenizer.token_to_id(SPECIAL_TOKENS[-1]),
            specials=" ".join(f"`{t}`" for t in SPECIAL_TOKENS),
            n_params=counts["total"],
            n_text=counts["text"],
            n_vision=counts["vision"],
            n_audio=counts["audio"],
            dtype=str(dtype).removeprefix("torch."),
            vocab_size=text_cfg.vocab_size,
            eos=text_cfg.eos_token_id,
            pad=text_cfg.pad_token_id,
            patch=config.vision_config.patch_size,
        )
    )
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB)")
    check_roundtrip(out)


MTP_DEPTHS = 3


def add_random_mtp_depths(out: Path, config, dtype: torch.dtype) -> None:
    """Random MTP draft heads in the real checkpoint layout (model.mtp.*, a shard of their own and the
    top-level mtp_config), so the engine's MTP path runs on the shipped model. Untrained: they draft
    almost nothing right."""
    import json
    import math

    from safetensors.torch import save_file
    text = config.text_config
    hidden, gen = text.hidden_size, torch.Generator().manual_seed(SEED + 1)
    q, kv = text.num_attention_heads * text.head_dim, text.num_key_value_heads * text.head_dim

    def normal(*shape):
        return (torch.randn(*shape, generator=gen) / math.sqrt(shape[-1])).to(dtype)
    tensors = {}
    for k in range(MTP_DEPTHS):
        p = f"model.mtp.layers.{k}."
        b = p + "transformer_block."
        tensors.update({
            p + "hidden_norm.weight": torch.ones(hidden, dtype=dtype), p + "embed_norm.weight": torch.ones(hidden, dtype=dtype),
            p + "input_proj.weight": normal(hidden, 2 * hidden),
            b + "attn_norm.weight": torch.ones(hidden, dtype=dtype), b + "mlp_norm.weight": torch.ones(hidden, dtype=dtype),
            b + "attn_sconv.weight": 0.1 * torch.randn(hidden, 1, 4, generator=gen),
            b + "mlp_sconv.weight": 0.1 * torch.randn(hidden, 1, 4, generator=gen),
            b + "attn.wq_du.weight": normal(q, hidden), b + "attn.wk_dv.weight": normal(kv, hidden),
            b + "attn.wv_dv.weight": normal(kv, hidden), b + "attn.wo_ud.weight": normal(hidden, q),
            b + "attn.wr_du.weight": normal(text.num_attention_heads * text.d_rel, hidden),
            b + "attn.q_norm.weight": torch.ones(text.head_dim, dtype=dtype),
            b + "attn.k_norm.weight": torch.ones(text.head_dim, dtype=dtype),
            b + "attn.k_sconv.weight": 0.1 * torch.randn(kv, 1, 4, generator=gen),
            b + "attn.v_sconv.weight": 0.1 * torch.randn(kv, 1, 4, generator=gen),
            b + "attn.rel_logits_proj.proj": (0.02 * torch.randn(text.d_rel, text.rel_extent, generator=gen)).to(dtype),
            b + "mlp.w13_dn.weight": normal(2 * text.intermediate_size, hidden),
            b + "mlp.w2_md.weight": normal(hidden, text.intermediate_size),
            b + "mlp.global_scale": torch.ones(1, dtype=dtype),
        })
    shard = "model-mtp.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / shard, metadata={"format": "pt"})
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({key: shard for key in tensors})
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True))
    raw = json.loads((out / "config.json").read_text())
    raw["mtp_config"] = {"num_nextn_predict_layers": MTP_DEPTHS, "chain_hidden_post_norm": False,
                         "local_layer_ids": None}
    for key in ("num_mtp_layers", "chain_hidden_post_norm", "mtp_local_layer_ids"):
        raw["text_config"].pop(key, None)   # an explicit null here would hide mtp_config (setdefault)
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True))


def check_roundtrip(out: Path) -> None:
    """Load the saved files back and generate a few tokens, so a broken asset fails here, not in tests."""
    from transformers import InklingForConditionalGeneration

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    sample = "héllo 😀 世界"
    assert tokenizer.decode(tokenizer.encode(sample).ids) == sample, "tokenizer does not round-trip"
    model = InklingForConditionalGeneration.from_pretrained(out).eval()
    ids = [tokenizer.token_to_id("<|message_user|>"), tokenizer.token_to_id("<|content_text|>")]
    ids += tokenizer.encode("Hello there").ids
    ids += [tokenizer.token_to_id("<|end_message|>"), tokenizer.token_to_id("<|message_model|>")]
    with torch.no_grad():
        result = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    new_ids = result[0, len(ids) :].tolist()
    print("generated ids:", new_ids, "->", repr(tokenizer.decode(new_ids)))


if __name__ == "__main__":
    main()
