"""Seeded mutators for every file format promptlookup reads and for its text inputs, and the checks
that hold each outcome to "a clean error or a valid result".

Shared by ``tests/test_fuzz.py`` (bounded, part of CI) and ``benchmarks/fuzz_formats.py`` (the same
generators for longer, counting outcomes). A case is ``(format, mutation, payload)``; :func:`check`
returns ``"ok"`` (a valid result, used afterwards) or ``"error"`` (the format's own error class);
anything else raises, and the caller counts or fails on it.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

FP = "0123456789abcdef"
N_VOCAB = 64
EXTREMES = (0, 1, 2, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1)
SPECIAL_TEXTS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<|im_start|>system\n")
BAD_UTF8 = (b"\xf7\xbf\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80",
            b"\xff", b"\xfe", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\x80",
            b"\xbf\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98")
CONTROL = bytes(range(0, 32)) + b"\x7f"


# -- valid base files -------------------------------------------------------------------------------
def _static_bytes(tmp: Path, rng: random.Random) -> bytes:
    from promptlookup.drafting.lookup.static_cache import build_static, write_static

    n = 200
    t = [np.array([rng.randrange(N_VOCAB) for _ in range(n)]) for _ in range(3)]
    write_static(tmp / "base.plc", build_static(t[0], t[1], t[2], np.ones(n, dtype=np.int64), N_VOCAB, FP))
    return (tmp / "base.plc").read_bytes()


def _llamacpp_bytes(rng: random.Random) -> bytes:
    from promptlookup.drafting.lookup.cache import NgramCache
    from promptlookup.drafting.lookup.llamacpp_file import pack_llamacpp

    cache = NgramCache()
    for _ in range(60):
        n = rng.randrange(1, 5)
        cache.add_records(np.array([[rng.randrange(N_VOCAB) for _ in range(n)] + [-1] * (4 - n)],
                                   dtype=np.int32), np.array([0, 1]), np.array([rng.randrange(N_VOCAB)]),
                          np.array([rng.randrange(1, 9)]))
    return pack_llamacpp(*cache.records())


def _history_bytes(tmp: Path, rng: random.Random) -> bytes:
    from promptlookup.drafting.suffix.history import History

    h = History(budget=2000, fingerprint=FP)
    for _ in range(4):
        h.add([rng.randrange(N_VOCAB) for _ in range(rng.randrange(5, 60))])
    h.save(tmp / "base.hist")
    return (tmp / "base.hist").read_bytes()


def _index_bytes(tmp: Path, rng: random.Random) -> bytes:
    from promptlookup.drafting.suffix.corpus_index import build_suffix_array, write_index

    toks = np.array([rng.randrange(8) for _ in range(300)], dtype=np.int32)
    write_index(tmp / "base.plsa", toks, build_suffix_array(toks, N_VOCAB), N_VOCAB, FP)
    return (tmp / "base.plsa").read_bytes()


def _curve_bytes() -> bytes:
    from promptlookup.costcurve import CostCurve

    seconds = (0.010, 0.018, 0.021, 0.025, 0.030, 0.034, 0.040, 0.043, 0.045)
    return CostCurve(seconds, "fuzz").to_json().encode()


def gguf_bytes(rng: random.Random | None = None) -> bytes:
    """A small GGUF v3 header: the keys promptlookup reads, a string and a string array (no tensors)."""
    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    kvs = [(s("general.architecture"), struct.pack("<I", 8) + s("llama")),
           (s("llama.context_length"), struct.pack("<II", 4, 8192)),
           (s("llama.block_count"), struct.pack("<II", 4, 30)),
           (s("llama.embedding_length"), struct.pack("<II", 4, 576)),
           (s("llama.attention.head_count"), struct.pack("<II", 4, 9)),
           (s("tokenizer.ggml.tokens"), struct.pack("<IIQ", 9, 8, 3) + s("a") + s("b") + s("<|im_end|>")),
           (s("llama.attention.head_count_kv"), struct.pack("<II", 4, 3)),
           (s("tokenizer.ggml.scores"), struct.pack("<IIQ", 9, 6, 3) + struct.pack("<3f", 0, 1, 2))]
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(k + v for k, v in kvs)


# -- CRC fixers and header fields ---------------------------------------------------------------------
def _fix_static(b: bytearray) -> None:
    if len(b) >= 64:
        struct.pack_into("<I", b, 56, zlib.crc32(bytes(b[64:])))
        struct.pack_into("<I", b, 60, zlib.crc32(bytes(b[:60])))


def _fix_history(b: bytearray) -> None:
    if len(b) >= 96:
        struct.pack_into("<I", b, 88, zlib.crc32(bytes(b[96:])))


def _fix_index(b: bytearray) -> None:
    if len(b) >= 128:
        struct.pack_into("<I", b, 80, zlib.crc32(bytes(b[128:])))
        struct.pack_into("<I", b, 124, zlib.crc32(bytes(b[:124])))


HEADERS: dict[str, tuple[int, list[tuple[int, str]], Callable[[bytearray], None]]] = {
    # format: (header size, [(offset, struct format) of its size fields], CRC fixer)
    "static": (64, [(8, "<I"), (12, "<I"), (32, "<Q"), (40, "<Q"), (48, "<Q")], _fix_static),
    "history": (96, [(8, "<I"), (12, "<I"), (32, "<Q"), (40, "<Q"), (48, "<Q"), (56, "<Q"), (64, "<Q"),
                     (72, "<Q"), (80, "<Q")], _fix_history),
    "index": (128, [(8, "<I"), (12, "<I"), (32, "<Q"), (40, "<Q"), (48, "<Q"), (56, "<Q"), (64, "<Q"),
                    (72, "<Q")], _fix_index),
    "llamacpp": (20, [(0, "<i"), (4, "<i"), (16, "<i"), (20, "<i"), (24, "<i")], lambda b: None),
    "gguf": (24, [(4, "<I"), (8, "<Q"), (16, "<Q"), (24, "<Q"), (56, "<Q")], lambda b: None),
}
BINARY_MUTATIONS = ("zero", "truncate", "header_flip", "body_flip", "body_flip_crc", "header_extreme",
                    "random")


def mutate_binary(fmt: str, good: bytes, kind: str, rng: random.Random) -> bytes:
    hsize, fields, fix = HEADERS[fmt]
    b = bytearray(good)
    if kind == "zero":
        return b""
    if kind == "truncate":
        return bytes(b[: rng.randrange(len(b))])
    if kind == "random":
        return rng.randbytes(rng.randrange(1, 400))
    if kind == "header_flip":
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(min(hsize, len(b)))] ^= rng.randrange(1, 256)
        return bytes(b)
    if kind in ("body_flip", "body_flip_crc"):
        for _ in range(rng.randrange(1, 5)):
            b[rng.randrange(hsize, len(b))] ^= rng.randrange(1, 256)
        if kind == "body_flip_crc":
            fix(b)
        return bytes(b)
    if kind == "header_extreme":
        off, f = rng.choice(fields)
        width = struct.calcsize(f)
        value = rng.choice(EXTREMES) % (1 << (8 * width))
        if f.islower() and value >= 1 << (8 * width - 1):
            value -= 1 << (8 * width)
        if off + width <= len(b):
            struct.pack_into(f, b, off, value)
        fix(b)
        return bytes(b)
    raise ValueError(kind)


def mutate_json(good: bytes, kind: str, rng: random.Random) -> bytes:
    if kind == "zero":
        return b""
    if kind == "truncate":
        return good[: rng.randrange(len(good))]
    if kind == "flip":
        b = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
        return bytes(b)
    if kind == "huge_number":
        return ("[" + "9" * rng.choice((40, 400, 5000)) + ", 1]").encode()
    if kind == "deep":
        d = rng.choice((33, 1000, 100_000))
        return ("[" * d + "]" * d).encode()
    if kind == "extreme_values":
        vals = [rng.choice(("5e-324", "1e308", "1e999", "-1", "0", "NaN", "Infinity", "-0.0", "1e-10",
                            "3600.5", "true", '"x"', "null", "0.01")) for _ in range(rng.randrange(1, 10))]
        return ("[" + ", ".join(vals) + "]").encode()
    if kind == "wrong_shape":
        return rng.choice((b"{}", b'{"seconds": 3}', b'{"seconds": {}}', b"3", b'"s"', b"[]",
                           b"[" + b"1," * 100_000 + b"1]", b'{"seconds": [1, 2], "label": [[[]]]}'))
    raise ValueError(kind)


JSON_MUTATIONS = ("zero", "truncate", "flip", "huge_number", "deep", "extreme_values", "wrong_shape")
TEXT_MUTATIONS = ("invalid_utf8", "huge_codepoint", "control", "special_tokens", "random_bytes", "mixed")


def mutate_text(kind: str, rng: random.Random) -> bytes:
    words = [b"hello", b" world", b"\n", b"def f(x):", b"  ", b"caf\xc3\xa9", b"\xe4\xb8\xad", b"0123"]
    parts: list[bytes] = []
    for _ in range(rng.randrange(1, 12)):
        if kind == "invalid_utf8":
            parts.append(rng.choice(BAD_UTF8 + tuple(words)))
        elif kind == "huge_codepoint":
            parts.append(rng.choice((b"\xf7\xbf\xbf\xbf", b"\xf5\x80\x80\x80", b"\xf4\x90\x80\x80", *words)))
        elif kind == "control":
            parts.append(bytes(rng.choice(CONTROL) for _ in range(rng.randrange(1, 4))))
        elif kind == "special_tokens":
            parts.append(rng.choice(SPECIAL_TEXTS).encode() if rng.random() < 0.5 else rng.choice(words))
        elif kind == "random_bytes":
            parts.append(rng.randbytes(rng.randrange(1, 16)))
        else:
            parts.append(rng.choice(BAD_UTF8 + tuple(s.encode() for s in SPECIAL_TEXTS) + tuple(words)
                                    + (CONTROL[:5],)))
    return b"".join(parts)


FORMATS = ("static", "llamacpp", "history", "index", "curve", "gguf", "text")


class Bases:
    """The valid file of each format, built once per run (seeded)."""

    def __init__(self, tmp: Path, seed: int) -> None:
        rng = random.Random(seed)
        self.tmp = tmp
        self.good = {"static": _static_bytes(tmp, rng), "llamacpp": _llamacpp_bytes(rng),
                     "history": _history_bytes(tmp, rng), "index": _index_bytes(tmp, rng),
                     "curve": _curve_bytes(), "gguf": gguf_bytes()}


def cases(fmt: str, bases: Bases, n: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """``n`` seeded (mutation, payload) cases of one format, cycling through its mutations."""
    rng = random.Random(f"{seed}:{fmt}")
    kinds = TEXT_MUTATIONS if fmt == "text" else JSON_MUTATIONS if fmt == "curve" else BINARY_MUTATIONS
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if fmt == "text":
            yield kind, mutate_text(kind, rng)
        elif fmt == "curve":
            yield kind, mutate_json(bases.good["curve"], kind, rng)
        else:
            yield kind, mutate_binary(fmt, bases.good[fmt], kind, rng)


# -- checks: "ok" (valid, and used) or "error" (the format's own error); anything else raises -----------
def check(fmt: str, data: bytes, tmp: Path, ctx: dict[str, Any]) -> str:
    path = tmp / f"case.{fmt}"
    path.write_bytes(data)
    return CHECKS[fmt](path, data, ctx)


def _check_static(path: Path, data: bytes, ctx: dict[str, Any]) -> str:
    from promptlookup.drafting.lookup.llamacpp_file import open_static_any
    from promptlookup.drafting.lookup.static_cache import CacheFormatError, open_static

    try:
        c = open_static(path, verify=False)  # header checked only: lookups must stay in bounds
    except CacheFormatError:
        pass
    else:
        for a in range(-1, 5):
            c.get((a, a + 1))
            c.count(a, 1, 3)
        c.close()
    try:
        c = open_static_any(path, N_VOCAB, lambda: FP, verify=True)
    except CacheFormatError:
        return "error"
    c.close()
    return "ok"


def _check_llamacpp(path: Path, data: bytes, ctx: dict[str, Any]) -> str:
    from promptlookup.drafting.lookup.llamacpp_file import load_dynamic
    from promptlookup.drafting.lookup.static_cache import CacheFormatError

    try:
        cache = load_dynamic(path, N_VOCAB)
    except CacheFormatError:
        return "error"
    keys, off, tok, cnt = cache.records()
    assert len(keys) and off[0] == 0 and off[-1] == len(tok) and np.all(cnt > 0) and np.all(tok >= 0)
    assert int(tok.max()) < N_VOCAB
    return "ok"


def _check_history(path: Path, data: bytes, ctx: dict[str, Any]) -> str:
    from promptlookup.drafting.suffix.history import History, HistoryFormatError
    from promptlookup.drafting.suffix.source import SuffixSource

    try:
        h = History.load(path, fingerprint=FP)
    except HistoryFormatError:
        return "error"
    src = SuffixSource(history=h, n_vocab=max(N_VOCAB, h.max_token + 1))
    src.reset([1, 2, 3, 4, 5])
    for _ in range(3):
        d = src.propose(4)
        src.extend(list(d.tokens[:1]) or [7])
    return "ok"


def _check_index(path: Path, data: bytes, ctx: dict[str, Any]) -> str:
    from promptlookup.drafting.suffix.corpus_index import CorpusIndexError, open_index

    try:
        idx = open_index(path, fingerprint=FP, n_vocab=N_VOCAB)
    except CorpusIndexError:
        return "error"
    try:  # unverified body: the kernels bound every read, so a clean error or an answer
        length, lo, hi = idx.longest_match([1, 2, 3, 4, 5, 6, 7])
        idx.followers(lo, hi, length)
        idx.verify()
    except CorpusIndexError:
        return "error"
    finally:
        idx.close()
    return "ok"


def _check_curve(path: Path, data: bytes, ctx: dict[str, Any]) -> str:
    import math

    from promptlookup.costcurve import CostCurve, CostCurveError

    try:
        curve = CostCurve.load(path)
    except CostCurveError:
        return "error"
    rel = curve.relative(9)
    assert all(math.isfinite(r) and r > 0 for r in rel), rel
    return "ok"


def _check_gguf(path: Path, data: bytes, ctx: dict[str, Any]) -> str:
    from promptlookup.backends.models import ModelError, check_gguf, kv_cache_estimate

    try:
        check_gguf(path)
    except ModelError:
        return "error"
    ctx_train, per_token = kv_cache_estimate(path)  # our reader: never raises on a malformed header
    assert ctx_train is None or ctx_train > 0
    assert per_token is None or per_token > 0
    return "ok"


def _check_text(path: Path, data: bytes, ctx: dict[str, Any]) -> str:
    """Every text reader: strict prompts refuse or decode; repaired text tokenizes identically with
    both tokenizers; raw invalid bytes never reach llama.cpp; chat content yields no control token."""
    from promptlookup.textin import TextInputError, read_prompt_file, read_text_bytes, utf8_error

    repaired, n_bad = read_text_bytes(path)
    assert utf8_error(repaired) is None and (n_bad == 0) == (repaired == data)
    outcome = "ok"
    try:
        prompt = read_prompt_file(path)
    except TextInputError:
        outcome, prompt = "error", repaired.decode()
    vocab, memo = ctx.get("vocab"), ctx.get("memo")
    if vocab is not None:
        ids = vocab.tokenize(repaired)
        assert memo is None or np.array_equal(memo.tokenize(repaired), ids)
        if n_bad:
            try:
                vocab.tokenize(data)
            except TextInputError:
                pass
            else:
                raise AssertionError("invalid UTF-8 reached llama.cpp's tokenizer")
    backend = ctx.get("backend")
    if backend is not None and ctx.get("chat_budget", 0) > 0:
        from promptlookup.chat import chat_tokens

        ctx["chat_budget"] -= 1
        control = ctx["control_ids"]
        ids = chat_tokens(backend, prompt)
        assert [t for t in ids if t in control] == ctx["template_controls"], "control token from user text"
    return outcome


CHECKS: dict[str, Callable[[Path, bytes, dict[str, Any]], str]] = {
    "static": _check_static, "llamacpp": _check_llamacpp, "history": _check_history, "index": _check_index,
    "curve": _check_curve, "gguf": _check_gguf, "text": _check_text,
}


def chat_context(backend) -> dict[str, Any]:  # noqa: ANN001
    """What the text check needs to hold chat prompts to "no control token from user text"."""
    from promptlookup.chat import chat_tokens

    control = {int(t) for text in backend.control_texts()
               for t in backend.tokenize(text, add_special=False, parse_special=True)}
    plain = chat_tokens(backend, "x")
    return {"backend": backend, "control_ids": control,
            "template_controls": [t for t in plain if t in control]}
