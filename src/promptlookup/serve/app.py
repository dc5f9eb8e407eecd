"""The OpenAI-compatible routes on one :class:`~promptlookup.api.Engine`.

``create_app(engine, settings)`` returns a FastAPI app: ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (``stream: true`` as server-sent events ending in ``data: [DONE]``),
``GET /health`` and ``GET /metrics``. Requests queue for the one model context (:mod:`.queue`);
nothing a client sends can crash the server or earn a 500: a pure-ASGI guard checks the API key and
reads the body (size limit, UTF-8, JSON) before FastAPI sees it, pydantic checks the fields against
:mod:`.schemas`, and every error -- FastAPI's 422s included -- is answered as OpenAI's error object
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from promptlookup import __version__
from promptlookup.api import ROLES, Completion, Engine, Options, RequestError, check_messages
from promptlookup.drafting.spec import OFF, SourceSpec, SpecError, options_of
from promptlookup.errors import UserError
from promptlookup.serve import schemas as s
from promptlookup.serve.history import HistorySaver
from promptlookup.serve.metrics import CONTENT_TYPE, Metrics
from promptlookup.serve.queue import Event, Job, Worker, error_event

log = logging.getLogger("promptlookup.serve")

PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
BODY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
MAX_SPECULATE_SETTINGS = 16  # distinct draft source settings one server builds (each keeps its state)
FINGERPRINT = f"promptlookup-{__version__}"


@dataclass(frozen=True)
class Settings:
    """The server's own settings (the engine's are the engine's)."""

    max_queue: int = 64  # requests waiting behind the one generating; beyond: 503 + Retry-After
    timeout: float | None = 600.0  # seconds per request, queue wait included
    api_key: str | None = None
    max_body: int = 8 << 20  # bytes of a request body
    model_alias: str | None = None
    history_save_every: int = 8  # requests between history saves


# -- errors ---------------------------------------------------------------------------------------
def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _event_response(ev: Event, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return error_response(ev.status, ev.message, ev.type, ev.param, headers=headers)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": s.ErrorResponse, "description": "a bad request (OpenAI's error object)"},
    401: {"model": s.ErrorResponse, "description": "a missing or wrong API key"},
    413: {"model": s.ErrorResponse, "description": "the body is over --max-body"},
    503: {"model": s.ErrorResponse,
          "description": "the queue is full (see Retry-After) or the server is stopping"},
}
GET_ERRORS = {k: v for k, v in ERROR_RESPONSES.items() if k == 401}
# one server-sent event: "data" holds a chunk object as JSON, the last one "[DONE]"
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                            "retry": {"type": "integer"}}}
SSE = {"text/event-stream": {"schema": SSE_EVENT}}


# -- the guard: API key, body size, UTF-8 and JSON before any route --------------------------------
def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


class Guard:
    """Pure ASGI middleware; see the module docstring. Bodies of the two POST routes are read here
    (at most ``max_body`` bytes), checked, and handed on unchanged as ``application/json``."""

    def __init__(self, app, settings: Settings, metrics: Metrics) -> None:
        self.app = app
        self.key = settings.api_key.encode("utf-8") if settings.api_key else None
        self.max_body = settings.max_body
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


# -- requests to engine options ---------------------------------------------------------------------
class Server:
    """The app's state: the engine, its worker, the metrics, the history saver."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.worker = Worker(settings.max_queue, on_done=self._done)
        self.metrics = Metrics(lambda: self.worker.waiting, lambda: self.worker.running)
        self.history = HistorySaver(engine, settings.history_save_every,
                                    on_save=self.metrics.history_saves.inc)
        self.model = settings.model_alias or engine.model_name
        self.created = int(time.time())
        self._spec_labels: set[str] = {engine.default_spec.label}

    def _done(self, job: Job) -> None:
        """After every generation (on the worker), whether its client stayed or not."""
        c = job.completion
        self.metrics.finished(c.counters, "cancelled" if c.stopped_by == "cancelled" else c.finish_reason)
        self.history.request_done()

    # -- checks before a request is queued ------------------------------------------------------
    def speculate(self, text: str | None) -> Any:
        if text is None:
            return None
        try:
            written = SourceSpec.parse(text)
            paths = [k for k, _ in written.options if options_of(written.name)[k].kind is str]
            if paths:
                raise RequestError(f"speculate {text!r}: {', '.join(paths)}: files are the server's to "
                                   "choose (--suffix-corpus, --lookup-cache-static, --history)", "speculate")
            spec = self.engine.spec(written)
        except SpecError as exc:
            raise RequestError(str(exc), "speculate") from None
        if spec.label not in self._spec_labels:
            if len(self._spec_labels) >= MAX_SPECULATE_SETTINGS:
                raise RequestError(f"this server already serves {MAX_SPECULATE_SETTINGS} speculate "
                                   "settings; use one of those (e.g. off, or the default)", "speculate")
            self._spec_labels.add(spec.label)
        return spec

    def options(self, body: s.SamplingFields, max_tokens: int | None, logprobs: int | None) -> dict[str, Any]:
        if body.n not in (None, 1):
            raise RequestError(f"n must be 1 (got {body.n}): one model context serves one completion "
                               "per request; send n requests instead", "n")
        n_ctx = self.engine.n_ctx
        if max_tokens is not None and max_tokens > n_ctx:
            raise RequestError(f"max_tokens is {max_tokens} but the context holds {n_ctx} tokens "
                               "(prompt included)", "max_tokens")
        opts = dict(
            max_tokens=n_ctx if max_tokens is None else max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k or 0, min_p=body.min_p or 0.0,
            repeat_penalty=1.0 if body.repeat_penalty is None else body.repeat_penalty,
            presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
            seed=body.seed, stop=body.stop, logprobs=logprobs, speculate=self.speculate(body.speculate),
        )
        checked = Options(**opts)
        checked.sampler()  # every sampler setting checked now: a SamplingError is a 400
        checked.stops()
        return opts

    # -- running a job --------------------------------------------------------------------------
    async def respond(self, request: Request, run: Callable[..., Iterator[Any]], stream: bool,
                      render: Render, finish: Callable[[Completion], Any] | None = None) -> Response:
        loop = asyncio.get_running_loop()
        timeout = self.settings.timeout
        job = Job(run=run, loop=loop, finish=finish,
                  deadline=None if timeout is None else time.monotonic() + timeout)
        if not self.worker.submit(job):
            self.metrics.rejected.inc()
            self.metrics.errors.labels("503").inc()
            return error_response(503, f"the server is busy: {self.worker.waiting} requests are waiting "
                                       f"(--max-queue {self.settings.max_queue}); retry later",
                                  "server_error", code="queue_full",
                                  headers={"Retry-After": str(self.worker.retry_after())})
        watcher = asyncio.create_task(self._watch(request, job))
        try:
            first = await self._next(job, watcher)
            if first is None:  # the client went away while the request waited
                watcher.cancel()
                return Response(status_code=499)
            if first.kind == "error":
                watcher.cancel()
                self.metrics.errors.labels(str(first.status)).inc()
                return _event_response(first)
            self.metrics.queue_time.observe((job.started or job.arrived) - job.arrived)
            if stream:
                return StreamingResponse(self._sse(job, watcher, render), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return await self._whole(job, watcher, render)
        except BaseException:
            watcher.cancel()
            self.worker.withdraw(job)
            raise

    async def _watch(self, request: Request, job: Job) -> None:
        """Wait for the client's disconnect; then cancel its job (dropped, or ended at its next step)."""
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                if not job.cancel.is_set():
                    self.metrics.cancelled.inc()
                self.worker.withdraw(job)
                return

    async def _next(self, job: Job, watcher: asyncio.Task) -> Event | None:
        """The job's next event, or None once its client is gone."""
        get = asyncio.ensure_future(job.events.get())
        await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
        return None

    async def _events(self, job: Job, watcher: asyncio.Task) -> AsyncIterator[Event]:
        """The job's chunk and error events up to its end (stops when the client is gone)."""
        first_text = True
        while True:
            ev = await self._next(job, watcher)
            if ev is None or ev.kind == "end":
                return
            if ev.kind == "chunk" and first_text and (ev.chunk.text or ev.chunk.completion is not None):
                first_text = False
                self.metrics.ttft.observe(time.monotonic() - job.arrived)
            yield ev

    def _finished(self, job: Job, completion: Completion) -> None:
        self.metrics.e2e.observe(time.monotonic() - job.arrived)

    async def _whole(self, job: Job, watcher: asyncio.Task, render: Render) -> Response:
        text: list[str] = []
        try:
            async for ev in self._events(job, watcher):
                if ev.kind == "error":
                    self.metrics.errors.labels(str(ev.status)).inc()
                    return _event_response(ev)
                text.append(ev.chunk.text)
                if ev.chunk.completion is not None:
                    self._finished(job, ev.chunk.completion)
                    return JSONResponse(render.whole("".join(text), ev.chunk.completion, ev.extra))
        finally:
            watcher.cancel()
        return Response(status_code=499)  # the client went away

    async def _sse(self, job: Job, watcher: asyncio.Task, render: Render) -> AsyncIterator[str]:
        try:
            yield _sse_line(render.head())
            async for ev in self._events(job, watcher):
                if ev.kind == "error":
                    self.metrics.errors.labels(str(ev.status)).inc()
                    yield _sse_line({"error": {"message": ev.message, "type": ev.type, "param": ev.param,
                                               "code": None}})
                    break
                chunk = ev.chunk
                if chunk.text:
                    yield _sse_line(render.delta(chunk.text))
                if chunk.completion is not None:
                    self._finished(job, chunk.completion)
                    for obj in render.tail(chunk.completion, ev.extra):
                        yield _sse_line(obj)
                    break
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            self.worker.withdraw(job)  # a no-op when it finished; ends it at its next step otherwise


def _sse_line(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(',', ':'))}\n\n"


# -- rendering a completion as OpenAI's objects ---------------------------------------------------------
def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0  # JSON has no -inf (a token of probability 0)


class Render:
    """The response objects of one request (chat or completions), whole or as stream chunks."""

    def __init__(self, server: Server, kind: str, body: s.SamplingFields, logprobs: int | None) -> None:
        self.server = server
        self.include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
        self.token_ids = bool(body.return_token_ids)
        self.kind = kind
        self.logprobs = logprobs
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.server.model,
                "system_fingerprint": FINGERPRINT}

    def _extensions(self, c: Completion) -> dict[str, Any]:
        counters = c.counters.as_dict()
        counters.update(stopped_by=c.stopped_by, source_choices=dict(c.source_choices),
                        source=_public_label(c.speculate))
        return {"timings": c.timings, "counters": counters, "seed": c.seed}

    @staticmethod
    def usage(c: Completion) -> dict[str, Any]:
        n = len(c.tokens)
        return {"prompt_tokens": c.prompt_tokens, "completion_tokens": n, "total_tokens": c.prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}

    def _logprobs(self, c: Completion, texts: Mapping[int, str] | None) -> dict[str, Any] | None:
        if c.logprobs is None or texts is None:
            return None
        if self.kind == "chat":
            def entry(t: int, lp: float) -> dict[str, Any]:
                text = texts[t]
                return {"token": text, "logprob": _finite(lp), "bytes": list(text.encode("utf-8"))}

            return {"content": [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, v) for t, v in x.top]}
                                for x in c.logprobs], "refusal": None}
        offsets, pos = [], 0
        for x in c.logprobs:
            offsets.append(pos)
            pos += len(texts[x.token])
        return {"tokens": [texts[x.token] for x in c.logprobs],
                "token_logprobs": [_finite(x.logprob) for x in c.logprobs],
                "top_logprobs": [{texts[t]: _finite(v) for t, v in x.top} for x in c.logprobs],
                "text_offset": offsets}

    # -- whole ----------------------------------------------------------------------------------
    def whole(self, text: str, c: Completion, texts: Mapping[int, str] | None) -> dict[str, Any]:
        lp = self._logprobs(c, texts)
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": lp, "finish_reason": c.finish_reason}
            obj = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": c.finish_reason}
            obj = self._base("text_completion")
        if self.token_ids:
            choice["token_ids"] = list(c.tokens)
        return {**obj, "choices": [choice], "usage": self.usage(c), **self._extensions(c)}

    # -- stream ---------------------------------------------------------------------------------
    def _chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        obj = self._base("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        obj["choices"] = [] if choice is None else [choice]
        if self.include_usage:
            obj["usage"] = None
        return obj

    def _choice(self, text: str | None, finish: str | None = None, lp: Any = None) -> dict[str, Any]:
        if self.kind == "chat":
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}

    def head(self) -> dict[str, Any]:
        if self.kind == "chat":
            return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None})
        return self._chunk(self._choice(""))

    def delta(self, text: str) -> dict[str, Any]:
        return self._chunk(self._choice(text))

    def tail(self, c: Completion, texts: Mapping[int, str] | None) -> list[dict[str, Any]]:
        """The last chunk (finish reason; the logprobs of every token, when asked; timings and
        counters), then the usage chunk when ``stream_options.include_usage``."""
        last = self._chunk(self._choice(None, c.finish_reason, self._logprobs(c, texts)))
        last.update(self._extensions(c))
        out = [last]
        if self.include_usage:
            u = self._chunk(None)
            u["usage"] = self.usage(c)
            u.update(self._extensions(c))
            out.append(u)
        return out


def _public_label(label: str) -> str:
    """A spec label without its file settings (paths on the server's disk stay there)."""
    name, *opts = label.split(":")
    paths = {k for k, o in options_of(name).items() if o.kind is str} if name != OFF else set()
    return ":".join([name, *(o for o in opts if o.partition("=")[0] not in paths)])


def _token_texts(engine: Engine) -> Callable[[Completion], dict[int, str]]:
    def texts(c: Completion) -> dict[int, str]:
        ids = {x.token for x in c.logprobs or ()} | {t for x in c.logprobs or () for t, _ in x.top}
        return {t: engine.detokenize([t]) for t in ids}

    return texts


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param(loc: Sequence[Any]) -> str | None:
    """A validation error's location as OpenAI's ``param`` ("messages.0.content"), without the body
    prefix and pydantic's union-member tags ("str", "list[str]", a message's role after its index)."""
    parts: list[str] = []
    for i, x in enumerate(loc):
        if x == "body" or (isinstance(x, str) and (x in _UNION_TAGS or any(ch in x for ch in "[]-"))):
            continue
        if i and isinstance(loc[i - 1], int) and x in ROLES:
            continue
        parts.append(str(x))
    return ".".join(parts) or None


def _messages(body: s.ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for m in body.messages:
        content: Any = m.content
        if isinstance(content, list):
            content = [{"type": "text", "text": p.text} for p in content]
        out.append({"role": m.role, "content": content})
    return out


# -- the app -------------------------------------------------------------------------------------------
def create_app(engine: Engine, settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    server = Server(engine, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.worker.start()
        try:
            yield
        finally:
            server.worker.stop()
            try:
                server.history.save()
            except (UserError, OSError) as exc:
                log.error("promptlookup serve: could not save the history: %s", exc)

    app = FastAPI(title="promptlookup", version=__version__, lifespan=lifespan,
                  description="An OpenAI-compatible server that speculates by prompt lookup "
                              "(the output is the model's own). One model context: requests queue.")
    app.state.server = server

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        # of a union's errors (stop: text or a list), the one that is not a plain type mismatch
        first = next((e for e in errors if not str(e.get("type", "")).endswith("_type")),
                     errors[0] if errors else {})
        param = _param(first.get("loc", ()))
        msg = first.get("msg", "invalid request")
        server.metrics.errors.labels("400").inc()
        return error_response(400, f"{param or 'body'}: {msg}", param=param, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        server.metrics.errors.labels(str(exc.status_code)).inc()
        message = {404: f"no route {request.method} {request.url.path} (see /openapi.json)",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(
                       exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, code="not_found" if exc.status_code == 404 else None,
                              headers=exc.headers)

    @app.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError) -> JSONResponse:
        ev = error_event(exc)
        server.metrics.errors.labels(str(ev.status)).inc()
        return _event_response(ev)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("promptlookup serve: internal error")
        return error_response(500, f"internal error ({type(exc).__name__}); the server logged it",
                              "server_error")

    @app.get("/health", response_model=s.Health, tags=["server"])
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": server.model, "running": server.worker.running,
                "waiting": server.worker.waiting, "max_queue": settings.max_queue,
                "requests": server.worker.served}

    @app.get("/metrics", tags=["server"], response_class=Response, responses={
        **GET_ERRORS, 200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                            "description": "Prometheus text format"}})
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", response_model=s.ModelList, responses=GET_ERRORS, tags=["openai"])
    async def models() -> dict[str, Any]:
        meta = {"n_ctx": engine.n_ctx, "n_vocab": int(engine.backend.n_vocab),
                "backend": type(engine.backend).__name__,
                "speculate": _public_label(engine.default_spec.label),
                "file": engine.model_name}
        return {"object": "list", "data": [{"id": server.model, "object": "model", "created": server.created,
                                            "owned_by": "promptlookup", "meta": meta}]}

    @app.post("/v1/chat/completions", response_model=s.ChatCompletion, tags=["openai"],
              responses={**ERROR_RESPONSES, 200: {"content": SSE, "description": "a chat completion, "
                                                  "or with stream: true server-sent chunks"}})
    async def chat_completions(body: s.ChatCompletionRequest, request: Request) -> Response:
        if body.top_logprobs is not None and not body.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        opts = server.options(body, max_tokens, logprobs)
        messages = check_messages(_messages(body))  # a bad message is a 400 before the queue

        def run(cancelled: Callable[[], bool], timeout: float | None) -> Iterator[Any]:
            return engine.chat(messages, stream=True, cancelled=cancelled, timeout=timeout, **opts)

        render = Render(server, "chat", body, logprobs)
        return await server.respond(request, run, bool(body.stream), render,
                                    _token_texts(engine) if logprobs is not None else None)

    @app.post("/v1/completions", response_model=s.TextCompletion, tags=["openai"],
              responses={**ERROR_RESPONSES, 200: {"content": SSE, "description": "a completion, "
                                                  "or with stream: true server-sent chunks"}})
    async def completions(body: s.CompletionRequest, request: Request) -> Response:
        if body.echo:
            raise RequestError("echo is not supported", "echo")
        if body.best_of not in (None, 1):
            raise RequestError(f"best_of must be 1 (got {body.best_of})", "best_of")
        if body.suffix is not None:
            raise RequestError("suffix (insertion) is not supported", "suffix")
        opts = server.options(body, body.max_tokens, body.logprobs)
        prompt: Any = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # one prompt given as a list of one
        if isinstance(prompt, str) and not prompt:
            raise RequestError("the prompt is empty", "prompt")

        def run(cancelled: Callable[[], bool], timeout: float | None) -> Iterator[Any]:
            return engine.generate(prompt, stream=True, cancelled=cancelled, timeout=timeout, **opts)

        render = Render(server, "completion", body, body.logprobs)
        return await server.respond(request, run, bool(body.stream), render,
                                    _token_texts(engine) if body.logprobs is not None else None)

    def openapi() -> dict[str, Any]:
        """FastAPI's schema, less the 422 responses it adds (validation errors are 400s here)."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            for item in schema.get("paths", {}).values():
                for op in item.values():
                    op.get("responses", {}).pop("422", None)
            comps = schema.get("components", {}).get("schemas", {})
            comps.pop("HTTPValidationError", None)
            comps.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(Guard, settings=settings, metrics=server.metrics)
    return app

