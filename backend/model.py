"""The Inkling text backbone, as transformers 5.23 computes it, over a paged KV cache.

Each layer: x += sconv_attn(attn(norm(x))); x += sconv_mlp(mlp(norm(x))). Every call takes a
`ForwardBatch` (built once per step by the runner) so a layer can be run alone in a test.
Tokens of all sequences are flattened into one row dimension T.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .block_pool import FULL, SLIDING
from .config import ModelConfig


@dataclass(frozen=True)
class SeqKeys:
    """The cached keys one sequence's queries may see in one cache group."""
    slots: torch.Tensor        # [L] flat cache slots
    positions: torch.Tensor    # [L] their token positions


@dataclass(frozen=True)
class SeqRows:
    row_start: int             # first row of this sequence in the flattened batch
    num_rows: int
    keys: dict[str, SeqKeys]   # per cache group


@dataclass(frozen=True)
class ForwardBatch:
    token_ids: torch.Tensor                 # [T]
    positions: torch.Tensor                 # [T]
    seqs: tuple[SeqRows, ...]
    write_slots: dict[str, torch.Tensor]    # per group, [T] cache slot of each new token
    conv_slots: torch.Tensor                # [B] each sequence's conv-state slot
    conv_window: torch.Tensor               # [T, K] rows of cat(states [B*(K-1)], x [T]) feeding each token
    conv_final: torch.Tensor                # [B, K-1] rows that become each sequence's new conv state
    snapshot_rows: torch.Tensor             # [S, K-1] conv states at block boundaries (prefix reuse)
    snapshot_slots: torch.Tensor            # [S] where those snapshots go


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # normalise in fp32, cast back, then scale (the reference's order)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class ConvState:
    """Short-convolution state of one conv: the last K-1 inputs per running sequence, plus snapshots
    at block boundaries so a reused prefix resumes with the right state. fp32, as the reference."""

    def __init__(self, channels: int, kernel: int, num_seq_slots: int, num_blocks: int, device):
        self.running = torch.zeros(num_seq_slots, kernel - 1, channels, dtype=torch.float32, device=device)
        self.snapshots = torch.zeros(num_blocks, kernel - 1, channels, dtype=torch.float32, device=device)


def short_conv(x: torch.Tensor, weight: torch.Tensor, state: ConvState, batch: ForwardBatch) -> torch.Tensor:
    """y = x + causal depthwise conv(x), kernel K, computed in fp32; tap K-1 multiplies the current token."""
    x32 = x.float()                                                    # [T, C]
    previous = state.running[batch.conv_slots].flatten(0, 1)           # [B*(K-1), C]
    rows = torch.cat([previous, x32])
    windows = rows[batch.conv_window]                                  # [T, K, C]
    y = (windows * weight.t()).sum(1)
    state.running[batch.conv_slots] = rows[batch.conv_final]
    if batch.snapshot_slots.numel():
        state.snapshots[batch.snapshot_slots] = rows[batch.snapshot_rows]
    return (x32 + y).to(x.dtype)


class KVCache:
    """Paged K/V per layer ([num_blocks * block_size, kv_heads, head_dim]) and the four conv states."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, num_seq_slots: int,
                 dtype: torch.dtype, device):
        self.block_size = block_size
        self.k, self.v, self.conv = [], [], []
        hidden, kernel = cfg.hidden_size, cfg.conv_kernel_size
        for i in range(cfg.num_layers):
            _, kv_heads, head_dim = cfg.attn_shape(cfg.is_sliding(i))
            shape = (num_blocks * block_size, kv_heads, head_dim)
            self.k.append(torch.zeros(shape, dtype=dtype, device=device))
            self.v.append(torch.zeros(shape, dtype=dtype, device=device))
            widths = (kv_heads * head_dim, kv_heads * head_dim, hidden, hidden)   # k, v, attn out, mlp out
            self.conv.append([ConvState(c, kernel, num_seq_slots, num_blocks, device) for c in widths])

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        total = 0
        for i in range(cfg.num_layers):
            _, kv_heads, head_dim = cfg.attn_shape(cfg.is_sliding(i))
            total += 2 * block_size * kv_heads * head_dim * itemsize
            total += (cfg.conv_kernel_size - 1) * (2 * kv_heads * head_dim + 2 * cfg.hidden_size) * 4
        return total


class Attention:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor]):
        self.sliding = cfg.is_sliding(layer)
        self.group = SLIDING if self.sliding else FULL
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.attn_shape(self.sliding)
        self.window = cfg.sliding_window
        self.extent = cfg.sliding_window if self.sliding else cfg.rel_extent
        self.log_floor = None if self.sliding else cfg.log_scaling_n_floor
        self.log_alpha = cfg.log_scaling_alpha
        self.eps, self.d_rel = cfg.rms_norm_eps, cfg.d_rel
        p = f"layers.{layer}.attn."
        self.wq, self.wk, self.wv, self.wr, self.wo = (w[p + n] for n in ("wq", "wk", "wv", "wr", "wo"))
        self.q_norm, self.k_norm, self.rel_proj = w[p + "q_norm"], w[p + "k_norm"], w[p + "rel_proj"]
        self.k_sconv, self.v_sconv = w[p + "k_sconv"], w[p + "v_sconv"]

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 conv: list[ConvState]) -> torch.Tensor:
        T = x.shape[0]
        q = rms_norm((x @ self.wq.t()).view(T, self.num_heads, self.head_dim), self.q_norm, self.eps)
        k = short_conv(x @ self.wk.t(), self.k_sconv, conv[0], batch).view(T, self.num_kv_heads, self.head_dim)
        v = short_conv(x @ self.wv.t(), self.v_sconv, conv[1], batch).view(T, self.num_kv_heads, self.head_dim)
        k = rms_norm(k, self.k_norm, self.eps)
        r = (x @ self.wr.t()).view(T, self.num_heads, self.d_rel)
        slots = batch.write_slots[self.group]
        k_cache[slots] = k
        v_cache[slots] = v
        out = torch.empty_like(q)
        for seq in batch.seqs:
            rows = slice(seq.row_start, seq.row_start + seq.num_rows)
            keys = seq.keys[self.group]
            out[rows] = self._attend(q[rows], r[rows], batch.positions[rows], k_cache[keys.slots],
                                     v_cache[keys.slots], keys.positions)
        return out.flatten(1) @ self.wo.t()

    def _attend(self, q, r, q_pos, k, v, k_pos):
        """q [n, H, d], r [n, H, d_rel], k/v [L, KVH, d] -> [n, H, d]."""
        n, L = q.shape[0], k.shape[0]
        distance = q_pos[:, None] - k_pos[None, :]                                  # [n, L]
        table = r @ self.rel_proj                                                   # [n, H, extent]
        index = distance.clamp(0, self.extent - 1)[:, None, :].expand(n, self.num_heads, L)
        bias = table.gather(-1, index).masked_fill(((distance < 0) | (distance >= self.extent))[:, None, :], 0.0)
        if self.log_floor is not None:  # log scaling of q and bias, in fp32
            tau = 1.0 + self.log_alpha * torch.log(((q_pos + 1).float() / self.log_floor).clamp(min=1.0))
            q = (q.float() * tau[:, None, None]).to(q.dtype)
            bias = (bias.float() * tau[:, None, None]).to(bias.dtype)
        groups = self.num_heads // self.num_kv_heads
        qg = q.view(n, self.num_kv_heads, groups, self.head_dim).permute(1, 2, 0, 3)   # [KVH, g, n, d]
        scores = (qg @ k.permute(1, 2, 0)[:, None]) * (1.0 / self.head_dim)                     # [KVH, g, n, L]
        scores = scores.reshape(self.num_heads, n, L) + bias.transpose(0, 1)
        hidden = distance < 0
        if self.sliding:
            hidden = hidden | (distance >= self.window)
        scores = scores.masked_fill(hidden[None], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = probs.view(self.num_kv_heads, groups, n, L) @ v.permute(1, 0, 2)[:, None]   # [KVH, g, n, d]
        return out.reshape(self.num_heads, n, self.head_dim).transpose(0, 1)


class DenseMLP:
    def __init__(self, p: str, w: dict[str, torch.Tensor]):
        self.gate, self.up, self.down = w[p + "w_gate"], w[p + "w_up"], w[p + "w_down"]
        self.global_scale = w[p + "global_scale"]

    def __call__(self, x):
        return ((F.silu(x @ self.gate.t()) * (x @ self.up.t())) @ self.down.t()) * self.global_scale


class MoE:
    """Sigmoid router over routed + shared experts; shared experts act as the weight sink."""

    def __init__(self, cfg: ModelConfig, p: str, w: dict[str, torch.Tensor]):
        self.top_k, self.num_shared, self.route_scale = cfg.num_experts_per_tok, cfg.n_shared_experts, cfg.route_scale
        self.router, self.router_bias, self.router_scale = w[p + "router"], w[p + "router_bias"], w[p + "router_scale"]
        self.gate, self.up, self.down = w[p + "experts_gate"], w[p + "experts_up"], w[p + "experts_down"]
        self.shared_gate, self.shared_up, self.shared_down = w[p + "shared_gate"], w[p + "shared_up"], w[p + "shared_down"]

    def __call__(self, x):
        logits = x.float() @ self.router.float().t()                      # [T, E + S], fp32 routing
        routed, shared = logits[:, :-self.num_shared], logits[:, -self.num_shared:]
        chosen = torch.topk(routed.sigmoid() + self.router_bias, self.top_k, dim=-1, sorted=False).indices
        log_w = F.logsigmoid(torch.cat([routed.gather(-1, chosen), shared], dim=-1))
        weights = torch.exp(log_w - torch.logsumexp(log_w, dim=-1, keepdim=True))
        weights = (weights * self.route_scale * self.router_scale).to(x.dtype)
        routed_w, shared_w = weights[:, :self.top_k], weights[:, self.top_k:]   # [T, k], [T, S]

        out = torch.zeros_like(x)
        for expert in chosen.unique().tolist():
            token, slot = torch.where(chosen == expert)
            h = x[token]
            h = (F.silu(h @ self.gate[expert].t()) * (h @ self.up[expert].t())) @ self.down[expert].t()
            out.index_add_(0, token, h * routed_w[token, slot, None])
        shared_out = torch.zeros_like(x, dtype=torch.float32)
        for s in range(self.num_shared):
            h = F.silu(x @ self.shared_gate[s].t()) * (x @ self.shared_up[s].t()) * shared_w[:, s, None]
            shared_out += h @ self.shared_down[s].t()
        return out + shared_out.to(x.dtype)


class InklingTextModel:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.embed_table, self.embed_norm, self.final_norm = w["embed"], w["embed_norm"], w["norm"]
        self.unembed = w["unembed"][:cfg.unpadded_vocab_size]
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            mlp = DenseMLP(p + "mlp.", w) if cfg.mlp_layer_types[i] == "dense" else MoE(cfg, p + "mlp.", w)
            self.layers.append((w[p + "attn_norm"], Attention(cfg, i, w), w[p + "attn_sconv"],
                                w[p + "mlp_norm"], mlp, w[p + "mlp_sconv"]))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return rms_norm(self.embed_table[token_ids], self.embed_norm, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache, inputs_embeds: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Final normed hidden states [T, hidden] for the batch's new tokens, caches updated."""
        eps = self.cfg.rms_norm_eps
        x = self.embed(batch.token_ids) if inputs_embeds is None else inputs_embeds
        for i, (attn_norm, attn, attn_sconv, mlp_norm, mlp, mlp_sconv) in enumerate(self.layers):
            conv = cache.conv[i]
            h = attn(rms_norm(x, attn_norm, eps), batch, cache.k[i], cache.v[i], conv)
            x = x + short_conv(h, attn_sconv, conv[2], batch)
            x = x + short_conv(mlp(rms_norm(x, mlp_norm, eps)), mlp_sconv, conv[3], batch)
        return rms_norm(x, self.final_norm, eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """muP-divided head, first `unpadded_vocab_size` columns; [N, hidden] -> [N, vocab]."""
        return (hidden / self.cfg.logits_mup_width_multiplier) @ self.unembed.t()


