"""The ASGI guard in front of every route: the API key, then a POST body's size, UTF-8 and JSON.

Why a pure-ASGI middleware of its own: these checks must run before FastAPI reads anything (a
body over ``max_body`` is refused from its Content-Length or as soon as it grows past the limit,
never read whole), and their failures must be OpenAI's error object with a 4xx status, like every
other error of the server. So the guard reads the two POST routes' bodies itself, checks them and
hands them on unchanged as ``application/json``; :func:`error_response` is the one place that
error object is written, for the routes' errors too. The key is compared with
:func:`hmac.compare_digest` (no timing oracle on it).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping

from fastapi.responses import JSONResponse

from promptlookup.serve.metrics import Metrics

PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
BODY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/corpora"})


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """OpenAI's error object ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


class Guard:
    """Pure ASGI middleware; see the module docstring. Bodies of the two POST routes are read here
    (at most ``max_body`` bytes), checked, and handed on unchanged as ``application/json``."""

    def __init__(self, app, api_key: str | None, max_body: int, metrics: Metrics) -> None:
        self.app = app
        self.key = api_key.encode("utf-8") if api_key else None
        self.max_body = max_body
        self.metrics = metrics
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        if self.key is not None and path not in PUBLIC_PATHS and not self._authorized(headers):
            self.metrics.errors.labels("401").inc()
            resp = error_response(401, "a valid API key is required: send Authorization: Bearer KEY",
                                  code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await resp(scope, receive, send)
            return
        if scope.get("method") == "POST" and path in BODY_PATHS:
            body = await self._read(scope, receive, send, headers)
            if body is None:
                return
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def _authorized(self, headers: Mapping[bytes, bytes]) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        assert self.key is not None
        return hmac.compare_digest(token.strip(), self.key) and scheme.lower() == b"bearer"

    async def _read(self, scope, receive, send, headers) -> bytes | None:
        """The checked body, or None after answering with the error."""

        async def fail(status: int, message: str, code: str | None = None) -> None:
            self.metrics.errors.labels(str(status)).inc()
            await error_response(status, message, code=code)(scope, receive, send)

        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await fail(413, f"the request body is {int(length)} bytes; this server takes at most "
                            f"{self.max_body} (--max-body)", "body_too_large")
            return None
        parts, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await fail(413, f"the request body is over {self.max_body} bytes (--max-body)",
                           "body_too_large")
                return None
            parts.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(parts)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            await fail(400, f"the request body is not UTF-8: invalid byte at offset {exc.start}",
                       "invalid_utf8")
            return None
        if not text.strip():
            await fail(400, "the request body is empty: send a JSON object", "invalid_json")
            return None
        try:
            value = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            await fail(400, f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                            f"column {exc.colno}", "invalid_json")
            return None
        except (ValueError, RecursionError) as exc:  # NaN, a 5000-digit number, nesting too deep
            await fail(400, f"the request body is not usable JSON: {str(exc)[:200] or type(exc).__name__}",
                       "invalid_json")
            return None
        if not isinstance(value, dict):
            await fail(400, f"the request body must be a JSON object, got {type(value).__name__}",
                       "invalid_json")
            return None
        return body


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the client's disconnect, when it comes

    return replay

