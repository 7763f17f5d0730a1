"""Plotly figures (plain figure dicts: {"data", "layout"}) drawn from recorded events. Pure functions, so
the same code draws a live answer, a replayed trace at step N, and the engine-wide view."""
from __future__ import annotations

from . import stats

COLORS = {"answer": "#0072B2", "engine": "#999999", "accepted": "#009E73", "corrected": "#E69F00",
          "bonus": "#0072B2", "plain": "#D5D5D5", "conditional": "#D55E00", "unconditional": "#0072B2",
          "full_attention": "#0072B2", "sliding_window": "#009E73", "mtp": "#CC79A7", "conv_state": "#E69F00"}
GROUP_NAMES = {"full_attention": "full attention", "sliding_window": "sliding window", "mtp": "MTP drafts",
               "conv_state": "short-conv state"}
GAP_S = 1.0
MAX_BARS = 80
UNCONDITIONAL_DEF = ("unconditional acceptance at position i:<br>steps that accepted draft i ÷ steps that "
                     "drafted position i")
CONDITIONAL_DEF = ("conditional acceptance at position i:<br>steps that accepted draft i ÷ steps that reached "
                   "it (accepted draft i−1)")


def _axis(title: str, **extra) -> dict:
    # no automargin and no title standoff: either makes plotly measure and redraw the whole figure
    # several times per update, which stalls the browser while tokens stream
    return {"title": {"text": title, "font": {"size": 12}}, "gridcolor": "#e8e8e8", "zeroline": False, "nticks": 6,
            **extra}


def _layout(title: str, x: str, y: str, **extra) -> dict:
    return {"title": {"text": title, "font": {"size": 15}, "x": 0.01, "xanchor": "left"},
            "height": 260, "margin": {"l": 50, "r": 12, "t": 58, "b": 42},
            "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
            "font": {"family": "Inter, 'Segoe UI', system-ui, sans-serif", "size": 12, "color": "#333"},
            "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.0, "yanchor": "bottom",
                       "font": {"size": 11}},
            "xaxis": _axis(x), "yaxis": _axis(y, rangemode="tozero"), "hovermode": "closest",
            "uirevision": "keep", **extra}


def _broken(xs: list[float], *columns: list) -> tuple[list, ...]:
    """Insert a gap (None) wherever the engine went quiet for over GAP_S, so lines do not bridge idle time."""
    out = ([], *([] for _ in columns))
    for i, x in enumerate(xs):
        if i and x - xs[i - 1] > GAP_S:
            for series in out:
                series.append(None)
        out[0].append(x)
        for series, column in zip(out[1:], columns):
            series.append(column[i])
    return out


def _empty(layout: dict, message: str) -> dict:
    layout["annotations"] = [{"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5,
                              "y": 0.5, "xanchor": "center", "font": {"size": 13, "color": "#888"}}]
    layout["xaxis"]["visible"] = layout["yaxis"]["visible"] = False
    return {"data": [], "layout": layout}


def speed_figure(events: list[dict], t0: float | None) -> dict:
    """Tokens/s of this answer over time, with the whole engine's rate behind it."""
    steps = [e for e in events if e["type"] == "Step"]
    metrics = [e for e in events if e["type"] == "Metrics"]
    layout = _layout("Tokens per second", "seconds since sent", "tokens / s")
    if not steps:
        return _empty(layout, "waiting for tokens")
    t0 = t0 if t0 is not None else steps[0]["time"]
    xs, ys = stats.speed_series(steps, t0)
    data = [{"type": "scatter", "mode": "lines", "name": "this answer", "x": xs, "y": ys,
             "line": {"color": COLORS["answer"], "width": 2.5},
             "hovertemplate": "%{y:.0f} tok/s at %{x:.2f} s<extra>this answer</extra>"}]
    if metrics:
        mx, my = _broken([m["time"] - t0 for m in metrics], [m["tokens_per_s"] for m in metrics])
        data.insert(0, {"type": "scatter", "mode": "lines", "name": "whole engine", "x": mx, "y": my,
                        "line": {"color": COLORS["engine"], "width": 1.5, "dash": "dot"},
                        "hovertemplate": "%{y:.0f} tok/s at %{x:.2f} s<extra>whole engine</extra>"})
    return {"data": data, "layout": layout}


def latency_figure(events: list[dict], t0: float | None) -> dict:
    """Time to first token, and the time each later step took per token it produced."""
    steps = [e for e in events if e["type"] == "Step"]
    layout = _layout("Latency", "step", "ms")
    if not steps:
        return _empty(layout, "waiting for the first token")
    gaps = stats.step_gaps_ms(steps, t0)
    xs = [s["step"] for s in steps[1:]]
    per_token = [g / len(s["emitted"]) for g, s in zip(gaps[1:], steps[1:])]
    data = [{"type": "scatter", "mode": "lines", "name": "per step", "x": xs, "y": gaps[1:],
             "line": {"color": COLORS["plain"], "width": 1.5},
             "hovertemplate": "step %{x}: %{y:.1f} ms<extra>time since the previous step</extra>"},
            {"type": "scatter", "mode": "lines", "name": "per token", "x": xs, "y": per_token,
             "line": {"color": COLORS["answer"], "width": 2},
             "hovertemplate": "step %{x}: %{y:.1f} ms per token<extra>step time ÷ tokens it emitted</extra>"}]
    ttft = stats.summary(events, t0)["ttft_s"]       # the engine's own figure once it has finished
    if ttft is not None:
        layout["title"]["text"] = f"Latency · first token {ttft * 1000:.0f} ms"
    return {"data": data, "layout": layout}


def _step_color(step: dict) -> str:
    """A step's bar: blue when every draft was accepted, orange when one was rejected, grey when nothing
    was drafted (green when only the accepted count is known)."""
    if not step["emitted"]:
        return COLORS["plain"]
    last = stats.token_kinds(step)[-1]
    if last == stats.TARGET:
        return COLORS["accepted"] if step["accepted"] else COLORS["plain"]
    return COLORS["bonus"] if last == stats.BONUS else COLORS["corrected"]


def acceptance_length_figure(events: list[dict]) -> dict:
    """Tokens produced by each step (accepted drafts + 1), and how often each count of accepted drafts came."""
    steps = [e for e in events if e["type"] == "Step"]
    layout = _layout("Acceptance length per step", "step", "tokens in the step")
    layout["xaxis"]["domain"] = [0, 0.62]
    layout["xaxis2"] = _axis("drafts accepted", domain=[0.74, 1], anchor="y2", dtick=1)
    layout["yaxis2"] = _axis("steps", anchor="x2", rangemode="tozero")
    if not steps:
        return _empty(layout, "waiting for tokens")
    if not any(s["drafted"] or s["accepted"] for s in steps):
        return _empty(layout, "nothing drafted yet:<br>each step made one token")
    if len(steps) > MAX_BARS:         # one SVG shape per bar: keep the browser quick on long answers
        layout["xaxis"]["title"]["text"] = f"step (the last {MAX_BARS})"
    shown = steps[-MAX_BARS:]
    colors = [_step_color(s) for s in shown]
    data = [{"type": "bar", "name": "per step", "x": [s["step"] for s in shown],
             "y": [len(s["emitted"]) for s in shown],
             "marker": {"color": colors, "line": {"width": 0}}, "showlegend": False,
             "customdata": [[len(s["drafted"]), s["accepted"]] for s in shown],
             "hovertemplate": "step %{x}: %{y} tokens<br>%{customdata[1]} accepted of %{customdata[0]} drafted"
                              "<extra></extra>"}]
    spec, _ = stats.request_spec(events)
    histogram = (spec or {}).get("accepted_histogram") or []
    if histogram:
        data.append({"type": "bar", "name": "histogram", "x": list(range(len(histogram))), "y": histogram,
                     "xaxis": "x2", "yaxis": "y2", "marker": {"color": COLORS["accepted"]}, "showlegend": False,
                     "hovertemplate": "%{y} steps accepted %{x} drafts<extra></extra>"})
    layout["bargap"] = 0.15
    return {"data": data, "layout": layout}


def acceptance_position_figure(events: list[dict]) -> dict:
    """Acceptance by draft position, conditional and unconditional (definitions on hover)."""
    spec, source = stats.request_spec(events)
    layout = _layout("Acceptance by draft position", "draft position", "acceptance", barmode="group")
    if not spec or not spec.get("num_drafted_per_pos"):
        return _empty(layout, "no drafts yet<br>(speculation: mtp or ngram)")
    positions = [f"draft {i + 1}" for i in range(len(spec["num_drafted_per_pos"]))]
    layout["yaxis"].update(range=[0, 1.12], tickformat=".0%")
    if source != "this answer's steps":
        layout["annotations"] = [{"text": "from " + source, "showarrow": False, "xref": "paper", "yref": "paper",
                                  "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom",
                                  "font": {"size": 10, "color": "#888"}}]
    data = []
    for key, name, definition in (("unconditional", "unconditional", UNCONDITIONAL_DEF),
                                  ("conditional", "conditional", CONDITIONAL_DEF)):
        values = spec.get(f"{key}_acceptance_per_pos") or []
        data.append({"type": "bar", "name": name, "x": positions, "y": values,
                     "marker": {"color": COLORS[key]}, "texttemplate": "%{y:.0%}", "textposition": "outside",
                     "cliponaxis": False,
                     "hovertemplate": "%{x}: %{y:.0%}<br><br>" + definition + "<extra>" + name + "</extra>"})
    return {"data": data, "layout": layout}


def cache_figure(metrics: list[dict], t0: float | None, title: str = "Cache use (whole engine)") -> dict:
    """Blocks in use per cache group over time, as a share of the pool, and a gauge of the pool's fill."""
    layout = _layout(title, "seconds", "share in use")
    layout["xaxis"]["domain"] = [0, 0.72]
    layout["yaxis"].update(tickformat=".0%", rangemode="tozero")
    if not metrics:
        return _empty(layout, "waiting for the engine's first report")
    t0 = t0 if t0 is not None else metrics[0]["time"]
    times = [m["time"] - t0 for m in metrics]
    data = []
    groups = list(metrics[-1]["kv"].get("groups", {}))
    for group in groups + ["conv_state"]:
        shares = []
        for m in metrics:
            entry = m["kv"]["groups"].get(group) if group != "conv_state" else m["kv"].get("conv_state")
            shares.append(entry["used"] / entry["total"] if entry and entry.get("total") else None)
        xs, ys = _broken(times, shares)
        data.append({"type": "scatter", "mode": "lines", "name": GROUP_NAMES.get(group, group), "x": xs, "y": ys,
                     "line": {"color": COLORS.get(group, "#666"), "width": 2,
                              "dash": "dot" if group == "conv_state" else "solid"},
                     "hovertemplate": "%{y:.1%} at %{x:.1f} s<extra>" + GROUP_NAMES.get(group, group) + "</extra>"})
    kv = metrics[-1]["kv"]
    data.append({"type": "indicator", "mode": "gauge+number", "value": 100 * kv.get("use_fraction", 0.0),
                 "number": {"suffix": "%", "valueformat": ".1f", "font": {"size": 26}},
                 "title": {"text": "block pool in use", "font": {"size": 12}},
                 "domain": {"x": [0.8, 1], "y": [0.12, 0.82]},
                 "gauge": {"axis": {"range": [0, 100], "showticklabels": False, "ticks": ""},
                           "bar": {"color": COLORS["full_attention"]},
                           "steps": [{"range": [0, 80], "color": "#f2f2f2"},
                                     {"range": [80, 100], "color": "#fde0c5"}]}})
    hit = kv.get("prefix_hit_rate")
    if hit is not None:
        layout["annotations"] = [{"text": f"prefix-cache hits {hit:.0%}<br>preemptions {kv.get('preemptions', 0)}",
                                  "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.9, "y": 0.0,
                                  "xanchor": "center", "font": {"size": 11, "color": "#666"}}]
    return {"data": data, "layout": layout}


def engine_speed_figure(metrics: list[dict], now: float) -> dict:
    """The whole engine's tokens/s and queue over the last minutes (engine-wide view)."""
    layout = _layout("Whole engine: tokens/s and requests", "seconds ago", "tokens / s")
    if not metrics:
        return _empty(layout, "the engine has not run a request yet")
    xs, rate, running, waiting = _broken([m["time"] - now for m in metrics], [m["tokens_per_s"] for m in metrics],
                                         [m["running"] for m in metrics], [m["waiting"] for m in metrics])
    layout["yaxis2"] = _axis("requests", overlaying="y", side="right", rangemode="tozero", showgrid=False,
                             dtick=1)
    data = [{"type": "scatter", "mode": "lines", "name": "tokens/s", "x": xs, "y": rate,
             "line": {"color": COLORS["answer"], "width": 2}, "hovertemplate": "%{y:.0f} tok/s<extra></extra>"},
            {"type": "scatter", "mode": "lines", "name": "running", "x": xs, "y": running,
             "yaxis": "y2", "line": {"color": COLORS["accepted"], "shape": "hv"},
             "hovertemplate": "%{y} running<extra></extra>"},
            {"type": "scatter", "mode": "lines", "name": "waiting", "x": xs, "y": waiting,
             "yaxis": "y2", "line": {"color": COLORS["corrected"], "shape": "hv", "dash": "dot"},
             "hovertemplate": "%{y} waiting<extra></extra>"}]
    return {"data": data, "layout": layout}


# -- one figure for a whole panel --------------------------------------------------------------------
TITLE_PX, LEGEND_PX, XLABEL_PX = 30, 22, 46
COLUMN_GAP = 0.08


def dashboard(rows: list[list[dict]], row_height: int = 250) -> dict:
    """Lay several figures out as one (rows of cells, each figure keeping its own axes, legend, title and
    annotations). One plotly figure per panel, because the browser redraws every gr.Plot on the page
    whenever any of them changes: five separate plots streaming at once stall it."""
    height = row_height * len(rows)
    out = {"data": [], "layout": {"height": height, "margin": {"l": 50, "r": 16, "t": 8, "b": 8},
                                  "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "barmode": "group",
                                  "bargap": 0.15, "hovermode": "closest", "uirevision": "keep", "showlegend": True,
                                  "font": _layout("", "", "")["font"], "annotations": []}}
    counters = {"x": 0, "y": 0, "legend": 0}
    for r, row in enumerate(rows):
        top = r * row_height
        y0, y1 = 1 - (top + row_height - XLABEL_PX) / height, 1 - (top + TITLE_PX + LEGEND_PX) / height
        width = (1 - COLUMN_GAP * (len(row) - 1)) / len(row)
        for c, fig in enumerate(row):
            x0 = c * (width + COLUMN_GAP)
            _place(fig, out, counters, (x0, x0 + width, y0, y1), title_y=1 - (top + 4) / height)
    return out


def _place(fig: dict, out: dict, counters: dict, cell: tuple, title_y: float) -> None:
    x0, x1, y0, y1 = cell
    layout = fig["layout"]
    ids = {}                                                   # local axis id -> dashboard axis id
    for key in sorted(k for k in layout if k[1:5] == "axis" and k[0] in "xy"):
        letter, number = key[0], key[5:]
        counters[letter] += 1
        ids[letter + number] = letter + (str(counters[letter]) if counters[letter] > 1 else "")
    for key in [k for k in layout if k[1:5] == "axis" and k[0] in "xy"]:
        letter, axis = key[0], dict(layout[key])
        lo, hi = (x0, x1) if letter == "x" else (y0, y1)
        a, b = axis.get("domain", [0, 1])
        axis["domain"] = [lo + a * (hi - lo), lo + b * (hi - lo)]
        axis["anchor"] = ids.get(axis.get("anchor", "y" if letter == "x" else "x"), axis.get("anchor"))
        if "overlaying" in axis:
            axis["overlaying"] = ids[axis["overlaying"]]
        out["layout"][f"{letter}axis{ids[letter + key[5:]][1:]}"] = axis     # "x" -> "xaxis", "x3" -> "xaxis3"
    legend = None
    if any(t.get("showlegend", True) and t["type"] != "indicator" for t in fig["data"]):
        counters["legend"] += 1
        legend = "legend" if counters["legend"] == 1 else f"legend{counters['legend']}"
        out["layout"][legend] = {**layout.get("legend", {}), "orientation": "h", "x": x0, "xanchor": "left",
                                 "y": y1 + 0.004, "yanchor": "bottom", "bgcolor": "rgba(0,0,0,0)"}
    for trace in fig["data"]:
        trace = dict(trace)
        if trace["type"] == "indicator":
            d = trace["domain"]
            trace["domain"] = {"x": [x0 + v * (x1 - x0) for v in d["x"]], "y": [y0 + v * (y1 - y0) for v in d["y"]]}
        else:
            trace["xaxis"], trace["yaxis"] = ids[trace.get("xaxis", "x")], ids[trace.get("yaxis", "y")]
            if legend:
                trace["legend"] = legend
        out["data"].append(trace)
    title = layout.get("title", {}).get("text")
    if title:
        out["layout"]["annotations"].append({"text": f"<b>{title}</b>", "showarrow": False, "xref": "paper",
                                             "yref": "paper", "x": x0 - 0.03, "y": title_y, "xanchor": "left",
                                             "yanchor": "top", "font": {"size": 15, "color": "#222"}})
    for note in layout.get("annotations", []):
        note = dict(note)
        for ref, lo, hi in (("xref", x0, x1), ("yref", y0, y1)):
            where = note.get(ref, "paper")
            if where == "paper":
                note[ref[0]] = lo + note[ref[0]] * (hi - lo)
            else:
                axis, _, suffix = where.partition(" ")
                note[ref] = " ".join([ids[axis]] + ([suffix] if suffix else []))
        out["layout"]["annotations"].append(note)
