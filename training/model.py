"""A trainable Inkling (batched, no cache) and its checkpoint writer.

The engine's `backend/model.py` runs Inkling over a paged cache for serving; this is the same
architecture written for training: whole sequences, autograd, one fused attention call. It saves
the original key layout (`model.llm.*`, `model.mtp.*`, `model.visual.*`, `model.audio.*`) that real
checkpoints, transformers and our engine all read. MTP depths are fed the backbone-normed token
embedding (vLLM's convention, which the engine uses by default).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TinyConfig:
    vocab_size: int = 4096
    unpadded_vocab_size: int = 4096
    hidden: int = 192
    layers: int = 6
    full_layers: tuple = (2, 5)          # the rest use sliding-window attention
    heads: int = 3
    kv_heads: int = 1
    head_dim: int = 64
    swa_heads: int = 3
    swa_kv_heads: int = 1
    swa_head_dim: int = 64
    window: int = 128
    d_rel: int = 16
    rel_extent: int = 1024
    log_floor: int | None = 512
    log_alpha: float = 0.1
    intermediate: int = 576
    mtp_depths: int = 3
    patch_size: int = 8
    vision_layers: int = 4               # 4 stages keep the tower at 0.16M parameters (5 would be 15.8M)
    max_positions: int = 4096
    special: dict = field(default_factory=dict)   # image/audio token ids, eos, pad

    def is_sliding(self, i: int) -> bool:
        return i not in self.full_layers


def rms_norm(x, w, eps=1e-6):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def short_conv(x, w):
    """x + causal depthwise conv (kernel 4) in fp32; x [B, T, C], w [C, 1, 4]."""
    x32 = x.float()
    y = F.conv1d(F.pad(x32.transpose(1, 2), (w.shape[-1] - 1, 0)), w.float(), groups=x.shape[-1])
    return (x32 + y.transpose(1, 2)).to(x.dtype)


class Block(nn.Module):
    def __init__(self, c: TinyConfig, sliding: bool):
        super().__init__()
        self.sliding = sliding
        self.h, self.kvh, self.d = (c.swa_heads, c.swa_kv_heads, c.swa_head_dim) if sliding else (c.heads, c.kv_heads, c.head_dim)
        self.window, self.extent = c.window, c.window if sliding else c.rel_extent
        self.log_floor = None if sliding else c.log_floor
        self.log_alpha, self.d_rel = c.log_alpha, c.d_rel
        H = c.hidden
        lin = lambda o, i: nn.Parameter(torch.randn(o, i) / math.sqrt(i))  # noqa: E731
        self.attn_norm, self.mlp_norm = nn.Parameter(torch.ones(H)), nn.Parameter(torch.ones(H))
        self.wq, self.wk, self.wv = lin(self.h * self.d, H), lin(self.kvh * self.d, H), lin(self.kvh * self.d, H)
        self.wr, self.wo = lin(self.h * c.d_rel, H), nn.Parameter(torch.zeros(H, self.h * self.d))
        self.q_norm, self.k_norm = nn.Parameter(torch.ones(self.d)), nn.Parameter(torch.ones(self.d))
        self.rel_proj = nn.Parameter(0.02 * torch.randn(c.d_rel, self.extent))
        conv = lambda ch: nn.Parameter(0.05 * torch.randn(ch, 1, 4))  # noqa: E731
        self.k_sconv, self.v_sconv = conv(self.kvh * self.d), conv(self.kvh * self.d)
        self.attn_sconv, self.mlp_sconv = conv(H), conv(H)
        self.w_gate, self.w_up = lin(c.intermediate, H), lin(c.intermediate, H)
        self.w_down, self.global_scale = nn.Parameter(torch.zeros(H, c.intermediate)), nn.Parameter(torch.ones(1))

    def forward(self, x, offset: int = 0):
        B, T, _ = x.shape
        h = rms_norm(x, self.attn_norm)
        q = rms_norm((h @ self.wq.t()).view(B, T, self.h, self.d), self.q_norm)
        k = rms_norm(short_conv(h @ self.wk.t(), self.k_sconv).view(B, T, self.kvh, self.d), self.k_norm)
        v = short_conv(h @ self.wv.t(), self.v_sconv).view(B, T, self.kvh, self.d)
        # distances reach T - 1 at most: the table needs only its first min(T, extent) columns
        table = (h @ self.wr.t()).view(B, T, self.h, self.d_rel) @ self.rel_proj[:, :T]     # [B, T, H, min(T, extent)]
        pos = torch.arange(T, device=x.device)
        dist = pos[:, None] - pos[None, :]                                                 # [T, T]
        index = dist.clamp(0, table.shape[-1] - 1)[None, None].expand(B, self.h, T, T)
        bias = table.permute(0, 2, 1, 3).gather(-1, index)
        bias = bias.masked_fill(((dist < 0) | (dist >= self.extent))[None, None], 0.0)
        if self.log_floor is not None:
            tau = 1.0 + self.log_alpha * torch.log(((pos + offset + 1).float() / self.log_floor).clamp(min=1.0))
            q = (q.float() * tau[None, :, None, None]).to(q.dtype)
            bias = (bias.float() * tau[None, None, :, None]).to(bias.dtype)
        hidden = dist < 0
        if self.sliding:
            hidden = hidden | (dist >= self.window)
        bias = bias.masked_fill(hidden[None, None], float("-inf"))
        rep = self.h // self.kvh
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1),
                                           v.transpose(1, 2).repeat_interleave(rep, 1), attn_mask=bias.to(q.dtype),
                                           scale=1.0 / self.d)
        x = x + short_conv(o.transpose(1, 2).reshape(B, T, -1) @ self.wo.t(), self.attn_sconv)
        h = rms_norm(x, self.mlp_norm)
        m = ((F.silu(h @ self.w_gate.t()) * (h @ self.w_up.t())) @ self.w_down.t()) * self.global_scale
        return x + short_conv(m, self.mlp_sconv)

    def state(self, p: str) -> dict:
        """Original checkpoint keys (w13 rows interleaved gate/up)."""
        w13 = torch.stack([self.w_gate, self.w_up], dim=1).reshape(-1, self.w_gate.shape[1])
        return {p + "attn_norm.weight": self.attn_norm, p + "mlp_norm.weight": self.mlp_norm,
                p + "attn_sconv.weight": self.attn_sconv, p + "mlp_sconv.weight": self.mlp_sconv,
                p + "attn.wq_du.weight": self.wq, p + "attn.wk_dv.weight": self.wk, p + "attn.wv_dv.weight": self.wv,
                p + "attn.wr_du.weight": self.wr, p + "attn.wo_ud.weight": self.wo,
                p + "attn.q_norm.weight": self.q_norm, p + "attn.k_norm.weight": self.k_norm,
                p + "attn.k_sconv.weight": self.k_sconv, p + "attn.v_sconv.weight": self.v_sconv,
                p + "attn.rel_logits_proj.proj": self.rel_proj, p + "mlp.w13_dn.weight": w13,
                p + "mlp.w2_md.weight": self.w_down, p + "mlp.global_scale": self.global_scale}


def vision_plan(patch: int, layers: int) -> list[tuple]:
    """The same stage plan as the engine's backend/towers.py (imported there at save-check time)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from backend.towers import plan_stages
    return plan_stages(patch, 2, layers, 3)


class Inkling(nn.Module):
    def __init__(self, c: TinyConfig):
        super().__init__()
        self.c = c
        H = c.hidden
        self.embed = nn.Parameter(torch.randn(c.vocab_size, H) * 0.5)
        self.embed_norm, self.norm = nn.Parameter(torch.ones(H)), nn.Parameter(torch.ones(H))
        self.unembed = nn.Parameter(torch.randn(c.vocab_size, H) / math.sqrt(H))
        self.blocks = nn.ModuleList([Block(c, c.is_sliding(i)) for i in range(c.layers)])
        self.mtp = nn.ModuleList([Block(c, sliding=False) for _ in range(c.mtp_depths)])
        self.mtp_hidden_norm = nn.ParameterList([nn.Parameter(torch.ones(H)) for _ in range(c.mtp_depths)])
        self.mtp_embed_norm = nn.ParameterList([nn.Parameter(torch.ones(H)) for _ in range(c.mtp_depths)])
        self.mtp_proj = nn.ParameterList([nn.Parameter(torch.randn(H, 2 * H) / math.sqrt(2 * H))
                                          for _ in range(c.mtp_depths)])
        plan = vision_plan(c.patch_size, c.vision_layers)
        self.vision = nn.ParameterList()
        self.vision_norms = nn.ParameterList()
        self.vision_folds = []
        for i, (start, end) in enumerate(zip(plan[:-1], plan[1:])):
            t, hw = end[0] // start[0], end[1] // start[1]
            last = i == len(plan) - 2
            out, inp = (H if last else end[3]), start[3] * t * hw * hw
            self.vision.append(nn.Parameter(torch.randn(out, inp) / math.sqrt(inp)))
            if not last:
                self.vision_norms.append(nn.Parameter(torch.ones(out)))
            self.vision_folds.append((t, hw))
        self.vision_final_norm = nn.Parameter(torch.ones(H))
        self.audio_embed = nn.Parameter(torch.randn(80 * 256, H) * 0.02)
        self.audio_norm = nn.Parameter(torch.ones(H))

    def embed_tokens(self, ids):
        return rms_norm(self.embed[ids], self.embed_norm)

    def encode_images(self, patches):
        """[N, 2, P, P, 3] normalised patches -> [N, H]."""
        x = patches
        for i, ((t, hw), w) in enumerate(zip(self.vision_folds, self.vision)):
            if t > 1 or hw > 1:
                B, T, Hh, W, C = x.shape
                x = x.reshape(B, T // t, t, Hh // hw, hw, W // hw, hw, C).permute(0, 1, 3, 5, 2, 4, 6, 7)
                x = x.reshape(B, T // t, Hh // hw, W // hw, t * hw * hw * C)
            x = x @ w.t()
            if i < len(self.vision_norms):
                x = F.gelu(rms_norm(x, self.vision_norms[i]))
        return rms_norm(x, self.vision_final_norm).reshape(patches.shape[0], -1)

    def encode_audio(self, bins):
        """[frames, 80] bin ids -> [frames, H]."""
        offsets = torch.arange(80, device=bins.device) * 256
        return rms_norm(self.audio_embed[bins + offsets].sum(-2), self.audio_norm)

    def forward(self, ids, media_rows=None, media_index=None):
        """ids [B, T]; media_rows [M, H] replace the embeddings at flat positions media_index [M].
        Returns (final normed hidden [B, T, H], logits [B, T, V])."""
        x = self.embed_tokens(ids)
        if media_rows is not None and len(media_rows):
            flat = x.reshape(-1, x.shape[-1]).clone()
            flat[media_index] = media_rows.to(flat.dtype)
            x = flat.view_as(x)
        for block in self.blocks:
            x = block(x)
        h = rms_norm(x, self.norm)
        return h, self.head(h)

    def head(self, h):
        return (h / 24.0) @ self.unembed.t()

    def mtp_logits(self, h, ids):
        """Depth k at position i reads h (or depth k-1's output) at i and token i+k+1; its logits score
        token i+k+2. Returns a list of [B, T-k-1, V] logits, one per depth."""
        out, prev = [], h
        for k, block in enumerate(self.mtp):
            n = ids.shape[1] - k - 1
            e = rms_norm(self.embed_tokens(ids[:, k + 1:]), self.mtp_embed_norm[k])
            z = torch.cat([rms_norm(prev[:, :n], self.mtp_hidden_norm[k]), e], dim=-1) @ self.mtp_proj[k].t()
            prev = block(z, offset=k + 1)
            out.append(self.head(prev))
        return out

    def load(self, checkpoint_dir: Path) -> None:
        """Continue from a checkpoint this class saved (original key layout)."""
        from safetensors.torch import load_file
        saved = {}
        for shard in sorted(Path(checkpoint_dir).glob("*.safetensors")):
            saved.update(load_file(shard))
        with torch.no_grad():
            for key, param in self.tensors().items():
                value = saved[key].float()
                if key.endswith("w13_dn.weight"):   # rows interleaved gate/up
                    block = self._owner(key)
                    block.w_gate.copy_(value[0::2])
                    block.w_up.copy_(value[1::2])
                else:
                    param.copy_(value)

    def _owner(self, key: str) -> Block:
        index = int(key.split(".")[3])
        return (self.mtp if key.startswith("model.mtp.") else self.blocks)[index]

    def save(self, out_dir: Path, dtype=torch.bfloat16, max_shard_bytes: int = 15_000_000) -> None:
        """Safetensors shards in the original key layout, an index, and config.json."""
        t = self.tensors()
        fp32 = ("sconv", "global_scale")   # kept fp32, as the reference keeps them
        tensors = {k: v.detach().to("cpu", torch.float32 if any(f in k for f in fp32) else dtype).contiguous()
                   for k, v in t.items()}
        self._write(out_dir, tensors, max_shard_bytes)

    def tensors(self) -> dict:
        """Checkpoint key -> tensor (parameters, or the interleaved w13 built from them)."""
        t = {"model.llm.embed.weight": self.embed, "model.llm.embed_norm.weight": self.embed_norm,
             "model.llm.norm.weight": self.norm, "model.llm.unembed.weight": self.unembed}
        for i, block in enumerate(self.blocks):
            t.update(block.state(f"model.llm.layers.{i}."))
        for k, block in enumerate(self.mtp):
            p = f"model.mtp.layers.{k}."
            t.update(block.state(p + "transformer_block."))
            t.update({p + "hidden_norm.weight": self.mtp_hidden_norm[k], p + "embed_norm.weight": self.mtp_embed_norm[k],
                      p + "input_proj.weight": self.mtp_proj[k]})
        for i, w in enumerate(self.vision):
            t[f"model.visual.layers.linear_{i}.weight"] = w
        for i, w in enumerate(self.vision_norms):
            t[f"model.visual.layers.norm_{i}.weight"] = w
        t.update({"model.visual.final_norm.weight": self.vision_final_norm, "model.audio.encoder.weight": self.audio_embed,
                  "model.audio.final_norm.weight": self.audio_norm})
        return t

    def _write(self, out_dir: Path, tensors: dict, max_shard_bytes: int) -> None:
        from safetensors.torch import save_file
        out_dir.mkdir(parents=True, exist_ok=True)
        shards, current, size = [], {}, 0
        for key in sorted(tensors):
            nbytes = tensors[key].numel() * tensors[key].element_size()
            if current and size + nbytes > max_shard_bytes:
                shards.append(current)
                current, size = {}, 0
            current[key], size = tensors[key], size + nbytes
        shards.append(current)
        weight_map = {}
        for n, shard in enumerate(shards, 1):
            name = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, out_dir / name, metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
        (out_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                         indent=1, sort_keys=True))
        (out_dir / "config.json").write_text(json.dumps(self.config_json(), indent=2, sort_keys=True))

    def config_json(self) -> dict:
        c, s = self.c, self.c.special
        text = {"model_type": "inkling_text", "vocab_size": c.vocab_size, "unpadded_vocab_size": c.unpadded_vocab_size,
                "hidden_size": c.hidden, "num_hidden_layers": c.layers,
                "layer_types": ["hybrid_sliding" if c.is_sliding(i) else "hybrid" for i in range(c.layers)],
                "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim,
                "swa_num_attention_heads": c.swa_heads, "swa_num_key_value_heads": c.swa_kv_heads,
                "swa_head_dim": c.swa_head_dim, "sliding_window_size": c.window, "d_rel": c.d_rel,
                "rel_extent": c.rel_extent, "log_scaling_n_floor": c.log_floor, "log_scaling_alpha": c.log_alpha,
                "intermediate_size": c.intermediate, "mlp_layer_types": ["dense"] * c.layers,
                "max_position_embeddings": c.max_positions, "rms_norm_eps": 1e-6, "logits_mup_width_multiplier": 24.0,
                "eos_token_id": s.get("eos"), "pad_token_id": s.get("pad"), "bos_token_id": None,
                "mtp_hidden_states_first": True}
        return {"model_type": "inkling_mm_model", "architectures": ["InklingForConditionalGeneration"],
                "text_config": text,
                "vision_config": {"model_type": "inkling_vision", "patch_size": c.patch_size, "temporal_patch_size": 2,
                                  "num_channels": 3, "n_layers": c.vision_layers},
                "audio_config": {"model_type": "inkling_audio", "n_mel_bins": 80, "mel_vocab_size": 256},
                "image_token_id": s.get("image"), "audio_token_id": s.get("audio"),
                "image_bos_token_id": s.get("image_bos"), "audio_bos_token_id": s.get("audio_bos"),
                "mtp_config": {"num_nextn_predict_layers": c.mtp_depths, "chain_hidden_post_norm": False,
                               "local_layer_ids": None},
                "torch_dtype": "bfloat16"}
