"""``GET/POST /v1/corpora`` and ``DELETE /v1/corpora/{name}``: named corpora on a running server.

What a POST does: ``{"name": N, "path": P}`` with ``P`` inside a ``--corpus-root`` directory (after
symbolic links are resolved; else 403). ``P`` may be a corpus directory (``promptlookup index``'s
output) or an index file, which is opened and checked whole (body CRC, sorted suffix array: a
corrupt file is a 400 and a log line, never served); or a source tree / document, which is indexed
into ``--corpus-dir/N`` by ``promptlookup index`` in a child process at lower priority (``nice``), so
the decoding threads keep their GIL and most of the CPU, then opened the same way. The call returns
(201) when the corpus is usable; a client that disconnects does not stop the build. One build runs
at a time (a second POST while one builds: 409). Requests name corpora in their ``corpora`` field
(an unknown name: 400 naming it).

A DELETE takes the name away at once (404 when unknown); the index is unmapped, and a corpus the
server built deleted from disk, when the last request drafting from it ends (``"deferred": true``
in the answer when that is later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from promptlookup.corpora.tree import INDEX_FILE, MANIFEST_FILE, check_name, corpora_dir
from promptlookup.drafting.suffix.corpus_index import MAGIC, CorpusIndexError
from promptlookup.errors import InputError
from promptlookup.serve.guard import error_response

log = logging.getLogger("promptlookup.serve")
BUILD_NICE = 10  # the build's priority below the server's decoding threads
MAX_PATH_CHARS = 4096


class CorpusAdd(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    name: str = Field(..., min_length=1, max_length=64, description="the corpus's name in requests")
    path: str = Field(..., min_length=1, max_length=MAX_PATH_CHARS,
                      description="a directory or file under one of the server's --corpus-root "
                                  "directories: a source tree or documents (indexed now), a corpus "
                                  "directory or an index file (loaded)")


class CorpusInfo(BaseModel):
    name: str
    tokens: int = Field(description="tokens in the index")
    bytes: int = Field(description="size of the index file")
    files: int | None = Field(None, description="files indexed (None: a bare index file)")
    source_bytes: int | None = None
    built: str | None = None
    in_use: int = Field(description="requests drafting from it now")
    default: bool = Field(description="a --corpus default: requests that name none draft from it")
    state: str | None = Field(None, description="ready (in the answer to POST)")


class CorpusList(BaseModel):
    object: str = "list"
    data: list[CorpusInfo]
    building: str | None = Field(None, description="the corpus a POST is building now")
    roots: list[str] = Field(description="the directories POST /v1/corpora may read (--corpus-root)")


class CorpusDeleted(BaseModel):
    name: str
    deleted: bool
    deferred: bool = Field(description="true: requests still draft from it; unmapped when they end")


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    from promptlookup.serve.schemas import ErrorResponse

    what = {400: "a bad name or path, a corrupt index, an indexing failure",
            401: "a missing or wrong API key",
            403: "a path outside --corpus-root (or no root given)", 404: "no corpus of that name",
            409: "the name is taken, or another corpus is being built", 413: "the body is over --max-body"}
    return {c: {"model": ErrorResponse, "description": what[c]} for c in codes}


class CorpusFailure(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class CorpusService:
    """The server's corpora: the engine's registry plus the roots, the build directory and builds."""

    def __init__(self, engine: Any, roots: tuple[str, ...] = (), build_dir: Path | None = None) -> None:
        self.engine = engine
        self.registry = engine.corpora
        self.roots = [Path(r).resolve() for r in roots]
        self.build_dir = build_dir or getattr(engine, "corpus_dir", None) or corpora_dir()
        self._lock = threading.Lock()
        self.building: str | None = None

    def allowed(self, path: str) -> Path:
        if not self.roots:
            raise CorpusFailure(403, "adding corpora is off: start the server with --corpus-root DIR",
                                "path", "forbidden")
        if "\0" in path:
            raise CorpusFailure(400, "path holds a NUL character", "path")
        try:
            p = Path(path).resolve()
        except (OSError, RuntimeError, ValueError) as exc:
            raise CorpusFailure(400, f"path: cannot resolve it ({exc})", "path") from None
        if not any(p == r or p.is_relative_to(r) for r in self.roots):
            raise CorpusFailure(403, "path is outside the directories this server may read (--corpus-root)",
                                "path", "forbidden")
        if not p.exists():
            raise CorpusFailure(400, f"path {path!r} does not exist", "path")
        return p

    def add(self, name: str, path: str) -> dict[str, Any]:
        """Blocking (run it in a thread): build or load, check whole, register; the corpus's info."""
        try:
            check_name(name)
        except InputError as exc:
            raise CorpusFailure(400, str(exc), "name") from None
        p = self.allowed(path)
        with self._lock:
            if self.registry.has(name):
                raise CorpusFailure(409, f"a corpus named {name!r} is already loaded (DELETE it first)",
                                    "name", "conflict")
            if self.building is not None:
                raise CorpusFailure(409, f"corpus {self.building!r} is being built; retry when it is done",
                                    "name", "busy")
            self.building = name
        try:
            owned = False
            if _is_index(p) or (p.is_dir() and (p / MANIFEST_FILE).exists() and (p / INDEX_FILE).exists()):
                ref = p
            else:
                ref = self.build_dir / name
                self._build(p, ref)
                owned = True
            try:
                entry = self.registry.open(str(ref), name=name, owned=owned, verify=True)
            except CorpusIndexError as exc:
                log.warning("promptlookup serve: corpus %r refused: %s", name, exc)
                raise CorpusFailure(400, f"corpus {name!r}: {exc}", "path", "corrupt_index") from None
            except InputError as exc:
                raise CorpusFailure(409 if "already loaded" in str(exc) else 400, str(exc), "name") from None
            log.info("promptlookup serve: corpus %r added (%d tokens) from %s", name, entry.index.n_tokens, p)
            return {**entry.info(), "default": False, "state": "ready"}
        finally:
            with self._lock:
                self.building = None

    def _build(self, src: Path, out: Path) -> None:
        model = getattr(self.engine.backend, "model_path", None)
        if model is None:
            raise CorpusFailure(400, "this server's backend has no model file to tokenize a corpus "
                                     "with; index it with `promptlookup index` and add the corpus directory",
                                "path")
        cmd = [sys.executable, "-m", "promptlookup", "index", str(src), "-o", str(out.absolute()), "-m",
               str(model), "--no-progress"]
        env = dict(os.environ)
        env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
        # no preexec_fn (unsafe in a threaded server): the child is lowered right after it starts
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        with contextlib.suppress(OSError, AttributeError):
            nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + BUILD_NICE)
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
        _, stderr = proc.communicate()
        if proc.returncode != 0:
            lines = [x for x in stderr.strip().splitlines() if x.strip()]
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            log.warning("promptlookup serve: building corpus from %s failed: %s", src, why)
            raise CorpusFailure(400, f"indexing {src} failed: {why}", "path", "index_failed")

    def remove(self, name: str) -> dict[str, Any]:
        try:
            now = self.registry.remove(name)
        except KeyError:
            raise CorpusFailure(404, f"no corpus named {name!r}", None, "not_found") from None
        return {"name": name, "deleted": True, "deferred": not now}


def _is_index(p: Path) -> bool:
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as fh:
            return fh.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _failure(exc: CorpusFailure) -> JSONResponse:
    return error_response(exc.status, exc.message, param=exc.param, code=exc.code)


router = APIRouter()


def _service(request: Request) -> CorpusService:
    return request.app.state.corpora


@router.get("/v1/corpora", tags=["corpora"], response_model=CorpusList, responses=_errors(401))
async def list_corpora(request: Request) -> dict[str, Any]:
    svc = _service(request)
    return {"object": "list", "data": svc.registry.info(), "building": svc.building,
            "roots": [str(r) for r in svc.roots]}


@router.post("/v1/corpora", status_code=201, tags=["corpora"], response_model=CorpusInfo,
             responses=_errors(400, 401, 403, 409, 413))
async def add_corpus(body: CorpusAdd, request: Request) -> Response:
    svc = _service(request)
    try:
        info = await asyncio.to_thread(svc.add, body.name, body.path)
    except CorpusFailure as exc:
        return _failure(exc)
    return JSONResponse(info, status_code=201)


@router.delete("/v1/corpora/{name}", tags=["corpora"], response_model=CorpusDeleted,
               responses=_errors(400, 401, 404))
async def delete_corpus(request: Request, name: Annotated[str, PathParam(
        max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="a loaded corpus's name")]) -> Response:
    try:
        return JSONResponse(_service(request).remove(name))
    except CorpusFailure as exc:
        return _failure(exc)
