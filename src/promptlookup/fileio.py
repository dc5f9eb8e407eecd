"""Atomic file writes, and the one header rule of our binary files.

Atomic: a killed process leaves the old file or the new one, never half of one.

Every file promptlookup writes (caches, histories, cost curves, bench output) goes through here:
the bytes go to a temporary file in the same directory, are fsynced, and replace the target with
``os.replace``. The temporary file gets ordinary permissions (``mkstemp`` would leave it 0600).

A process killed mid-write (kill -9, out of memory) leaves its temporary file behind, up to the size
of the target; every write first removes the temporaries of the same target (our naming pattern
only) that nobody has written to for :data:`STALE_TMP_SECONDS`.

Header: :class:`BinaryHeader` is the layout and the checks every binary format shares (magic,
version, tokenizer fingerprint, body and header CRCs); each format declares one and adds only its
own fields and invariants.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import struct
import tempfile
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from promptlookup.formats import kind_of

STALE_TMP_SECONDS = 300  # a live writer touches its temporary file far more often than this


def cache_dir() -> Path:
    """Where promptlookup keeps what it measured or checked once per machine (cost curves, the
    backend's health mark): ``$PROMPTLOOKUP_CACHE``, else ``~/.cache/promptlookup``. Read at each
    call, so a test or a wrapper can point it elsewhere at any time."""
    root = os.environ.get("PROMPTLOOKUP_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "promptlookup"


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


# -- one binary header ------------------------------------------------------------------------
PREFIX = struct.Struct("<8sII16s")  # magic, version, the format's u32, tokenizer fingerprint
FINGERPRINT_BYTES = 16


class Header(NamedTuple):
    """A header as read: the format's u32 at byte 12, the fingerprint ("" when none was recorded),
    the format's own fields, and the CRC the body must have."""

    param: int
    fingerprint: str
    fields: tuple[int, ...]
    body_crc: int


@dataclass(frozen=True)
class BinaryHeader:
    """The one header rule of every binary file promptlookup writes (static cache, corpus index,
    suffix history), so each is checked the same way, in the same order, with the same messages.

    Layout, little-endian::

        0     8  magic
        8     4  u32 version
        12    4  u32 the format's own (n-gram size, suffix-array item size, automaton depth)
        16   16  tokenizer fingerprint, ASCII, NUL-padded (all NUL: none recorded)
        32       the format's fields (``fields``, struct codes)
        ..    4  u32 crc32 of every byte after the header (the body)
        ..       zeros up to size - 4 (room for fields a later version adds)
        size-4 4 u32 crc32 of the header's bytes before it

    Why the header has its own CRC: the body CRC needs the whole file read (a second per 100 MB),
    so opening checks only the header; its CRC makes every size and offset in it trustworthy before
    any of them is used to map or slice the body.
    """

    magic: bytes
    version: int
    what: str  # what the file is, as messages name it: "static cache"
    fields: str  # struct codes of the format's fields after the prefix: "QQQ"
    size: int  # header bytes in all
    rebuild: str  # what to do with a file of an older version or another tokenizer
    error: type[Exception]

    def __post_init__(self) -> None:
        if len(self.magic) != 8 or self.size % 8 or self.size < self._body_crc.size + 4:
            raise ValueError(f"malformed header rule for {self.what}")

    @property
    def _body_crc(self) -> struct.Struct:
        return struct.Struct("<8sII16s" + self.fields + "I")

    def pack(self, param: int, fingerprint: str, fields: Sequence[int], body_crc: int) -> bytes:
        """The header of a file whose body (every byte after it) has crc32 ``body_crc``."""
        fp = fingerprint.encode("ascii")
        if len(fp) > FINGERPRINT_BYTES:
            raise ValueError(f"a tokenizer fingerprint is at most {FINGERPRINT_BYTES} ASCII characters")
        head = self._body_crc.pack(self.magic, self.version, param, fp, *fields, body_crc)
        head += b"\0" * (self.size - 4 - len(head))
        return head + struct.pack("<I", zlib.crc32(head))

    def read(self, head: bytes, name: str, fingerprint: str | None = None) -> Header:
        """Check the first bytes of a file (``size`` of them, or all it has): length, magic, version,
        header CRC, fingerprint (matching ``fingerprint`` when given); raise ``error`` naming ``name``."""
        if len(head) < self.size:
            raise self.error(f"{name}: not a {self.what} (only {len(head)} bytes, header is {self.size})")
        values = self._body_crc.unpack_from(head)
        magic, version, param, fp_raw = values[:4]
        if magic != self.magic:
            kind = kind_of(head[:16])
            raise self.error(f"{name}: not a {self.what}: bad magic {magic!r}"
                             + (f" (it is {kind})" if kind else ""))
        if version != self.version:
            hint = f"; {self.rebuild}" if version < self.version else ""
            raise self.error(f"{name}: {self.what} version {version} is not supported "
                             f"(this reads {self.version}){hint}")
        (want_crc,) = struct.unpack_from("<I", head, self.size - 4)
        if zlib.crc32(head[: self.size - 4]) != want_crc:
            raise self.error(f"{name}: {self.what} header is corrupt (checksum mismatch)")
        try:
            fp = fp_raw.rstrip(b"\0").decode("ascii")
        except UnicodeDecodeError:
            raise self.error(f"{name}: {self.what} header has a malformed tokenizer fingerprint") from None
        if fingerprint is not None and fp != fingerprint:
            raise self.error(f"{name}: {self.what} is for another tokenizer: built for tokenizer "
                             f"{fp or '(none)'}, this one is {fingerprint}; {self.rebuild}")
        return Header(param, fp, tuple(values[4:-1]), values[-1])

    def check_body(self, data: bytes | memoryview | mmap.mmap, body_crc: int, name: str) -> None:
        """The full check of the body (``data`` is the whole file): its crc32 against the header's."""
        with memoryview(data) as view:
            ok = zlib.crc32(view[self.size :]) == body_crc
        if not ok:
            raise self.error(f"{name}: {self.what} body is corrupt (checksum mismatch)")


def crc32_of(chunks: Iterable[bytes | memoryview | np.ndarray]) -> int:
    """crc32 of ``chunks`` one after another (arrays by their bytes), as ``zlib.crc32`` of the join."""
    crc = 0
    for c in chunks:
        if isinstance(c, np.ndarray):
            c = memoryview(np.ascontiguousarray(c)).cast("B")
        crc = zlib.crc32(c, crc)
    return crc
