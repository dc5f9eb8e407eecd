"""The server's suffix history on disk: written every few requests and once more at shutdown.

The engine loads ``--history FILE`` at start (a corrupt or foreign file is refused there) and every
request's text joins the history in memory. :class:`HistorySaver` writes it back atomically
(``fileio.atomic_write``: a temporary file, fsync, ``os.replace``), so a server killed at any moment
leaves the previous file or the new one, never half of one. Saves run on an executor thread after
a request (holding the engine's lock, which a request takes only to join the history) and on the main
thread after the engine loop stopped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("promptlookup.serve")


class HistorySaver:
    def __init__(self, engine, every: int, on_save: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.every = every
        self.on_save = on_save
        self._since = 0  # requests finished since the last save
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.engine.history_path is not None

    def request_done(self) -> None:
        """Called after each finished request (off the event loop): save every ``every`` requests."""
        if not self.enabled:
            return
        with self._lock:
            self._since += 1
            due = self._since >= self.every
        if due:
            self.save()

    def save(self) -> int | None:
        """Write the history now (the engine's lock makes it wait for a running request)."""
        if not self.enabled:
            return None
        with self._lock:
            self._since = 0
        size = self.engine.save_history()
        if self.on_save is not None:
            self.on_save()
        return size
