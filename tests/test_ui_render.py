"""The playground's views are pure functions of recorded events: provenance HTML, the draft ladder, the
headline numbers, the plots, and trace export / strict import / replay. No model is loaded here."""
import copy
import html
import json
import pickle
import re

import plotly.graph_objects as go
import pytest
from ui_recorded import STREAMS, without_draft_detail

from ui import plots, render, stats, trace
from ui.inputs import parse_input
from ui.session import DEFAULT_SETTINGS, Session, Turn
from ui.views import panels

ALL = {**STREAMS, "no_detail": without_draft_detail(STREAMS["ngram"])}


def steps_of(stream):
    return [e for e in stream["events"] if e["type"] == "Step"]


def turn_of(stream) -> Turn:
    turn = Turn("prompt", [], stream["settings"], sent_at=stream["sent_at"])
    turn.events = copy.deepcopy(stream["events"])
    return turn


def spans(fragment: str) -> list[tuple[str, str, str]]:
    """(kind, title, text) of each token span."""
    return [(k, html.unescape(t), html.unescape(x)) for k, t, x in
            re.findall(r'<span class="tok tok-(\w+)" title="([^"]*)">([^<]*)</span>', fragment)]


# -- provenance ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ALL))
def test_provenance_spans_spell_the_answer_in_order_with_one_kind_per_token(name):
    steps = steps_of(ALL[name])
    out = spans(render.provenance_html(steps))
    assert "".join(text for _, _, text in out) == "".join(s["text"] for s in steps)
    kinds = [k for s in steps for k, t in zip(stats.token_kinds(s), render._token_texts(s)) if t]
    assert [k for k, _, _ in out] == kinds
    assert all(re.match(r"step \d+ · token \d+ of \d+ · ", title) for _, title, _ in out)


def test_provenance_shows_accepted_bonus_and_corrected_tokens_from_a_speculating_engine():
    kinds = {k for k, _, _ in spans(render.provenance_html(steps_of(STREAMS["ngram"])))}
    assert kinds == {"accepted", "bonus", "corrected", "target"}
    assert {k for k, _, _ in spans(render.provenance_html(steps_of(STREAMS["none"])))} == {"target"}
    assert {k for k, _, _ in spans(render.provenance_html(steps_of(STREAMS["mtp"])))} >= \
        {"accepted", "bonus", "corrected"}


def test_an_engine_without_draft_detail_still_marks_accepted_tokens_but_invents_no_rejections():
    detailed = spans(render.provenance_html(steps_of(STREAMS["ngram"])))
    counted = spans(render.provenance_html(steps_of(ALL["no_detail"])))
    assert [k == "accepted" for k, _, _ in counted] == [k == "accepted" for k, _, _ in detailed]
    assert {k for k, _, _ in counted} == {"accepted", "target"}
    assert any("counts only" in title for k, title, _ in counted if k == "target")


def test_token_text_is_escaped_and_whitespace_kept():
    step = {"type": "Step", "step": 0, "drafted": [], "accepted": 0, "emitted": [1, 2], "text": "<b>&\n",
            "emitted_text": ["<b>", "&\n"], "time": 1.0, "request_id": "r"}
    out = render.provenance_html([step])
    assert "<b>" not in out and "&lt;b&gt;" in out and "&amp;\n" in out


def test_a_character_split_across_tokens_goes_on_the_last_token():
    step = {"type": "Step", "step": 0, "drafted": [5], "accepted": 1, "emitted": [5, 6], "text": "é",
            "emitted_text": ["\ufffd", "\ufffd"], "time": 1.0, "request_id": "r"}
    assert [(k, x) for k, _, x in spans(render.provenance_html([step]))] == [("bonus", "é")]


def test_legend_names_all_four_kinds():
    legend = render.legend_html()
    for kind in ("accepted", "bonus", "corrected", "target"):
        assert f"tok-{kind}" in legend


# -- figures the UI computes agree with the engine's own -------------------------------------------
@pytest.mark.parametrize("name", ["ngram", "mtp"])
def test_spec_counts_from_steps_equal_the_engines_summary(name):
    finished = next(e for e in STREAMS[name]["events"] if e["type"] == "Finished")
    ours = stats.spec_counts(steps_of(STREAMS[name]))
    for key, value in ours.items():
        assert finished["spec_summary"][key] == pytest.approx(value), key


def test_without_detail_the_acceptance_figures_come_from_engine_counts_and_say_so():
    spec, source = stats.request_spec(ALL["no_detail"]["events"])
    assert spec["num_drafts"] > 0 and "engine-wide" in source
    fig = plots.acceptance_position_figure(ALL["no_detail"]["events"])
    assert fig["data"] and "engine-wide" in json.dumps(fig["layout"])


@pytest.mark.parametrize("name, reason", [("mtp", "hit max tokens"), ("ngram", "finished")])
def test_summary_of_a_finished_answer(name, reason):
    events = STREAMS[name]["events"]
    s = stats.summary(events, STREAMS[name]["sent_at"])
    finished = events[-1]
    assert s["num_tokens"] == finished["usage"]["completion_tokens"]
    assert s["tokens_per_s"] == finished["timings"]["tokens_per_s"]
    assert 1 < s["spec"]["mean_acceptance_length"] <= 4
    footer = render.answer_footer(s, STREAMS[name]["settings"])
    assert f"{s['num_tokens']} tokens" in footer and f"{name}×3" in footer and reason in footer


def test_speed_series_counts_tokens_over_the_trailing_window():
    steps = [{"time": 10.0 + 0.1 * i, "emitted": [0, 0]} for i in range(20)]
    xs, ys = stats.speed_series(steps, t0=10.0)
    assert ys[-1] == pytest.approx(20.0)            # 2 tokens every 0.1 s
    assert xs == sorted(xs)


# -- ladder ----------------------------------------------------------------------------------------
def test_ladder_explains_a_rejection_and_shows_discarded_drafts_as_ghosts():
    steps = steps_of(STREAMS["ngram"])
    broke = next(i for i, s in enumerate(steps) if s["drafted"] and s["accepted"] < len(s["drafted"]))
    out = render.ladder_html(steps, broke)
    s = steps[broke]
    assert "instead of" in out and f"{s['accepted']} of {len(s['drafted'])} drafts accepted" in out
    selected = out[out.index('class="rung selected"'):]
    selected = selected[:selected.index("rung-note")]
    assert selected.count('class="cell ghost"') == len(s["drafted"]) - s["accepted"] - 1
    assert selected.count('class="cell rej"') == 1 and selected.count('class="cell fix"') == 1


def test_ladder_explains_a_bonus_and_a_step_without_drafts():
    steps = steps_of(STREAMS["ngram"])
    bonus = next(i for i, s in enumerate(steps) if s["drafted"] and s["accepted"] == len(s["drafted"]))
    assert "bonus token" in render.ladder_html(steps, bonus)
    plain = next(i for i, s in enumerate(steps) if not s["drafted"])
    assert "Nothing was drafted" in render.ladder_html(steps, plain)
    assert "reports counts" in render.ladder_html(steps_of(ALL["no_detail"]), bonus)


def test_ladder_clamps_the_index_and_handles_no_steps():
    steps = steps_of(STREAMS["none"])
    assert f"step {len(steps) - 1} of {len(steps) - 1}" in render.ladder_html(steps, 10_000)
    assert "ladder-empty" in render.ladder_html([], 0)


# -- plots -----------------------------------------------------------------------------------------
def builders(events, t0):
    metrics = [e for e in events if e["type"] == "Metrics"]
    return {"speed": plots.speed_figure(events, t0), "latency": plots.latency_figure(events, t0),
            "length": plots.acceptance_length_figure(events), "position": plots.acceptance_position_figure(events),
            "cache": plots.cache_figure(metrics, t0), "engine": plots.engine_speed_figure(metrics, t0 + 5)}


@pytest.mark.parametrize("name", list(ALL))
def test_every_plot_is_a_valid_plotly_figure_at_every_point_of_the_stream(name):
    events = ALL[name]["events"]
    for cut in (0, 1, 3, len(events) // 2, len(events)):
        for fig in builders(events[:cut], ALL[name]["sent_at"]).values():
            go.Figure(fig)          # raises on anything plotly does not accept
            json.dumps(fig, allow_nan=False)


def test_plots_show_the_stream():
    events, t0 = STREAMS["ngram"]["events"], STREAMS["ngram"]["sent_at"]
    figs = builders(events, t0)
    speed = {d["name"]: d for d in figs["speed"]["data"]}
    assert len(speed["this answer"]["y"]) > 10 and max(speed["this answer"]["y"]) > 0
    per_step = figs["length"]["data"][0]
    assert per_step["y"] == [len(s["emitted"]) for s in steps_of(STREAMS["ngram"])]
    histogram = figs["length"]["data"][1]["y"]
    assert histogram == events[-1]["spec_summary"]["accepted_histogram"]
    position = {d["name"]: d["y"] for d in figs["position"]["data"]}
    assert position["conditional"] == events[-1]["spec_summary"]["conditional_acceptance_per_pos"]
    assert "steps that reached" in json.dumps(figs["position"])          # definitions on hover
    cache_names = {d.get("name") for d in figs["cache"]["data"]}
    assert {"full attention", "sliding window", "short-conv state"} <= cache_names
    assert any(d["type"] == "indicator" for d in figs["cache"]["data"])
    assert "first token" in figs["latency"]["layout"]["title"]["text"]


def test_without_speculation_the_acceptance_plots_say_nothing_was_drafted():
    events = STREAMS["none"]["events"]
    assert "nothing drafted" in json.dumps(plots.acceptance_length_figure(events))
    assert "no drafts" in json.dumps(plots.acceptance_position_figure(events))


@pytest.mark.parametrize("name", list(ALL))
def test_the_dashboard_keeps_every_view_with_its_own_axes_legend_and_title(name):
    events, t0 = ALL[name]["events"], ALL[name]["sent_at"]
    figs = builders(events, t0)
    rows = [[figs["speed"], figs["latency"]], [figs["length"], figs["position"]], [figs["cache"]]]
    board = plots.dashboard(rows)
    go.Figure(board)
    assert len(board["data"]) == sum(len(f["data"]) for row in rows for f in row)
    titles = [a["text"] for a in board["layout"]["annotations"] if a["text"].startswith("<b>")]
    assert [re.sub("<[^>]+>", "", t).split(" ·")[0] for t in titles] == \
        ["Tokens per second", "Latency", "Acceptance length per step", "Acceptance by draft position",
         "Cache use (whole engine)"]
    used = {t["xaxis"] for t in board["data"] if t["type"] != "indicator"}
    assert len(used) == sum(1 for row in rows for f in row if f["data"] and f["data"][0]["type"] != "indicator"
                            for k in f["layout"] if k.startswith("xaxis") and any(
                                t.get("xaxis", "x") == "x" + k[5:] for t in f["data"]))
    for series in board["data"]:                # every trace sits on axes that exist, inside the page
        if series["type"] == "indicator":
            assert 0 <= series["domain"]["x"][0] < series["domain"]["x"][1] <= 1
            continue
        x = board["layout"]["xaxis" + series["xaxis"][1:]]
        y = board["layout"]["yaxis" + series["yaxis"][1:]]
        assert 0 <= x["domain"][0] < x["domain"][1] <= 1 and 0 <= y["domain"][0] < y["domain"][1] <= 1
        assert x["anchor"] == series["yaxis"] or y.get("overlaying")


def test_dashboard_cells_do_not_overlap():
    events, t0 = STREAMS["ngram"]["events"], STREAMS["ngram"]["sent_at"]
    figs = builders(events, t0)
    board = plots.dashboard([[figs["speed"], figs["latency"]], [figs["length"], figs["position"]]])
    boxes = [(board["layout"][k]["domain"], board["layout"]["y" + k[1:]]["domain"])
             for k in board["layout"] if k.startswith("xaxis") and "overlaying" not in board["layout"][k]]
    for i, (xa, ya) in enumerate(boxes):
        for xb, yb in boxes[i + 1:]:
            overlap_x = min(xa[1], xb[1]) - max(xa[0], xb[0])
            overlap_y = min(ya[1], yb[1]) - max(ya[0], yb[0])
            assert overlap_x <= 1e-9 or overlap_y <= 1e-9 or (xa == xb and ya == yb)


def test_idle_time_breaks_the_lines():
    metrics = [e for e in STREAMS["ngram"]["events"] if e["type"] == "Metrics"]
    later = [{**m, "time": m["time"] + 30} for m in metrics]
    fig = plots.engine_speed_figure(metrics + later, later[-1]["time"])
    assert None in fig["data"][0]["x"]


# -- chat messages, replay, traces -----------------------------------------------------------------
def test_the_conversation_shows_answers_with_footers_refusals_and_attachments():
    ok = turn_of(STREAMS["ngram"])
    ok.user_text = "<script>alert(1)</script>"
    ok.files = [{"path": "/srv/x.png", "name": "x.png", "kind": "image", "thumb": "data:image/jpeg;base64,AAAA"}]
    refused = Turn("", [{"path": None, "name": "notes.txt", "kind": None}], DEFAULT_SETTINGS, notice="not a file")
    out = render.conversation_html([ok, refused])
    users, bots = out.split('<div class="msg user">')[1:], out.split('<div class="msg bot">')[1:]
    assert len(users) == len(bots) == 2
    assert "answer-footer" in bots[0] and "tok-accepted" in bots[0] and "not a file" in bots[1]
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert 'src="data:image/jpeg;base64,AAAA"' in out and "/srv/x.png" not in out     # never a server path
    assert "notes.txt" in users[1]
    assert "spinner" in render.conversation_html([ok], pending="loading the model… 3 s").split("msg bot")[-1]
    assert "conv-empty" in render.conversation_html([])


def test_an_error_event_reads_as_a_sentence():
    turn = Turn("hi", [], DEFAULT_SETTINGS)
    turn.events = [{"type": "Error", "request_id": "r", "message": "Image 1: The image file is truncated."}]
    out = render.reply_html(turn.events, turn.settings, None)
    assert "could not answer: Image 1: The image file is truncated." in out


def session_of(*names) -> Session:
    session = Session()
    for name in names:
        turn = turn_of(ALL[name])
        turn.files = [{"path": "/srv/secret/uploads/cat.png", "name": "cat.png", "kind": "image"}]
        session.turns.append(turn)
    return session


def test_a_trace_round_trips_and_replays_exactly_like_the_live_views():
    session = session_of("ngram", "mtp", "no_detail")
    lines = trace.export_lines(session, {"model": "inkling-tiny", "capabilities": {"per_token_drafts": True}})
    assert "/srv/secret" not in "\n".join(lines)                    # no server paths leave
    loaded = trace.parse(("\n".join(lines) + "\n").encode())
    assert loaded.engine["model"] == "inkling-tiny" and len(loaded.turns) == 3
    for live, replayed in zip(session.turns, loaded.turns):
        assert replayed.events == live.events and replayed.settings == live.settings
        assert replayed.files == [{"path": None, "name": "cat.png", "kind": "image"}]
        live_view, replay_view = panels(live), panels(replayed)
        assert {k: getattr(v, "plot", v) for k, v in live_view.items()} == \
            {k: getattr(v, "plot", v) for k, v in replay_view.items()}


def test_replay_at_step_n_shows_only_what_had_happened_by_then():
    turn = turn_of(STREAMS["ngram"])
    view = panels(turn, step_index=5)
    assert "step 5 of 5" in view["ladder"]
    figure = json.loads(view["plots"])
    answer = next(d for d in figure["data"] if d.get("name") == "this answer")
    assert max(answer["x"]) <= steps_of(STREAMS["ngram"])[5]["time"] - turn.sent_at + 1e-9


def good_trace() -> list[str]:
    return trace.export_lines(session_of("ngram"), {"model": "m"})


@pytest.mark.parametrize("mutate, phrase", [
    (lambda lines: [], "empty"),
    (lambda lines: lines + ["__import__('os').system('true')"], "not valid JSON"),
    (lambda lines: ['{"type": "trace", "version": 99}'] + lines[1:], "version-1 trace header"),
    (lambda lines: lines + ["[1, 2]"], "must be a JSON object"),
    (lambda lines: lines + ['{"type": "event", "turn": 0, "event": {"type": "Pickle"}}'], "unknown event type"),
    (lambda lines: lines + ['{"type": "macro", "x": 1}'], "unknown line type"),
    (lambda lines: lines[:1] + lines[2:], "must follow its turn"),
    (lambda lines: lines + ['{"type": "event", "turn": 0, "event": {"type": "Step", "request_id": "r", "step": 0, '
                            '"drafted": [], "accepted": 0, "emitted": ["os.system"], "text": "", "time": 1}}'],
     "wrong type"),
    (lambda lines: lines + ['{"type": "event", "turn": 0, "event": {"type": "Metrics", "time": NaN, '
                            '"tokens_per_s": 1, "running": 1, "waiting": 0, "kv": {"groups": {}}}}'], "NaN"),
    (lambda lines: lines + ['{"type": "event", "turn": 0, "event": {"type": "Error", "request_id": "r"}}'],
     "missing message"),
    (lambda lines: lines + ['{"type": "event", "turn": 0, "event": {"type": "Metrics", "time": 1, "tokens_per_s": 1, '
                            '"running": 1, "waiting": 0, "kv": {"groups": {"<a href=x>": {"used": 1, "total": 2}}}}}'],
     "kv.*wrong type"),
    (lambda lines: lines + ['{"type": "turn", "user_text": "x", "settings": {"temperature": "__import__(\'os\')"}}'],
     "wrong type"),
])
def test_a_bad_trace_is_refused_with_a_sentence(mutate, phrase):
    with pytest.raises(trace.TraceError, match=phrase):
        trace.parse(("\n".join(mutate(good_trace())) + "\n").encode())


def test_a_pickle_is_not_a_trace():
    with pytest.raises(trace.TraceError, match="not UTF-8"):
        trace.parse(pickle.dumps(session_of("ngram")))


def test_trace_size_limits_are_checked_before_parsing(monkeypatch):
    monkeypatch.setattr(trace, "MAX_BYTES", 1000)
    with pytest.raises(trace.TraceError, match="limit is"):
        trace.parse(b"x" * 1001)
    monkeypatch.setattr(trace, "MAX_BYTES", 32 << 20)
    monkeypatch.setattr(trace, "MAX_LINE_BYTES", 100)
    with pytest.raises(trace.TraceError, match="longer than"):
        trace.parse(("\n".join(good_trace())).encode())


def test_figures_in_a_trace_are_numbers_or_it_is_refused():
    lines = good_trace()
    finished = json.loads(lines[-1])
    finished["event"]["spec_summary"]["mean_acceptance_length"] = "<img src=x onerror=alert(1)>"
    with pytest.raises(trace.TraceError, match="spec_summary: field 'mean_acceptance_length'"):
        trace.parse("\n".join(lines[:-1] + [json.dumps(finished)]).encode())


def test_unknown_fields_are_dropped_not_kept():
    lines = good_trace()
    lines.append(json.dumps({"type": "event", "turn": 0, "event": {"type": "Error", "request_id": "r",
                                                                    "message": "m", "path": "/etc/passwd"}}))
    loaded = trace.parse("\n".join(lines).encode())
    assert loaded.turns[0].events[-1] == {"type": "Error", "request_id": "r", "message": "m"}


# -- input box and session -------------------------------------------------------------------------
@pytest.mark.parametrize("value, modalities, phrase", [
    ({"text": "  ", "files": []}, ["text"], "empty"),
    (None, ["text"], "must be text"),
    ({"text": "hi", "files": ["/tmp/x/notes.txt"]}, ["text", "image", "audio"], "notes.txt is not a file"),
    ({"text": "hi", "files": ["/tmp/x/cat.png"]}, ["text"], "reads text only"),
    ({"text": "x" * 100_001, "files": []}, ["text"], "Shorten it"),
])
def test_bad_input_gets_a_sentence(value, modalities, phrase):
    _, _, problem = parse_input(value, modalities)
    assert phrase in problem


def test_good_input_is_split_into_text_and_media():
    text, files, problem = parse_input({"text": "what?", "files": [{"path": "/u/a.PNG"}, "/u/b.wav"]},
                                       ["text", "image", "audio"])
    assert problem is None and text == "what?"
    assert [(f["name"], f["kind"]) for f in files] == [("a.PNG", "image"), ("b.wav", "audio")]
    assert parse_input("plain", ["text"]) == ("plain", [], None)


def test_history_sends_only_answered_turns_with_the_system_prompt():
    settings = {**DEFAULT_SETTINGS, "system_prompt": "Be brief."}
    answered = turn_of(STREAMS["none"])
    refused = Turn("bad", [], settings, notice="refused")
    current = Turn("next", [{"path": "/u/a.png", "name": "a.png", "kind": "image"}], settings)
    session = Session(turns=[answered, refused, current])
    messages = session.messages_for(current)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"][0]["text"] == answered.reply_text
    assert messages[3]["content"] == [{"type": "image", "path": "/u/a.png"}, {"type": "text", "text": "next"}]


def test_recording_thins_metrics_but_keeps_the_last_one():
    turn = Turn("x", [], DEFAULT_SETTINGS)
    for i in range(50):
        turn.record({"type": "Metrics", "time": 100 + i * 0.01, "tokens_per_s": 1.0, "running": 1, "waiting": 0,
                     "kv": {"groups": {}}})
    turn.record({"type": "Finished", "request_id": "r", "reason": "stop"})
    times = [e["time"] for e in turn.of_type("Metrics")]
    assert len(times) < 10 and times[-1] == pytest.approx(100.49)


def test_a_token_without_text_shows_its_id_in_the_ladder():
    step = {"type": "Step", "request_id": "r", "step": 0, "drafted": [7, 10], "accepted": 1, "emitted": [7, 10],
            "text": "", "time": 1.0, "emitted_text": ["", ""], "drafted_text": ["", ""]}
    out = render.ladder_html([step], 0)
    assert "\u27e810\u27e9" in out and "\u201c\u201d" not in out


@pytest.mark.parametrize("drafted, accepted, emitted", [
    ([5, 6, 7], 3, [5]), ([5, 6, 7], 3, [5, 6, 7]), ([5, 6, 7], 1, [5]), ([], 2, [5]), ([], 0, []), ([5], 0, [8]),
])
def test_a_step_cut_short_by_the_end_of_the_answer_still_renders(drafted, accepted, emitted):
    """The last step keeps only the tokens up to a stop token or the limit, whatever was accepted."""
    step = {"type": "Step", "request_id": "r", "step": 0, "drafted": drafted, "accepted": accepted,
            "emitted": emitted, "text": "x" * len(emitted), "time": 1.0}
    events = [{"type": "Started", "request_id": "r", "prompt_tokens": 3}, step]
    out = render.ladder_html([step], 0)
    assert 'class="rung selected"' in out and "rung-note" in out
    render.provenance_html([step])
    for fig in builders(events, 0.5).values():
        go.Figure(fig)


def test_the_views_need_no_model_and_no_torch():
    """Everything but hub.py (the one place that builds Requests) works without the engine's stack."""
    import subprocess
    import sys
    code = ("import sys; import ui.render, ui.plots, ui.stats, ui.trace, ui.views, ui.replay, ui.session, "
            "ui.inputs, ui.presets, ui.plot_view; print(sorted(m for m in ('torch', 'backend') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    assert out.stdout.strip() == "[]"
