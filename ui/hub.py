"""The one engine every browser session shares: loading it in the background, sending a session's
request, and the engine-wide view (who is running, the engine's own Metrics over time).

The engine owns its step thread and gives each request its own event queue (backend contract);
a handler here only drains that queue, so sessions batch together in the engine's steps.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from backend import Request, SamplingParams, SpecConfig

log = logging.getLogger(__name__)
ENGINE_METRICS_EVERY_S = 0.1
ENGINE_HISTORY_S = 300
RECENT_REQUESTS = 12


@dataclass
class LiveRequest:
    request_id: str
    session: str
    spec: str
    started: float = field(default_factory=time.time)
    state: str = "waiting"
    num_tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None

    def observe(self, event: dict) -> None:
        if event["type"] == "Step":
            self.state = "running"
            self.num_tokens += len(event["emitted"])
            self.first_token = self.first_token or event["time"]
            self.last_token = event["time"]
        elif event["type"] in ("Finished", "Error"):
            self.state = event.get("reason", "error")

    def row(self, now: float) -> dict:
        span = (self.last_token - self.first_token) if self.first_token and self.last_token else 0
        return {"request_id": self.request_id, "session": self.session, "state": self.state, "spec": self.spec,
                "num_tokens": self.num_tokens, "tokens_per_s": (self.num_tokens - 1) / span if span > 0 else None,
                "age_s": now - self.started}


class EngineHub:
    """Holds the shared engine (or its loading state) and what every session has running on it."""

    def __init__(self, info: dict):
        self.info = dict(info)              # model, backend, device, dtype (for the about panel and traces)
        self.engine = None
        self.error: str | None = None
        self.load_started = time.time()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._live: dict[str, LiveRequest] = {}
        self._recent: deque[LiveRequest] = deque(maxlen=RECENT_REQUESTS)
        self._metrics: deque[dict] = deque()
        self._sessions: dict[str, float] = {}     # session hash -> last seen

    # -- loading ----------------------------------------------------------------------------------
    def load_in_background(self, load: Callable[[], object]) -> None:
        threading.Thread(target=self._load, args=(load,), name="engine-loader", daemon=True).start()

    def _load(self, load) -> None:
        try:
            self.set_engine(load())
        except Exception as exc:    # shown in the page: the server stays up for replay
            log.exception("The model failed to load")
            self.error = f"{type(exc).__name__}: {exc}"
            self._ready.set()

    def set_engine(self, engine) -> None:
        self.engine = engine
        self.info.update(max_model_len=engine.max_model_len)
        self._ready.set()

    def no_engine(self, why: str) -> None:
        self.error = why
        self._ready.set()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    @property
    def status(self) -> str:
        if self.engine is not None:
            return "ready"
        if self.error:
            return f"no model: {self.error}"
        return f"loading the model… {time.time() - self.load_started:.0f} s"

    @property
    def capabilities(self) -> dict:
        return dict(self.engine.capabilities) if self.engine is not None else {}

    # -- requests ---------------------------------------------------------------------------------
    def make_request(self, messages: list[dict], settings: dict) -> Request:
        sampling = SamplingParams(temperature=float(settings["temperature"]), top_p=float(settings["top_p"]),
                                  top_k=int(settings["top_k"]), max_tokens=int(settings["max_tokens"]),
                                  seed=None if settings["seed"] is None else int(settings["seed"]))
        spec = SpecConfig(method=settings["spec_method"], num_tokens=int(settings["num_spec_tokens"]))
        return Request(messages=messages, sampling=sampling, spec=spec,
                       reasoning_effort=settings.get("reasoning_effort"))

    def stream(self, session: str, request: Request) -> Iterator[dict]:
        """Send a request and yield its events as dicts; Steps carry each token's text. Stopping early
        (closed tab, cancelled handler) closes the engine's stream, which aborts the request."""
        spec = request.spec
        label = "none" if spec.method == "none" else f"{spec.method}×{spec.num_tokens}"
        live = LiveRequest(request.request_id, session, label)
        with self._lock:
            self._live[request.request_id] = live
            self._sessions[session] = time.time()
        events = self.engine.stream(request)
        try:
            for event in events:
                d = event.to_dict()
                if d["type"] == "Metrics":
                    self._observe_metrics(d)
                else:
                    live.observe(d)
                    if d["type"] == "Step":
                        self._annotate(d)
                yield d
        finally:
            events.close()
            with self._lock:
                self._live.pop(request.request_id, None)
                if live.state in ("waiting", "running"):
                    live.state = "abort"
                self._recent.appendleft(live)

    def _annotate(self, step: dict) -> None:
        tokenizer = getattr(self.engine, "tokenizer", None)
        if tokenizer is not None:
            step["emitted_text"] = [tokenizer.decode([t]) for t in step["emitted"]]
            step["drafted_text"] = [tokenizer.decode([t]) for t in step["drafted"]]

    def abort_session(self, session: str) -> int:
        """Abort every request this session has running; returns how many."""
        with self._lock:
            ids = [r.request_id for r in self._live.values() if r.session == session]
        for request_id in ids:
            self.engine.abort(request_id)
        return len(ids)

    def forget_session(self, session: str) -> None:
        """A tab closed: abort what it left running."""
        if self.engine is not None:
            self.abort_session(session)
        with self._lock:
            self._sessions.pop(session, None)

    def touch(self, session: str) -> None:
        with self._lock:
            self._sessions[session] = time.time()

    # -- engine-wide view -------------------------------------------------------------------------
    def _observe_metrics(self, metrics: dict) -> None:
        with self._lock:
            if self._metrics and metrics["time"] - self._metrics[-1]["time"] < ENGINE_METRICS_EVERY_S:
                return
            self._metrics.append(metrics)
            while self._metrics and metrics["time"] - self._metrics[0]["time"] > ENGINE_HISTORY_S:
                self._metrics.popleft()

    def snapshot(self) -> dict:
        now = time.time()
        with self._lock:
            rows = [r.row(now) for r in self._live.values()] + [r.row(now) for r in self._recent]
            return {"requests": rows, "num_active": len(self._live), "num_sessions": len(self._sessions),
                    "metrics": list(self._metrics), "now": now}
