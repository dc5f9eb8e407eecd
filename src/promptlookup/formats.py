"""What kind of file this is, from its first bytes: so a file given in the wrong place is named.

Why: llama.cpp's n-gram cache has no header, so any file parses as one until a record fails (a
suffix history given as ``--lookup-cache-static`` was "not a valid llama.cpp n-gram cache: truncated
follower list at byte 0"), and a zero-byte file parses as an empty cache and silently drafts
nothing. Every reader of a file we did not just write asks :func:`foreign_kind` first.
"""

from __future__ import annotations

import os

# magic -> what the file is, as an error message names it
MAGICS: tuple[tuple[bytes, str], ...] = (
    (b"PLSTATIC", "a promptlookup static cache"),
    (b"PLSUFHST", "a promptlookup suffix history (--suffix-history)"),
    (b"PLSUFIDX", "a promptlookup corpus index (promptlookup index, --suffix-corpus)"),
    (b"GGUF", "a GGUF model"),
)
EMPTY = "an empty file (0 bytes)"


def kind_of(head: bytes) -> str | None:
    """The kind of a file starting with ``head`` (its first 16 bytes or more); None if unknown."""
    if not head:
        return EMPTY
    for magic, what in MAGICS:
        if head.startswith(magic):
            return what
    text = head.lstrip()
    # text only: a llama.cpp cache starting with token 123 also starts with b"{" (then NUL bytes)
    if text[:1] in (b"{", b"[") and all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        return "a JSON file"
    return None


def kind_of_file(path: str | os.PathLike[str]) -> str | None:
    """:func:`kind_of` a file's first bytes (an unreadable file is None: its reader says why)."""
    try:
        with open(path, "rb") as fh:
            return kind_of(fh.read(16))
    except OSError:
        return None


def foreign_kind(path: str | os.PathLike[str], own: str) -> str | None:
    """The kind of ``path`` when it is not ``own`` (one of the kinds above, or None for a headerless
    format such as llama.cpp's n-gram cache): the reader refuses it, naming that kind."""
    kind = kind_of_file(path)
    return None if kind == own else kind
