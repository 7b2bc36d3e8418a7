"""The one home of the server's error body: OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

Every refusal (the edge's 400/401/403/413, a route's 4xx, 429 when the queue is full, a 500)
and a stream's failure event are built here, for ``specdec serve`` and the ``--ray`` ingress
alike. No heavy imports: ``edge.py`` (and so ``specdec serve --help``) uses this module; the
handlers import FastAPI only when they are installed on an app.
"""

from __future__ import annotations

import json
import logging


def error_body(message: str, type_: str, code: str | int | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_event(message: str, status: int) -> str:
    """A stream's failure after its first byte: one server-sent event with the error body."""
    return f"data: {json.dumps(error_body(message, 'server_error', status))}\n\n"


class APIError(Exception):
    """An error answered with an OpenAI error body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return error_body(self.message, self.type, self.code, self.param)


def add_error_handlers(app, logger: logging.Logger) -> None:
    """Answer ``APIError``, Starlette's HTTP errors (404, 405) and anything unhandled (500, logged)
    with the error body, so no route returns a traceback or a bare ``{"detail": ...}``."""
    from fastapi.responses import JSONResponse  # lazy: see the module docstring
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(APIError)
    async def _api_error(_req, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req, exc: StarletteHTTPException):
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), type_, exc.status_code), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(_req, exc: Exception):
        logger.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error", 500),
                            status_code=500)
