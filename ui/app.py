"""The playground page: layout top to bottom, then the event wiring, then one short handler per event.

A chat turn: `chat` parses the input box, builds a Request from the session's history and settings,
and drains the engine's event stream (hub.py), recording each event in the session's Turn and
yielding the chat (several times a second) and the plots (a few times a second). Every view is
redrawn from the recorded events, so a replayed trace looks exactly like the live answer.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gradio as gr

from . import render, replay, trace
from .hub import EngineHub
from .inputs import parse_input
from .plot_view import PlotView, serve_plotly
from .presets import load_presets
from .session import DEFAULT_SETTINGS, Session, Turn
from .views import engine_figure, figure, inspected_turn, panels

CHAT_EVERY_S = 1 / 15          # redraw the answer this often while tokens stream,
PLOTS_EVERY_S = 0.33           # and the plots this often;
REDRAW_S_PER_TOKEN = 1e-4      # but a long conversation costs the browser more per redraw: slow down (0.3 s at
                               # 3000 tokens)
LOAD_WAIT_S = 900              # a message sent while the model loads waits this long for it
PLAY_STEP_S = 0.6              # the ladder's autoplay pace
SPEC_METHODS = ["none", "mtp", "ngram"]
PRESET_PROMPT = "Presets…"
EFFORTS = ["off", "0.25", "0.5", "0.75", "1.0"]
CSS_PATH = Path(__file__).with_name("playground.css")

SPEC_HELP = ("**Speculation.** *none*: the target model makes every token. *mtp*: the model's own "
             "multi-token-prediction heads draft the next tokens. *ngram*: drafts copied from an earlier place where "
             "the last few tokens occurred. The target checks all drafts of a step in one forward pass.\n")


class Playground:
    def __init__(self, hub: EngineHub, presets: dict[str, dict] | None = None, spec_method: str = "none",
                 num_spec_tokens: int = 3):
        self.hub = hub
        self.presets = load_presets() if presets is None else presets
        # the page's initial speculation setting; "auto" becomes mtp once the engine says it has MTP heads
        self.spec_default = (spec_method, num_spec_tokens)
        self.export_dir = Path(tempfile.mkdtemp(prefix="traces-", dir=gr.utils.get_upload_folder()))

    # ---------------------------------------------------------------------------------------------
    def build(self) -> gr.Blocks:
        serve_plotly()
        empty = panels(None)
        with gr.Blocks(title="Inkling Playground", delete_cache=(600, 3600), fill_width=True) as demo:
            session = gr.State(None)
            loaded_trace = gr.State(None)
            with gr.Row(elem_id="header"):
                gr.HTML('<div class="brand">Inkling <span>Playground</span></div>')
                status = gr.HTML(self._status_html(), elem_id="status")
            with gr.Sidebar(label="Sampling and prompt", open=False, width=320):
                system_prompt = gr.Textbox("", label="System prompt", lines=2, placeholder="optional")
                temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)",
                                        elem_id="temperature")
                top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p")
                top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k (0 = off)")
                seed = gr.Number(value=0, precision=0, label="Seed", elem_id="seed")
                max_tokens = gr.Slider(1, 4096, value=256, step=1, label="Max new tokens", elem_id="max-tokens")
                effort = gr.Dropdown(EFFORTS, value="off", label="Reasoning effort")
            with gr.Row(equal_height=False):
                with gr.Column(scale=5, min_width=420):
                    with gr.Row(equal_height=True, elem_id="toolbar"):
                        preset = gr.Dropdown([PRESET_PROMPT, *self.presets], value=PRESET_PROMPT, show_label=False,
                                             container=False, scale=3, elem_id="presets")
                        clear = gr.Button("Clear", size="sm", elem_id="clear", min_width=70, scale=1)
                        export = gr.DownloadButton("Export trace", size="sm", elem_id="export", min_width=110,
                                                   scale=1)
                    chatbot = gr.HTML(render.conversation_html([]), elem_id="chat")
                    gr.HTML(render.legend_html())
                    box = gr.MultimodalTextbox(elem_id="message", sources=["upload"], file_count="multiple",
                                               show_label=False, autofocus=True,
                                               placeholder="Type a message, drop an image or audio clip…")
                    with gr.Row(equal_height=True):
                        # the box's own microphone records webm in Chrome, which the engine cannot read;
                        # this recorder hands over WAV, attached to the message when a recording stops
                        mic = gr.Audio(sources=["microphone"], type="filepath", format="wav", show_label=False,
                                       container=False, scale=3, elem_id="mic",
                                       waveform_options=gr.WaveformOptions(sample_rate=16000))
                        stop = gr.Button("■ Stop", variant="stop", elem_id="stop", min_width=90, scale=1)
                    with gr.Row(equal_height=True):
                        spec_method = gr.Radio(SPEC_METHODS, value=self._initial_spec_method(SPEC_METHODS), label="Speculation", scale=3,
                                               elem_id="spec-method",
                                               info="temperature, seed, max tokens…: the › sidebar, top left")
                        num_spec = gr.Slider(1, 8, value=self.spec_default[1], step=1, label="Drafts per step", scale=2,
                                             elem_id="num-spec")
                with gr.Column(scale=6, min_width=480):
                    with gr.Tabs():
                        with gr.Tab("Live", id="live") as live_tab:
                            cards = gr.HTML(render.stats_html(None), elem_id="cards")
                            live_plot = PlotView(empty["plots"], elem_id="live-plot")
                        with gr.Tab("Draft ladder", id="ladder") as ladder_tab:
                            with gr.Row():
                                prev_btn = gr.Button("◀ step", size="sm", min_width=60)
                                play_btn = gr.Button("▶ play", size="sm", min_width=60)
                                pause_btn = gr.Button("❚❚ pause", size="sm", min_width=60)
                                next_btn = gr.Button("step ▶", size="sm", min_width=60)
                            step_slider = gr.Slider(0, 1, value=0, step=1, label="Step", elem_id="ladder-step")
                            ladder = gr.HTML(render.ladder_html([], 0), elem_id="ladder")
                        with gr.Tab("Compare", id="compare") as compare_tab:
                            gr.Markdown("Run one prompt twice, each alone on the engine, with the sampling "
                                        "settings and seed from the sidebar: **A** and **B** differ only in "
                                        "speculation.", elem_classes="help")
                            compare_prompt = gr.Textbox(label="Prompt", lines=2,
                                                        value="Repeat this list three times: red, orange, yellow, "
                                                              "green, blue, indigo, violet.")
                            with gr.Row():
                                compare_a = gr.Dropdown(self._spec_choices(), value="none", label="A",
                                                        elem_id="compare-spec-a")
                                compare_b = gr.Dropdown(self._spec_choices(), value="mtp ×3", label="B",
                                                        elem_id="compare-spec-b")
                            compare_btn = gr.Button("Run A, then B", variant="primary")
                            compare_verdict = gr.HTML(elem_id="compare-verdict")
                            with gr.Row():
                                compare_out_a = gr.HTML(elem_id="compare-a")
                                compare_out_b = gr.HTML(elem_id="compare-b")
                        with gr.Tab("Engine", id="engine") as engine_tab:
                            engine_table = gr.HTML(elem_id="engine-table")
                            engine_plot = PlotView(figure(engine_figure(self.hub.snapshot())), elem_id="engine-plot")
                        with gr.Tab("Replay", id="replay") as replay_tab:
                            trace_file = gr.File(label="Load a trace (.jsonl exported here)",
                                                 type="binary", elem_id="trace-file")
                            trace_info = gr.HTML()
                            with gr.Row():
                                replay_turn = gr.Dropdown([], label="Turn", scale=1)
                                replay_step = gr.Slider(0, 1, value=0, step=1, label="Step", scale=3)
                            replay_answer = gr.HTML(elem_classes="replay-answer")
                            replay_cards = gr.HTML()
                            replay_ladder = gr.HTML()
                            replay_plot = PlotView(empty["plots"], elem_id="replay-plot")
                        with gr.Tab("About", id="about") as about_tab:
                            about = gr.HTML(self._about_html())
                            gr.Markdown(SPEC_HELP + "\n" + ABOUT_MD, elem_classes="help")
            tabs = [live_tab, ladder_tab, compare_tab, engine_tab, replay_tab, about_tab]
            loading_timer = gr.Timer(0.5)
            engine_timer = gr.Timer(1.0, active=False)

            # -- wiring -------------------------------------------------------------------------------
            controls = [temperature, top_p, top_k, seed, max_tokens, spec_method, num_spec, effort, system_prompt]
            live = [chatbot, box, session, cards, live_plot, step_slider, ladder, export]
            chat = box.submit(self.chat, [box, *controls, session], live, api_name="chat",
                              concurrency_limit=None, show_progress="hidden")
            stop.click(self.stop, None, None, api_name="stop", concurrency_limit=None)
            clear.click(self.clear, None, live, api_name="clear", concurrency_limit=None, cancels=[chat])
            # the button downloads the trace written when the last answer ended; the API gets a fresh one
            export.click(self.export, session, export, api_name="export_trace")
            mic.change(self.attach_recording, [box, mic], [box, mic], api_visibility="private")
            preset.input(self.apply_preset, preset, [box, *controls], api_visibility="private")
            step_inputs = [session, step_slider]
            step_slider.input(self.show_step, step_inputs, [step_slider, ladder], api_visibility="private")
            prev_btn.click(self.step_by(-1), step_inputs, [step_slider, ladder], api_visibility="private")
            next_btn.click(self.step_by(+1), step_inputs, [step_slider, ladder], api_visibility="private")
            play = play_btn.click(self.play, step_inputs, [step_slider, ladder], api_visibility="private")
            pause_btn.click(None, None, None, cancels=[play])
            compare_btn.click(self.compare, [compare_prompt, compare_a, compare_b, *controls],
                              [compare_out_a, compare_out_b, compare_verdict], api_name="compare",
                              concurrency_limit=None)
            replay_views = [replay_answer, replay_cards, replay_ladder, replay_plot]
            trace_file.upload(replay.load, trace_file, [loaded_trace, trace_info, replay_turn, replay_step,
                                                        *replay_views], api_name="load_trace")
            replay_turn.input(replay.show_turn, [loaded_trace, replay_turn], [replay_step, *replay_views],
                              api_visibility="private")
            replay_step.input(replay.views, [loaded_trace, replay_turn, replay_step], replay_views,
                              api_visibility="private")
            loading_timer.tick(self.loading_tick, None, [status, spec_method, compare_a, compare_b, about,
                                                          loading_timer], api_visibility="private")
            for tab in tabs:    # the engine-wide view refreshes only while it is shown
                tab.select(lambda shown=(tab is engine_tab): gr.Timer(active=shown), None, engine_timer,
                           api_visibility="private")
            engine_timer.tick(self.engine_view, None, [engine_table, engine_plot],
                              api_visibility="private")
            demo.load(self.on_load, None, [status, spec_method, compare_a, compare_b, about], api_visibility="private")
            demo.unload(self.on_unload)
        return demo

    # -- chat ------------------------------------------------------------------------------------
    def chat(self, message, temperature=0.0, top_p=1.0, top_k=0, seed=0, max_tokens=256, spec_method="none",
             num_spec_tokens=3, reasoning_effort="off", system_prompt="", session: Session | None = None,
             request: gr.Request = None):
        """Send the input box's message ({"text", "files"}) and stream the answer."""
        session = session or Session()
        settings = _settings(temperature, top_p, top_k, seed, max_tokens, spec_method, num_spec_tokens,
                             reasoning_effort, system_prompt)
        modalities = self.hub.capabilities.get("modalities", ["text", "image", "audio"])
        text, files, problem = parse_input(message, modalities)
        turn = Turn(text, files, settings, notice=problem)
        session.turns.append(turn)
        view = panels(turn)
        yield self._outputs(session, view, "start")
        if problem is None:
            yield from self._wait_for_engine(session, turn, view)
        if turn.notice is None:
            for plots_due in self._stream(session, turn, _hash(request)):
                view = panels(turn) if plots_due else view
                yield self._outputs(session, view, "streaming")
        yield self._outputs(session, panels(inspected_turn(session)), "end")

    def _wait_for_engine(self, session: Session, turn: Turn, view: dict):
        deadline = time.time() + LOAD_WAIT_S
        while not self.hub.wait_ready(0.5) and time.time() < deadline:
            yield self._outputs(session, view, "streaming", pending=self.hub.status)
        if self.hub.engine is None:
            turn.notice = f"No model is loaded ({self.hub.error or 'still loading'}); the Replay tab still works."

    def _stream(self, session: Session, turn: Turn, session_hash: str):
        """Send the turn and record its events; yields whenever the views are due a redraw (True when the
        plots are due too)."""
        try:
            request = self.hub.make_request(session.messages_for(turn), turn.settings)
        except ValueError as exc:           # e.g. drafts outside 1..8 from an API caller
            turn.notice = str(exc)
            return
        turn.request_id, turn.sent_at = request.request_id, time.time()
        last_chat = last_plots = 0.0
        num_tokens = sum(len(s["emitted"]) for t in session.turns for s in t.steps)   # all the page redraws
        for event in self.hub.stream(session_hash, request):
            turn.record(event)
            num_tokens += len(event.get("emitted", ()))
            now, every = time.monotonic(), num_tokens * REDRAW_S_PER_TOKEN
            if now - last_chat >= max(CHAT_EVERY_S, every):
                plots_due = now - last_plots >= max(PLOTS_EVERY_S, every)
                yield plots_due
                last_chat, last_plots = now, (now if plots_due else last_plots)

    def _outputs(self, session: Session, view: dict, stage: str, pending: str | None = None) -> tuple:
        """The chat's outputs: conversation, input box, state, cards, plots, ladder step and view, export
        button. While streaming, every component gets a plain value (unchanged ones cost nothing to send):
        a property update (gr.skip() included) makes Gradio rebuild the component's config, so the box,
        slider and button are updated only at the start and the end. The state is mutated in place."""
        messages = render.conversation_html(session.turns, pending)
        last_step = max(0, view["num_steps"] - 1)
        if stage == "streaming":
            box, state, slider, export = None, gr.skip(), 0, None
        elif stage == "start":
            box, state, slider, export = gr.MultimodalTextbox(value=None, interactive=False), session, 0, None
        else:
            box, state = gr.MultimodalTextbox(value=None, interactive=True), session
            slider, export = gr.Slider(0, max(1, last_step), value=last_step, step=1), self.export(session)
        return messages, box, state, view["cards"], view["plots"], slider, view["ladder"], export

    def stop(self, request: gr.Request = None):
        """Abort whatever this browser session has running (its cache blocks are freed)."""
        if self.hub.engine is not None:
            self.hub.abort_session(_hash(request))

    def clear(self, request: gr.Request = None):
        """Forget this tab's conversation (whatever it has running was cancelled, which aborts it)."""
        self.stop(request)
        view = panels(None)
        return (render.conversation_html([]), gr.MultimodalTextbox(value=None, interactive=True), None, view["cards"],
                view["plots"], gr.Slider(0, 1, value=0), view["ladder"], None)

    def attach_recording(self, message, recording: str | None):
        """Move a finished microphone recording into the message box's attachments."""
        if not recording:
            return gr.skip(), gr.skip()
        message = message or {}
        files = [f.get("path") if isinstance(f, dict) else f for f in message.get("files") or []]
        return {"text": message.get("text") or "", "files": files + [recording]}, None

    # -- ladder ----------------------------------------------------------------------------------
    def show_step(self, session: Session, index):
        turn = inspected_turn(session or Session())
        steps = turn.steps if turn else []
        index = max(0, min(int(index or 0), len(steps) - 1)) if steps else 0
        return gr.Slider(value=index), render.ladder_html(steps, index)

    def step_by(self, delta: int):
        def move(session: Session, index):
            return self.show_step(session, int(index or 0) + delta)
        return move

    def play(self, session: Session, index):
        turn = inspected_turn(session or Session())
        steps = turn.steps if turn else []
        start = int(index or 0) + 1 if steps and int(index or 0) < len(steps) - 1 else 0
        for i in range(start, len(steps)):
            yield gr.Slider(value=i), render.ladder_html(steps, i)
            time.sleep(PLAY_STEP_S)

    # -- presets, export, compare ----------------------------------------------------------------
    def apply_preset(self, name: str):
        preset = self.presets.get(name)
        if preset is None:
            return (gr.skip(),) * 10
        s = preset["settings"]
        effort = "off" if s["reasoning_effort"] is None else str(float(s["reasoning_effort"]))
        return ({"text": preset["text"], "files": preset["files"]}, s["temperature"], s["top_p"], s["top_k"],
                s["seed"], s["max_tokens"], s["spec_method"], s["num_spec_tokens"], effort, s["system_prompt"])

    def export(self, session: Session | None):
        """Write this session as a JSONL trace (replacing its previous one) and hand it to the browser."""
        session = session or Session()
        if session.export_path:
            Path(session.export_path).unlink(missing_ok=True)
        folder = Path(tempfile.mkdtemp(dir=self.export_dir))         # one folder per file: names never collide
        path = folder / f"inkling-trace-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        path.write_text("\n".join(trace.export_lines(session, self._engine_info())) + "\n")
        session.export_path = str(path)
        return str(path)

    def compare(self, prompt: str, spec_a: str, spec_b: str, temperature=0.0, top_p=1.0, top_k=0, seed=0,
                max_tokens=256, spec_method="none", num_spec_tokens=3, reasoning_effort="off", system_prompt="",
                request: gr.Request = None):
        """Run `prompt` with speculation A, then B, each alone; show both, the speedup, and whether they match."""
        base = _settings(temperature, top_p, top_k, seed, max_tokens, spec_method, num_spec_tokens,
                         reasoning_effort, system_prompt)
        runs = [Turn(prompt or "", [], {**base, **_parse_spec(spec)}) for spec in (spec_a, spec_b)]
        if not (prompt or "").strip():
            yield "", "", render.compare_verdict_html(None, None, "Type a prompt to compare.")
            return
        if not self.hub.wait_ready(LOAD_WAIT_S) or self.hub.engine is None:
            yield "", "", render.compare_verdict_html(None, None, "No model is loaded.")
            return
        crowded = False
        for turn in runs:
            for _ in self._stream(Session(turns=[turn]), turn, _hash(request)):
                crowded = crowded or self.hub.snapshot()["num_active"] > 1
                yield self._compare_view(runs, crowded)
        yield self._compare_view(runs, crowded, done=True)

    def _compare_view(self, runs: list[Turn], crowded: bool, done: bool = False):
        a, b = runs
        note = "Other requests shared the engine during this run, so the timings are disturbed." if crowded else None
        verdict = render.compare_verdict_html(a, b, note) if done else \
            render.compare_verdict_html(None, None, "running…")
        return render.compare_side_html("A", a), render.compare_side_html("B", b), verdict

    # -- status, engine-wide view, session lifetime ----------------------------------------------
    def loading_tick(self):
        done = self.hub.wait_ready(0)
        return self._ready_updates() + (gr.Timer(active=not done),)

    def on_load(self, request: gr.Request = None):
        if request is not None:
            self.hub.touch(request.session_hash)
        return self._ready_updates()

    def _ready_updates(self):
        methods = [m for m in SPEC_METHODS if m in self.hub.capabilities.get("spec_methods", SPEC_METHODS)]
        radio = gr.Radio(choices=methods, value=self._initial_spec_method(methods)) if self.spec_default[0] == "auto" \
            else gr.Radio(choices=methods)
        return (self._status_html(), radio, gr.Dropdown(choices=self._spec_choices()),
                gr.Dropdown(choices=self._spec_choices()), self._about_html())

    def _initial_spec_method(self, methods) -> str:
        if self.spec_default[0] != "auto":
            return self.spec_default[0]
        return "mtp" if "mtp" in methods and self.hub.status == "ready" else "none"

    def on_unload(self, request: gr.Request = None):
        if request is not None:
            self.hub.forget_session(request.session_hash)

    def engine_view(self, request: gr.Request = None):
        snap = self.hub.snapshot()
        own = request.session_hash if request else None
        return render.engine_html(snap, own), figure(engine_figure(snap))

    def _spec_choices(self) -> list[str]:
        methods = self.hub.capabilities.get("spec_methods", SPEC_METHODS)
        return ["none"] + [f"{m} ×{k}" for m in SPEC_METHODS if m != "none" and m in methods for k in range(1, 9)]

    def _engine_info(self) -> dict:
        return {**self.hub.info, "capabilities": self.hub.capabilities}

    def _status_html(self) -> str:
        return render.status_html(self.hub.info, self.hub.status)

    def _about_html(self) -> str:
        return render.about_html(self.hub.info, self.hub.capabilities, self.hub.status)


ABOUT_MD = """
**How to read the answer.** Each token is coloured by how it was made: an *accepted draft* (proposed by the
drafter and confirmed by the target model), a *bonus* token (the target's own next token after every draft
was accepted), a *correction* (the target's token where it rejected a draft), or a *target token* with no
draft. Hover a token for its step and id.

**Acceptance length** is accepted drafts + 1 per step: the tokens one target forward pass produced.
**Unconditional acceptance** at position *i* is the share of steps that drafted position *i* and accepted
it; **conditional acceptance** is the share of steps that reached position *i* (accepted draft *i−1*)
and accepted it too. Greedy decoding gives the same text with any speculation setting; sampling gives the
same distribution.

**Traces.** *Export trace* saves this tab's conversation (settings, seeds, every event) as JSONL; the
Replay tab steps through one without a model. Attachments are not included, only their names.
"""


def _settings(temperature, top_p, top_k, seed, max_tokens, spec_method, num_spec_tokens, reasoning_effort,
              system_prompt) -> dict:
    effort = None if reasoning_effort in (None, "", "off") else float(reasoning_effort)
    return {**DEFAULT_SETTINGS, "temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k),
            "seed": None if seed is None else int(seed), "max_tokens": int(max_tokens),
            "spec_method": spec_method or "none", "num_spec_tokens": int(num_spec_tokens),
            "reasoning_effort": effort, "system_prompt": system_prompt or ""}


def _parse_spec(choice: str) -> dict:
    """"ngram ×3" -> {"spec_method": "ngram", "num_spec_tokens": 3}; "none" -> method none."""
    method, _, k = (choice or "none").partition(" ×")
    return {"spec_method": method, "num_spec_tokens": int(k) if k else 3}


def _hash(request: gr.Request | None) -> str:
    """The browser session's id (gradio_client calls from one Client share one)."""
    return request.session_hash if request is not None and request.session_hash else "api"
