"""The native engine: the step loop, request admission, and event streams.

One thread owns `step()`: schedule -> prepare + forward (runner) -> sample -> commit -> emit events.
Callers either drive `add_request` / `step` themselves (tests, scripts) or use `stream` / `astream`,
which start that thread and hand each request its own event queue.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from pathlib import Path

import torch

from .block_pool import FULL, SLIDING, BlockPool
from .config import ModelConfig, load_config
from .events import Error, Event, Finished, Metrics, Started, Step
from .loader import CheckpointError, load_weights
from .model import InklingTextModel, KVCache
from .mtp import MTP_GROUP, MtpHeads
from .prompt import Prompt, PromptBuilder, RequestError
from .request import Request, Sequence, SpecConfig
from .runner import ModelRunner, StepRows
from .scheduler import ScheduledSeq, Scheduler
from .speculation import SpecDecodingStats, propose_ngram, verify
from .tokenizer import ChatTokenizer, IncrementalDetokenizer
from .towers import AudioEmbedding, VisionTower

MAX_TOKENS_LIMIT = 1 << 20
MAX_SPEC_TOKENS = 8
SMALL_MODEL_PARAMS = 100_000_000


class _Live:
    """Engine-side bookkeeping of one admitted request."""

    def __init__(self, seq: Sequence, detok: IncrementalDetokenizer | None):
        self.seq = seq
        self.detok = detok
        self.arrival = time.perf_counter()
        self.first_token: float | None = None


class NativeEngine:
    capabilities = {"per_token_drafts": True, "draft_probabilities": False, "prefix_caching": True,
                    "modalities": ["text"]}

    def __init__(self, model_dir: str | Path, device: str = "cpu", dtype: str = "float32",
                 spec: SpecConfig | None = None, *, block_size: int = 16, num_blocks: int | None = None,
                 kv_cache_bytes: int = 256 << 20, max_num_seqs: int = 16, max_batched_tokens: int = 256,
                 max_model_len: int | None = None, max_image_tokens: int = 1024, max_audio_seconds: float = 60.0):
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was asked for but this machine has no CUDA GPU; use --device cpu.")
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype {dtype!r} is not supported; use float32 or bfloat16.")
        self.dtype = getattr(torch, dtype)
        self.spec = spec or SpecConfig()
        self.config: ModelConfig = load_config(self.model_dir)
        weights = load_weights(self.model_dir, self.config, self.dtype, self.device)
        self.model = InklingTextModel(self.config, weights)
        self.mtp = MtpHeads(self.config, self.model, weights) if "mtp.0.input_proj" in weights else None
        self.num_text_params = sum(t.numel() for n, t in weights.items()
                                   if not n.startswith(("mtp.", "vision.", "audio.")))
        if self.device.type == "cpu" and self.num_text_params < SMALL_MODEL_PARAMS:
            # a small model's matmuls gain little from OpenMP threads, and the stream thread's team
            # then contends with the caller's: measured 3x slower streaming decode with 2 threads
            torch.set_num_threads(1)
        self.capabilities = {**self.capabilities,
                             "spec_methods": ["none", "ngram"] + (["mtp"] if self.mtp else []),
                             "num_mtp_depths": self.config.num_mtp_layers if self.mtp else 0}
        problem = self._spec_problem(self.spec)
        if problem:
            raise ValueError(problem)
        self.tokenizer = ChatTokenizer.from_model_dir(self.model_dir)
        cfg = self.config
        try:
            vision = VisionTower(cfg.vision, cfg.hidden_size, weights) if "vision.final_norm" in weights else None
            audio = AudioEmbedding(cfg.audio, weights) if "audio.embed" in weights else None
        except KeyError as exc:
            raise CheckpointError(f"The checkpoint's vision or audio tower lacks {exc.args[0]!r}; the checkpoint "
                                  "is incomplete.") from exc
        self.prompts = PromptBuilder(cfg, self.tokenizer, vision, audio, self.dtype, self.device,
                                     max_image_tokens, max_audio_seconds)
        self.capabilities["modalities"] = ["text"] + ["image"] * bool(vision) + ["audio"] * bool(audio)
        groups = tuple(g for g, present in ((FULL, not all(map(cfg.is_sliding, range(cfg.num_layers)))),
                                            (SLIDING, any(map(cfg.is_sliding, range(cfg.num_layers))))) if present)
        num_mtp_positions = MAX_SPEC_TOKENS if self.mtp else 0
        if num_blocks is None:
            num_blocks = max(8, kv_cache_bytes // KVCache.bytes_per_block(cfg, block_size, self.dtype,
                                                                           num_mtp_positions))
        self.pool = BlockPool(num_blocks, block_size, groups + ((MTP_GROUP,) if self.mtp else ()))
        self.scheduler = Scheduler(self.pool, groups, cfg.sliding_window, max_num_seqs, max_batched_tokens,
                                   has_mtp=self.mtp is not None)
        self.runner = ModelRunner(cfg, self.model, self.mtp, self.pool, self.scheduler, max_num_seqs, self.dtype,
                                  self.device, num_mtp_positions)
        self.spec_stats = SpecDecodingStats()
        self.max_model_len = min(max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings,
                                 self.scheduler.max_tokens_per_sequence())
        self.eos_ids = frozenset(cfg.eos_token_ids) | (self.tokenizer.stop_ids if self.tokenizer else frozenset())
        self._live: dict[str, _Live] = {}
        self._aborts: set[str] = set()
        self._queues: dict[str, queue.Queue] = {}      # request id -> its stream's events
        self._emitted: deque[tuple[float, int]] = deque()   # (time, tokens) for tokens/s
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- admission --------------------------------------------------------------------------------
    def prompt_ids(self, request: Request) -> list[int]:
        """The token ids a request feeds the model (its rendered chat, or its expanded prompt_ids)."""
        return self.prompts.build(request, encode=False).token_ids

    def _spec_problem(self, spec: SpecConfig) -> str | None:
        if not isinstance(spec, SpecConfig):
            return "spec must be a SpecConfig (method none, mtp or ngram, num_tokens 1..8)."
        if spec.method == "mtp" and self.mtp is None:
            return (f"{self.model_dir.name} has no MTP draft heads (model.mtp.* tensors), so method 'mtp' cannot "
                    "run; use 'ngram' or 'none'.")
        return None

    def _validate(self, request: Request) -> Prompt:
        problem = self._spec_problem(request.spec) if request.spec is not None else None
        problem = problem or request.sampling.problem()
        if problem:
            raise RequestError(problem)
        prompt = self.prompts.build(request)
        ids = prompt.token_ids
        if not ids or (request.messages is not None and not any(
                _has_content(m) for m in request.messages)):
            raise RequestError("The prompt is empty; type a message or give at least one prompt token.")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise RequestError(f"Token id {bad[0]} is outside the vocabulary (0..{self.config.vocab_size - 1}); "
                               "fix the prompt ids.")
        if len(ids) >= self.max_model_len:
            raise RequestError(f"The prompt has {len(ids)} tokens but the context holds {self.max_model_len}; "
                               "shorten the prompt.")
        max_tokens = request.sampling.max_tokens
        if max_tokens > MAX_TOKENS_LIMIT or len(ids) + max_tokens > self.max_model_len:
            raise RequestError(f"max_tokens {max_tokens} plus the prompt's {len(ids)} tokens exceeds the context "
                               f"of {self.max_model_len} tokens; ask for at most "
                               f"{self.max_model_len - len(ids)} new tokens.")
        return prompt

    def add_request(self, request: Request) -> list[Event]:
        """Admit a request to the waiting queue. Returns [Started] or [Error]; never raises for bad input."""
        with self._lock:
            if request.request_id in self._live:
                return [Error(request.request_id, f"Request id {request.request_id!r} is already running; "
                                                  "use a new id.")]
            try:
                prompt = self._validate(request)
            except RequestError as exc:
                return [Error(request.request_id, str(exc))]
            ids = prompt.token_ids
            seq = Sequence(request, ids, self.eos_ids, request.spec or self.spec, prompt.spans, prompt.embeds)
            detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None
            self._live[request.request_id] = _Live(seq, detok)
            self.scheduler.add(seq)
            self._wake.set()
            return [Started(request.request_id, prompt_tokens=len(ids), image_tokens=prompt.count("image"),
                            audio_tokens=prompt.count("audio"), notes=tuple(prompt.notes))]

    def abort(self, request_id: str) -> None:
        """Stop a request between steps and free everything it holds."""
        with self._lock:
            self._aborts.add(request_id)
            self._wake.set()

    # -- the step ---------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._aborts)

    def step(self) -> list[Event]:
        """One engine step: schedule, forward, verify/sample, commit, draft. Returns its events."""
        with self._lock:
            events: list[Event] = []
            for request_id in self._aborts:
                if request_id in self._live:
                    events.append(self._finish(self._live[request_id], "abort"))
            self._aborts.clear()
            scheduled = self.scheduler.schedule()
            if not scheduled:
                return events
            try:
                events += self._run(scheduled)
            except Exception as exc:   # a failing step must not strand requests
                for item in scheduled:
                    if item.seq.request_id in self._live:
                        events.append(self._fail(self._live[item.seq.request_id], f"The engine step failed: {exc}"))
            events.append(self._metrics(time.time()))
            return events

    def _run(self, scheduled: list[ScheduledSeq]) -> list[Event]:
        hidden, logits = self.runner.execute(scheduled)
        now = time.time()
        verdicts, kept = {}, []
        for item in scheduled:
            seq = item.seq
            n = item.num_tokens
            if item.samples and bool(torch.isfinite(logits[seq.request_id]).all()):
                drafted = seq.draft_ids[:item.num_drafts]
                probs = seq.draft_probs[:item.num_drafts] if seq.draft_probs is not None else None
                emitted, accepted = verify(logits[seq.request_id], drafted, probs, seq.sampling, seq.generator)
                verdicts[seq.request_id] = (drafted, emitted, accepted)
                n = item.num_tokens - item.num_drafts + accepted
            kept.append(n)
        self.runner.commit_conv(scheduled, kept)
        events, steps, row = [], [], 0
        for item, n in zip(scheduled, kept):
            seq = item.seq
            start = seq.num_computed
            seq.num_computed += n
            seq.draft_ids, seq.draft_probs = [], None
            self.scheduler.register_full_blocks(seq)
            live = self._live[seq.request_id]
            if item.samples and seq.request_id not in verdicts:
                events.append(self._fail(live, "The model produced NaN or infinite logits for this request; it was "
                                               "stopped (try float32, or a shorter prompt)."))
            elif item.samples:
                events += self._emit(live, *verdicts[seq.request_id], now)
            if seq.request_id in self._live:
                steps.append(StepRows(seq, row, start, seq.num_computed, drafting=item.samples))
            row += item.num_tokens
        mtp_drafts = self.runner.propose_mtp([s for s in steps if s.seq.uses_mtp], hidden)
        self.runner.record_hidden(steps, hidden)
        for step in steps:
            seq = step.seq
            room = min(seq.spec.num_tokens, seq.sampling.max_tokens - seq.num_generated - 1,
                       self.max_model_len - len(seq.token_ids) - 1)
            if not step.drafting or room <= 0:
                continue
            if seq.spec.method == "ngram":
                seq.draft_ids = propose_ngram(seq.token_ids, room, seq.spec.ngram_min, seq.spec.ngram_max,
                                              seq.spec.ngram_lookback)
            elif seq.request_id in mtp_drafts:
                drafts = mtp_drafts[seq.request_id]
                seq.draft_ids = drafts.draft_ids[:room]
                seq.draft_probs = drafts.probs[:room] if drafts.probs is not None else None
        return events

    def _emit(self, live: _Live, drafted: list[int], emitted: list[int], accepted: int, now: float) -> list[Event]:
        """Commit a verification's tokens, stopping at a stop token or the length limit."""
        seq = live.seq
        if live.first_token is None:
            live.first_token = time.perf_counter()
        seq.stats.observe(len(drafted), accepted)
        self.spec_stats.observe(len(drafted), accepted)
        reason, kept = None, []
        for token in emitted:
            seq.token_ids.append(token)
            kept.append(token)
            if token in seq.eos_ids:
                reason = "stop"
            elif seq.num_generated >= seq.sampling.max_tokens or len(seq.token_ids) >= self.max_model_len:
                reason = "length"
            if reason:
                break
        text = ""
        if live.detok:
            text = live.detok.push(kept) + (live.detok.flush() if reason else "")
        events: list[Event] = [Step(seq.request_id, seq.num_steps, drafted, accepted, kept, text, now)]
        seq.num_steps += 1
        self._emitted.append((now, len(kept)))
        if reason:
            events.append(self._finish(live, reason))
        return events

    def _finish(self, live: _Live, reason: str) -> Finished:
        seq = live.seq
        self.scheduler.finish(seq)
        del self._live[seq.request_id]
        end = time.perf_counter()
        ttft = (live.first_token - live.arrival) if live.first_token else None
        decode_s = (end - live.first_token) if live.first_token else 0.0
        generated = seq.num_generated
        return Finished(seq.request_id, reason,
                        usage={"prompt_tokens": seq.prompt_len, "completion_tokens": generated,
                               "cached_tokens": seq.num_cached_prompt},
                        spec_summary={"method": seq.spec.method, "num_spec_tokens": seq.spec.num_tokens,
                                      **seq.stats.to_dict()},
                        timings={"ttft_s": ttft, "decode_s": decode_s, "total_s": end - live.arrival,
                                 "tokens_per_s": (generated - 1) / decode_s if generated > 1 and decode_s > 0
                                 else None})

    def _fail(self, live: _Live, message: str) -> Error:
        self._finish(live, "error")
        return Error(live.seq.request_id, message)

    def _metrics(self, now: float) -> Metrics:
        while self._emitted and now - self._emitted[0][0] > 2.0:
            self._emitted.popleft()
        span = now - self._emitted[0][0] if len(self._emitted) > 1 else 0.0
        rate = sum(n for _, n in list(self._emitted)[1:]) / span if span > 0 else 0.0
        usage = self.pool.usage()
        num_conv = self.scheduler.max_num_seqs - len(self.scheduler.free_conv_slots)
        queried = self.pool.num_prefix_queried_blocks
        kv = {"groups": {g: {"used": usage["used"][g], "total": usage["total"]} for g in self.pool.groups},
              "conv_state": {"used": num_conv, "total": self.scheduler.max_num_seqs},
              "use_fraction": usage["use_fraction"], "block_size": self.pool.block_size,
              "cached_free_blocks": usage["cached_free"],
              "prefix_hit_blocks": self.pool.num_prefix_hit_blocks,
              "prefix_hit_rate": self.pool.num_prefix_hit_blocks / queried if queried else 0.0,
              "preemptions": self.scheduler.num_preemptions}
        return Metrics(now, rate, len(self.scheduler.running), len(self.scheduler.waiting), kv,
                       {"method": self.spec.method, **self.spec_stats.to_dict()})

    # -- streaming --------------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(target=self._loop, name="inkling-engine", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while not self._closed:
            if not self.has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            for event in self.step():
                self._dispatch(event)

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, Metrics):   # engine-wide: every open stream sees it
            for events in list(self._queues.values()):
                events.put(event)
            return
        target = self._queues.get(event.request_id)
        if target is not None:
            target.put(event)

    def stream(self, request: Request):
        """Yield this request's events (Started, Step..., Metrics..., Finished or Error) as they happen."""
        events: queue.Queue[Event] = queue.Queue()
        with self._lock:
            self._queues[request.request_id] = events
            first = self.add_request(request)
        try:
            for event in first:
                yield event
                if isinstance(event, Error):
                    return
            self._ensure_thread()
            while True:
                event = events.get()
                yield event
                if isinstance(event, (Finished, Error)) and event.request_id == request.request_id:
                    return
        finally:   # a consumer that stops early (closed tab, break) aborts its request
            with self._lock:
                self._queues.pop(request.request_id, None)
                if request.request_id in self._live:
                    self._aborts.add(request.request_id)
                    self._wake.set()

    async def astream(self, request: Request):
        """The same events as `stream`, for asyncio callers."""
        iterator = self.stream(request)
        sentinel = object()
        while True:
            event = await asyncio.to_thread(next, iterator, sentinel)
            if event is sentinel:
                return
            yield event

    def close(self) -> None:
        """Stop the stream thread (a later stream starts it again)."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _has_content(message: dict) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        return any(p.get("type") != "text" or str(p.get("text", "")).strip() for p in content if isinstance(p, dict))
    return False
