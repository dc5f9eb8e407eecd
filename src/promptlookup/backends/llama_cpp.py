"""llama.cpp through ``llama-cpp-python``: greedy decoding with a rollback-able KV cache.

The high-level ``Llama`` object is used only to load the model and for its tokenizer; decoding goes
through the C API directly so that a verify step is exactly one ``llama_decode`` of ``1 + N``
tokens with logits requested for every position, and a rejected draft is undone with
``llama_memory_seq_rm``. Argmax is taken here, in numpy, over the logits rows llama.cpp returns;
under sampling, the :class:`~promptlookup.sampling.Sampler` reads the same rows in place (no copy of
the logits unless a penalty is applied).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from promptlookup.backends.base import BackendError, check_keep, one_turn
from promptlookup.sampling import Sampler

DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 512
#: what llama.cpp's system info prints for the matmul kernels whose result for a row depends on how
#: many rows share the batch: llamafile's tinyBLAS (taken for 2+ rows, the one-token decode takes
#: ggml's vec-dot) and the repacked weight layouts (a gemm for 4+ rows, a gemv below)
BATCH_DEPENDENT_KERNELS = ("LLAMAFILE = 1", "REPACK = 1")
#: ggml's tiled K-quant matmul is a third such kernel (taken for 8+ rows); it has no build switch
#: but this environment variable, read at its first use, turns it off
TILED_MATMUL_ENV = "GGML_CPU_TILED_MM"


def system_info(lib) -> str:
    """llama.cpp's one-line build report (``CPU : AVX2 = 1 | ... | LLAMAFILE = 1 | ...``)."""
    return lib.llama_print_system_info().decode("utf-8", "replace").strip()


def invariant_build(info: str) -> bool:
    """Whether the build was made without the batch-dependent kernels (set-up's ``invariant``
    kernels), read from its system info: only then can a row be bit-identical in every batch. The
    smoke test proves it on the installed library; this only says what was asked for."""
    return not any(k in info for k in BATCH_DEPENDENT_KERNELS)


def _switch_off_batch_dependent_runtime_paths(lib) -> None:
    """On an invariant build, turn the tiled K-quant matmul off before the first decode (it is
    chosen per batch size at run time; a process-wide setting, so set only where invariance is what
    the build is for, and never over a user's own choice)."""
    if invariant_build(system_info(lib)):
        os.environ.setdefault(TILED_MATMUL_ENV, "0")


def default_threads() -> int:
    """Threads default to the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class LlamaCppBackend:
    """A loaded GGUF model with one sequence of KV cache."""

    name = "llama.cpp"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        record_logits: bool = False,
    ) -> None:
        try:
            import llama_cpp  # deferred: importing it loads the shared library
        except (ImportError, OSError, RuntimeError) as exc:
            raise BackendError(f"the llama.cpp library could not be loaded ({exc}); "
                               "run 'promptlookup doctor', and scripts/setup.sh to reinstall") from exc

        self._lib = llama_cpp
        _switch_off_batch_dependent_runtime_paths(llama_cpp)
        self.model_path = Path(model_path)
        self.n_threads = n_threads or default_threads()
        self.n_batch = n_batch
        from promptlookup.backends.models import check_context

        check_context(self.model_path, n_ctx)  # before llama.cpp allocates (and touches) the KV cache
        try:
            self._llama = llama_cpp.Llama(
                model_path=str(self.model_path),
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_ubatch=n_batch,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"llama.cpp could not load {self.model_path}: {exc}") from exc
        self._ctx = self._llama.ctx
        self._vocab = llama_cpp.llama_model_get_vocab(self._llama.model)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))  # llama.cpp may round it up
        # Llama caps the batch at the context size; one llama_decode must never exceed it.
        self.n_batch = n_batch = min(n_batch, int(llama_cpp.llama_n_batch(self._ctx)),
                                     int(llama_cpp.llama_n_ubatch(self._ctx)))
        self.n_past = 0
        self._ids: list[int] = []  # the tokens in the cache, for the sampler's penalties
        self.record_logits = record_logits
        self.recorded: list[tuple[int, np.ndarray]] = []  # (position, logits row) when recording

        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        b = self._batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(b.logits, shape=(n_batch,))
        n_seq = np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))
        n_seq[:] = 1
        for i in range(n_batch):
            b.seq_id[i][0] = 0

    # -- metadata -------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, str]:
        return dict(self._llama.metadata)

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, int(token)))

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every id that ends generation (EOS, EOT, ...)."""
        if getattr(self, "_eog", None) is None:
            self._eog = frozenset(t for t in range(self.n_vocab) if self.is_eog(t))
        return self._eog

    def grammar_tokenizer(self) -> object:
        """llguidance's tokenizer over this vocabulary (structured output; built once per engine).

        As ``llguidance.llamacpp.lltokenizer_from_vocab`` (each token's piece; control tokens, and
        user-defined ones that look like them, marked with a 0xff byte; llama.cpp's own tokenizer
        for text), with llama.cpp's current attribute call instead of its deprecated alias."""
        import ctypes

        import llguidance

        lib, vocab = self._lib, self._vocab
        buf = ctypes.create_string_buffer(16 * 1024 + 1)
        tokens: list[bytes] = []
        for t in range(self.n_vocab):
            n = lib.llama_token_to_piece(vocab, t, buf, 16 * 1024, 0, True)
            if n < 0:
                raise BackendError(f"token {t}'s text is over 16 KiB")
            piece = bytes(buf[:n])
            attr = lib.llama_vocab_get_attr(vocab, t)
            if attr & lib.LLAMA_TOKEN_ATTR_CONTROL or (attr & lib.LLAMA_TOKEN_ATTR_USER_DEFINED
                                                       and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + piece
            tokens.append(piece)
        tokenize = ctypes.cast(lib.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        return llguidance.LLTokenizer.from_llamacpp(tokens=tokens, vocab_ptr=vocab, tokenize_fptr=tokenize,
                                                    eos_token=sorted(self.eog_ids) or None, slices=None)

    def check_token(self, token: int) -> None:
        if not 0 <= int(token) < self.n_vocab:
            raise BackendError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")

    # -- tokenizer ------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return list(
            self._llama.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
        )

    def detokenize(self, ids: Sequence[int]) -> str:
        for t in ids:
            self.check_token(t)
        return self._llama.detokenize(list(ids)).decode("utf-8", errors="replace")

    def control_texts(self) -> list[str]:
        """Texts of the tokens only ``parse_special`` matches (control and unknown tokens; user-defined
        ones are matched either way). promptlookup.chat finds these in template text only."""
        if getattr(self, "_control_texts", None) is None:
            lib, vocab = self._lib, self._vocab
            mask = lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_UNKNOWN
            texts = {lib.llama_vocab_get_text(vocab, t) for t in range(self.n_vocab)
                     if lib.llama_vocab_get_attr(vocab, t) & mask}
            self._control_texts = sorted(t.decode("utf-8", "replace") for t in texts if t)
        return self._control_texts

    def fingerprint(self) -> str:
        """A tokenizer fingerprint for files built with this vocabulary (see drafting caches)."""
        from promptlookup.fingerprint import fingerprint_pieces

        return fingerprint_pieces(
            self.n_vocab,
            (self._llama.detokenize([t], special=True) for t in range(self.n_vocab)),
        )

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """Render the model's own chat template for one user turn, ready for generation."""
        return self.render_chat(one_turn(user, system))

    @property
    def chat_template(self) -> str | None:
        """The GGUF's chat template text (``tokenizer.chat_template``), None when it has none."""
        template = self.metadata.get("tokenizer.chat_template")
        return template or None

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Render the model's own chat template for ``messages`` (role/content; tool calls and tool
        results as OpenAI's) and ``tools``, ready for the assistant's next turn."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        meta = self.metadata
        template = self.chat_template
        if not template:
            raise BackendError(f"{self.model_path.name} has no chat template (chat needs one)")

        def piece(key: str) -> str:
            tid = meta.get(key)
            if tid is None:
                return ""
            return self._llama.detokenize([int(tid)], special=True).decode("utf-8", "replace")

        fmt = Jinja2ChatFormatter(
            template=template,
            eos_token=piece("tokenizer.ggml.eos_token_id"),
            bos_token=piece("tokenizer.ggml.bos_token_id"),
        )
        try:
            return fmt(messages=[dict(m) for m in messages], tools=list(tools) if tools else None).prompt
        except Exception as exc:  # jinja2 raises TemplateError (and the template's own raise_exception)
            raise BackendError(f"the chat template refused these messages: {exc}") from exc

    # -- decoding -------------------------------------------------------------------------
    def _decode(self, ids: Sequence[int], want: str, sampler: Sampler | None = None) -> list[int]:
        """Decode ``ids`` at ``n_past..``; return the choice after the last token or after each."""
        m = len(ids)
        if m == 0:
            raise BackendError("nothing to decode")
        if self.n_past + m > self.n_ctx:
            raise BackendError(
                f"context full: {self.n_past} cached + {m} new tokens > n_ctx {self.n_ctx}"
            )
        for t in ids:
            self.check_token(t)
        if sampler is not None and sampler.argmax_only:
            sampler = None
        del self._ids[self.n_past :]
        self._ids.extend(int(t) for t in ids)
        result: list[int] = []
        stopped = False  # the sampler stopped at a rejected draft: later rows are never read
        for start in range(0, m, self.n_batch):
            chunk = ids[start : start + self.n_batch]
            c = len(chunk)
            self._tok[:c] = chunk
            self._pos[:c] = np.arange(self.n_past, self.n_past + c)
            last_chunk = start + c == m
            if want == "all":
                self._out[:c] = 1
            else:
                self._out[:c] = 0
                self._out[c - 1] = 1 if last_chunk else 0
            self._batch.n_tokens = c
            rc = self._lib.llama_decode(self._ctx, self._batch)
            if rc != 0:
                del self._ids[self.n_past :]
                raise BackendError(f"llama_decode failed with code {rc} at position {self.n_past}")
            n_rows = c if want == "all" else int(last_chunk)
            if n_rows:
                ptr = self._lib.llama_get_logits(self._ctx)
                rows = np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))
                if self.record_logits:
                    first = self.n_past + (c - n_rows)
                    self.recorded.extend((first + i, rows[i].copy()) for i in range(n_rows))
                if sampler is None:
                    result.extend(int(t) for t in rows.argmax(axis=1))
                elif not stopped:  # rows predict the positions after the last n_rows tokens fed
                    at = self.n_past + c - n_rows + 1
                    chosen = sampler.sample_rows(rows, self._ids, at)
                    result.extend(chosen)
                    last = at + len(chosen) - 1
                    stopped = last < len(self._ids) and self._ids[last] != chosen[-1]
            self.n_past += c
        return result

    @property
    def tokens(self) -> list[int]:
        return list(self._ids)

    def prefill(self, ids: Sequence[int], sampler: Sampler | None = None, keep: int = 0) -> int:
        check_keep(self._ids, ids, keep)
        self.recorded.clear()
        if keep:
            self.rollback(keep)
            return self._decode(ids[keep:], want="last", sampler=sampler)[-1]
        self._lib.llama_memory_clear(self._mem, True)
        self.n_past = 0
        self._ids = []
        return self._decode(ids, want="last", sampler=sampler)[-1]

    def verify(self, ids: Sequence[int], sampler: Sampler | None = None) -> list[int]:
        return self._decode(ids, want="all", sampler=sampler)

    def rollback(self, n_keep: int) -> None:
        if not 0 <= n_keep <= self.n_past:
            raise BackendError(f"cannot roll back to {n_keep} with {self.n_past} cached")
        if n_keep < self.n_past:
            ok = self._lib.llama_memory_seq_rm(self._mem, 0, n_keep, -1)
            if not ok:
                raise BackendError(f"llama_memory_seq_rm refused to drop positions {n_keep}..")
            self.n_past = n_keep
            del self._ids[n_keep:]

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        llama = getattr(self, "_llama", None)
        if llama is not None:
            llama.close()
            self._llama = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        with contextlib.suppress(Exception):
            self.close()
