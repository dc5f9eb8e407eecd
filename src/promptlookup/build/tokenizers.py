"""Tokenizers for building files from a corpus: the model's vocabulary alone, and the memoized one.

Why here and not in ``create``: ``create``, ``index``, ``stats``, the ``merge`` of caches, the
llama.cpp drop-in and the benchmarks all need a model's tokens (or its fingerprint) without loading
its weights; they share :class:`VocabTokenizer` and :func:`open_tokenizer` from this module.
:mod:`promptlookup.build.memo_tokenizer` holds the memoized twin (llama.cpp's tokens, ~8x faster).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import numpy as np

from promptlookup.errors import InputError
from promptlookup.textin import TextInputError, utf8_error


class VocabTokenizer:
    """The model's tokenizer alone: the vocabulary through llama.cpp's C API, no weights and no
    context (about 35 MB resident, where a vocab-only ``llama_cpp.Llama`` takes about 100)."""

    def __init__(self, model_path: str | os.PathLike[str]) -> None:
        import llama_cpp  # deferred: loads the shared library
        from llama_cpp._utils import suppress_stdout_stderr

        self._lib = llama_cpp
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise InputError(f"model file not found: {model_path}")
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        with suppress_stdout_stderr(disable=False):
            llama_cpp.llama_backend_init()
            self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
        if not self._model:
            raise InputError(f"llama.cpp could not load the vocabulary of {model_path}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.metadata: dict[str, str] = self._read_metadata()

    def _read_metadata(self) -> dict[str, str]:
        lib, out = self._lib, {}
        buf = ctypes.create_string_buffer(1 << 16)
        for i in range(lib.llama_model_meta_count(self._model)):
            n = lib.llama_model_meta_key_by_index(self._model, i, buf, len(buf))
            if n < 0 or n >= len(buf):
                continue
            key = buf.value.decode("utf-8", "replace")
            n = lib.llama_model_meta_val_str_by_index(self._model, i, buf, len(buf))
            if 0 <= n < len(buf):
                out[key] = buf.value.decode("utf-8", "replace")
        return out

    def close(self) -> None:
        """Free the vocabulary; tokenizing afterwards is an error, never a dangling pointer."""
        if getattr(self, "_model", None):
            self._lib.llama_model_free(self._model)
            self._model = None
            self._vocab = None

    def _live_vocab(self):  # noqa: ANN202
        if self._vocab is None:
            raise ValueError(f"the tokenizer of {self.model_path} was closed")
        return self._vocab

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    def piece(self, token: int, special: bool = True) -> bytes:
        """The text of one token, as ``llama_cpp.Llama.detokenize([token])`` gives it."""
        if not 0 <= token < self.n_vocab:
            raise ValueError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")
        buf = ctypes.create_string_buffer(64)
        n = self._lib.llama_token_to_piece(self._live_vocab(), token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        out = buf.raw[:n]
        if token == self._lib.llama_vocab_bos(self._vocab) and out[:1] == b" ":
            out = out[1:]  # llama-cpp-python drops the space llama-1 vocabularies put after BOS
        return out

    def tokenize(self, data: bytes, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        bad = utf8_error(data)
        if bad is not None:  # llama.cpp would abort the process on some of these (see textin.py)
            raise TextInputError(f"text to tokenize is not valid UTF-8 at byte {bad.start} ({bad.reason}); "
                                 "read it through promptlookup.textin")
        buf = np.empty(len(data) + 8, dtype=np.int32)
        ptr = buf.ctypes.data_as(ctypes.POINTER(self._lib.llama_token))
        n = self._lib.llama_tokenize(self._live_vocab(), data, len(data), ptr, len(buf), add_special,
                                     parse_special)
        if n < 0:  # cannot happen with one slot per byte plus specials, but never trust a length
            buf = np.empty(-n, dtype=np.int32)
            ptr = buf.ctypes.data_as(ctypes.POINTER(self._lib.llama_token))
            n = self._lib.llama_tokenize(self._vocab, data, len(data), ptr, len(buf), add_special,
                                         parse_special)
        return buf[:n].copy()

    def fingerprint(self) -> str:
        from promptlookup.fingerprint import fingerprint_pieces

        return fingerprint_pieces(self.n_vocab, (self.piece(t) for t in range(self.n_vocab)))

    def special_texts(self) -> list[bytes]:
        """Texts of the tokens llama.cpp's tokenizer matches before pre-tokenizing (control,
        user-defined and unknown tokens)."""
        lib = self._lib
        mask = lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_USER_DEFINED | lib.LLAMA_TOKEN_ATTR_UNKNOWN
        vocab = self._live_vocab()
        return sorted({lib.llama_vocab_get_text(vocab, t) for t in range(self.n_vocab)
                       if lib.llama_vocab_get_attr(vocab, t) & mask} - {b"", None})


TOKENIZERS = ("memo", "llama")


def open_tokenizer(model_path: str | os.PathLike[str], kind: str = "memo"):  # noqa: ANN201
    """``memo``: llama.cpp's tokens with pieces memoized (memo_tokenizer.py); ``llama``: llama.cpp's
    tokenizer on every byte (the reference, several times slower)."""
    if kind not in TOKENIZERS:
        raise InputError(f"unknown tokenizer {kind!r} (memo or llama)")
    base = VocabTokenizer(model_path)
    if kind == "llama":
        return base
    from promptlookup.build.memo_tokenizer import MemoTokenizer

    return MemoTokenizer(base)


def describe_tokenizer(tok) -> str:  # noqa: ANN001
    fast = getattr(tok, "fast", None)
    if fast is None:
        return "llama.cpp's tokenizer"
    return ("llama.cpp's tokens, pieces memoized" if fast
            else f"llama.cpp's tokenizer (memo off: {tok.reason})")
