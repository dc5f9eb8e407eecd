"""Running the app under uvicorn: bind, say where, stop cleanly on SIGTERM/SIGINT.

Why our own ``uvicorn.Server``: on a signal, uvicorn waits for open connections before the app's
shutdown runs, and a stream that is still generating would hold it there; so the first SIGTERM or
SIGINT cancels every job at once (a running generation ends at its next step), then uvicorn shuts
down, the app's lifespan ends the engine loop's requests and saves the history, and the process
exits 0. Uvicorn itself re-raises a captured signal after shutdown (the process would die by it); this server
records the signal only, so the exit status says the shutdown went well. A second SIGINT forces
the exit.
"""

from __future__ import annotations

import signal
import socket
import sys
from typing import Any

import uvicorn

from promptlookup.api import Engine
from promptlookup.serve.app import Settings, create_app

READY = "promptlookup serve: listening on"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self._app = app
        self.signals: list[int] = []

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.signals.append(sig)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True
        self._app.state.server.stop(timeout=0)  # cancel now; the lifespan waits for the requests

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.should_exit or not self.servers:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"{READY} http://{shown}:{port}", flush=True)


def run_server(engine: Engine, settings: Settings, host: str = "127.0.0.1", port: int = 8080) -> int:
    """Serve until a signal; returns the exit status (0 after a clean shutdown)."""
    app = create_app(engine, settings)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=10, server_header=False)
    server = _Server(config, app)
    sock = bind(host, port)  # here, so that a port in use is one line (an OSError: exit 2)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started and not server.signals:
        print(f"promptlookup: error: could not serve on {host}:{port}", file=sys.stderr)
        return 2
    return 0


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host:port`` (port 0: a free one)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock
