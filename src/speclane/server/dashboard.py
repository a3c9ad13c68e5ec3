"""``GET /dashboard`` (a self-contained HTML page) and ``GET /dashboard/state`` (its JSON).

The page (``static/dashboard.html``: inline CSS and JS, nothing fetched from elsewhere)
polls the state every 500 ms. The state comes from the engine's ``LaneRecorder`` and
``LatencyWindow`` (one process) or from the cluster front, which merges its replicas'
recorders (``engine/lane_recorder.py``, ``merge_states``); either way a request reads
copies kept behind locks and never waits on the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse


@cache
def dashboard_html() -> str:
    return resources.files("speclane.server").joinpath("static/dashboard.html").read_text(encoding="utf-8")


def install_dashboard(app: FastAPI, state: Callable[[], dict[str, Any]]) -> None:
    @app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_html(), headers={"Cache-Control": "no-cache"})

    @app.get("/dashboard/state")
    async def dashboard_state() -> dict[str, Any]:
        return state()
