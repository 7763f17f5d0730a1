"""Inkling's image and audio encoders: what turns pixels and dMel bins into rows of the text width.

Vision: a hierarchical patch MLP. Each stage folds time and space into depth (t x hw x hw
neighbours become one vector), projects it (no bias), and except for the last stage applies
RMSNorm then GELU; the last stage projects to the text width, then a final RMSNorm. One token per
patch. The stage plan (fold factors and widths) follows transformers' `plan_out_scales`.
Audio: each frame's 80 dMel bins pick rows of one embedding table (bin + 256 * mel index), summed,
then RMSNorm.
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

from .model import rms_norm

VISION_EPS = AUDIO_EPS = 1e-6


def prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors + ([n] if n > 1 else [])


def plan_stages(patch_size: int, temporal_patch_size: int, num_layers: int, channels: int) -> list[tuple]:
    """(t, h, w, c) at the input of each stage and after the last: spatial folds first, then temporal,
    placed where the log of the folded size best follows a straight line from 1 to a whole patch."""
    h = list(itertools_cumprod(prime_factors(patch_size)[::-1]))
    t = list(itertools_cumprod(prime_factors(temporal_patch_size)[::-1]))
    candidates = [(1, 1, 1, channels)]
    candidates += [(1, x, x, math.ceil(x * x * channels / 64) * 64) for x in h]
    # the reference writes this width without dividing by 64 before rounding; kept for parity
    candidates += [(y, h[-1], h[-1], math.ceil(h[-1] ** 2 * channels * y) * 64) for y in t]
    sizes = torch.tensor([float(a * b * c) for a, b, c, _ in candidates])
    ideal = torch.linspace(0, math.log(patch_size * patch_size * temporal_patch_size * channels), num_layers + 1)
    cost = (ideal[:, None] - torch.log(sizes)[None, :]).abs()
    if num_layers >= len(candidates):
        chosen = cost.argmin(dim=1).tolist()
    else:   # fewer stages than candidate scales: the best one-to-one assignment
        from scipy.optimize import linear_sum_assignment
        chosen = linear_sum_assignment(cost.numpy())[1].tolist()
    chosen[0], chosen[-1] = 0, len(candidates) - 1
    return [candidates[i] for i in chosen]


def itertools_cumprod(values: list[int]):
    total = 1
    for v in values:
        total *= v
        yield total


class VisionTower:
    def __init__(self, vision_cfg: dict, text_hidden: int, w: dict[str, torch.Tensor]):
        self.patch_size = int(vision_cfg.get("patch_size", 40))
        temporal = int(vision_cfg.get("temporal_patch_size", 2))
        num_layers = int(vision_cfg.get("n_layers", vision_cfg.get("num_hidden_layers", 24)))
        stages = plan_stages(self.patch_size, temporal, num_layers, int(vision_cfg.get("num_channels", 3)))
        self.stages = []
        for i, (start, end) in enumerate(zip(stages[:-1], stages[1:])):
            t_fold, hw_fold = end[0] // start[0], end[1] // start[1]
            weight = w[f"vision.{i}.linear"]
            last = i == num_layers - 1
            expected = (text_hidden if last else end[3], start[3] * t_fold * hw_fold * hw_fold)
            if tuple(weight.shape) != expected:
                raise ValueError(f"vision stage {i} weight has shape {tuple(weight.shape)} but the config's plan "
                                 f"implies {expected}; vision_config does not match the checkpoint.")
            self.stages.append((t_fold, hw_fold, weight, None if last else w[f"vision.{i}.norm"]))
        self.final_norm = w["vision.final_norm"]

    @staticmethod
    def fold(x: torch.Tensor, t: int, hw: int) -> torch.Tensor:
        """(B, T, H, W, C) -> (B, T/t, H/hw, W/hw, t*hw*hw*C), neighbours ordered (t, h, w, c)."""
        B, T, H, W, C = x.shape
        x = x.reshape(B, T // t, t, H // hw, hw, W // hw, hw, C).permute(0, 1, 3, 5, 2, 4, 6, 7)
        return x.reshape(B, T // t, H // hw, W // hw, t * hw * hw * C)

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, T, P, P, 3] patches -> [N, text_hidden], one row per patch."""
        x = pixel_values
        for t_fold, hw_fold, weight, norm in self.stages:
            if t_fold > 1 or hw_fold > 1:
                x = self.fold(x, t_fold, hw_fold)
            x = x @ weight.t()
            if norm is not None:
                x = F.gelu(rms_norm(x, norm, VISION_EPS))
        return rms_norm(x, self.final_norm, VISION_EPS).reshape(pixel_values.shape[0], -1)


class AudioEmbedding:
    def __init__(self, audio_cfg: dict, w: dict[str, torch.Tensor]):
        self.num_mels = int(audio_cfg.get("n_mel_bins", 80))
        self.bins_per_mel = int(audio_cfg.get("mel_vocab_size", 256))
        self.table, self.norm = w["audio.embed"], w["audio.norm"]
        if self.table.shape[0] != self.num_mels * self.bins_per_mel:
            raise ValueError(f"audio embedding has {self.table.shape[0]} rows but audio_config implies "
                             f"{self.num_mels} x {self.bins_per_mel}.")

    @torch.inference_mode()
    def __call__(self, bins: torch.Tensor) -> torch.Tensor:
        """[frames, num_mels] dMel bin indices -> [frames, text_hidden]."""
        offsets = torch.arange(self.num_mels, device=bins.device) * self.bins_per_mel
        return rms_norm(self.table[bins + offsets].sum(dim=-2), self.norm, AUDIO_EPS)


# checkpoint key -> engine name, for the original layout and transformers' module names
TOWER_KEYS = [
    (re.compile(r"^model\.visual\.layers\.linear_(\d+)\.weight$"), r"vision.\1.linear"),
    (re.compile(r"^model\.visual\.layers\.norm_(\d+)\.weight$"), r"vision.\1.norm"),
    (re.compile(r"^model\.visual\.final_norm\.weight$"), "vision.final_norm"),
    (re.compile(r"^model\.vision_tower\.encoder_layers\.(\d+)\.projection\.weight$"), r"vision.\1.linear"),
    (re.compile(r"^model\.vision_tower\.encoder_layers\.(\d+)\.layer_norm\.weight$"), r"vision.\1.norm"),
    (re.compile(r"^model\.vision_tower\.final_norm\.weight$"), "vision.final_norm"),
    (re.compile(r"^model\.audio\.encoder\.weight$"), "audio.embed"),
    (re.compile(r"^model\.audio\.final_norm\.weight$"), "audio.norm"),
    (re.compile(r"^model\.audio_tower\.embed_audio_tokens\.embed_audio_tokens\.weight$"), "audio.embed"),
    (re.compile(r"^model\.audio_tower\.norm\.weight$"), "audio.norm"),
]


def tower_name(key: str) -> str | None:
    for pattern, target in TOWER_KEYS:
        if pattern.match(key):
            return pattern.sub(target, key)
    return None
