"""The playground in a real browser (Debian's chromium, driven by Playwright; no browser is downloaded):
open the page, type a prompt, attach an image, send, watch tokens appear and a plot change, stop.
Screenshots go to test-artifacts/ (git-ignored) for a person to look at."""
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright
from ui_server import LONG_PROMPT, LONG_SAMPLING, LONG_SEEDS, LONG_TOKENS, ROOT, running_app

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]   # a microphone that beeps
ARTIFACTS = ROOT / "test-artifacts"
VIEWPORT = {"width": 1600, "height": 1000}      # a projector's 16:10


@pytest.fixture(scope="module")
def page():
    assert CHROMIUM.exists(), "needs Debian's chromium: run scripts/test.sh, or apt-get install -y chromium"
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(log_path=ARTIFACTS / "ui_browser_server.log") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_context(viewport=VIEWPORT, permissions=["microphone"]).new_page()
        page.set_default_timeout(60_000)
        page.goto(url)
        page.locator(".status-ready").wait_for()              # the model finished loading
        yield page
        browser.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"ui_{name}.png"))


def num_tokens(page) -> int:
    return page.locator("#chat .tok").count()


def plotted_points(page, plot_id: str) -> int:
    """Points in the plotly graph's traces, read from the live graph div."""
    return page.locator(f"#{plot_id} .js-plotly-plot").evaluate(
        "el => (el.data || []).reduce((n, t) => n + ((t.x || []).length), 0)")


def wait_for_tokens(page, at_least: int) -> None:
    deadline = time.time() + 60
    while num_tokens(page) < at_least:
        assert time.time() < deadline, "no tokens appeared in the chat"
        time.sleep(0.1)


def test_type_attach_an_image_and_send(page):
    shot(page, "1_open")
    # the shipped model has MTP heads: the page starts with MTP drafting, so the plots have something to show
    expect(page.locator("#spec-method input[value=mtp]")).to_be_checked()
    page.locator("#message textarea").fill("What shapes and colours are in this picture?")
    page.locator("#message input[type=file]").set_input_files(str(ROOT / "assets" / "examples" / "shapes.png"))
    page.locator("#message img").first.wait_for()             # the attachment's thumbnail
    shot(page, "2_typed_with_image")
    page.locator("#message textarea").press("Enter")
    page.locator("#chat .answer-footer").wait_for()
    assert num_tokens(page) > 0
    assert page.locator("#chat .msg.user img.thumb").count() == 1       # the picture is in the conversation
    assert "TOK/S" in page.locator("#cards").inner_text().upper()
    shot(page, "3_image_answer")


def start_a_long_answer(page) -> None:
    """Send LONG_PROMPT, sampled, trying seeds until an answer is still streaming after LONG_TOKENS."""
    page.locator("#max-tokens input[type=number]").fill(str(LONG_SAMPLING["max_tokens"]))
    page.locator("#max-tokens input[type=number]").press("Enter")
    page.locator("#temperature input[type=number]").fill(str(LONG_SAMPLING["temperature"]))
    page.locator("#temperature input[type=number]").press("Enter")
    for seed in LONG_SEEDS:
        page.locator("#clear").click()
        page.locator("#chat .conv-empty").wait_for()
        page.locator("#seed input").fill(str(seed))
        page.locator("#message textarea").fill(LONG_PROMPT)
        page.locator("#message textarea").press("Enter")
        deadline = time.time() + 120
        while num_tokens(page) < LONG_TOKENS and page.locator("#chat .answer-footer").count() == 0:
            assert time.time() < deadline, "the answer did not grow for two minutes"
            time.sleep(0.1)
        if page.locator("#chat .answer-footer").count() == 0:
            return
        page.locator("#message textarea:not([disabled])").wait_for()
    pytest.fail(f"every seed in {LONG_SEEDS} ended its story before {LONG_TOKENS} tokens; lengthen LONG_PROMPT")


def test_watch_tokens_and_plots_stream_then_stop(page):
    start_a_long_answer(page)
    first_tokens, first_points = num_tokens(page), plotted_points(page, "live-plot")
    time.sleep(1.0)
    assert num_tokens(page) > first_tokens                    # tokens keep arriving
    assert plotted_points(page, "live-plot") > first_points   # and the plots move while they stream
    shot(page, "4_streaming")
    assert page.locator("#chat .live-caret").count() == 1           # the answer shows it is still coming
    red = page.locator("#stop").evaluate("e => getComputedStyle(e).backgroundColor")
    page.locator("#stop").click()
    page.locator("#chat .answer-footer", has_text="stopped").wait_for(timeout=30_000)
    assert page.locator("#chat .live-caret").count() == 0
    page.mouse.move(0, 0)                                            # off the button: no hover colour
    page.wait_for_function(f"getComputedStyle(document.querySelector('#stop')).backgroundColor != '{red}'",
                           timeout=5_000)                            # Stop quiet again (after its transition)
    footer = page.locator("#chat .answer-footer").last.inner_text()
    assert int(re.search(r"(\d+) tokens", footer).group(1)) < LONG_SAMPLING["max_tokens"]
    page.locator("#message textarea:not([disabled])").wait_for()   # ready for the next message
    shot(page, "5_stopped")


def test_the_draft_ladder_and_engine_views_show_the_answer(page):
    page.get_by_role("tab", name="Draft ladder").click()
    page.locator("#ladder .rung.selected").wait_for()
    page.get_by_role("button", name="◀ step").click()
    page.locator("#ladder .rung-note").wait_for()
    shot(page, "6_ladder")
    page.get_by_role("tab", name="Engine").click()
    page.locator("#engine-table td", has_text="this tab").first.wait_for()
    shot(page, "7_engine")
    page.get_by_role("tab", name="Live").click()


def test_an_unreadable_file_gets_a_sentence_in_the_chat(page, tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("not an image")
    page.locator("#message input[type=file]").set_input_files(str(bad))
    page.locator("#message textarea").fill("What is this?")
    page.locator("#message textarea").press("Enter")
    notice = page.locator("#chat .notice", has_text="notes.txt is not a file this playground reads")
    notice.wait_for()
    page.locator("#message textarea:not([disabled])").wait_for()
    shot(page, "8_bad_file")


def test_a_preset_fills_the_message_and_the_settings(page):
    page.locator("#presets input").click()
    page.get_by_role("option", name="Listen to a clip").click()
    expect(page.locator("#message textarea")).to_have_value("What does the speaker say?")
    page.locator("#message .thumbnail-wrapper").wait_for()                 # the example clip is attached
    expect(page.locator("#spec-method input[value=mtp]")).to_be_checked()
    answers = page.locator("#chat .msg.bot").count()
    page.locator("#message textarea").press("Enter")
    page.locator("#chat .msg.user .chip", has_text="hat.flac").wait_for()
    page.locator(f"#chat .msg.bot >> nth={answers}").locator(".answer-footer, .notice").wait_for()
    shot(page, "9_preset_audio")


def test_export_a_trace_and_replay_it_without_the_model(page, tmp_path):
    with page.expect_download() as download:
        page.locator("#export").click()
    path = tmp_path / download.value.suggested_filename
    download.value.save_as(path)
    assert path.suffix == ".jsonl" and path.read_text().startswith('{"type": "trace"')
    page.get_by_role("tab", name="Replay").click()
    page.locator("#trace-file input[type=file]").set_input_files(str(path))
    page.get_by_text("Replayed from its events; no model runs.").wait_for()
    page.locator(".replay-answer .tok").first.wait_for()
    page.locator("#replay-plot .js-plotly-plot").wait_for()
    shot(page, "10_replay")
    page.get_by_role("tab", name="About").click()
    page.locator(".about", has_text="inkling-tiny").wait_for()
    shot(page, "11_about")


def test_record_from_the_microphone_and_send(page):
    page.locator("#clear").click()
    page.locator("#chat .conv-empty").wait_for()
    page.locator("#mic button", has_text="Record").first.click()
    time.sleep(1.5)
    page.locator("#mic button", has_text="Stop").first.click()
    page.locator("#message .thumbnail-wrapper").wait_for()              # the recording is attached, as WAV
    page.locator("#message textarea").fill("What did I say?")
    page.locator("#message textarea").press("Enter")
    page.locator("#chat .msg.user .chip", has_text="audio").wait_for()
    page.locator("#chat .msg.bot").locator(".answer-footer, .notice").first.wait_for()
    assert "could not answer" not in page.locator("#chat .msg.bot").inner_text()
    shot(page, "12_microphone")
