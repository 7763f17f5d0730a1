"""The bundle of live panels (cards, plots, ladder) for one turn's events, assembled from the pure
renderers and plot builders, and which turn they describe."""
from __future__ import annotations

import json

from . import plots, render, stats
from .session import Session, Turn


def figure(fig: dict) -> str:
    """A plotly figure dict as a PlotView's value: its JSON (plot_view.py draws it)."""
    return json.dumps(fig, allow_nan=False)


def panels(turn: Turn | None, step_index: int | None = None) -> dict:
    """Cards, the plots and the ladder for a turn; with `step_index`, as of that step (replay)."""
    events = turn.events if turn else []
    steps = [e for e in events if e["type"] == "Step"]
    if step_index is not None and steps:
        step_index = max(0, min(step_index, len(steps) - 1))
        cutoff = steps[step_index]["time"]
        is_last = step_index == len(steps) - 1
        events = [e for e in events if e.get("time", 0) <= cutoff and (is_last or e["type"] != "Finished")]
        steps = steps[:step_index + 1]
    t0 = turn.sent_at if turn else None
    ladder_at = len(steps) - 1 if step_index is None else step_index
    return {
        "cards": render.stats_html(stats.summary(events, t0) if turn else None),
        "plots": figure(live_figure(events, t0)),
        "ladder": render.ladder_html(steps, ladder_at),
        "num_steps": len(turn.steps) if turn else 0,
    }


def live_figure(events: list[dict], t0: float | None) -> dict:
    """The Live panel's five views of one answer, as one figure."""
    metrics = [e for e in events if e["type"] == "Metrics"]
    return plots.dashboard([[plots.speed_figure(events, t0), plots.latency_figure(events, t0)],
                            [plots.acceptance_length_figure(events), plots.acceptance_position_figure(events)],
                            [plots.cache_figure(metrics, t0)]])


def engine_figure(snapshot: dict) -> dict:
    """The Engine panel: the whole engine's speed, queue and cache over the last minutes."""
    metrics, now = snapshot["metrics"], snapshot["now"]
    return plots.dashboard([[plots.engine_speed_figure(metrics, now)],
                            [plots.cache_figure(metrics, now, "Cache use (whole engine)")]])


def inspected_turn(session: Session) -> Turn | None:
    """The turn the panels describe: the latest one that reached the engine."""
    return next((t for t in reversed(session.turns) if t.notice is None), None)
