"""llama.cpp through ``llama-cpp-python``: greedy decoding with a rollback-able KV cache.

The high-level ``Llama`` object is used only to load the model and for its tokenizer; decoding goes
through the C API directly so that a verify step is exactly one ``llama_decode`` of ``1 + N``
tokens with logits requested for every position, and a rejected draft is undone with
``llama_memory_seq_rm``. The context can hold several sequences (``n_seq``, each in its own KV
stream) that one forward decodes together (:meth:`LlamaCppBackend.decode_many`, continuous
batching); the single-sequence API is sequence 0 of the same path. Argmax is taken here, in
numpy, over the logits rows llama.cpp returns; under sampling, the
:class:`~promptlookup.sampling.Sampler` reads the same rows in place (no copy of the logits unless a
penalty is applied).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from promptlookup.backends.base import BackendError, SeqDecode, check_keep, one_turn
from promptlookup.backends.compute_thread import on_compute_thread
from promptlookup.sampling import Sampler

DEFAULT_N_CTX = 4096  # a backend built directly; the CLI, Engine and load_backend size it (context_size.py)
DEFAULT_N_BATCH = 512
#: the context the ``Llama`` object makes for itself (llama.cpp's smallest): it is only used to load
#: the weights and the tokenizer, and decoding has its own context (see ``_own_context``)
SCRATCH_N_CTX = 256
#: llama.cpp's context size granularity (per sequence, when each has its own KV stream)
CTX_PAD = 256
#: what a part of :meth:`LlamaCppBackend.decode_many` may want
WANTS = ("all", "last", "none")
#: what llama.cpp's system info prints for the matmul kernels whose result for a row depends on how
#: many rows share the batch: llamafile's tinyBLAS (taken for 2+ rows, the one-token decode takes
#: ggml's vec-dot) and the repacked weight layouts (a gemm for 4+ rows, a gemv below), unless set-up
#: patched the repack (:data:`REPACK_ONE_ORDER`)
BATCH_DEPENDENT_KERNELS = ("LLAMAFILE = 1", "REPACK = 1")
#: what set-up's invariant build adds to the system info when it keeps the repack: Q4_K only, its
#: gemv rounding as its gemm does (promptlookup.llama_build.recipe says why), so ``REPACK = 1`` is
#: then not batch-dependent
REPACK_ONE_ORDER = "REPACK_ONE_ORDER = 1"
#: ggml's tiled K-quant matmul is a third such kernel (taken for 8+ rows); it has no build switch
#: but this environment variable, read at its first use, turns it off
TILED_MATMUL_ENV = "GGML_CPU_TILED_MM"
#: what set-up's patched invariant build adds to the system info (promptlookup.llama_build): CPU
#: flash attention takes one reduction path for every batch shape; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
#: Q2_K-Q6_K and F16 matmuls take a row against many columns at once, each result bit-identical to
#: upstream's one-pair kernel (the mark's value counts the kernel sets: 2 added Q4_0, Q5_1, Q2_K, Q3_K
#: and Q5_K)
FLASH_ATTENTION_ONE_PATH = "FA_ONE_PATH = 1"
MUL_MAT_COLS = "MUL_MAT_COLS = 2"
#: the column matmul of set-ups before 2026-12-08: Q4_1, Q5_0, Q8_0, Q4_K and Q6_K only (Q4_0, Q5_1,
#: Q2_K, Q3_K and Q5_K took ggml's one-pair kernel: exact, verifies dearer)
MUL_MAT_COLS_OLDER = "MUL_MAT_COLS = 1"
#: the process-wide default for flash attention: ``auto`` (on where it keeps rows invariant), ``on``,
#: ``off`` (llama-server's ``-fa`` has the same three values)
FLASH_ATTENTION_ENV = "PROMPTLOOKUP_FLASH_ATTENTION"
#: ``auto`` turns flash attention on up to this many positions per sequence (see
#: :func:`flash_attention_default`)
FLASH_ATTENTION_AUTO_CTX = 512


def system_info(lib) -> str:
    """llama.cpp's one-line build report (``CPU : AVX2 = 1 | ... | LLAMAFILE = 1 | ...``)."""
    return lib.llama_print_system_info().decode("utf-8", "replace").strip()


def invariant_build(info: str) -> bool:
    """Whether the build was made without the batch-dependent kernels (set-up's ``invariant``
    kernels), read from its system info: only then can a row be bit-identical in every batch. The
    smoke test proves it on the installed library; this only says what was asked for."""
    return not _batch_dependent(info)


def _batch_dependent(info: str) -> list[str]:
    """The batch-dependent kernels ``info`` reports (their names, as ``LLAMAFILE``)."""
    found = [k for k in BATCH_DEPENDENT_KERNELS if k in info]
    if REPACK_ONE_ORDER in info:
        found = [k for k in found if k != "REPACK = 1"]
    return [k.split(" = ")[0] for k in found]


def one_path_flash_attention(info: str) -> bool:
    """Whether flash attention may be on without breaking invariance: an invariant build whose CPU
    flash attention set-up patched to take one reduction path for every batch shape (it reports
    :data:`FLASH_ATTENTION_ONE_PATH`; promptlookup.llama_build.recipe says why upstream's paths differ)."""
    return invariant_build(info) and FLASH_ATTENTION_ONE_PATH in info


#: the command that installs the safe build into the running environment (src/promptlookup/llama_build)
SETUP_COMMAND = "promptlookup setup-llama"
#: set to ``fast`` where llama.cpp's batch-dependent kernels were chosen on purpose (the same variable
#: set-up reads): then a build without the invariant kernels is what was asked for, and says nothing
KERNELS_ENV = "PROMPTLOOKUP_LLAMA_KERNELS"


def build_problem(info: str) -> str | None:
    """What keeps this llama.cpp build from being promptlookup's safe one, read from its system info
    (None: it is that build). A build pip made from upstream's source has llama.cpp's default kernels,
    whose result for a row depends on the batch, and lacks the flash-attention patch."""
    if not invariant_build(info):
        return f"its matmul kernels depend on the batch ({', '.join(_batch_dependent(info))})"
    if not one_path_flash_attention(info):
        return "its flash attention is not the one-path patch"
    return None


def build_warning(info: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The one line a run prints when its llama-cpp-python is not the safe build (None: it is, or
    ``$PROMPTLOOKUP_LLAMA_KERNELS=fast`` says the fast kernels are wanted). Nothing degrades silently:
    the line says what is lost and the command that fixes it."""
    problem = build_problem(info)
    if problem is None or environ.get(KERNELS_ENV, "").strip().lower() == "fast":
        return None
    return (f"promptlookup: warning: this llama-cpp-python is not promptlookup's safe build ({problem}): "
            "speculative output may differ from --speculate off, and upstream's build dies by SIGILL on "
            f"AMX CPUs; run '{SETUP_COMMAND}' to install the exact one")


_warned_build = False


def _warn_once_if_not_safe(lib) -> None:
    """Print :func:`build_warning` once per process (a server loads its model once; a CLI run once)."""
    global _warned_build
    if _warned_build:
        return
    line = build_warning(system_info(lib))
    if line:
        import sys

        print(line, file=sys.stderr, flush=True)
        _warned_build = True


def flash_attention_default(info: str, n_ctx: int, environ: Mapping[str, str] = os.environ) -> bool:
    """Flash attention for a backend that was not told: ``$PROMPTLOOKUP_FLASH_ATTENTION`` ``on`` or
    ``off``; ``auto`` (or unset): on where the build keeps rows invariant with it
    (:func:`one_path_flash_attention`) and a sequence holds at most :data:`FLASH_ATTENTION_AUTO_CTX`
    positions. Why the bound: the one path attends one cell at a time, which beats attention without
    flash attention on short contexts and loses on long ones (benchmarks/flash_attention.py, -t 2: a
    9-token verify 0.89x at 128 cached positions, 1.13x at 700, 1.35x at 3000)."""
    value = environ.get(FLASH_ATTENTION_ENV, "").strip().lower() or "auto"
    if value not in ("auto", "on", "off"):
        raise BackendError(f"{FLASH_ATTENTION_ENV}={environ[FLASH_ATTENTION_ENV]!r} is not one of "
                           "auto, on, off")
    if value == "auto":
        return one_path_flash_attention(info) and n_ctx <= FLASH_ATTENTION_AUTO_CTX
    return value == "on"


def _switch_off_batch_dependent_runtime_paths(lib) -> None:
    """On an invariant build, turn the tiled K-quant matmul off before the first decode (it is
    chosen per batch size at run time; a process-wide setting, so set only where invariance is what
    the build is for, and never over a user's own choice)."""
    if invariant_build(system_info(lib)):
        os.environ.setdefault(TILED_MATMUL_ENV, "0")


def default_threads() -> int:
    """Threads default to the cores this process may run on, busy or not.

    Why not fewer when other processes are busy: the load changes while a server runs (a count
    chosen at start-up would be stale for hours), and with llama.cpp's short spin (the default set
    in :mod:`promptlookup.backends.threads`) all the cores degrade with the load instead of
    collapsing. Measured on 2 cores (docs/setup.md, a shared machine): idle, ``-t 2`` decoded 52
    tokens/s against 36 at ``-t 1``; beside one busy process 23 against 36, beside two 20 against
    26, while prefilling 1.0-1.3x as fast. ``doctor`` says when fewer would decode faster."""
    from promptlookup.backends.threads import available_cores

    return available_cores()


def pack_forwards(lengths: Sequence[tuple[int, int]], n_batch: int) -> list[list[tuple[int, int, int]]]:
    """Pack parts feeding ``(seq, tokens)`` into ``llama_decode`` calls of at most ``n_batch`` tokens:
    ``(part index, lo, hi)`` slices, in increasing sequence order. A part that fits in one call is
    never split (it starts a new call when the current one has no room for it); a longer one fills
    calls in order, as one long prompt is chunked at ``n_batch`` from its start when it is alone.

    Why sequence order: with one KV stream per sequence, llama.cpp computes a call in ubatches that
    each take sequences with consecutive ids in increasing order (:func:`split_equal_sizes`); parts
    packed as they arrived (say sequences 2, 0, 3, 1) cost two forwards ({2, 3} then {0, 1}), packed
    in order one (measured: four one-token parts 84 ms against 44 ms on 2 cores)."""
    calls: list[list[tuple[int, int, int]]] = []
    cur: list[tuple[int, int, int]] = []
    room = n_batch
    for k in sorted(range(len(lengths)), key=lambda k: lengths[k][0]):
        m = lengths[k][1]
        if room < m <= n_batch:
            calls.append(cur)
            cur, room = [], n_batch
        lo = 0
        while lo < m:
            if room == 0:
                calls.append(cur)
                cur, room = [], n_batch
            take = min(room, m - lo)
            cur.append((k, lo, lo + take))
            lo += take
            room -= take
    if cur:
        calls.append(cur)
    return calls


def split_equal_sizes(call: Sequence[tuple[int, int]], n_ubatch: int) -> list[int]:
    """The ubatches, in tokens, llama.cpp computes one ``llama_decode`` call in when each sequence
    has its own KV stream (``kv_unified`` off: its ``split_equal`` with ``sequential``): ``call`` is
    ``(seq, tokens)`` in increasing sequence order, as :func:`pack_forwards` lays it out.

    Each ubatch takes the lowest sequence with tokens left and the sequences after it with
    consecutive ids that still have tokens, and the same number of tokens from each: the fewest any
    of them has left (at most ``n_ubatch`` in all). So parts of equal length on consecutive
    sequences are one forward, and a longer part, or a gap in the ids, costs another."""
    left = [[seq, n] for seq, n in call if n > 0]
    sizes: list[int] = []
    while left:
        run = [left[0]]
        for item in left[1:]:
            if item[0] != run[-1][0] + 1:
                break
            run.append(item)
        take = max(1, min(min(n for _, n in run), n_ubatch // len(run)))
        for item in run:
            item[1] -= take
        sizes.append(take * len(run))
        left = [item for item in left if item[1] > 0]
    return sizes


@functools.lru_cache(maxsize=4096)
def forward_sizes_of(lengths: tuple[tuple[int, int], ...], n_batch: int, streams: bool) -> tuple[int, ...]:
    """:meth:`LlamaCppBackend.forward_sizes` of ``(seq, tokens)`` parts in increasing sequence order,
    with one KV stream per sequence (``streams``) or a single sequence."""
    sizes: list[int] = []
    for call in pack_forwards(lengths, n_batch):
        if streams:
            sizes.extend(split_equal_sizes([(lengths[k][0], hi - lo) for k, lo, hi in call], n_batch))
        else:
            sizes.append(sum(hi - lo for _, lo, hi in call))
    return tuple(sizes)


class LlamaCppBackend:
    """A loaded GGUF model with ``n_seq`` sequences of KV cache (one unless continuous batching).

    The single-sequence :class:`~promptlookup.backends.base.Decoder` methods act on sequence 0; the
    :class:`~promptlookup.backends.base.BatchDecoder` methods address any sequence. Both go through
    one packing path (:meth:`decode_many`), so a sequence decoded alone and one decoded in company
    are fed to llama.cpp the same way.

    ``flash_attention``: None (default) reads ``$PROMPTLOOKUP_FLASH_ATTENTION``
    (:func:`flash_attention_default`: by default on only on set-up's patched invariant build, where
    it keeps every row's logits the same in every batch, and for short contexts, where it is the
    faster); True / False force it (on a build without the patch, on gives up invariance).

    Not thread-safe: one caller at a time (a ``llama_decode`` releases the GIL, and the batch buffers
    and cached ids here are shared by every call)."""

    name = "llama.cpp"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        record_logits: bool = False,
        n_seq: int = 1,
        flash_attention: bool | None = None,
    ) -> None:
        try:
            import llama_cpp  # deferred: importing it loads the shared library
        except (ImportError, OSError, RuntimeError) as exc:
            raise BackendError(f"the llama.cpp library could not be loaded ({exc}); "
                               f"run 'promptlookup doctor', and '{SETUP_COMMAND}' to reinstall") from exc

        self._lib = llama_cpp
        _warn_once_if_not_safe(llama_cpp)
        _switch_off_batch_dependent_runtime_paths(llama_cpp)
        self.model_path = Path(model_path)
        self.n_threads = n_threads or default_threads()
        max_seq = int(llama_cpp.llama_max_parallel_sequences())
        if not 1 <= n_seq <= max_seq:
            raise BackendError(f"n_seq {n_seq} is outside 1..{max_seq} (llama.cpp's limit)")
        if n_ctx < 1 or n_batch < 1:
            raise BackendError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be positive")
        from promptlookup.backends.models import check_context

        check_context(self.model_path, n_ctx, n_seq)  # before llama.cpp allocates (and touches) the KV cache
        try:
            # Llama loads the weights and the tokenizer; its own context is the smallest llama.cpp
            # makes (0.3.36's Llama cannot set n_seq_max / kv_unified) and is freed at once below.
            self._llama = llama_cpp.Llama(
                model_path=str(self.model_path),
                n_ctx=SCRATCH_N_CTX,
                n_batch=SCRATCH_N_CTX,
                n_ubatch=SCRATCH_N_CTX,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"llama.cpp could not load {self.model_path}: {exc}") from exc
        self.flash_attention = (flash_attention_default(system_info(llama_cpp), n_ctx)
                                if flash_attention is None else bool(flash_attention))
        self._ctx = self._own_context(n_ctx, n_seq, n_batch)
        self._vocab = llama_cpp.llama_model_get_vocab(self._llama.model)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._pieces: list[bytes | None] = [None] * self.n_vocab  # each token's text (detokenize)
        self._bos = int(llama_cpp.llama_vocab_bos(self._vocab))
        self._chat_formatter = None  # the chat template, compiled on first use (render_chat)
        self.n_seq = int(llama_cpp.llama_n_seq_max(self._ctx))
        # positions per sequence: llama.cpp pads the whole context to a multiple of 256 and gives
        # each of the n_seq streams an equal share, so this may be above the n_ctx asked for
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx))
        # one llama_decode must never take more than the context's batch (and one ubatch: a larger
        # batch would be split by llama.cpp into ubatches we do not control)
        self.n_batch = n_batch = min(int(llama_cpp.llama_n_batch(self._ctx)),
                                     int(llama_cpp.llama_n_ubatch(self._ctx)))
        self._seq_ids: list[list[int]] = [[] for _ in range(self.n_seq)]  # each sequence's cached ids
        self.record_logits = record_logits
        # (position, logits row) of every row decoded while recording, per sequence; ``recorded`` is
        # sequence 0's (the single-sequence API's)
        self.recorded_seqs: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(self.n_seq)]
        self.recorded = self.recorded_seqs[0]

        # every token belongs to one sequence, so one seq_id slot per token is enough; which
        # sequence is written per token by each decode
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        b = self._batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(b.logits, shape=(n_batch,))
        n_seq_id = np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))
        n_seq_id[:] = 1
        self._seq_slot = [b.seq_id[i] for i in range(n_batch)]  # each token's seq_id array
        for slot in self._seq_slot:
            slot[0] = 0
        self._slot_seq = [0] * n_batch  # what each slot holds now (writing a ctypes slot costs)

    def _own_context(self, n_ctx: int, n_seq: int, n_batch: int):
        """The decoding context: ``n_seq`` sequences of ``n_ctx`` positions each, in separate KV
        streams (``kv_unified`` off, so a sequence can never take another's cells and its attention
        reads only its own), built with the loaded ``Llama``'s settings (threads, ...) and
        :attr:`flash_attention`, which replaces the ``Llama``'s own scratch context."""
        lib = self._lib
        params = lib.llama_context_params.from_buffer_copy(self._llama.context_params)
        # llama.cpp pads each sequence's share up to a multiple of 256 anyway; asking for the padded
        # size keeps the total divisible by n_seq (else it logs a "rounding down" it does not do)
        params.n_ctx = -(-n_ctx // CTX_PAD) * CTX_PAD * n_seq
        params.n_batch = params.n_ubatch = min(n_batch, n_ctx * n_seq)
        params.n_seq_max = n_seq
        params.kv_unified = False
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attention
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        ctx = lib.llama_init_from_model(self._llama.model, params)
        if ctx is None:
            self._llama.close()
            raise BackendError(f"llama.cpp could not make a context of {n_seq} x {n_ctx} positions "
                               f"for {self.model_path}")
        self._llama._ctx.close()  # the scratch context: nothing here decodes through the Llama
        return ctx

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
        """The text of ``ids``: each token's piece, joined (llama.cpp's ``llama_detokenize``), less
        the space after a leading BOS (as llama-cpp-python's ``Llama.detokenize``).

        Why a table of pieces: the text of a whole output is made again at every step
        (``TextTracker``), and llama-cpp-python asks llama.cpp for every token's piece each time, in a
        Python loop: with 4 streaming requests a fifth of the server's Python time went there, all of
        it between two forwards. Why not llama-cpp-python's: it reads each piece into a 32-byte
        buffer and drops a longer one, and this vocabulary has 47 (a newline and 32 or more spaces of
        indentation, a rule of 64 dashes), so deeply indented code lost its indentation.
        :meth:`detokenize_reference` is the plain twin."""
        pieces = self._pieces
        try:
            if ids and min(ids) < 0:  # a list index would count it from the end
                raise IndexError(min(ids))
            raw = b"".join([p if (p := pieces[t]) is not None else self._piece(t) for t in ids])
        except (IndexError, TypeError, ValueError):
            for t in ids:
                self.check_token(t)
            raise
        if raw[:1] == b" " and ids and ids[0] == self._bos:
            raw = raw[1:]
        return raw.decode("utf-8", errors="replace")

    def _piece(self, token: int) -> bytes:
        """``token``'s piece as llama.cpp writes it (no special-token text), kept in the table."""
        self._pieces[token] = piece = self._piece_of(token)
        return piece

    def _piece_of(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = int(self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False))
        if n < 0:  # the piece is longer than the buffer: llama.cpp says how long
            buf = ctypes.create_string_buffer(-n)
            n = int(self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False))
        return bytes(buf[:n])

    def detokenize_reference(self, ids: Sequence[int]) -> str:
        """:meth:`detokenize`'s plain twin: every piece asked of llama.cpp, one token at a time."""
        for t in ids:
            self.check_token(t)
        raw = b"".join(self._piece_of(int(t)) for t in ids)
        if raw[:1] == b" " and ids and ids[0] == self._bos:
            raw = raw[1:]
        return raw.decode("utf-8", errors="replace")

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

        fmt = self._chat_formatter
        if fmt is None:  # compiling the template costs more than rendering it: once per model
            fmt = self._chat_formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=piece("tokenizer.ggml.eos_token_id"),
                bos_token=piece("tokenizer.ggml.bos_token_id"),
            )
        try:
            return fmt(messages=[dict(m) for m in messages], tools=list(tools) if tools else None).prompt
        except Exception as exc:  # jinja2 raises TemplateError (and the template's own raise_exception)
            raise BackendError(f"the chat template refused these messages: {exc}") from exc

    # -- decoding -------------------------------------------------------------------------
    def _seq_note(self, seq: int) -> str:
        """Which sequence a message is about, where there is more than one."""
        return f" (sequence {seq})" if self.n_seq > 1 else ""

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq:
            raise BackendError(f"sequence {seq} is outside 0..{self.n_seq - 1}")

    def _check_parts(self, parts: Sequence[SeqDecode]) -> None:
        """Refuse, before anything is decoded, every part that cannot be decoded as asked."""
        if not parts:
            raise BackendError("nothing to decode: no parts")
        seen: set[int] = set()
        for part in parts:
            seq = part.seq
            self._check_seq(seq)
            if seq in seen:
                raise BackendError(f"sequence {seq} has more than one part in one decode")
            seen.add(seq)
            if part.want not in WANTS:
                raise BackendError(f"want must be 'all', 'last' or 'none', not {part.want!r}"
                                   f"{self._seq_note(seq)}")
            m = len(part.ids)
            if m == 0:
                raise BackendError(f"nothing to decode{self._seq_note(seq)}")
            cached = len(self._seq_ids[seq])
            if cached + m > self.n_ctx:
                raise BackendError(f"context full: {cached} cached + {m} new tokens > n_ctx {self.n_ctx}"
                                   f"{self._seq_note(seq)}")
            for t in part.ids:
                if not 0 <= int(t) < self.n_vocab:
                    raise BackendError(f"token id {t} is outside the vocabulary (0..{self.n_vocab - 1})"
                                       f"{self._seq_note(seq)}")

    def _chunks(self, parts: Sequence[SeqDecode]) -> list[list[tuple[int, int, int]]]:
        """The ``llama_decode`` calls for ``parts``: :func:`pack_forwards` of their lengths."""
        return pack_forwards([(p.seq, len(p.ids)) for p in parts], self.n_batch)

    def forward_sizes(self, parts: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
        """The token counts of the forwards llama.cpp computes for ``(seq, tokens)`` parts in
        increasing sequence order: each ``llama_decode`` call's ubatches (:func:`split_equal_sizes`
        with one KV stream per sequence, the whole call with one sequence). Remembered
        (:func:`forward_sizes_of`): the draft pricing asks up to nine times per sequence per step,
        for the few layouts a batch has."""
        return forward_sizes_of(parts, self.n_batch, self.n_seq > 1)

    def decode_many(self, parts: Sequence[SeqDecode]) -> list[list[int]]:
        """Decode every part at its sequence's next positions, in as few ``llama_decode`` calls as
        ``n_batch`` allows; what each part wanted, in order (see :class:`SeqDecode`).

        Everything is checked first, so a refused call decodes nothing; if ``llama_decode`` fails,
        every sequence is rolled back to where this call found it before the error is raised."""
        self._check_parts(parts)
        samplers = [None if p.sampler is None or p.sampler.argmax_only else p.sampler for p in parts]
        starts = [len(self._seq_ids[p.seq]) for p in parts]
        for part in parts:  # the sampler's penalties read the ids before each position
            self._seq_ids[part.seq].extend(int(t) for t in part.ids)
        results: list[list[int]] = [[] for _ in parts]
        stopped = [False] * len(parts)  # a sampler stopped at a rejected draft: later rows unread
        lib, tok, pos, out, slots, slot_seq = (self._lib, self._tok, self._pos, self._out,
                                               self._seq_slot, self._slot_seq)
        for chunk in self._chunks(parts):
            n = 0
            for k, lo, hi in chunk:
                part, c = parts[k], hi - lo
                seq = part.seq
                tok[n : n + c] = part.ids[lo:hi]
                pos[n : n + c] = np.arange(starts[k] + lo, starts[k] + hi)
                if part.want == "all":
                    out[n : n + c] = 1
                else:
                    out[n : n + c] = 0
                    if part.want == "last" and hi == len(part.ids):
                        out[n + c - 1] = 1
                for i in range(n, n + c):
                    if slot_seq[i] != seq:
                        slots[i][0] = slot_seq[i] = seq
                n += c
            self._batch.n_tokens = n
            rc = on_compute_thread(lib.llama_decode, self._ctx, self._batch)
            if rc != 0:
                for part, start in zip(parts, starts, strict=True):
                    lib.llama_memory_seq_rm(self._mem, part.seq, start, -1)
                    del self._seq_ids[part.seq][start:]
                first = min(starts[k] + lo for k, lo, _ in chunk)
                raise BackendError(f"llama_decode failed with code {rc} at position {first}"
                                   f"{self._seq_note(parts[chunk[0][0]].seq)}")
            n_out = int(out[:n].sum())
            if not n_out:
                continue
            rows_all = np.ctypeslib.as_array(lib.llama_get_logits(self._ctx), shape=(n_out, self.n_vocab))
            r = 0  # rows come in batch order, one per token whose logits were asked for
            for k, lo, hi in chunk:
                part = parts[k]
                n_rows = hi - lo if part.want == "all" else int(part.want == "last" and hi == len(part.ids))
                if not n_rows:
                    continue
                rows = rows_all[r : r + n_rows]
                r += n_rows
                first = starts[k] + hi - n_rows  # the position of the first row's token
                if self.record_logits:
                    self.recorded_seqs[part.seq].extend((first + i, rows[i].copy()) for i in range(n_rows))
                sampler = samplers[k]
                if sampler is None:
                    results[k].extend(int(t) for t in rows.argmax(axis=1))
                elif not stopped[k]:  # rows predict the positions after the tokens they were fed
                    ids = self._seq_ids[part.seq]
                    chosen = sampler.sample_rows(rows, ids, first + 1)
                    results[k].extend(chosen)
                    last = first + len(chosen)
                    stopped[k] = last < len(ids) and ids[last] != chosen[-1]
        return results

    def seq_tokens(self, seq: int) -> list[int]:
        self._check_seq(seq)
        return list(self._seq_ids[seq])

    def seq_rollback(self, seq: int, n_keep: int) -> None:
        self._check_seq(seq)
        ids = self._seq_ids[seq]
        if not 0 <= n_keep <= len(ids):
            raise BackendError(f"cannot roll back to {n_keep} with {len(ids)} cached{self._seq_note(seq)}")
        if n_keep < len(ids):
            if not self._lib.llama_memory_seq_rm(self._mem, seq, n_keep, -1):
                raise BackendError(f"llama_memory_seq_rm refused to drop positions {n_keep}.."
                                   f"{self._seq_note(seq)}")
            del ids[n_keep:]

    def seq_copy(self, src: int, dst: int, n_keep: int) -> None:
        """``dst`` holds ``src``'s first ``n_keep`` positions. Each sequence has a KV stream of its own,
        and llama.cpp copies between streams only whole (``llama_memory_seq_cp`` over every position:
        the cells now, the data at the start of the next ``llama_decode``, before anything is written),
        so the copy is whole and ``dst``'s positions from ``n_keep`` on are then dropped. Measured on the
        bundled model: a whole 2048-position stream copied in about a twentieth of the time 250 prompt
        tokens take to compute, its rows bit-identical to computed ones on the invariant build."""
        self._check_seq(src)
        self._check_seq(dst)
        ids = self._seq_ids[src]
        if src == dst or not 0 <= n_keep <= len(ids):
            raise BackendError(f"cannot copy {n_keep} positions of sequence {src} ({len(ids)} cached) "
                               f"to sequence {dst}")
        self._lib.llama_memory_seq_rm(self._mem, dst, -1, -1)
        self._lib.llama_memory_seq_cp(self._mem, src, dst, -1, -1)
        if n_keep < len(ids) and not self._lib.llama_memory_seq_rm(self._mem, dst, n_keep, -1):
            raise BackendError(f"llama_memory_seq_rm refused to drop positions {n_keep}.."
                               f"{self._seq_note(dst)}")
        self._seq_ids[dst] = list(ids[:n_keep])

    @property
    def n_past(self) -> int:
        """Positions sequence 0 holds (the single-sequence API's)."""
        return len(self._seq_ids[0])

    @property
    def tokens(self) -> list[int]:
        return list(self._seq_ids[0])

    def prefill(self, ids: Sequence[int], sampler: Sampler | None = None, keep: int = 0) -> int:
        check_keep(self._seq_ids[0], ids, keep)
        self.recorded.clear()
        self.seq_rollback(0, keep)
        return self.decode_many([SeqDecode(0, ids[keep:], "last", sampler)])[0][-1]

    def verify(self, ids: Sequence[int], sampler: Sampler | None = None) -> list[int]:
        return self.decode_many([SeqDecode(0, ids, "all", sampler)])[0]

    def rollback(self, n_keep: int) -> None:
        self.seq_rollback(0, n_keep)

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None) is not None:  # before the model it was made from
            self._lib.llama_free(self._ctx)
            self._ctx = None
        llama = getattr(self, "_llama", None)
        if llama is not None:
            llama.close()
            self._llama = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        with contextlib.suppress(Exception):
            self.close()
