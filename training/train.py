"""Train the shipped inkling-tiny on the packed data of scripts/build_data.py; one GPU, bf16 autocast.

    python training/train.py --data data/pack --out runs/tiny [--minutes 8] [--resume runs/tiny/state.pt]

Loss: next-token cross-entropy on every text token (chat answers, prose and stories) and on the model's
answers in image and audio chats (with --history, some after earlier exchanges), plus, for each MTP depth
k, the cross-entropy of predicting token i+k+2 at position i (weight 0.3) on the same tokens. Writes the checkpoint (bf16 shards <= 15 MB, config.json) and, with
--save-state, the weights and optimizer state to resume from.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
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
MESSAGE_MODEL, EOS, PAD, IMAGE, AUDIO = 1, 10, 13, 11, 12


def patchify(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """uint8 [H, W, 3] -> [N, P, P, 3] as the engine's backend/media.py makes them: pad with -1 on the
    0-255 scale to ceil(H/P) rows x (floor(W/P) + 1) columns of patches, then (x - 255 mean) / (255 std).
    (The tower sees each patch repeated as 2 frames: Chats.batch does that.)"""
    H, W, _ = pixels.shape
    rows, cols = -(-H // patch), W // patch + 1
    canvas = torch.full((rows * patch, cols * patch, 3), -1.0)
    canvas[:H, :W] = pixels.float()
    canvas = (canvas - CLIP_MEAN * 255) / (CLIP_STD * 255)
    patches = canvas.reshape(rows, patch, cols, patch, 3).permute(0, 2, 1, 3, 4).reshape(-1, patch, patch, 3)
    return patches


def load_pack(path: Path, kind: str, patch: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(token ids per example, media per example: image patches [N, P, P, 3] or dMel frames [F, 80])."""
    d = {k: v for k, v in np.load(path).items()}   # decompress each array once
    ids = [torch.from_numpy(d["input_ids"][a:b].astype(np.int64)) for a, b in zip(d["id_offsets"][:-1], d["id_offsets"][1:])]
    if kind == "image":
        media = [patchify(torch.from_numpy(d["pixels"][a:b].reshape(h, w, 3)), patch)
                 for a, b, h, w in zip(d["pixel_offsets"][:-1], d["pixel_offsets"][1:], d["heights"], d["widths"])]
    else:   # two 4-bit dMel bins per byte
        packed = torch.from_numpy(d["bins_packed"].astype(np.int64))
        bins = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
        media = [bins[a:b] for a, b in zip(d["frame_offsets"][:-1], d["frame_offsets"][1:])]
    return ids, media


ROLE_MARKERS = (0, 1, 2, 3)   # <|message_user|>, <|message_model|>, <|message_system|>, <|message_tool|>


def answer_mask(ids: torch.Tensor) -> torch.Tensor:
    """True at the tokens of every model turn (after its <|message_model|>, up to the next role marker):
    the loss covers all of a chat's answers, the first one (which names the image) included."""
    is_marker = torch.isin(ids, torch.tensor(ROLE_MARKERS))
    turn = torch.cumsum(is_marker.long(), 0)                    # which turn each token is in
    marker_of_turn = torch.cat([torch.tensor([-1]), ids[is_marker]])
    return (marker_of_turn[turn] == MESSAGE_MODEL) & ~is_marker


class Chats:
    """Chats for the media loss: each row is up to `max_history` earlier exchanges (a text chat, an image
    chat or an audio chat, drawn at random) and then one image or audio chat. The wire format concatenates
    (each message delimits itself), so a row is its chats' ids end to end; the media rows follow in order.
    Without history the model only learns to answer about the first picture of a conversation."""

    HISTORY = ("text", "image", "audio")

    def __init__(self, pools: dict[str, tuple[list[torch.Tensor], list, str]], seed: int):
        self.pools = pools      # name -> (ids per chat, media per chat (None for text), "image"/"audio"/"text")
        self.rng = random.Random(seed)

    def pick(self, kind: str) -> tuple[str, int]:
        return kind, self.rng.randrange(len(self.pools[kind][0]))

    def rows(self, kind: str, size: int, history_prob: float, max_history: int = 2) -> list[list[tuple[str, int]]]:
        rows = []
        for _ in range(size):
            n = self.rng.randint(1, max_history) if self.rng.random() < history_prob else 0
            rows.append([self.pick(self.rng.choice(self.HISTORY)) for _ in range(n)] + [self.pick(kind)])
        return rows

    def batch(self, model: Inkling, rows: list[list[tuple[str, int]]], device, extra_columns: int = 0):
        """(ids [B, T + extra_columns] padded, media rows, their flat positions in ids, loss mask [B, T], lengths)."""
        seqs = [torch.cat([self.pools[kind][0][i] for kind, i in row]) for row in rows]
        lengths = torch.tensor([len(x) for x in seqs])
        ids = torch.full((len(seqs), int(lengths.max()) + extra_columns), PAD, dtype=torch.long)
        mask = torch.zeros((len(seqs), int(lengths.max())), dtype=torch.bool)
        for r, seq in enumerate(seqs):
            ids[r, :len(seq)] = seq
            mask[r, :len(seq)] = answer_mask(seq)
        ids, mask = ids.to(device), mask.to(device)
        media_rows, index = [], []
        for kind, placeholder in (("image", IMAGE), ("audio", AUDIO)):
            items = [self.pools[k][1][i] for row in rows for k, i in row if self.pools[k][2] == kind]
            if items:   # row-major order of the placeholders = the order of the items
                x = torch.cat(items).to(device)
                media_rows.append(model.encode_images(x[:, None].expand(-1, 2, -1, -1, -1)) if kind == "image"
                                  else model.encode_audio(x))     # each image patch seen as 2 frames
                index.append((ids == placeholder).flatten().nonzero().squeeze(1))
        return ids, torch.cat(media_rows), torch.cat(index), mask, lengths.to(device)

    def training_batch(self, model: Inkling, kind: str, size: int, history_prob: float, device):
        ids, media_rows, index, mask, _ = self.batch(model, self.rows(kind, size, history_prob), device)
        # losses() feeds ids[:, :-1]: keep the placeholders that fall inside it
        width = ids.shape[1]
        keep = index % width < width - 1
        index = index[keep] - index[keep] // width   # flat positions in ids[:, :-1]
        return ids, media_rows[keep], index, mask


def text_chats(data: Path, max_tokens: int = 256) -> list[torch.Tensor]:
    """The chat documents of the text pack (each a complete chat in the wire format) of at most
    `max_tokens` tokens (99% of them), to keep history rows short."""
    tokens = np.fromfile(data / "text_train.bin", dtype=np.uint16)
    index = np.load(data / "text_index.npz")
    return [torch.from_numpy(tokens[o:o + n].astype(np.int64))
            for o, n, chat in zip(index["train_offsets"], index["train_lengths"], index["train_is_chat"]) if chat and n <= max_tokens]


def fresh_images(data: Path, patch: int, count: int, seed: str, validation: bool = False):
    """Render `count` new single-shape images with the data builder's own code (scripts/build_data.py),
    never one of the held-out images. Training chats by default; with `validation`, held-out-style
    questions (ids end at the generation prompt) and their labels."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import build_data
    from backend.tokenizer import ChatTokenizer
    tokenizer = ChatTokenizer.from_model_dir(data)
    held = np.load(data / "images_heldout.npz")
    pixels, offsets = held["pixels"], held["pixel_offsets"]
    exclude = {pixels[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])}
    rng = random.Random(seed)
    items = (build_data.shape_questions if validation else build_data.shape_conversations)(rng, count, exclude)
    ids, media = [], []
    for item in items:
        pixels = np.asarray(item["image"], dtype=np.uint8)
        n = build_data.image_tokens(pixels.shape[0], pixels.shape[1], patch)
        messages = item["conversation"][:1] if validation else item["conversation"]
        ids.append(torch.tensor(build_data.chat_ids(tokenizer, messages, [n], generation_prompt=validation)))
        media.append(patchify(torch.from_numpy(pixels.copy()), patch))
    return ids, media, [item["label"] for item in items], tokenizer


@torch.no_grad()
def image_accuracy(model: Inkling, chats: Chats, rows: list[list[tuple[str, int]]], labels: list[dict], tokenizer,
                   max_tokens: int = 12) -> float:
    """Greedy answers to validation questions (each row ends at the generation prompt), scored as
    training/evaluate.py scores the held-out set: right when the answer names the shape and the colour."""
    model.eval()
    device = next(model.parameters()).device
    ids, media_rows, index, _, lengths = chats.batch(model, rows, device, extra_columns=max_tokens)
    B = len(rows)
    answers = torch.zeros((B, max_tokens), dtype=torch.long, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        for t in range(max_tokens):
            _, logits = model(ids, media_rows, index)
            nxt = logits[torch.arange(B), lengths - 1, :model.c.unpadded_vocab_size].argmax(-1)
            ids[torch.arange(B), lengths] = nxt
            answers[:, t] = nxt
            lengths += 1
    model.train()
    correct = 0
    for label, answer in zip(labels, answers.tolist()):
        text = tokenizer.decode(answer[:answer.index(EOS)] if EOS in answer else answer).lower()
        correct += label["shape"] in text and label["colour"] in text
    return correct / B


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
    parser.add_argument("--image-batch", type=int, help="images per step (default: --media-batch)")
    parser.add_argument("--fresh-images", type=int, default=0, help="render this many more single-shape chats")
    parser.add_argument("--history", type=float, default=0.0,
                        help="share of media chats that come after 1-2 earlier exchanges (text, image or audio chats)")
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
    ids, media = load_pack(args.data / "images_train.npz", "image", config.patch_size)
    if args.fresh_images:
        more_ids, more_media, _, _ = fresh_images(args.data, config.patch_size, args.fresh_images, seed=f"fresh-{step}")
        ids, media = ids + more_ids, media + more_media
    texts = text_chats(args.data)
    val_ids, val_media, val_labels, tokenizer = fresh_images(args.data, config.patch_size, 300, seed="validation", validation=True)
    chats = Chats({"image": (ids, media, "image"), "audio": (*load_pack(args.data / "audio_train.npz", "audio", config.patch_size), "audio"),
                   "text": (texts, [None] * len(texts), "text"), "val": (val_ids, val_media, "image")}, seed=step + 1)
    val_rows = {"alone": [[("val", i)] for i in range(len(val_ids))],
                "after_a_chat": [[chats.pick(random.Random(i).choice(Chats.HISTORY)), ("val", i)] for i in range(len(val_ids))]}
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
            # the MTP depths learn the answers about pictures and clips too, so they draft there as well
            image_loss, image_depth = losses(model, *chats.training_batch(model, "image", args.image_batch or args.media_batch, args.history, args.device))
            audio_loss, audio_depth = losses(model, *chats.training_batch(model, "audio", args.media_batch, args.history, args.device))
            loss = (loss + args.image_weight * (image_loss + MTP_WEIGHT * sum(image_depth))
                    + audio_loss + MTP_WEIGHT * sum(audio_depth))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            with torch.no_grad(), torch.autocast(args.device if args.device != "cpu" else "cpu", dtype=torch.bfloat16):
                v_main, v_depth = losses(model, val.batch(args.batch, args.device))
            entry = {"step": step, "minutes": round((time.time() - start) / 60, 2), "lr": lr, "loss": float(main_loss), "image_loss": float(image_loss),
                     "audio_loss": float(audio_loss), "image_mtp": [float(d) for d in image_depth],
                     "audio_mtp": [float(d) for d in audio_depth], "val_loss": float(v_main),
                     "val_ppl": math.exp(float(v_main)), "val_mtp": [float(d) for d in v_depth]}
            if step % 500 == 0:
                entry["val_image_accuracy"] = {name: image_accuracy(model, chats, rows, val_labels, tokenizer)
                                               for name, rows in val_rows.items()}
            log.append(entry)
            print(json.dumps(entry), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.save_state:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, args.out / "state.pt")
    model.save(args.out / "checkpoint")
    log.append({"step": step, "final_val_image_accuracy": {name: image_accuracy(model, chats, rows, val_labels, tokenizer)
                                                           for name, rows in val_rows.items()}})
    print(json.dumps(log[-1]))
    with open(args.out / "log.jsonl", "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in log)
    print(json.dumps({"done": step}))


if __name__ == "__main__":
    main()
