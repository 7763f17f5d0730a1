"""The Replay tab: load an exported trace and step through it with no model. Each handler returns
(trace state, info, turn picker, step slider, answer, cards, ladder, plots) or the tail of that."""
from __future__ import annotations

import gradio as gr

from . import render, trace
from .session import Turn
from .views import panels


def load(data: bytes | None):
    """Read a trace strictly and show its last turn at its last step (or say why it cannot be read)."""
    if not data:
        return (None, "", gr.Dropdown(choices=[], value=None), gr.Slider(0, 1, value=0)) + views(None, None, 0)
    try:
        loaded = trace.parse(data)
    except trace.TraceError as exc:
        message = f'<div class="notice">\u26a0\ufe0e This trace cannot be replayed: {render.escape(str(exc))}</div>'
        return (None, message, gr.Dropdown(choices=[], value=None), gr.Slider(0, 1, value=0)) + views(None, None, 0)
    choices = [(f"{i + 1}: {render.shorten(t.user_text or ', '.join(f['name'] for f in t.files), 48)}", i)
               for i, t in enumerate(loaded.turns)]
    last = len(loaded.turns) - 1 if loaded.turns else None
    return (loaded, render.trace_info_html(loaded.engine, len(loaded.turns)), gr.Dropdown(choices=choices, value=last),
            *show_turn(loaded, last))


def show_turn(loaded: trace.Trace | None, turn_index):
    turn = _turn(loaded, turn_index)
    last_step = max(0, len(turn.steps) - 1) if turn else 0
    return (gr.Slider(0, max(1, last_step), value=last_step),) + views(loaded, turn_index, last_step)


def views(loaded: trace.Trace | None, turn_index, step_index):
    """The answer as of that step, then its cards, ladder and plots."""
    turn = _turn(loaded, turn_index)
    if turn is None:
        return "", "", render.ladder_html([], 0), panels(None)["plots"]
    step_index = max(0, int(step_index or 0))
    view = panels(turn, step_index)
    if turn.notice is not None:
        answer = render.reply_html([], {}, None, turn.notice)
    else:
        answer = f'<div class="prov">{render.provenance_html(turn.steps[:step_index + 1])}</div>'
    return answer, view["cards"], view["ladder"], view["plots"]


def _turn(loaded: trace.Trace | None, turn_index) -> Turn | None:
    if loaded is None or turn_index is None or not 0 <= int(turn_index) < len(loaded.turns):
        return None
    return loaded.turns[int(turn_index)]
