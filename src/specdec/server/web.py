"""The web pages of ``specdec serve``: a playground at ``/`` and a live dashboard at ``/dashboard``.

    GET /                  the playground: chat through /v1/chat/completions, tokens coloured by origin
    GET /dashboard         live charts of the server's speculation
    GET /static/...        their HTML, JS and CSS (shipped in the package: no CDN, no build step)
    GET /playground/config what the pages need to know: the model, the drafters a request may choose
    GET /metrics/live      the dashboard's data: per-second buckets (``live.py``)

The pages hold no data of their own, so they are public; the data comes through
the /v1 routes, /playground/config (it names the model, which may be a file path) and
/metrics/live, which take the API key when one is set (the pages ask for it).
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
LIVE_PATH = "/metrics/live"
CONFIG_PATH = "/playground/config"
# where GuardMiddleware asks for the API key
PROTECTED_PATHS = ("/v1", "/tokenize", "/detokenize", LIVE_PATH, CONFIG_PATH)
MAX_WINDOW = 900  # seconds of history /metrics/live returns at most (live.KEEP_SECONDS)


def add_web_routes(app, state, api_key_required: bool = False) -> None:
    """Add the pages and their data routes to ``app`` (``state``: the app's ServerState)."""
    from fastapi import Query
    from fastapi.responses import FileResponse
    from fastapi.staticfiles import StaticFiles

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def playground():
        return FileResponse(STATIC_DIR / "playground.html")

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard():
        return FileResponse(STATIC_DIR / "dashboard.html")

    @app.get(CONFIG_PATH)
    async def config():
        loaded = [t.value for t in state.llm.drafts.loaded()]
        return {"model": state.model_name, "max_model_len": state.max_model_len, "drafters": loaded,
                "api_key_required": api_key_required}

    @app.get(LIVE_PATH)
    async def live(window: int = Query(120, ge=10, le=MAX_WINDOW)):
        return state.metrics.live.snapshot(window)
