"""Atomic file writes: a killed process leaves the old file or the new one, never half of one.

Every file promptlookup writes (caches, histories, cost curves, bench output) goes through here:
the bytes go to a temporary file in the same directory, are fsynced, and replace the target with
``os.replace``. The temporary file gets ordinary permissions (``mkstemp`` would leave it 0600).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np


def atomic_write(path: str | os.PathLike[str], chunks: Iterable[bytes | memoryview | np.ndarray]) -> None:
    """Write ``chunks`` one after another to ``path``, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
