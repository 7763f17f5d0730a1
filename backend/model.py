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
    candidate_rows: torch.Tensor            # [N, K-1] conv states a sequence may end this step with
    candidate_slots: torch.Tensor           # [N] where they wait (slot * MAX_CANDIDATES + i) until commit
    snapshot_rows: torch.Tensor             # [S, K-1] conv states at block boundaries (prefix reuse)
    snapshot_slots: torch.Tensor            # [S] where those snapshots go
    position_offset: int = 0                # added to positions for log scaling (MTP depth k runs k+1 ahead)


# A step that verifies k drafts may end a sequence after any of its k+1 last tokens.
MAX_CANDIDATES = 9


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # normalise in fp32, cast back, then scale (the reference's order)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class ConvState:
    """Short-convolution state of one conv: the last K-1 inputs per running sequence; the candidate
    states of this step (one per place a speculative step may stop), committed once acceptance is
    known; and snapshots at block boundaries so a reused prefix resumes with the right state.
    fp32, as the reference."""

    def __init__(self, channels: int, kernel: int, num_seq_slots: int, num_blocks: int, device):
        self.running = torch.zeros(num_seq_slots, kernel - 1, channels, dtype=torch.float32, device=device)
        self.candidates = torch.zeros(num_seq_slots * MAX_CANDIDATES, kernel - 1, channels, dtype=torch.float32,
                                      device=device)
        self.snapshots = torch.zeros(num_blocks, kernel - 1, channels, dtype=torch.float32, device=device)


def short_conv(x: torch.Tensor, weight: torch.Tensor, state: ConvState, batch: ForwardBatch) -> torch.Tensor:
    """y = x + causal depthwise conv(x), kernel K, computed in fp32; tap K-1 multiplies the current token."""
    x32 = x.float()                                                    # [T, C]
    previous = state.running[batch.conv_slots].flatten(0, 1)           # [B*(K-1), C]
    rows = torch.cat([previous, x32])
    windows = rows[batch.conv_window]                                  # [T, K, C]
    y = (windows * weight.t()).sum(1)
    state.candidates[batch.candidate_slots] = rows[batch.candidate_rows]
    if batch.snapshot_slots.numel():
        state.snapshots[batch.snapshot_slots] = rows[batch.snapshot_rows]
    return (x32 + y).to(x.dtype)


@dataclass
class LayerCache:
    k: torch.Tensor                 # [num_blocks * block_size, kv_heads, head_dim]
    v: torch.Tensor
    conv: list[ConvState]           # k, v, attention output, MLP output


class KVCache:
    """Paged K/V and the four conv states of every layer: the backbone's, then one per MTP draft
    position (virtual depth) the engine may run."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, num_seq_slots: int,
                 dtype: torch.dtype, device, num_mtp_positions: int = 0):
        self.block_size = block_size

        def layer(sliding: bool) -> LayerCache:
            _, kv_heads, head_dim = cfg.attn_shape(sliding)
            shape = (num_blocks * block_size, kv_heads, head_dim)
            widths = (kv_heads * head_dim, kv_heads * head_dim, cfg.hidden_size, cfg.hidden_size)
            return LayerCache(torch.zeros(shape, dtype=dtype, device=device),
                              torch.zeros(shape, dtype=dtype, device=device),
                              [ConvState(c, cfg.conv_kernel_size, num_seq_slots, num_blocks, device) for c in widths])
        self.layers = [layer(cfg.is_sliding(i)) for i in range(cfg.num_layers)]
        self.mtp_layers = [layer(cfg.is_mtp_sliding(j)) for j in range(num_mtp_positions)]

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype, num_mtp_positions: int = 0) -> int:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        sliding = [cfg.is_sliding(i) for i in range(cfg.num_layers)]
        sliding += [cfg.is_mtp_sliding(j) for j in range(num_mtp_positions)]
        total = 0
        for is_sliding in sliding:
            _, kv_heads, head_dim = cfg.attn_shape(is_sliding)
            total += 2 * block_size * kv_heads * head_dim * itemsize
            total += (cfg.conv_kernel_size - 1) * (2 * kv_heads * head_dim + 2 * cfg.hidden_size) * 4
        return total

    @staticmethod
    def commit_conv(layers: list[LayerCache], slots: torch.Tensor, chosen: torch.Tensor) -> None:
        """Each sequence keeps the candidate conv state of where its step really ended."""
        for layer in layers:
            for state in layer.conv:
                state.running[slots] = state.candidates[chosen]


class Attention:
    def __init__(self, cfg: ModelConfig, p: str, sliding: bool, w: dict[str, torch.Tensor], group: str | None = None):
        self.sliding = sliding
        self.group = group or (SLIDING if sliding else FULL)
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.attn_shape(self.sliding)
        self.window = cfg.sliding_window
        self.extent = cfg.sliding_window if self.sliding else cfg.rel_extent
        self.log_floor = None if self.sliding else cfg.log_scaling_n_floor
        self.log_alpha = cfg.log_scaling_alpha
        self.eps, self.d_rel = cfg.rms_norm_eps, cfg.d_rel
        self.wq, self.wk, self.wv, self.wr, self.wo = (w[p + n] for n in ("wq", "wk", "wv", "wr", "wo"))
        self.q_norm, self.k_norm, self.rel_proj = w[p + "q_norm"], w[p + "k_norm"], w[p + "rel_proj"]
        self.k_sconv, self.v_sconv = w[p + "k_sconv"], w[p + "v_sconv"]

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache) -> torch.Tensor:
        T = x.shape[0]
        q = rms_norm((x @ self.wq.t()).view(T, self.num_heads, self.head_dim), self.q_norm, self.eps)
        k = short_conv(x @ self.wk.t(), self.k_sconv, cache.conv[0], batch).view(T, self.num_kv_heads, self.head_dim)
        v = short_conv(x @ self.wv.t(), self.v_sconv, cache.conv[1], batch).view(T, self.num_kv_heads, self.head_dim)
        k = rms_norm(k, self.k_norm, self.eps)
        r = (x @ self.wr.t()).view(T, self.num_heads, self.d_rel)
        slots = batch.write_slots[self.group]
        cache.k[slots] = k
        cache.v[slots] = v
        out = torch.empty_like(q)
        for seq in batch.seqs:
            rows = slice(seq.row_start, seq.row_start + seq.num_rows)
            keys = seq.keys[self.group]
            out[rows] = self._attend(q[rows], r[rows], batch.positions[rows], cache.k[keys.slots],
                                     cache.v[keys.slots], keys.positions, batch.position_offset)
        return out.flatten(1) @ self.wo.t()

    def _attend(self, q, r, q_pos, k, v, k_pos, offset: int):
        """q [n, H, d], r [n, H, d_rel], k/v [L, KVH, d] -> [n, H, d]. The bias needs only distances;
        log scaling needs true positions, `offset` ahead of the cache positions (MTP depths)."""
        n, L = q.shape[0], k.shape[0]
        distance = q_pos[:, None] - k_pos[None, :]                                  # [n, L]
        table = r @ self.rel_proj                                                   # [n, H, extent]
        index = distance.clamp(0, self.extent - 1)[:, None, :].expand(n, self.num_heads, L)
        bias = table.gather(-1, index).masked_fill(((distance < 0) | (distance >= self.extent))[:, None, :], 0.0)
        if self.log_floor is not None:  # log scaling of q and bias, in fp32
            tau = 1.0 + self.log_alpha * torch.log(((q_pos + offset + 1).float() / self.log_floor).clamp(min=1.0))
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


class DecoderLayer:
    """x += sconv_attn(attn(norm(x))); x += sconv_mlp(mlp(norm(x)))."""

    def __init__(self, cfg: ModelConfig, p: str, w: dict[str, torch.Tensor], sliding: bool, dense: bool,
                 group: str | None = None):
        self.eps = cfg.rms_norm_eps
        self.attn_norm, self.mlp_norm = w[p + "attn_norm"], w[p + "mlp_norm"]
        self.attn_sconv, self.mlp_sconv = w[p + "attn_sconv"], w[p + "mlp_sconv"]
        self.attn = Attention(cfg, p + "attn.", sliding, w, group)
        self.mlp = DenseMLP(p + "mlp.", w) if dense else MoE(cfg, p + "mlp.", w)

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache) -> torch.Tensor:
        h = self.attn(rms_norm(x, self.attn_norm, self.eps), batch, cache)
        x = x + short_conv(h, self.attn_sconv, cache.conv[2], batch)
        return x + short_conv(self.mlp(rms_norm(x, self.mlp_norm, self.eps)), self.mlp_sconv, cache.conv[3], batch)


class InklingTextModel:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.embed_table, self.embed_norm, self.final_norm = w["embed"], w["embed_norm"], w["norm"]
        self.unembed = w["unembed"][:cfg.unpadded_vocab_size]
        self.layers = [DecoderLayer(cfg, f"layers.{i}.", w, cfg.is_sliding(i), cfg.mlp_layer_types[i] == "dense")
                       for i in range(cfg.num_layers)]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return rms_norm(self.embed_table[token_ids], self.embed_norm, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache, inputs_embeds: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Final normed hidden states [T, hidden] for the batch's new tokens, caches updated."""
        x = self.embed(batch.token_ids) if inputs_embeds is None else inputs_embeds
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer(x, batch, layer_cache)
        return rms_norm(x, self.final_norm, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """muP-divided head, first `unpadded_vocab_size` columns; [N, hidden] -> [N, vocab]."""
        return (hidden / self.cfg.logits_mup_width_multiplier) @ self.unembed.t()
