"""The OpenAI-compatible routes on one :class:`~promptlookup.api.Engine`, and the request's path
from a route through the queue to its response.

``create_app(engine, settings)`` returns a FastAPI app: ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (``stream: true`` as server-sent events ending in ``data: [DONE]``),
``GET /health`` and ``GET /metrics``. A request's path: the route (:data:`router`) checks the body into
a :class:`~promptlookup.serve.queue.Job` -- data: its kind, its prompt, its
:class:`~promptlookup.options.RequestOptions` built once by the schema's ``to_options`` --, and
:meth:`Server.respond` hands it to the engine loop (:meth:`~promptlookup.api.Engine.submit`), whose
events come back through the job (:mod:`.queue`); the server watches the client and answers whole or
as a stream, with the objects :mod:`.render` builds. Nothing a client sends can crash the server or
earn a 500: the ASGI guard (:mod:`.guard`) checks the API key and reads the body (size limit, UTF-8,
JSON) before FastAPI sees it, pydantic checks the fields against :mod:`.schemas`, and every error --
FastAPI's 422s included -- is answered as OpenAI's error object
(:func:`.guard.error_response`) with a 4xx status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from promptlookup import __version__
from promptlookup.api import ROLES, Completion, Engine, RequestError, check_messages
from promptlookup.drafting.spec import SourceSpec, SpecError, options_of
from promptlookup.errors import UserError
from promptlookup.serve import schemas as s
from promptlookup.serve.guard import Guard, error_response
from promptlookup.serve.history import HistorySaver
from promptlookup.serve.metrics import CONTENT_TYPE, Metrics
from promptlookup.serve.queue import Event, Job, TokenTexts, error_event
from promptlookup.serve.render import Render, public_label
from promptlookup.tools import format_for

log = logging.getLogger("promptlookup.serve")

MAX_SPECULATE_SETTINGS = 16  # distinct draft source settings one server builds (each keeps its state)


@dataclass(frozen=True)
class Settings:
    """The server's own settings (the engine's are the engine's)."""

    max_queue: int = 64  # requests waiting for a free slot; beyond: 503 + Retry-After
    timeout: float | None = 600.0  # seconds per request, queue wait included
    api_key: str | None = None
    max_body: int = 8 << 20  # bytes of a request body
    model_alias: str | None = None
    history_save_every: int = 8  # requests between history saves
    corpus_roots: tuple[str, ...] = ()  # directories POST /v1/corpora may read (none: adding is off)


# -- errors ---------------------------------------------------------------------------------------
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


# -- requests to engine options ---------------------------------------------------------------------
class Server:
    """The app's state: the engine (its loop runs the requests), the metrics, the history saver."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.loop = engine.loop
        self.loop.max_queue = settings.max_queue
        self.closing = False
        self.metrics = Metrics(lambda: self.loop.waiting, lambda: self.loop.running,
                               lambda: self.loop.stats if self.loop.parallel > 1 else None,
                               lambda: engine.history, lambda: engine.learned_bytes)
        self.history = HistorySaver(engine, settings.history_save_every,
                                    on_save=self.metrics.history_saves.inc)
        self.model = settings.model_alias or engine.model_name
        self.created = int(time.time())
        self._spec_labels: set[str] = {engine.default_spec.label}

    def _done(self, job: Job) -> None:
        """After every generation (on the event loop), whether its client stayed or not; a history
        save, when one is due, on an executor thread (a file write must not stall the event loop)."""
        c = job.completion
        self.metrics.finished(c.counters, "cancelled" if c.stopped_by == "cancelled" else c.finish_reason)
        asyncio.get_running_loop().run_in_executor(None, self._history_after_request)

    def _history_after_request(self) -> None:
        try:
            self.history.request_done()
        except Exception:  # e.g. a history save that failed (a full disk): logged, served on
            log.exception("promptlookup serve: saving the history after a request failed")

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

    # -- running a job --------------------------------------------------------------------------
    def job(self, kind: str, prompt: Any, body: s.SamplingFields) -> Job:
        """A request, checked, as the data the engine loop runs: its options built once from the body."""
        opts = body.to_options(self.engine.n_ctx, self.speculate(body.speculate))
        timeout = self.settings.timeout
        return Job(kind, prompt, opts, asyncio.get_running_loop(),
                   deadline=None if timeout is None else time.monotonic() + timeout,
                   annotate=TokenTexts(self.engine.detokenize) if opts.logprobs is not None else None,
                   on_done=self._done)

    async def respond(self, request: Request, job: Job, render: Render) -> Response:
        """Queue ``job`` and answer with its events: whole, or as a stream (``render.stream``)."""
        stream = render.stream
        submitted = None if self.closing else self.engine.submit(
            job.kind, job.prompt, job.options, job.sink, job.cancel, job.deadline)
        if submitted is None:
            self.metrics.rejected.inc()
            self.metrics.errors.labels("503").inc()
            if self.closing:
                return error_response(503, "the server is shutting down", "server_error")
            return error_response(503, f"the server is busy: {self.loop.waiting} requests are waiting "
                                       f"(--max-queue {self.settings.max_queue}); retry later",
                                  "server_error", code="queue_full",
                                  headers={"Retry-After": str(self.loop.retry_after())})
        watcher = asyncio.create_task(self._watch(request, job))
        try:
            first = await self._next(job)
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
            self.withdraw(job)
            raise

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new requests, end the running ones at their next step, and wait up to ``timeout``."""
        self.closing = True
        self.loop.stop(timeout)

    def withdraw(self, job: Job) -> None:
        """The job's client went away: its request ends at its next step (dropped if it waits)."""
        job.cancel.set()
        self.loop.wake()

    async def _watch(self, request: Request, job: Job) -> None:
        """Wait for the client's disconnect; then cancel its job (dropped, or ended at its next step).
        However the watch ends, it queues :data:`GONE` behind the job's events, which wakes a reader
        waiting for the next one (:meth:`_next`)."""
        try:
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    if not job.cancel.is_set():
                        self.metrics.cancelled.inc()
                    self.withdraw(job)
                    return
        finally:
            job.events.put_nowait(GONE)

    async def _next(self, job: Job) -> Event | None:
        """The job's next event, or None once its client is gone (the watcher queued :data:`GONE`).

        Why one queue rather than waiting on the events and the watcher together: ``asyncio.wait``
        makes a task and callbacks for every event, and a stream has one event per step of each
        request, all handled on the loop while the next forward computes."""
        ev = await job.events.get()
        return None if ev is GONE else ev

    async def _events(self, job: Job) -> AsyncIterator[Event]:
        """The job's chunk and error events up to its end (stops when the client is gone)."""
        first_text = True
        while True:
            ev = await self._next(job)
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
            async for ev in self._events(job):
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
            async for ev in self._events(job):
                if ev.kind == "error":
                    self.metrics.errors.labels(str(ev.status)).inc()
                    yield _sse_line({"error": {"message": ev.message, "type": ev.type, "param": ev.param,
                                               "code": None}})
                    break
                chunk = ev.chunk
                last = chunk.completion is not None
                rest = chunk.logprobs  # each delta carries its tokens' logprobs; the tail what is left
                if chunk.text or (rest and not last):
                    yield _sse_line(render.delta(chunk.text, chunk.logprobs, ev.extra))
                    rest = None
                if last:
                    self._finished(job, chunk.completion)
                    for obj in render.tail(chunk.completion, rest, ev.extra):
                        yield _sse_line(obj)
                    break
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            self.withdraw(job)  # a no-op when it finished; ends it at its next step otherwise


def _sse_line(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(',', ':'))}\n\n"


#: what a job's watcher queues as it ends: the reader stops there (the client is gone, or the answer done)
GONE = Event("gone")

_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param(loc: Sequence[Any]) -> str | None:
    """A validation error's location as OpenAI's ``param`` ("messages.0.content"), without the body
    prefix and pydantic's union-member tags ("str", "list[str]", a message's role after its index)."""
    parts: list[str] = []
    for i, x in enumerate(loc):
        if x == "body" or (isinstance(x, str) and (x in _UNION_TAGS or any(ch in x for ch in "[]-"))):
            continue
        if i > 1 and loc[i - 2] == "messages" and isinstance(loc[i - 1], int) and x in ROLES + ("function",):
            continue  # a message's role tag (not tools.0.function)
        if i and loc[i - 1] == "response_format" and x in ("text", "json_object", "json_schema"):
            continue  # the discriminator's tag, as a role after a message's index
        parts.append(str(x))
    return ".".join(parts) or None


def _messages(body: s.ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for m in body.messages:
        content: Any = m.content
        if isinstance(content, list):
            content = [{"type": "text", "text": p.text} for p in content]
        msg: dict[str, Any] = {"role": m.role, "content": content}
        if isinstance(m, s.AssistantMessage) and m.tool_calls:
            msg["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
        if isinstance(m, s.ToolMessage):
            ids = (("tool_call_id", m.tool_call_id), ("name", m.name))
            msg.update({k: v for k, v in ids if v is not None})
        out.append(msg)
    return out


# -- errors, as OpenAI's error object (4xx; a 500 only for our own bugs) ------------------------------
def _server(request: Request) -> Server:
    return request.app.state.server


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    # of a union's errors (stop: text or a list), the one that is not a plain type mismatch
    first = next((e for e in errors if not str(e.get("type", "")).endswith("_type")),
                 errors[0] if errors else {})
    param = _param(first.get("loc", ()))
    msg = first.get("msg", "invalid request")
    _server(request).metrics.errors.labels("400").inc()
    return error_response(400, f"{param or 'body'}: {msg}", param=param, code="invalid_value")


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    _server(request).metrics.errors.labels(str(exc.status_code)).inc()
    message = {404: f"no route {request.method} {request.url.path} (see /openapi.json)",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(
                   exc.status_code, str(exc.detail))
    return error_response(exc.status_code, message, code="not_found" if exc.status_code == 404 else None,
                          headers=exc.headers)


async def user_error(request: Request, exc: UserError) -> JSONResponse:
    ev = error_event(exc)
    _server(request).metrics.errors.labels(str(ev.status)).inc()
    return _event_response(ev)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("promptlookup serve: internal error")
    return error_response(500, f"internal error ({type(exc).__name__}); the server logged it", "server_error")


# -- the routes ----------------------------------------------------------------------------------------
router = APIRouter()


@router.get("/health", response_model=s.Health, tags=["server"])
async def health(request: Request) -> dict[str, Any]:
    server = _server(request)
    loop = server.loop
    return {"status": "ok", "model": server.model, "parallel": loop.parallel, "running": loop.running,
            "waiting": loop.waiting, "max_queue": server.settings.max_queue, "requests": loop.served}


@router.get("/metrics", tags=["server"], response_class=Response, responses={
    **GET_ERRORS, 200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                        "description": "Prometheus text format"}})
async def metrics(request: Request) -> Response:
    return Response(_server(request).metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models", response_model=s.ModelList, responses=GET_ERRORS, tags=["openai"])
async def models(request: Request) -> dict[str, Any]:
    server = _server(request)
    engine = server.engine
    meta = {"n_ctx": engine.n_ctx, "n_vocab": int(engine.backend.n_vocab),
            "backend": type(engine.backend).__name__,
            "speculate": public_label(engine.default_spec.label),
            "file": engine.model_name}
    return {"object": "list", "data": [{"id": server.model, "object": "model", "created": server.created,
                                        "owned_by": "promptlookup", "meta": meta}]}


@router.post("/v1/chat/completions", response_model=s.ChatCompletion, tags=["openai"],
             responses={**ERROR_RESPONSES, 200: {"content": SSE, "description": "a chat completion, "
                                                 "or with stream: true server-sent chunks"}})
async def chat_completions(body: s.ChatCompletionRequest, request: Request) -> Response:
    server = _server(request)
    body.refuse_unsupported()
    job = server.job("chat", check_messages(_messages(body)), body)  # every 400 before the queue
    if job.options.tool_choice.mode != "none":
        format_for(server.engine.backend)  # a template without tool support: 400 naming tools
    return await server.respond(request, job, Render(server.model, "chat", body, job.options.logprobs))


@router.post("/v1/completions", response_model=s.TextCompletion, tags=["openai"],
             responses={**ERROR_RESPONSES, 200: {"content": SSE, "description": "a completion, "
                                                 "or with stream: true server-sent chunks"}})
async def completions(body: s.CompletionRequest, request: Request) -> Response:
    server = _server(request)
    job = server.job("completion", body.prompt_input(), body)
    return await server.respond(request, job, Render(server.model, "completion", body, job.options.logprobs))


# -- the app -------------------------------------------------------------------------------------------
def create_app(engine: Engine, settings: Settings | None = None) -> FastAPI:
    """The FastAPI app on ``engine``: the routes above, the error handlers, the ASGI guard."""
    settings = settings or Settings()
    server = Server(engine, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.closing = False
        try:
            yield
        finally:
            server.stop()
            try:
                server.history.save()
            except (UserError, OSError) as exc:
                log.error("promptlookup serve: could not save the history: %s", exc)

    app = FastAPI(title="promptlookup", version=__version__, lifespan=lifespan,
                  description="An OpenAI-compatible server that speculates by prompt lookup "
                              "(the output is the model's own). One model context: requests queue.")
    app.state.server = server
    from promptlookup.serve.corpora import CorpusService
    from promptlookup.serve.corpora import router as corpora_router

    app.state.corpora = CorpusService(engine, settings.corpus_roots)
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(UserError, user_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, internal_error)
    app.include_router(router)
    app.include_router(corpora_router)

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
    app.add_middleware(Guard, api_key=settings.api_key, max_body=settings.max_body, metrics=server.metrics)
    return app
