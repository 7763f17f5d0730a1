"""Tokenizer for Inkling checkpoints: tokenizer.json plus the Inkling chat wire format.

Wire format (vLLM's Inkling renderer): each message is <|message_ROLE|> followed by
its parts; every part closes with <|end_message|>; a finished model turn then ends
with <|content_model_end_sampling|>; the generation prompt is <|message_model|>.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tokenizers import Tokenizer

MESSAGE_TOKENS = {
    "user": "<|message_user|>",
    "model": "<|message_model|>",
    "system": "<|message_system|>",
    "tool": "<|message_tool|>",
}
ROLE_ALIASES = {"assistant": "model"}
CONTENT_TEXT = "<|content_text|>"
CONTENT_IMAGE = "<|content_image|>"
CONTENT_AUDIO = "<|content_audio_input|>"
AUDIO_END = "<|audio_end|>"
CONTENT_THINKING = "<|content_thinking|>"
END_PART = "<|end_message|>"
END_MODEL_TURN = "<|content_model_end_sampling|>"
IMAGE_PLACEHOLDER = "<|image_placeholder|>"
AUDIO_PLACEHOLDER = "<|audio_placeholder|>"
GENERATION_PROMPT = MESSAGE_TOKENS["model"]
REASONING_EFFORT_TEMPLATE = "Thinking effort level: {}"
REPLACEMENT_CHAR = "\ufffd"


class ChatTokenizer:
    """tokenizer.json from a checkpoint + the Inkling chat wire format."""

    def __init__(self, tokenizer: Tokenizer, eos_token: str | None = None):
        self._tok = tokenizer
        # Text is data: a literal "<|end_message|>" in user text must not become a marker (prompt injection).
        self._tok.encode_special_tokens = True
        stop = {self.token_id(END_MODEL_TURN)}
        # Some checkpoints name an eos of their own in tokenizer_config.json; it also ends generation.
        if eos_token is not None and tokenizer.token_to_id(eos_token) is not None:
            stop.add(tokenizer.token_to_id(eos_token))
        self.stop_ids: frozenset[int] = frozenset(stop)
        # config.json's image/audio token ids win over the placeholder names (real checkpoints name them
        # <|unused_200054|> and the like); set by the engine
        self.image_placeholder_id: int | None = None
        self.audio_placeholder_id: int | None = None

    @classmethod
    def from_model_dir(cls, model_dir) -> "ChatTokenizer | None":
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            return None
        return cls(Tokenizer.from_file(str(path)), eos_token=_read_eos_token(model_dir))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(
                f"The tokenizer has no token {token!r}; this checkpoint's tokenizer.json "
                "does not support the Inkling wire format marker it needs."
            )
        return token_id

    def render_chat(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        reasoning_effort: float | None = None,
        media_token_counts: list[int] = (),
    ) -> list[int]:
        """Token ids of a conversation in the Inkling wire format (media as placeholder runs)."""
        if not isinstance(messages, (list, tuple)):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts.")
        counts = list(media_token_counts)
        for n in counts:
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"media_token_counts must hold positive integers; got {n!r}.")

        messages = list(messages)
        if reasoning_effort is not None:
            effort_message = {"role": "system", "content": _effort_text(reasoning_effort)}
            # It goes after the leading system messages, before the first message of the conversation proper.
            first = next((i for i, m in enumerate(messages) if _role_of(m, i) != "system"), len(messages))
            messages.insert(first, effort_message)

        ids: list[int] = []
        media_seen = 0
        for index, message in enumerate(messages):
            role = _role_of(message, index)
            ids.append(self.token_id(MESSAGE_TOKENS[role]))
            for part in _parts_of(message, index):
                media_seen = self._render_part(part, index, ids, counts, media_seen)
            if role == "model":
                ids.append(self.token_id(END_MODEL_TURN))
        if media_seen != len(counts):
            raise ValueError(
                f"media_token_counts has {len(counts)} entries but the messages hold {media_seen} "
                "image/audio parts; pass exactly one count per media part, in order of appearance."
            )
        if add_generation_prompt:
            ids.append(self.token_id(GENERATION_PROMPT))
        return ids

    def _render_part(self, part: dict, index: int, ids: list[int], counts: list[int], media_seen: int) -> int:
        """Append one part's ids; returns the updated count of media parts consumed."""
        kind = part.get("type")
        if kind in ("text", "thinking"):
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError(f"message {index}: a {kind!r} part needs a string 'text' field.")
            ids.append(self.token_id(CONTENT_TEXT if kind == "text" else CONTENT_THINKING))
            ids.extend(self.encode(text))
        elif kind in ("image", "audio"):
            if media_seen >= len(counts):
                raise ValueError(
                    f"message {index}: {kind} part number {media_seen + 1} has no entry in media_token_counts; "
                    "pass one placeholder count per image/audio part, in order of appearance."
                )
            n = counts[media_seen]
            media_seen += 1
            if kind == "image":
                ids.append(self.token_id(CONTENT_IMAGE))
                ids.extend([self.image_placeholder_id or self.token_id(IMAGE_PLACEHOLDER)] * n)
            else:
                ids.append(self.token_id(CONTENT_AUDIO))
                ids.extend([self.audio_placeholder_id or self.token_id(AUDIO_PLACEHOLDER)] * n)
                ids.append(self.token_id(AUDIO_END))
        else:
            raise ValueError(
                f"message {index}: unknown part type {kind!r}; use 'text', 'image', 'audio' or 'thinking'."
            )
        ids.append(self.token_id(END_PART))
        return media_seen


def _read_eos_token(model_dir: Path) -> str | None:
    """eos_token from tokenizer_config.json if the checkpoint has one (a string or {'content': ...})."""
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return None
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _role_of(message, index: int) -> str:
    if not isinstance(message, dict):
        raise ValueError(f"message {index} must be a dict with 'role' and 'content'; got {type(message).__name__}.")
    role = message.get("role")
    role = ROLE_ALIASES.get(role, role)
    if role not in MESSAGE_TOKENS:
        raise ValueError(
            f"message {index}: unknown role {message.get('role')!r}; "
            "use 'user', 'model' (or 'assistant'), 'system' or 'tool'."
        )
    return role


def _parts_of(message: dict, index: int) -> list[dict]:
    content = message.get("content")
    # A plain string is shorthand for one text part.
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, (list, tuple)) or not all(isinstance(p, dict) for p in content):
        raise ValueError(f"message {index}: 'content' must be a string or a list of part dicts.")
    return list(content)


def _effort_text(effort) -> str:
    if isinstance(effort, bool) or not isinstance(effort, (int, float)) or not math.isfinite(effort):
        raise ValueError(f"reasoning_effort must be a finite number such as 0.5; got {effort!r}.")
    # Always written as a float ("1.0", not "1") so one setting has one spelling.
    return REASONING_EFFORT_TEMPLATE.format(float(effort))


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text pieces, never splitting a UTF-8 character."""

    def __init__(self, tokenizer: ChatTokenizer):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        # ids[:prefix] are settled context; ids[prefix:read] were emitted and are decoded again as
        # context so each step's text is the difference of two decodes (decoders can be context-dependent).
        self._prefix = 0
        self._read = 0

    def push(self, new_ids: list[int]) -> str:
        self._ids.extend(new_ids)
        prefix_text = self._tokenizer.decode(self._ids[self._prefix : self._read])
        full_text = self._tokenizer.decode(self._ids[self._prefix :])
        # A trailing U+FFFD means the last token ended mid-character: wait for the rest of its bytes.
        if full_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        prefix_text = self._tokenizer.decode(self._ids[self._prefix : self._read])
        full_text = self._tokenizer.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :]
