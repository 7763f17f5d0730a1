"""Train the shipped inkling-tiny on the packed data of scripts/build_data.py; one GPU, bf16 autocast.

    python training/train.py --data data/pack --out runs/tiny [--minutes 8] [--resume runs/tiny/state.pt]

Loss: next-token cross-entropy on every text token (chat answers, prose and stories) plus, for each MTP
depth k, the cross-entropy of predicting token i+k+2 at position i (weight 0.3), and captions /
transcripts after images and audio. Writes the checkpoint (bf16 shards <= 15 MB, config.json) and, with
--save-state, the weights and optimizer state to resume from.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from model import Inkling, TinyConfig

MTP_WEIGHT = 0.3


class TextStream:
    """Random windows of `length + 1` tokens from a flat uint16 token file."""

    def __init__(self, path: Path, length: int, seed: int):
        self.tokens = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
        self.length = length
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, size: int, device) -> torch.Tensor:
        starts = torch.randint(0, len(self.tokens) - self.length - 1, (size,), generator=self.gen)
        return torch.stack([self.tokens[s:s + self.length + 1] for s in starts.tolist()]).to(device)


CLIP_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073])
CLIP_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711])
MESSAGE_MODEL, PAD, IMAGE, AUDIO = 1, 13, 11, 12


def patchify(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """uint8 [H, W, 3] -> [N, 2, P, P, 3] as the engine's backend/media.py feeds the tower: pad with -1
    on the 0-255 scale to ceil(H/P) rows x (floor(W/P) + 1) columns of patches, then (x - 255 mean) /
    (255 std), each patch repeated as 2 frames."""
    H, W, _ = pixels.shape
    rows, cols = -(-H // patch), W // patch + 1
    canvas = torch.full((rows * patch, cols * patch, 3), -1.0)
    canvas[:H, :W] = pixels.float()
    canvas = (canvas - CLIP_MEAN * 255) / (CLIP_STD * 255)
    patches = canvas.reshape(rows, patch, cols, patch, 3).permute(0, 2, 1, 3, 4).reshape(-1, patch, patch, 3)
    return patches[:, None].expand(-1, 2, -1, -1, -1)


class Examples:
    """Chat examples with one image or one audio clip each (packed by scripts/build_data.py)."""

    def __init__(self, path: Path, kind: str, patch: int, seed: int):
        d = {k: v for k, v in np.load(path).items()}   # decompress each array once
        self.kind, self.patch = kind, patch
        self.ids = [torch.from_numpy(d["input_ids"][a:b].astype(np.int64))
                    for a, b in zip(d["id_offsets"][:-1], d["id_offsets"][1:])]
        if kind == "image":
            self.media = [torch.from_numpy(d["pixels"][a:b].reshape(h, w, 3))
                          for a, b, h, w in zip(d["pixel_offsets"][:-1], d["pixel_offsets"][1:], d["heights"], d["widths"])]
        else:   # two 4-bit dMel bins per byte
            packed = torch.from_numpy(d["bins_packed"].astype(np.int64))
            bins = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
            self.media = [bins[a:b] for a, b in zip(d["frame_offsets"][:-1], d["frame_offsets"][1:])]
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, model: Inkling, size: int, device):
        """(ids [B, T+1] padded, media rows, their flat positions in ids[:, :-1], loss mask)."""
        pick = torch.randint(0, len(self.ids), (size,), generator=self.gen).tolist()
        T = max(len(self.ids[i]) for i in pick)
        ids = torch.full((size, T), PAD, dtype=torch.long)
        mask = torch.zeros((size, T), dtype=torch.bool)
        for row, i in enumerate(pick):
            seq = self.ids[i]
            ids[row, :len(seq)] = seq
            answer = int((seq == MESSAGE_MODEL).nonzero()[-1]) + 1   # loss on the model's answer only
            mask[row, answer:len(seq)] = True
        ids, mask = ids.to(device), mask.to(device)
        if self.kind == "image":
            rows = model.encode_images(torch.cat([patchify(self.media[i], self.patch) for i in pick]).to(device))
        else:
            rows = model.encode_audio(torch.cat([self.media[i] for i in pick]).to(device))
        placeholder = IMAGE if self.kind == "image" else AUDIO
        index = (ids[:, :-1] == placeholder).flatten().nonzero().squeeze(1)
        return ids, rows, index, mask


def losses(model: Inkling, ids: torch.Tensor, media_rows=None, media_index=None, loss_mask=None):
    """(main loss, [MTP depth losses]) for a batch of sequences ids [B, T+1]."""
    inputs, targets = ids[:, :-1], ids[:, 1:]
    mask = loss_mask[:, 1:] if loss_mask is not None else torch.ones_like(targets, dtype=torch.bool)
    h, logits = model(inputs, media_rows, media_index)
    V = model.c.unpadded_vocab_size
    main = F.cross_entropy(logits[..., :V].float().flatten(0, 1), targets.flatten(), reduction="none")
    main = (main * mask.flatten()).sum() / mask.sum().clamp(min=1)
    depth_losses = []
    for k, depth_logits in enumerate(model.mtp_logits(h, inputs)):
        # depth k at position i predicts token i+k+2 of `ids`, i.e. targets[:, i+k+1]
        t = targets[:, k + 1:]
        m = mask[:, k + 1:]
        n = t.shape[1]
        l = F.cross_entropy(depth_logits[:, :n, :V].float().flatten(0, 1), t.flatten(), reduction="none")
        depth_losses.append((l * m.flatten()).sum() / m.sum().clamp(min=1))
    return main, depth_losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--init", type=Path, help="start from the weights of a saved checkpoint directory")
    parser.add_argument("--image-weight", type=float, default=1.0)
    parser.add_argument("--save-state", action="store_true", help="also write state.pt (weights + optimizer)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--media-batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--total-steps", type=int, default=10**9, help="stop after this many steps")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    vocab = json.loads((args.data / "tokenizer.json").read_text())
    size = max(t["id"] for t in vocab["added_tokens"]) + 1
    size = max(size, max(vocab["model"]["vocab"].values()) + 1)
    special = {"eos": 10, "pad": PAD, "image": IMAGE, "audio": AUDIO, "image_bos": 5, "audio_bos": 6}
    config = TinyConfig(vocab_size=-(-size // 64) * 64, unpadded_vocab_size=size, special=special)
    model = Inkling(config).to(args.device)
    if args.init:
        model.load(args.init)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    step = 0
    if args.resume and args.resume.exists():
        state = torch.load(args.resume, map_location=args.device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    stream = TextStream(args.data / "text_train.bin", args.length, seed=step)
    val = TextStream(args.data / "text_val.bin", args.length, seed=1)
    images = Examples(args.data / "images_train.npz", "image", config.patch_size, seed=step + 1)
    audio = Examples(args.data / "audio_train.npz", "audio", config.patch_size, seed=step + 2)
    start = time.time()
    budget = args.minutes * 60
    log = []
    while time.time() - start < budget and step < args.total_steps:
        # warm-up, then a cosine over the run's wall-clock budget (one device call is the whole run)
        progress = (time.time() - start) / budget
        lr = args.lr * min(1.0, (step + 1) / 200) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.autocast(args.device if args.device != "cpu" else "cpu", dtype=torch.bfloat16):
            main_loss, depth = losses(model, stream.batch(args.batch, args.device))
            loss = main_loss + MTP_WEIGHT * sum(depth)
            image_loss, _ = losses(model, *images.batch(model, args.media_batch, args.device))
            audio_loss, _ = losses(model, *audio.batch(model, args.media_batch, args.device))
            loss = loss + args.image_weight * image_loss + audio_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            with torch.no_grad(), torch.autocast(args.device if args.device != "cpu" else "cpu", dtype=torch.bfloat16):
                v_main, v_depth = losses(model, val.batch(args.batch, args.device))
            entry = {"step": step, "lr": lr, "loss": float(main_loss), "image_loss": float(image_loss),
                     "audio_loss": float(audio_loss), "val_loss": float(v_main),
                     "val_ppl": math.exp(float(v_main)), "val_mtp": [float(d) for d in v_depth]}
            log.append(entry)
            print(json.dumps(entry), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.save_state:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, args.out / "state.pt")
    model.save(args.out / "checkpoint")
    with open(args.out / "log.jsonl", "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in log)
    print(json.dumps({"done": step}))


if __name__ == "__main__":
    main()
