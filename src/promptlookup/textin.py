"""Text read for tokenizing: checked or repaired here, before any of it reaches a tokenizer.

Why one place: llama.cpp's tokenizer decodes UTF-8 leniently but throws ``std::invalid_argument``
("invalid codepoint") through its C API on a lead byte that decodes above U+10FFFF (``\\xf7\\xbf\\xbf\\xbf``,
common in any binary file). Nothing catches it, so the process aborts (exit 134), or a tokenizer worker
dies and takes its pool with it. Python's strict UTF-8 decoder refuses a superset of what llama.cpp
cannot take (also overlong forms and surrogates), so text that passes it is safe for every tokenizer.

Two policies, one per kind of reader:

- a prompt (``generate -p/-f``, bench workloads) is what the user means to say: invalid UTF-8 is
  refused with the byte offset (:func:`strict_text`, :func:`prompt_text`);
- a corpus or a replay text (``create``, ``index``, ``stats``) is data: every invalid sequence is
  replaced by U+FFFD as Python's ``errors="replace"`` does, and the count is reported
  (:func:`repair_utf8`, :func:`read_text_bytes`). Valid UTF-8 passes unchanged, byte for byte, so
  caches of valid text stay identical to llama.cpp's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from promptlookup.errors import InputError

REPLACEMENT = "\ufffd".encode()


class TextInputError(InputError):
    """Text that cannot be tokenized as given; the message names the input and the problem."""


def utf8_error(data: bytes) -> UnicodeDecodeError | None:
    """The first strict-UTF-8 error in ``data``, or None when it is valid."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc
    return None


def repair_utf8(data: bytes) -> tuple[bytes, int]:
    """``(valid UTF-8, number of invalid sequences replaced by U+FFFD)``; valid input is returned as is."""
    if utf8_error(data) is None:
        return data, 0
    text = data.decode("utf-8", errors="replace")
    # U+FFFD already in the input is a valid 3-byte sequence that the decoder keeps; the rest are ours.
    n = text.count("\ufffd") - data.count(REPLACEMENT)
    return text.encode("utf-8"), n


def strict_text(data: bytes, what: str) -> str:
    """``data`` decoded as strict UTF-8, or a :class:`TextInputError` naming the first bad byte."""
    exc = utf8_error(data)
    if exc is None:
        return data.decode("utf-8")
    bad = data[exc.start : exc.end]
    raise TextInputError(f"{what} is not UTF-8 text: invalid byte {bad[:1].hex()!s} at offset {exc.start} "
                         f"({exc.reason})")


def prompt_text(text: str, what: str = "the prompt") -> str:
    """A prompt that came in as a ``str`` from argv: undo Python's surrogateescape and check it."""
    try:
        return strict_text(text.encode("utf-8", "surrogateescape"), what)
    except UnicodeEncodeError:  # a lone surrogate that argv decoding did not produce
        raise TextInputError(f"{what} is not UTF-8 text: it holds a lone surrogate") from None


def _input_file(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path)
    if p.is_dir():
        raise TextInputError(f"{what} is a directory, not a file: {p}")
    if not p.is_file():
        raise TextInputError(f"{what} not found: {p}")
    return p


def read_input_bytes(path: str | os.PathLike[str], what: str) -> bytes:
    """A file's bytes, or ``-`` for stdin; a directory or a missing file is a clear error."""
    if str(path) == "-":
        return sys.stdin.buffer.read()
    p = _input_file(path, what)
    try:
        return p.read_bytes()
    except OSError as exc:
        raise TextInputError(f"cannot read {what} {p}: {exc.strerror or exc}") from None


def read_prompt_file(path: str | os.PathLike[str], what: str = "prompt file") -> str:
    """A prompt file (or ``-`` for stdin) as strict UTF-8 text."""
    name = "stdin" if str(path) == "-" else f"{what} {path}"
    return strict_text(read_input_bytes(path, what), name)


def read_text_bytes(path: str | os.PathLike[str], what: str = "text file") -> tuple[bytes, int]:
    """A data text for tokenizing: ``(repaired bytes, invalid sequences replaced)``."""
    return repair_utf8(read_input_bytes(path, what))


def check_input_files(paths, what: str = "corpus file") -> None:  # noqa: ANN001
    """Every path is a readable regular file (a directory is named as one)."""
    for p in paths:
        _input_file(p, what)


def replaced_note(n: int, who: str) -> list[str]:
    """The report line for repaired input (none when nothing was replaced)."""
    if not n:
        return []
    s = "" if n == 1 else "s"
    return [f"{who}: {n} invalid UTF-8 sequence{s} replaced by U+FFFD before tokenizing"]
