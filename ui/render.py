"""HTML views, each a pure function of recorded events: the answer coloured by token provenance, the
draft ladder, headline numbers, the engine-wide table and the about panel. Every piece of text that
came from a user, a model or a trace is escaped."""
from __future__ import annotations

from html import escape

from . import stats
from .stats import ACCEPTED, BONUS, CORRECTED, TARGET

LEGEND = {
    ACCEPTED: ("accepted draft", "a drafted token the target model agreed with"),
    BONUS: ("bonus token", "the target's own token after every draft was accepted"),
    CORRECTED: ("correction", "the target's own token where it rejected a draft"),
    TARGET: ("target token, no draft", "the target's own token; nothing was drafted for it"),
}
LADDER_CONTEXT = 3                  # steps shown above and below the selected one
VISIBLE_WHITESPACE = str.maketrans({" ": "\u2423", "\n": "\u23ce", "\t": "\u21e5"})


def legend_html() -> str:
    items = "".join(f'<span class="legend-item" title="{escape(why)}"><span class="tok tok-{kind}">{escape(label)}'
                    f"</span></span>" for kind, (label, why) in LEGEND.items())
    return f'<div class="legend">{items}</div>'


def _token_texts(step: dict) -> list[str]:
    """Each emitted token's text. Falls back to the step's text on its last token when the per-token
    pieces do not add up (a character split across tokens)."""
    pieces = step.get("emitted_text")
    if pieces and len(pieces) == len(step["emitted"]) and "".join(pieces) == step["text"]:
        return list(pieces)
    return [""] * (len(step["emitted"]) - 1) + [step["text"]] if step["emitted"] else []


def _token_title(step: dict, i: int, kind: str, has_detail: bool) -> str:
    n = len(step["emitted"])
    title = f"step {step['step']} · token {i + 1} of {n} · {LEGEND[kind][0]} · id {step['emitted'][i]}"
    probs = step.get("draft_probs")
    if kind == ACCEPTED and probs and i < len(probs):
        title += f" · draft probability {probs[i]:.2f}"
    if kind == TARGET and step["accepted"] and not has_detail:
        title += " · the engine reports counts only, not which drafts it rejected"
    return title


def provenance_html(steps: list[dict]) -> str:
    """The answer so far, one span per token, coloured by how the token came (see LEGEND). No wrapper,
    so a streaming answer only ever grows at its end (the browser receives appends, not the whole text)."""
    has_detail = stats.has_draft_detail(steps)
    spans = []
    for step in steps:
        for i, (kind, text) in enumerate(zip(stats.token_kinds(step), _token_texts(step))):
            if text:
                title = _token_title(step, i, kind, has_detail)
                spans.append(f'<span class="tok tok-{kind}" title="{escape(title)}">{escape(text)}</span>')
    return "".join(spans)


def _fmt(value, spec: str, unit: str = "", none: str = "–") -> str:
    return none if value is None else f"{value:{spec}}{unit}"


def _scaled(value, factor):
    return None if value is None else value * factor


def answer_footer(summary: dict, settings: dict) -> str:
    """One line under an answer: how many tokens, how fast, how speculation did, why it ended."""
    parts = [f"{summary['num_tokens']} tokens", f"{_fmt(summary['tokens_per_s'], '.0f')} tok/s",
             f"first token {_fmt(_scaled(summary['ttft_s'], 1000), '.0f', ' ms')}"]
    method = settings.get("spec_method", "none")
    if method != "none":
        spec = summary["spec"] or {}
        parts.append(f"{method}×{settings.get('num_spec_tokens')}: acceptance length "
                     f"{_fmt(spec.get('mean_acceptance_length'), '.2f')}, "
                     f"{_fmt(_scaled(spec.get('acceptance_rate'), 100), '.0f', '%')} of drafts accepted")
    if summary["reason"]:
        parts.append({"stop": "finished", "length": "hit max tokens", "abort": "stopped",
                      "error": "failed"}.get(summary["reason"], summary["reason"]))
    return f'<div class="answer-footer">{escape(" · ".join(parts))}</div>'


def reply_html(events: list[dict], settings: dict, t0: float | None, notice: str | None = None) -> str:
    """An assistant message: the provenance-coloured answer, notes, errors and the footer."""
    if notice:
        return f'<div class="notice">\u26a0\ufe0e {escape(notice)}</div>'
    steps = [e for e in events if e["type"] == "Step"]
    summary = stats.summary(events, t0)
    body = provenance_html(steps) if steps else ""
    notes = "".join(f'<div class="note">{escape(n)}</div>' for n in summary["notes"])
    error = next((e["message"] for e in events if e["type"] == "Error"), None)
    if error:
        return notes + body + f'<div class="notice">\u26a0\ufe0e The engine could not answer: {escape(error)}</div>'
    if not steps:
        return notes + '<div class="pending">thinking…</div>'
    done = any(e["type"] == "Finished" for e in events)
    return notes + body + (answer_footer(summary, settings) if done else "")


def _attachment(f: dict) -> str:
    if f.get("thumb"):      # a data: URI made by inputs.thumbnail, never a path
        return f'<img class="thumb" src="{escape(f["thumb"])}" alt="{escape(f["name"])}" title="{escape(f["name"])}">'
    return f'<span class="chip"><b>{escape(f["kind"] or "file")}</b> {escape(f["name"])}</span>'


def conversation_html(turns: list, pending: str | None = None) -> str:
    """The whole conversation as one HTML block: each user message (text, attachments) and its answer.
    (Not gr.Chatbot: it re-renders every token span through its message pipeline on each update, which
    stalls the browser on long answers; plain HTML stays quick.) `pending` replaces the last answer while
    it waits (e.g. for the model to load)."""
    if not turns:
        return ('<div class="conv"><div class="conv-empty">Ask something, attach an image or a clip, and watch '
                'each token arrive, coloured by how it was made.</div></div>')
    parts = []
    for turn in turns:
        files = "".join(_attachment(f) for f in turn.files)
        text = f'<div class="msg-text">{escape(turn.user_text)}</div>' if turn.user_text else ""
        parts.append(f'<div class="msg user">{f"<div class=attachments>{files}</div>" if files else ""}{text}</div>')
        if turn.is_done:
            turn.rendered = turn.rendered or reply_html(turn.events, turn.settings, turn.sent_at, turn.notice)
            reply = turn.rendered
        else:
            reply = reply_html(turn.events, turn.settings, turn.sent_at, turn.notice)
        if pending and turn is turns[-1]:
            reply = f'<div class="pending"><span class="spinner"></span> {escape(pending)}</div>'
        elif not turn.is_done and turn.steps:
            reply += '<span class="live-caret">▌</span>'    # still streaming (the page's Stop turns red)
        parts.append(f'<div class="msg bot">{reply}</div>')
    return f'<div class="conv"><div class="conv-inner">{"".join(parts)}</div></div>'


def stats_html(summary: dict | None, settings: dict | None = None) -> str:
    """The row of headline numbers above the plots."""
    s = summary or {}
    spec = s.get("spec") or {}
    cards = [
        ("tokens", _fmt(s.get("num_tokens"), "d"), "tokens in this answer"),
        ("tok/s", _fmt(s.get("tokens_per_s"), ".0f"), "decode speed of this answer (after the first token)"),
        ("TTFT", _fmt(_scaled(s.get("ttft_s"), 1000), ".0f", " ms"), "time to first token"),
        ("ITL", _fmt(s.get("itl_ms"), ".1f", " ms"), "inter-token latency: mean time per token after the first"),
        ("accept len", _fmt(spec.get("mean_acceptance_length"), ".2f"),
         "mean acceptance length: tokens per step that carried drafts (accepted drafts + 1)"),
        ("cache", _fmt(_scaled(s.get("kv_use"), 100), ".1f", "%"), "share of the engine's KV block pool in use"),
    ]
    html = "".join(f'<div class="card" title="{escape(why)}"><div class="card-value">{escape(v)}</div>'
                   f'<div class="card-label">{escape(k)}</div></div>' for k, v, why in cards)
    return f'<div class="cards">{html}</div>'


def _cell(text: str, cls: str, title: str) -> str:
    shown = escape(text.translate(VISIBLE_WHITESPACE)) if text else "\u00a0"
    return f'<span class="cell {cls}" title="{escape(title)}">{shown}</span>'


def _rung(step: dict, selected: bool, has_detail: bool) -> str:
    drafted, accepted, emitted = step["drafted"], step["accepted"], step["emitted"]
    draft_texts, emitted_texts = _labels(drafted, step.get("drafted_text")), _labels(emitted, step.get("emitted_text"))
    draft_cells, target_cells = [], []
    for i, text in enumerate(draft_texts):
        cls = "acc" if i < accepted else "rej" if i == accepted else "ghost"
        what = {"acc": "accepted", "rej": "rejected: the target chose otherwise", "ghost": "never checked: an "
                "earlier draft was rejected"}[cls]
        draft_cells.append(_cell(text, cls, f"draft {i + 1}: {what} (id {drafted[i]})"))
    for i, text in enumerate(emitted_texts):
        kind = stats.token_kinds(step)[i]
        cls = {ACCEPTED: "same", BONUS: "bonus", CORRECTED: "fix", TARGET: "own"}[kind]
        target_cells.append(_cell(text, cls, f"{LEGEND[kind][0]} (id {emitted[i]})"))
    rows = []
    if drafted:
        rows.append(f'<div class="rung-row"><span class="rung-label">drafts</span>{"".join(draft_cells)}</div>')
    rows.append(f'<div class="rung-row"><span class="rung-label">target</span>{"".join(target_cells)}</div>')
    head = f'<span class="rung-step">step {step["step"]}</span>'
    note = f'<div class="rung-note">{escape(_rung_sentence(step, has_detail))}</div>' if selected else ""
    return f'<div class="rung{" selected" if selected else ""}">{head}<div>{"".join(rows)}{note}</div></div>'


def _labels(ids: list[int], texts: list[str] | None) -> list[str]:
    """What a ladder cell shows for each token: its text, or ⟨id⟩ for one without text (a special token
    such as the end of the turn, or an engine that sent no token text)."""
    texts = texts if texts and len(texts) == len(ids) else [""] * len(ids)
    return [text or f"\u27e8{token}\u27e9" for token, text in zip(ids, texts)]


def _quote(text: str) -> str:
    return "\u201c" + text.translate(VISIBLE_WHITESPACE) + "\u201d"


def _rung_sentence(step: dict, has_detail: bool) -> str:
    drafted, accepted, emitted = step["drafted"], step["accepted"], step["emitted"]
    texts = _labels(emitted, step.get("emitted_text"))
    n = len(emitted)
    if n == 0:
        return "This step emitted no tokens."
    if n <= accepted:                  # the answer ended (stop token or max tokens) inside the accepted drafts
        return (f"{accepted} drafts were accepted and the answer ended after {n} of them (a stop token or the "
                f"token limit), before the target's own token.")
    if not drafted:
        if accepted and not has_detail:
            return (f"{accepted} drafts were accepted, then the target added {_quote(texts[-1])}: {n} tokens in one "
                    "step (this engine reports counts, not the draft tokens).")
        return f"Nothing was drafted; the target produced {_quote(texts[-1])}: 1 token in one step."
    k = len(drafted)
    if accepted == k:
        return (f"All {k} drafts were accepted and the target added the bonus token {_quote(texts[-1])}: "
                f"{n} tokens in one step.")
    draft_texts = _labels(drafted, step.get("drafted_text"))
    return (f"{accepted} of {k} drafts accepted; at draft {accepted + 1} the target chose {_quote(texts[accepted])} "
            f"instead of {_quote(draft_texts[accepted])}"
            + (f", so the {k - accepted - 1} later drafts were discarded" if k - accepted - 1 else "")
            + f": {n} token{'s' if n > 1 else ''} in one step.")


def ladder_html(steps: list[dict], index: int) -> str:
    """The draft ladder around step `index`: each rung one step, its drafts above what the target chose."""
    if not steps:
        return ('<div class="ladder-empty">Send a message, then step through how each token was drafted and '
                'checked.</div>')
    index = max(0, min(index, len(steps) - 1))
    has_detail = stats.has_draft_detail(steps)
    lo, hi = max(0, index - LADDER_CONTEXT), min(len(steps), index + LADDER_CONTEXT + 1)
    context = "".join(s["text"] for s in steps[:index])[-120:]
    rungs = "".join(_rung(steps[i], i == index, has_detail) for i in range(lo, hi))
    key = ('<div class="ladder-key"><span class="cell acc">accepted</span><span class="cell rej">rejected</span>'
           '<span class="cell ghost">discarded</span><span class="cell fix">target\'s correction</span>'
           '<span class="cell bonus">bonus</span><span class="cell own">target, no draft</span></div>')
    return (f'<div class="ladder">{key}<div class="ladder-context" title="the answer before this step">'
            f'…{escape(context)}<span class="caret">▌</span></div>{rungs}'
            f'<div class="ladder-pos">step {index} of {len(steps) - 1}</div></div>')


def engine_html(snapshot: dict, own_session: str | None) -> str:
    """The engine-wide table: every stream on the shared engine (no prompt text: other people's)."""
    rows = []
    for r in snapshot["requests"]:
        who = "this tab" if r["session"] == own_session else f"tab {r['session'][:6]}"
        rows.append(f"<tr><td>{escape(who)}</td><td>{escape(r['request_id'])}</td><td>{escape(r['state'])}</td>"
                    f"<td>{escape(r['spec'])}</td><td>{r['num_tokens']}</td><td>{_fmt(r['tokens_per_s'], '.0f')}</td>"
                    f"<td>{r['age_s']:.1f} s</td></tr>")
    body = "".join(rows) or '<tr><td colspan="7" class="muted">No requests yet.</td></tr>'
    tabs = snapshot["num_sessions"]
    head = (f'<div class="engine-head">{snapshot["num_active"]} running now · {tabs} tab{"s" if tabs != 1 else ""} '
            f'open</div>')
    return (f'{head}<table class="engine-table"><thead><tr><th>who</th><th>request</th><th>state</th>'
            f"<th>speculation</th><th>tokens</th><th>tok/s</th><th>age</th></tr></thead><tbody>{body}</tbody></table>")


def about_html(info: dict, capabilities: dict | None, status: str) -> str:
    """Model, backend, device, dtype, and what this engine can and cannot report."""
    caps = capabilities or {}
    facts = [("model", info.get("model")), ("backend", info.get("backend")), ("device", info.get("device")),
             ("dtype", info.get("dtype")), ("status", status)]
    if caps:
        facts += [("inputs", ", ".join(caps.get("modalities", []))),
                  ("speculation", ", ".join(caps.get("spec_methods", []))),
                  ("MTP depths", caps.get("num_mtp_depths")), ("context", info.get("max_model_len"))]
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in facts if v is not None)
    reports = [
        ("per_token_drafts", "which draft tokens each step proposed and accepted",
         "only how many were accepted: the ladder shows counts"),
        ("draft_probabilities", "each draft's probability (shown on hover)", "no draft probabilities"),
        ("prefix_caching", "prompt tokens served from the prefix cache", "no prefix cache"),
    ]
    items = "".join(f'<li class="{"yes" if caps.get(k) else "no"}">{"✓" if caps.get(k) else "✗"} '
                    f"{escape(yes if caps.get(k) else no)}</li>" for k, yes, no in reports) if caps else ""
    return f'<table class="about">{rows}</table><ul class="reports">{items}</ul>'


def shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def status_html(info: dict, status: str) -> str:
    """The header's model line; a spinner while the model loads."""
    model = str(info.get("model", "")).rstrip("/").rsplit("/", 1)[-1]
    facts = " · ".join(escape(str(x)) for x in (model, info.get("backend"), info.get("device"), info.get("dtype")) if x)
    state = "ready" if status == "ready" else "failed" if status.startswith("no model") else "loading"
    spinner = '<span class="spinner"></span>' if state == "loading" else ""
    return (f'<div class="status status-{state}"><span class="facts">{facts}</span>'
            f'<span class="pill">{spinner}{escape(status)}</span></div>')


def compare_side_html(label: str, turn) -> str:
    """One side of a comparison: its speculation setting, the coloured answer, and its footer."""
    method = turn.settings["spec_method"]
    name = "no speculation" if method == "none" else f"{method}, {turn.settings['num_spec_tokens']} drafts per step"
    body = reply_html(turn.events, turn.settings, turn.sent_at, turn.notice) if turn.events or turn.notice else \
        '<div class="pending">waiting…</div>'
    return f'<div class="compare-side"><div class="compare-label">{escape(label)} · {escape(name)}</div>{body}</div>'


def compare_verdict_html(a, b, note: str | None) -> str:
    """Speedup of B over A (decode tok/s and wall time) and whether the two outputs are identical."""
    if a is None or b is None:
        return f'<div class="verdict muted">{escape(note or "")}</div>'
    sa, sb = stats.summary(a.events, a.sent_at), stats.summary(b.events, b.sent_at)
    if a.error or b.error or not (sa["tokens_per_s"] and sb["tokens_per_s"]):
        return f'<div class="verdict muted">{escape(note or "One of the runs did not finish; see its message.")}</div>'
    ids = lambda t: [tok for s in t.steps for tok in s["emitted"]]  # noqa: E731
    same = ids(a) == ids(b)
    speedup = sb["tokens_per_s"] / sa["tokens_per_s"]
    wall = (sa["total_s"] / sb["total_s"]) if sa["total_s"] and sb["total_s"] else None
    if same:
        match = "identical outputs"
    elif a.settings["temperature"] > 0:
        match = ("outputs differ: expected when sampling, since speculation keeps the distribution, not "
                 "each sample")
    else:
        match = "outputs differ under greedy decoding: this is worth reporting"
    extra = f" · wall time ×{wall:.2f}" if wall else ""
    return (f'<div class="verdict"><span class="speedup">speedup ×{speedup:.2f}</span>'
            f'<span class="detail">decode A {sa["tokens_per_s"]:.0f} → B {sb["tokens_per_s"]:.0f} tok/s{extra}</span>'
            f'<span class="match {"same" if same else "differ"}">{"✓" if same else "≠"} {escape(match)}</span>'
            + (f'<div class="muted">{escape(note)}</div>' if note else "") + "</div>")


def trace_info_html(engine: dict, num_turns: int) -> str:
    facts = [str(engine.get(k)) for k in ("model", "backend", "device", "dtype") if engine.get(k)]
    return (f'<div class="trace-info">Trace of {num_turns} turn{"s" if num_turns != 1 else ""}'
            f'{" from " + escape(" · ".join(facts)) if facts else ""}. Replayed from its events; no model runs.</div>')
