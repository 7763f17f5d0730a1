"""What a request feeds the model: token ids, and the image/audio rows that replace placeholders.

Chat messages are rendered in the Inkling wire format with one placeholder per image patch or audio
frame; raw prompt ids get each `<|content_image|>` / `<|content_audio_input|>` marker followed by the
next media item's placeholders (as vLLM's processor does). Media are decoded and encoded once, at
admission.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig
from .media import MediaError, load_audio, load_image
from .request import Request
from .tokenizer import ChatTokenizer
from .towers import AudioEmbedding, VisionTower


class RequestError(ValueError):
    """A request the engine refuses; the message says what to fix."""


@dataclass(frozen=True)
class MediaSpan:
    kind: str                   # "image" or "audio"
    start: int                  # position of its first placeholder
    num_tokens: int
    content_hash: bytes


@dataclass
class Prompt:
    token_ids: list[int]
    spans: list[MediaSpan]
    embeds: torch.Tensor | None     # [sum of span lengths, hidden], spans in order
    notes: list[str]                # e.g. an image downscaled to fit the token cap

    def count(self, kind: str) -> int:
        return sum(s.num_tokens for s in self.spans if s.kind == kind)


class PromptBuilder:
    def __init__(self, cfg: ModelConfig, tokenizer: ChatTokenizer | None, vision: VisionTower | None,
                 audio: AudioEmbedding | None, dtype: torch.dtype, device: torch.device,
                 max_image_tokens: int, max_audio_seconds: float):
        self.cfg, self.tokenizer, self.vision, self.audio = cfg, tokenizer, vision, audio
        self.dtype, self.device = dtype, device
        self.max_image_tokens, self.max_audio_seconds = max_image_tokens, max_audio_seconds
        if tokenizer is not None:
            tokenizer.image_placeholder_id = cfg.image_token_id
            tokenizer.audio_placeholder_id = cfg.audio_token_id

    def build(self, request: Request, encode: bool = True) -> Prompt:
        """Token ids and media rows of a request; `encode=False` skips running the towers."""
        if request.prompt_ids is not None:
            ids = request.prompt_ids
            if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) for t in ids):
                raise RequestError("prompt_ids must be a list of whole-number token ids.")
            ids, features = self._expand_markers(list(ids), self._load_all(list(request.media or [])))
        elif request.messages is None:
            raise RequestError("The request has neither messages nor prompt_ids; give one of them.")
        elif self.tokenizer is None:
            raise RequestError("This checkpoint has no tokenizer.json, so text cannot be encoded; send prompt_ids "
                               "instead.")
        else:
            if not isinstance(request.messages, (list, tuple)):
                raise RequestError("messages must be a list of {'role': ..., 'content': ...} dicts.")
            parts = [p for m in request.messages if isinstance(m, dict) and isinstance(m.get("content"), list)
                     for p in m["content"] if isinstance(p, dict) and p.get("type") in ("image", "audio")]
            features = self._load_all(parts)
            try:
                ids = self.tokenizer.render_chat(request.messages, reasoning_effort=request.reasoning_effort,
                                                 media_token_counts=[f.num_tokens for _, f in features])
            except ValueError as exc:
                raise RequestError(str(exc)) from exc
        spans = self._spans(ids, features)
        notes = [f"{kind} {i + 1} was downscaled from {f.original_size[1]}x{f.original_size[0]} to "
                 f"{f.size[1]}x{f.size[0]} to fit {self.max_image_tokens} image tokens"
                 for i, (kind, f) in enumerate(features) if kind == "image" and f.downscaled]
        embeds = self._encode(features) if encode and features else None
        return Prompt(ids, spans, embeds, notes)

    def _load_all(self, parts: list[dict]) -> list[tuple[str, object]]:
        features, image_budget = [], self.max_image_tokens
        for number, part in enumerate(parts, 1):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("image", "audio"):
                raise RequestError(f"media item {number} must be a dict with type 'image' or 'audio'.")
            if (kind == "image" and self.vision is None) or (kind == "audio" and self.audio is None):
                raise RequestError(f"This checkpoint has no {'vision' if kind == 'image' else 'audio'} tower, so "
                                   f"it cannot read {kind}s; send text only.")
            source = next((part[k] for k in ("path", "data", "image", "array") if part.get(k) is not None), None)
            if source is None:
                raise RequestError(f"{kind} {number} has no 'path' (or 'data'/'array'); attach the file again.")
            try:
                if kind == "image":
                    if image_budget < 1:
                        raise RequestError(f"The images use up the cap of {self.max_image_tokens} image tokens "
                                           f"before image {number}; send fewer images.")
                    f = load_image(source, patch_size=self.vision.patch_size, max_tokens=image_budget)
                    image_budget -= f.num_tokens
                else:
                    f = load_audio(source, max_seconds=self.max_audio_seconds)
            except MediaError as exc:
                # numbered across the whole conversation, so name the file too when there is one
                name = f" ({Path(source).name})" if isinstance(source, (str, Path)) else ""
                raise RequestError(f"{kind.capitalize()} {number}{name}: {exc}") from exc
            features.append((kind, f))
        return features

    def _expand_markers(self, ids: list[int], features: list[tuple[str, object]]) -> tuple[list[int], list]:
        """Each image marker takes the next image, each audio marker the next audio clip. Returns the
        expanded ids and the media in the order they now appear."""
        markers = {self.cfg.image_bos_token_id: ("image", self.cfg.image_token_id),
                   self.cfg.audio_bos_token_id: ("audio", self.cfg.audio_token_id)}
        queues = {kind: [f for k, f in features if k == kind] for kind in ("image", "audio")}
        out, placed = [], []
        for t in ids:
            out.append(t)
            if t in markers:
                kind, placeholder = markers[t]
                if not queues[kind]:
                    raise RequestError(f"prompt_ids hold more {kind} markers (id {t}) than attached {kind}s; "
                                       f"attach one {kind} per marker.")
                item = queues[kind].pop(0)
                placed.append((kind, item))
                out += [placeholder] * item.num_tokens
        left = {kind: len(q) for kind, q in queues.items() if q}
        if left:
            raise RequestError(f"{', '.join(f'{n} {k}(s)' for k, n in left.items())} have no marker in prompt_ids; put "
                               f"an image marker ({self.cfg.image_bos_token_id}) or audio marker "
                               f"({self.cfg.audio_bos_token_id}) where each goes.")
        return out, placed

    def _spans(self, ids: list[int], features: list[tuple[str, object]]) -> list[MediaSpan]:
        kinds = {self.cfg.image_token_id: "image", self.cfg.audio_token_id: "audio"}
        runs, p = [], 0
        while p < len(ids):
            if ids[p] in kinds:
                start = p
                while p < len(ids) and ids[p] == ids[start]:
                    p += 1
                runs.append((kinds[ids[start]], start, p - start))
            else:
                p += 1
        if [(k, n) for k, _, n in runs] != [(k, f.num_tokens) for k, f in features]:
            raise RequestError("The prompt's image/audio placeholder tokens do not match the attached media; "
                               "do not type placeholder tokens yourself.")
        return [MediaSpan(k, start, n, f.content_hash) for (k, start, n), (_, f) in zip(runs, features)]

    def _encode(self, features: list[tuple[str, object]]) -> torch.Tensor:
        rows = []
        for kind, f in features:
            if kind == "image":
                rows.append(self.vision(f.pixel_values.to(self.device, self.dtype)))
            else:
                rows.append(self.audio(f.bins.to(self.device)))
        return torch.cat(rows)
