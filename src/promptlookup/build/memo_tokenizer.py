"""llama.cpp's tokens for big texts at many times its speed: pre-tokenize ASCII ourselves, memoize pieces.

Why: ``promptlookup create`` spent ~70 % of its time in llama.cpp's tokenizer (about 3 MB/s per core;
most of it a ``std::regex`` over the whole text and one BPE per piece). Byte-level BPE works piece by
piece: the pre-tokenizer cuts the text into pieces and each piece is merged on its own. Code and
prose repeat their pieces endlessly (about 1 % of the pieces of 30 MB of Python are distinct), so:

1. Cut the text into pieces exactly as llama.cpp's pre-tokenizer does, in compiled code. Only the
   ``smollm`` family's rules (digits split off one by one, then the GPT-2 pattern as llama.cpp's own
   hand-written matcher runs it) are emulated, and only over ASCII. A line-like segment holding any
   non-ASCII byte stays whole: it is cut only at points where every pre-tokenizer ends a piece (a
   newline after printable ASCII), and llama.cpp tokenizes it as one piece of text.
2. Look each piece up in a hash table of pieces already seen (bytes compared, not just hashes).
3. Tokenize only the new pieces with llama.cpp, many per call: pieces are joined with a ``0`` digit,
   which the pre-tokenizer always isolates, so the output splits at the ``0`` token.

Blocks that contain the text of a special token (which ``parse_special`` would turn into one token)
go to llama.cpp whole. A probe text with the tricky cases is tokenized both ways when the tokenizer
opens; any difference (another vocabulary, another llama.cpp) turns the fast path off. The tokens
are llama.cpp's, bit for bit: tests compare both paths on real text and on random ASCII.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# llama.cpp's pre-tokenizers whose rules are {"\p{N}", GPT-2 pattern} (llama-vocab.cpp)
EMULATED_PRE = frozenset({"smollm", "starcoder", "refact", "codeshell", "command-r"})

SEP = b"0"
MEMO_ARENA_LIMIT = 256 << 20  # piece bytes kept before the memo starts over

# classes of ASCII code points as llama.cpp's unicode flags have them (unicode.cpp / unicode-data.cpp)
_OTHER, _LETTER, _NUMBER, _SPACE = 0, 1, 2, 3
_CLS = np.zeros(128, dtype=np.uint8)
for _c in range(128):
    if 65 <= _c <= 90 or 97 <= _c <= 122:
        _CLS[_c] = _LETTER
    elif 48 <= _c <= 57:
        _CLS[_c] = _NUMBER
    elif _c in (9, 10, 11, 12, 13, 32):
        _CLS[_c] = _SPACE

PROBE = (
    b"x = 12345 + y's  'll 're 've 'm 'd 'x ''s\n\n\tdef f(a,b):\n    return a  \n  \t \n"
    b"  12  a1b2 ' s \x00\x01\x7f ~~~ !!a\n\r\n\x0b\x0c end   \t\nfoo\t\tbar  \n9\n\n  \n"
    b"caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xc2\xa0x \xe4\xb8\xad\xe6\x96\x87 \xd9\xa3\n"
    b"x = 'don't' # \xf0\x9f\x98\x80\nlast line without newline"
)


@njit(cache=True, nogil=True)
def _hash(buf, a, b):
    h = np.uint64(14695981039346656037)
    for i in range(a, b):
        h = (h ^ np.uint64(buf[i])) * np.uint64(1099511628211)
    h ^= h >> np.uint64(29)
    return np.int64(h | np.uint64(1))


@njit(cache=True, nogil=True)
def _segment_end(buf, a, n):
    """End of the segment starting at ``a``: the next '\\n' after printable ASCII, or ``n``."""
    i = a + 1
    while i < n:
        if buf[i] == 10 and 0x21 <= buf[i - 1] <= 0x7E:
            return i
        i += 1
    return n


@njit(cache=True, nogil=True)
def _gpt2_next(buf, cls, pos, end):
    """End of the piece starting at ``pos`` in the range [., end): llama.cpp's custom GPT-2 matcher."""
    c = buf[pos]
    if c == 39 and pos + 1 < end:  # 's 't 'm 'd 're 've 'll
        d = buf[pos + 1]
        if d == 115 or d == 116 or d == 109 or d == 100:
            return pos + 2
        if pos + 2 < end:
            e = buf[pos + 2]
            if (d == 114 and e == 101) or (d == 118 and e == 101) or (d == 108 and e == 108):
                return pos + 3
    k = cls[c]
    p = pos
    if c == 32:
        p = pos + 1
        k = cls[buf[p]] if p < end else np.uint8(255)
    if k == 1 or k == 2 or k == 0:  # ?\p{L}+  ?\p{N}+  ?[^\s\p{L}\p{N}]+
        while p < end and cls[buf[p]] == k:
            p += 1
        return p
    n_ws = 0
    while pos + n_ws < end and cls[buf[pos + n_ws]] == 3:
        n_ws += 1
    if n_ws > 1 and pos + n_ws < end:  # \s+(?!\S)
        return pos + n_ws - 1
    return pos + max(n_ws, 1)  # \s+ (ASCII always matches something; never stall)


@njit(cache=True, nogil=True)
def _insert(h, buf, a, b, tab_h, tab_e, e_off, e_len, e_tok, e_ntok, arena, n_ent, n_arena):
    """Entry id of piece buf[a:b]; a new pending entry (e_ntok = -1) if unseen. -1 if no room."""
    mask = len(tab_h) - 1
    slot = h & mask
    ln = b - a
    while True:
        th = tab_h[slot]
        if th == 0:
            break
        if th == h:
            e = tab_e[slot]
            if e_len[e] == ln:
                o = e_off[e]
                same = True
                for i in range(ln):
                    if arena[o + i] != buf[a + i]:
                        same = False
                        break
                if same:
                    return e
        slot = (slot + 1) & mask
    if 2 * (n_ent[0] + 1) > len(tab_h) or n_ent[0] >= len(e_off) or n_arena[0] + ln > len(arena):
        return -1
    e = n_ent[0]
    n_ent[0] += 1
    tab_h[slot] = h
    tab_e[slot] = e
    o = n_arena[0]
    for i in range(ln):
        arena[o + i] = buf[a + i]
    n_arena[0] += ln
    e_off[e] = o
    e_len[e] = ln
    e_tok[e] = 0
    e_ntok[e] = -1
    return e


@njit(cache=True, nogil=True)
def _scan(buf, start, cls, tab_h, tab_e, e_off, e_len, e_tok, e_ntok, arena, n_ent, n_arena, out, n_out):
    """Pieces of buf[start:] as entry ids appended to ``out``; returns where it stopped (len(buf) when
    done, earlier when the memo is full: grow it and call again from there)."""
    n = len(buf)
    pos = start
    while pos < n:
        seg = _segment_end(buf, pos, n)
        ascii_only = True
        for i in range(pos, seg):
            if buf[i] >= 128:
                ascii_only = False
                break
        run = pos  # end of the digit-free run at pos, where llama.cpp's GPT-2 matcher works
        while pos < seg:
            if not ascii_only:  # one opaque piece: llama.cpp tokenizes the whole segment
                end = seg
            elif cls[buf[pos]] == 2:  # "\p{N}": every digit is its own piece
                end = pos + 1
            else:
                if run <= pos:
                    run = pos
                    while run < seg and cls[buf[run]] != 2:
                        run += 1
                end = _gpt2_next(buf, cls, pos, run)
            e = _insert(_hash(buf, pos, end), buf, pos, end, tab_h, tab_e, e_off, e_len, e_tok, e_ntok,
                        arena, n_ent, n_arena)
            if e < 0:
                return pos
            out[n_out[0]] = e
            n_out[0] += 1
            pos = end
    return n


@njit(cache=True, nogil=True)
def _emit(ids, n, e_tok, e_ntok, toks):
    total = 0
    for i in range(n):
        if e_ntok[ids[i]] < 0:
            raise RuntimeError("memo tokenizer: a piece was never tokenized")
        total += e_ntok[ids[i]]
    res = np.empty(total, dtype=np.int32)
    k = 0
    for i in range(n):
        e = ids[i]
        o = e_tok[e]
        for j in range(e_ntok[e]):
            res[k] = toks[o + j]
            k += 1
    return res


@njit(cache=True, nogil=True)
def _rehash(tab_h, tab_e, size):
    nh = np.zeros(size, dtype=np.int64)
    ne = np.zeros(size, dtype=np.int32)
    mask = size - 1
    for s in range(len(tab_h)):
        h = tab_h[s]
        if h != 0:
            t = h & mask
            while nh[t] != 0:
                t = (t + 1) & mask
            nh[t] = h
            ne[t] = tab_e[s]
    return nh, ne


def _grown(a: np.ndarray, need: int) -> np.ndarray:
    out = np.zeros(max(need, 2 * len(a)), dtype=a.dtype)
    out[: len(a)] = a
    return out


class MemoTokenizer:
    """``tokenize(data, add_special, parse_special)`` with exactly the tokens of ``base`` (a
    ``tokenizers.VocabTokenizer``), fast on texts that repeat their pieces. Falls back to ``base`` for
    vocabularies it does not emulate, for blocks holding special-token text, and if the probe fails."""

    def __init__(self, base) -> None:  # noqa: ANN001 (a VocabTokenizer; no import cycle)
        self.base = base
        self.n_vocab = base.n_vocab
        self.fast = False
        self.reason = ""
        meta = getattr(base, "metadata", {}) or {}
        if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") not in EMULATED_PRE:
            kind = f"{meta.get('tokenizer.ggml.model')}/{meta.get('tokenizer.ggml.pre')}"
            self.reason = f"pre-tokenizer {kind} is not emulated"
            return
        self._specials = [s for s in base.special_texts() if s]
        self._sep_tok = base.tokenize(SEP, add_special=False, parse_special=False)
        if len(self._sep_tok) != 1:
            self.reason = "the separator digit is not one token"
            return
        self._sep = int(self._sep_tok[0])
        plain = base.tokenize(b"a", add_special=False, parse_special=False).tolist()
        full = base.tokenize(b"a", add_special=True, parse_special=False).tolist()
        i = next((k for k in range(len(full) - len(plain) + 1) if full[k : k + len(plain)] == plain), None)
        if i is None:
            self.reason = "cannot locate the added special tokens"
            return
        self._prefix, self._suffix = full[:i], full[i + len(plain) :]
        self._reset_memo()
        self.fast = True
        probe_ok = all(
            np.array_equal(self.tokenize(p, add_special=s, parse_special=True),
                           base.tokenize(p, add_special=s, parse_special=True))
            for p in (PROBE, PROBE[7:], PROBE[:-5]) for s in (False, True)
        )
        if not probe_ok:
            self.fast, self.reason = False, "the probe text tokenized differently"
            self._reset_memo()

    def _reset_memo(self) -> None:
        self._tab_h = np.zeros(1 << 16, dtype=np.int64)
        self._tab_e = np.zeros(1 << 16, dtype=np.int32)
        self._e_off = np.zeros(1 << 15, dtype=np.int64)
        self._e_len = np.zeros(1 << 15, dtype=np.int64)
        self._e_tok = np.zeros(1 << 15, dtype=np.int64)
        self._e_ntok = np.zeros(1 << 15, dtype=np.int64)
        self._arena = np.zeros(1 << 20, dtype=np.uint8)
        self._toks = np.zeros(1 << 18, dtype=np.int32)
        self._n_ent = np.zeros(1, dtype=np.int64)
        self._n_arena = np.zeros(1, dtype=np.int64)
        self._n_toks = 0
        digits = bytes(range(48, 58))
        self._fill_pending(self._scan_block(digits)[1], digits_alone=True)

    # -- the memo ------------------------------------------------------------------------------
    def _scan_block(self, data: bytes) -> tuple[np.ndarray, range]:
        """Entry ids of the pieces of ``data`` and the ids of the pieces new here (pending)."""
        buf = np.frombuffer(data, dtype=np.uint8)
        out = np.empty(len(buf) + 1, dtype=np.int32)
        n_out = np.zeros(1, dtype=np.int64)
        first_new = int(self._n_ent[0])
        pos = 0
        while True:
            pos = _scan(buf, pos, _CLS, self._tab_h, self._tab_e, self._e_off, self._e_len, self._e_tok,
                        self._e_ntok, self._arena, self._n_ent, self._n_arena, out, n_out)
            if pos >= len(buf):
                break
            self._grow(_segment_end(buf, pos, len(buf)) - pos)
        return out[: n_out[0]], range(first_new, int(self._n_ent[0]))

    def _grow(self, piece_len: int) -> None:
        n = int(self._n_ent[0])
        if 2 * (n + 1) > len(self._tab_h):
            self._tab_h, self._tab_e = _rehash(self._tab_h, self._tab_e, 2 * len(self._tab_h))
        if n >= len(self._e_off):
            self._e_off, self._e_len = _grown(self._e_off, n + 1), _grown(self._e_len, n + 1)
            self._e_tok, self._e_ntok = _grown(self._e_tok, n + 1), _grown(self._e_ntok, n + 1)
        if int(self._n_arena[0]) + piece_len > len(self._arena):
            self._arena = _grown(self._arena, int(self._n_arena[0]) + piece_len)

    def _store(self, ents: np.ndarray, toks: np.ndarray, lens: np.ndarray) -> None:
        """Entries ``ents`` get consecutive runs of ``toks`` of lengths ``lens``."""
        need = self._n_toks + len(toks)
        if need > len(self._toks):
            self._toks = _grown(self._toks, need)
        self._toks[self._n_toks : need] = toks
        offs = np.empty(len(lens), dtype=np.int64)
        offs[0] = self._n_toks
        np.cumsum(lens[:-1], out=offs[1:])
        offs[1:] += self._n_toks
        self._e_tok[ents], self._e_ntok[ents] = offs, lens
        self._n_toks = need

    def _tokenize_alone(self, ents: list[int], text: bytes, rel: list[int], lens: list[int]) -> None:
        for e, o, n in zip(ents, rel, lens, strict=True):
            t = self.base.tokenize(text[o : o + n], add_special=False, parse_special=False)
            self._store(np.array([e]), t, np.array([len(t)], dtype=np.int64))

    def _fill_pending(self, pending: range, digits_alone: bool = False, batch_bytes: int = 1 << 20) -> None:
        """Tokenize the pending entries (made in one scan, so their bytes are one arena run) with
        llama.cpp, many pieces per call."""
        if not len(pending):
            return
        ents = list(pending)
        a0 = int(self._e_off[pending.start])
        rel = (self._e_off[pending.start : pending.stop] - a0).tolist()
        lens = self._e_len[pending.start : pending.stop].tolist()
        text = self._arena[a0 : rel[-1] + lens[-1] + a0].tobytes()
        if digits_alone:
            self._tokenize_alone(ents, text, rel, lens)
            return
        i = 0
        while i < len(ents):
            batch: list[int] = []
            parts: list[bytes] = []
            alone: list[int] = []
            size = 0
            while i < len(ents) and size < batch_bytes:
                p = text[rel[i] : rel[i] + lens[i]]
                if SEP in p:
                    alone.append(i)
                else:
                    batch.append(i)
                    parts.append(p)
                    size += lens[i] + 1
                i += 1
            parts.append(b"")
            joined = SEP.join(parts)
            toks = self.base.tokenize(joined, add_special=False, parse_special=False) if batch else None
            if toks is not None:
                cuts = np.flatnonzero(toks == self._sep)
                if len(cuts) == len(batch) and not any(s in joined for s in self._specials):
                    lens_t = np.diff(cuts, prepend=-1) - 1
                    self._store(np.asarray([ents[k] for k in batch]), toks[toks != self._sep], lens_t)
                else:  # never trust a split we cannot account for
                    alone.extend(batch)
            self._tokenize_alone([ents[k] for k in alone], text, [rel[k] for k in alone],
                                 [lens[k] for k in alone])

    # -- the interface -------------------------------------------------------------------------
    def _special_regions(self, data: bytes) -> list[tuple[int, int]]:
        """Merged [a, b) spans, each from a safe cut to a safe cut, covering every occurrence of a
        special token's text: llama.cpp tokenizes these spans, the memo the rest."""
        spans = []
        for sp in self._specials:
            i = data.find(sp)
            while i >= 0:
                spans.append((_cut_before(data, i), _cut_after(data, i + len(sp))))
                i = data.find(sp, i + 1)
        spans.sort()
        merged: list[tuple[int, int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        return merged

    def pieces(self, data: bytes) -> list[bytes]:
        """The pre-tokenizer pieces of ``data`` as this emulation cuts it (a segment with non-ASCII
        bytes is one piece); for tests and debugging."""
        ids, new = self._scan_block(data)
        self._fill_pending(new)  # an entry is never left pending
        return [self._arena[self._e_off[e] : self._e_off[e] + self._e_len[e]].tobytes() for e in ids]

    def _tokenize_plain(self, data: bytes) -> np.ndarray:
        if int(self._n_arena[0]) > MEMO_ARENA_LIMIT:
            self._reset_memo()
        ids, new = self._scan_block(data)
        self._fill_pending(new)
        return _emit(ids, len(ids), self._e_tok, self._e_ntok, self._toks)

    def tokenize(self, data: bytes, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        if not self.fast:
            return self.base.tokenize(data, add_special=add_special, parse_special=parse_special)
        parts = []
        pos = 0
        # user-defined tokens are matched even without parse_special: llama.cpp decides those spans
        for a, b in self._special_regions(data):
            if a > pos:
                parts.append(self._tokenize_plain(data[pos:a]))
            parts.append(self.base.tokenize(data[a:b], add_special=False, parse_special=parse_special))
            pos = b
        if pos < len(data) or not parts:
            parts.append(self._tokenize_plain(data[pos:]))
        if add_special:
            parts = [np.asarray(self._prefix, dtype=np.int32), *parts,
                     np.asarray(self._suffix, dtype=np.int32)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _printable(c: int) -> bool:
    return 0x21 <= c <= 0x7E


def _cut_before(data: bytes, i: int) -> int:
    """The last safe cut (a '\n' after printable ASCII) at or before ``i``; 0 if none."""
    while True:
        i = data.rfind(b"\n", 0, i + 1)
        if i <= 0:
            return 0
        if _printable(data[i - 1]):
            return i
        i -= 1


def _cut_after(data: bytes, i: int) -> int:
    """The first safe cut at or after ``i``; len(data) if none."""
    while True:
        i = data.find(b"\n", max(i, 1))
        if i < 0:
            return len(data)
        if _printable(data[i - 1]):
            return i
        i += 1
