"""A plotly view that redraws in place: a gr.HTML whose value is a figure's JSON, drawn by plotly.js
with Plotly.react on one persistent element.

Why not gr.Plot: it re-creates its plot element on every update and draws it twice, and every other
gr.Plot on the page redraws with it; while tokens stream that kept a 2-core machine's browser busy
full time. plotly.js comes from the plotly Python package (the same version the tests validate
figures with), served from its own folder.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr
import plotly

PLOTLY_DIR = Path(plotly.__file__).resolve().parent / "package_data"
PLOTLY_JS = PLOTLY_DIR / "plotly.min.js"

DRAW_JS = """
const target = element.querySelector('.plot-view');
const config = {responsive: true, displaylogo: false,
                modeBarButtonsToRemove: ['select2d', 'lasso2d', 'autoScale2d', 'toggleSpikelines']};
function draw() {
  if (!props.value) return;
  if (!window.Plotly) { setTimeout(draw, 100); return; }     // the script in <head> is still loading
  const fig = JSON.parse(props.value);
  window.Plotly.react(target, fig.data, fig.layout, config);
}
watch('value', draw);
draw();
"""


def serve_plotly() -> None:
    """Let the page load plotly.js (a fixed library folder, nothing a user names)."""
    gr.set_static_paths([str(PLOTLY_DIR)])


def PlotView(value: str | None = None, elem_id: str | None = None) -> gr.HTML:   # noqa: N802 (a component)
    return gr.HTML(value, html_template='<div class="plot-view"></div>', js_on_load=DRAW_JS, elem_id=elem_id,
                   head=f'<script src="/gradio_api/file={PLOTLY_JS}"></script>', elem_classes="plot-view-box")
