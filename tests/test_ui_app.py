"""The playground served by `python app.py` on the shipped model, driven through gradio_client as an API
user would: text, image and audio turns stream; stop aborts; bad input reads as a sentence in the chat
and the app keeps serving that session and others; traces export and replay; compare runs both sides.
Plus the handlers in-process, to check that every way out of a turn frees the engine's cache."""
import html
import re
import threading
import time
from pathlib import Path

import pytest
from conftest import assert_all_free
from gradio_client import Client, handle_file
from ui_server import LONG_PROMPT, LONG_SAMPLING, LONG_SEEDS, LONG_TOKENS, ROOT, running_app

EXAMPLES = ROOT / "assets" / "examples"
ARTIFACTS = ROOT / "test-artifacts"
TOKEN = re.compile(r'<span class="tok tok-\w+"')
LONG = LONG_PROMPT


@pytest.fixture(scope="module")
def url():
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(log_path=ARTIFACTS / "ui_app_server.log") as url:
        yield url


def client(url) -> Client:
    return Client(url, verbose=False)


def answer(outputs) -> str:
    """The last answer in the conversation HTML of a /chat output tuple."""
    conversation = outputs[0]
    return conversation[conversation.rindex('<div class="msg bot">'):]


def last_user_message(outputs) -> str:
    conversation = outputs[0]
    return conversation[conversation.rindex('<div class="msg user">'):conversation.rindex('<div class="msg bot">')]


def chat(c: Client, text: str, files=(), **settings) -> tuple[list, tuple]:
    """Send a message; returns (every streamed output, the final output)."""
    job = c.submit({"text": text, "files": [handle_file(str(f)) for f in files]}, api_name="/chat", **settings)
    final = job.result(timeout=300)
    return job.outputs(), final


def readable(message: str) -> bool:
    """A sentence for a person: no traceback, no Python reprs."""
    return len(message) > 20 and "Traceback" not in message and "object at 0x" not in message


def test_a_text_turn_streams_token_by_token(url):
    c = client(url)
    outputs, final = chat(c, LONG, max_tokens=200)
    counts = [len(TOKEN.findall(answer(o))) for o in outputs]
    streamed = [n for o, n in zip(outputs, counts) if n and "answer-footer" not in answer(o)]
    assert len(streamed) >= 3, counts                          # chunks arrived before the end
    assert counts == sorted(counts)                            # and only ever grew
    footer = re.search(r'answer-footer">(\d+) tokens .*(hit max tokens|finished)</div>', answer(final))
    assert footer and int(footer.group(1)) <= 200
    cards, plot = final[2], final[3]                           # (the session state is not an API output)
    assert "tok/s" in cards
    assert '"name": "this answer"' in plot                     # the tokens/s view has its line


def test_a_second_turn_keeps_the_history(url):
    c = client(url)
    chat(c, "Hello", max_tokens=8)
    _, final = chat(c, "And again", max_tokens=8, spec_method="ngram", num_spec_tokens=2)
    assert final[0].count('class="msg user"') == final[0].count('class="msg bot"') == 2
    assert TOKEN.search(answer(final)) and "answer-footer" in answer(final)


@pytest.mark.parametrize("name, question", [("shapes.png", "What is in this picture?"),
                                            ("hello.ogg", "What does the speaker say?")])
def test_image_and_audio_turns_answer_or_explain(url, name, question):
    outputs, final = chat(client(url), question, files=[EXAMPLES / name], max_tokens=24, spec_method="mtp")
    user = last_user_message(final)                                         # the attachment shows
    assert ('class="thumb"' in user and 'alt="shapes.png"' in user) if name.endswith(".png") else name in user
    text = answer(final)
    if TOKEN.search(text):
        assert "answer-footer" in text and "could not answer" not in text
    else:                                                                   # an engine without that tower
        assert "could not answer" in text and readable(html.unescape(text))


def long_running_job(c: Client):
    """A /chat job still streaming after LONG_TOKENS tokens (trying seeds until one is)."""
    for seed in LONG_SEEDS:
        c.predict(api_name="/clear")
        job = c.submit({"text": LONG, "files": []}, seed=seed, api_name="/chat", **LONG_SAMPLING)
        deadline = time.time() + 120
        while not job.done() and not (job.outputs() and len(TOKEN.findall(answer(job.outputs()[-1]))) >= LONG_TOKENS):
            assert time.time() < deadline, "the answer did not grow for two minutes"
            time.sleep(0.05)
        if not job.done():
            return job
        job.result()
    pytest.fail(f"every seed in {LONG_SEEDS} ended its story before {LONG_TOKENS} tokens; lengthen LONG_PROMPT or raise the temperature")


def test_stop_aborts_the_answer_and_the_session_keeps_working(url):
    c = client(url)
    job = long_running_job(c)
    c.predict(api_name="/stop")
    final = job.result(timeout=30)
    text = answer(final)
    assert "stopped" in text
    assert int(re.search(r"(\d+) tokens", text).group(1)) < LONG_SAMPLING["max_tokens"]
    _, after = chat(c, "Are you still there?", max_tokens=5)
    assert TOKEN.search(answer(after)) and "answer-footer" in answer(after)


@pytest.mark.parametrize("make_file, phrase", [
    (None, "The message is empty"),
    (lambda d: (d / "notes.txt", b"plain text"), "notes.txt is not a file this playground reads"),
    (lambda d: (d / "broken.png", b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 50), "Image 1 (broken.png)"),
    (lambda d: (d / "noise.wav", b"RIFF\x00\x00\x00\x00WAVEfmt garbage"), "Audio 1 (noise.wav)"),
])
def test_bad_input_reads_as_a_sentence_and_the_app_keeps_working(url, tmp_path, make_file, phrase):
    c, other = client(url), client(url)
    files = []
    if make_file:
        path, data = make_file(tmp_path)
        path.write_bytes(data)
        files = [path]
    _, final = chat(c, "" if make_file is None else "Look at this", files=files)
    text = html.unescape(answer(final))
    assert phrase in text and readable(text)
    assert 'class="notice"' in answer(final)
    _, same = chat(c, "Hello", max_tokens=4)                   # that session still works
    assert TOKEN.search(answer(same)) and "answer-footer" in answer(same)
    _, fresh = chat(other, "Hello", max_tokens=4)              # and so does another
    assert TOKEN.search(answer(fresh)) and "answer-footer" in answer(fresh)


def test_sessions_share_the_engine_each_with_its_own_chat(url):
    clients = [client(url) for _ in range(3)]
    results = [None] * 3

    def run(i):
        results[i] = chat(clients[i], f"{LONG} Session {i}.", max_tokens=40 + 10 * i)[1]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, final in enumerate(results):
        assert final[0].count('class="msg user"') == 1 and f"Session {i}." in final[0]
        assert TOKEN.search(answer(final)) and "answer-footer" in answer(final)


def test_a_trace_exports_and_replays_through_the_api(url):
    c = client(url)
    chat(c, "abc abc abc abc", max_tokens=32, spec_method="ngram")
    path = c.predict(api_name="/export_trace")
    lines = Path(path).read_text().splitlines()
    assert lines[0].startswith('{"type": "trace"') and len(lines) > 10
    replay = c.predict(handle_file(path), api_name="/load_trace")
    info, answer_html, ladder = replay[0], replay[3], replay[5]       # (the loaded trace is state: not an output)
    assert "Trace of 1 turn" in info and TOKEN.search(answer_html) and "rung selected" in ladder
    bad = Path(path).with_name("bad.jsonl")
    bad.write_text('{"type": "trace", "version": 1}\n{"type": "event", "turn": 0, "event": {}}\n')
    refused = c.predict(handle_file(str(bad)), api_name="/load_trace")
    assert "cannot be replayed: Line 2" in html.unescape(refused[0])


def test_compare_shows_both_sides_the_speedup_and_whether_they_match(url):
    a, b, verdict = client(url).predict("abc abc abc abc", "none", "ngram ×3", max_tokens=48,
                                        api_name="/compare")
    assert "no speculation" in a and "ngram, 3 drafts per step" in b
    assert "speedup ×" in verdict and "identical outputs" in verdict      # greedy: lossless


# -- in-process: every way out of a turn frees the cache ---------------------------------------------
@pytest.fixture(scope="module")
def playground():
    from backend import load_engine
    from ui.app import Playground
    from ui.hub import EngineHub
    hub = EngineHub({"model": "inkling-tiny"})
    hub.set_engine(load_engine(str(ROOT / "assets" / "inkling-tiny")))
    return Playground(hub, presets={})


def streaming_chat(playground, tab=None):
    """An in-process chat generator whose answer is still streaming after LONG_TOKENS tokens."""
    for seed in LONG_SEEDS:
        stream = playground.chat({"text": LONG, "files": []}, seed=seed, spec_method="mtp", request=tab,
                                 **LONG_SAMPLING)
        for outputs in stream:
            if len(TOKEN.findall(answer(outputs))) >= LONG_TOKENS and "answer-footer" not in answer(outputs):
                return stream
    pytest.fail(f"every seed in {LONG_SEEDS} ended its story before {LONG_TOKENS} tokens; lengthen LONG_PROMPT or raise the temperature")


def test_stop_frees_every_block(playground):
    stream = streaming_chat(playground)
    playground.stop()
    final = list(stream)[-1]
    assert "stopped" in answer(final)
    assert_all_free(playground.hub.engine)


def test_a_closed_tab_aborts_its_request_and_frees_every_block(playground):
    stream = streaming_chat(playground)
    stream.close()                      # what Gradio does when the browser goes away
    deadline = time.time() + 10
    while playground.hub.engine.has_work() and time.time() < deadline:
        time.sleep(0.05)
    assert_all_free(playground.hub.engine)
    assert playground.hub.snapshot()["requests"][0]["state"] == "abort"


def test_a_message_sent_while_the_model_loads_waits_and_then_answers(playground):
    import threading as th

    from ui.app import Playground
    from ui.hub import EngineHub
    release = th.Event()
    hub = EngineHub({"model": "inkling-tiny"})
    hub.load_in_background(lambda: release.wait(30) and playground.hub.engine)
    outputs = Playground(hub, presets={}).chat({"text": "Hello", "files": []}, max_tokens=4)
    waiting = [next(outputs) for _ in range(2)]
    assert "loading the model" in answer(waiting[-1])
    release.set()
    final = list(outputs)[-1]
    assert TOKEN.search(answer(final)) and "answer-footer" in answer(final)


def test_without_a_model_the_chat_says_so_and_replay_still_works(playground):
    from ui.app import Playground
    from ui.hub import EngineHub
    hub = EngineHub({"model": "inkling-tiny"})
    hub.no_engine("started with --replay-only")
    final = list(Playground(hub, presets={}).chat({"text": "Hello", "files": []}))[-1]
    assert "No model is loaded (started with --replay-only)" in answer(final)


def test_the_engine_view_shows_every_tab_and_marks_this_one(playground):
    from ui.render import engine_html

    class Tab:
        def __init__(self, session_hash):
            self.session_hash = session_hash
    streams = [streaming_chat(playground, Tab(name)) for name in ("tab-one", "tab-two")]
    snapshot = playground.hub.snapshot()
    running = [r for r in snapshot["requests"] if r["state"] in ("waiting", "running")]
    assert {r["session"] for r in running} == {"tab-one", "tab-two"}
    table = engine_html(snapshot, "tab-one")
    assert "this tab" in table and "tab tab-tw" in table and "2 running now" in table
    for name, stream in zip(("tab-one", "tab-two"), streams):
        playground.hub.abort_session(name)
        assert "stopped" in answer(list(stream)[-1])
    assert_all_free(playground.hub.engine)
