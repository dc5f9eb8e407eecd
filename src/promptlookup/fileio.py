"""Atomic file writes: a killed process leaves the old file or the new one, never half of one.

Every file promptlookup writes (caches, histories, cost curves, bench output) goes through here:
the bytes go to a temporary file in the same directory, are fsynced, and replace the target with
``os.replace``. The temporary file gets ordinary permissions (``mkstemp`` would leave it 0600).

A process killed mid-write (kill -9, out of memory) leaves its temporary file behind, up to the size
of the target; every write first removes the temporaries of the same target (our naming pattern
only) that nobody has written to for :data:`STALE_TMP_SECONDS`.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

STALE_TMP_SECONDS = 300  # a live writer touches its temporary file far more often than this


def temp_pattern(path: Path) -> re.Pattern[str]:
    """Names of the temporary files :func:`atomic_write` makes for ``path`` (``mkstemp``'s 8 random
    characters between our prefix and suffix)."""
    return re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")


def remove_stale_temps(path: str | os.PathLike[str], max_age_s: float = STALE_TMP_SECONDS) -> list[Path]:
    """Delete the temporaries of ``path`` left by killed writers (unmodified for ``max_age_s``)."""
    path = Path(path)
    pattern, now, removed = temp_pattern(path), time.time(), []
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for e in entries:
            if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    if now - e.stat(follow_symlinks=False).st_mtime > max_age_s:
                        os.unlink(e.path)
                        removed.append(Path(e.path))
    return removed


def atomic_write(path: str | os.PathLike[str], chunks: Iterable[bytes | memoryview | np.ndarray]) -> None:
    """Write ``chunks`` one after another to ``path``, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            for c in chunks:
                fh.write(c.tobytes() if isinstance(c, np.ndarray) and not c.flags.c_contiguous else c)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, atomically."""
    atomic_write(path, [text.encode("utf-8")])
