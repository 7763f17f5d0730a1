"""One browser session's conversation: its turns, each with the settings it ran under and the events it
recorded. Everything the views draw is a pure function of these records, so a trace replays exactly."""
from __future__ import annotations

from dataclasses import dataclass, field

METRICS_EVERY_S = 0.1      # record engine-wide Metrics at most this often (the engine sends one per step)

DEFAULT_SETTINGS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "max_tokens": 256,
                    "spec_method": "none", "num_spec_tokens": 3, "reasoning_effort": None, "system_prompt": ""}


@dataclass
class Turn:
    """One user message and what came back. `notice` is set when the UI refused the message itself."""
    user_text: str
    files: list[dict]                        # {"path", "name", "kind"}; paths stay server-side, never in traces
    settings: dict
    events: list[dict] = field(default_factory=list)   # Started, Step (+ token texts), Metrics, Finished / Error
    request_id: str | None = None
    sent_at: float | None = None             # wall clock when the request went to the engine
    notice: str | None = None
    rendered: str | None = None              # the finished answer's HTML, kept: its events no longer change
    _last_metrics_at: float = -1.0
    _pending_metrics: dict | None = None

    def record(self, event: dict) -> None:
        """Keep every request event; thin the engine-wide Metrics to one per METRICS_EVERY_S (the last
        one before the turn ends is always kept)."""
        if event["type"] == "Metrics":
            if event["time"] - self._last_metrics_at >= METRICS_EVERY_S:
                self.events.append(event)
                self._last_metrics_at, self._pending_metrics = event["time"], None
            else:
                self._pending_metrics = event
            return
        if event["type"] == "Error":     # name the user's files, not where the server keeps them
            for f in (f for f in self.files if f["path"]):
                event = {**event, "message": event["message"].replace(f["path"], f["name"])}
        if event["type"] in ("Finished", "Error") and self._pending_metrics is not None:
            self.events.append(self._pending_metrics)
            self._pending_metrics = None
        self.events.append(event)

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def steps(self) -> list[dict]:
        return self.of_type("Step")

    @property
    def reply_text(self) -> str:
        return "".join(s["text"] for s in self.steps)

    @property
    def is_done(self) -> bool:
        return self.notice is not None or any(e["type"] in ("Finished", "Error") for e in self.events)

    @property
    def error(self) -> str | None:
        if self.notice:
            return self.notice
        return next((e["message"] for e in self.events if e["type"] == "Error"), None)

    @property
    def finished(self) -> dict | None:
        return next((e for e in self.events if e["type"] == "Finished"), None)


@dataclass
class Session:
    """What one browser tab has said and seen. Lives in a gr.State; the engine is shared (see hub.py)."""
    turns: list[Turn] = field(default_factory=list)
    export_path: str | None = None           # the trace last written for this tab's Export button

    @property
    def last(self) -> Turn | None:
        return self.turns[-1] if self.turns else None

    def messages_for(self, turn: Turn) -> list[dict]:
        """The conversation to send for `turn`: its system prompt, earlier exchanges the model answered
        (refused or failed turns never reached it), then this turn's message."""
        system = turn.settings.get("system_prompt") or ""
        messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system.strip() else []
        for earlier in self.turns[:self.turns.index(turn)]:
            if earlier.error is None and earlier.steps:
                messages.append(user_message(earlier))
                messages.append({"role": "assistant", "content": [{"type": "text", "text": earlier.reply_text}]})
        messages.append(user_message(turn))
        return messages


def user_message(turn: Turn) -> dict:
    parts = [{"type": f["kind"], "path": f["path"]} for f in turn.files]
    if turn.user_text.strip():
        parts.append({"type": "text", "text": turn.user_text})
    return {"role": "user", "content": parts}
