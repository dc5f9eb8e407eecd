"""An incremental suffix automaton with continuation counts: the index behind ``--suffix``.

Why a suffix automaton: it is built online, one token at a time, in amortized O(1) transitions
and at most ``2n`` states and ``3n`` transitions (linear memory, no path compression to get
right), and the longest earlier occurrence of the current context falls out of the construction
for free: after appending a token, the suffix link of the newest state is the longest suffix of
the text that occurred before. Walking a transition extends a match by one token, walking a
suffix link backs it off, so drafting several tokens ahead is the same streaming matcher fed the
hypothetical tokens.

Counts. The number of occurrences of a string is the size of its state's end-position set. Kept
exactly for every state would cost a walk to the root per token (quadratic on repetitive text),
so counts are kept only for states whose shortest string has at most ``depth`` tokens: a token
appended walks from the first such ancestor of the new state up to the root, at most ``depth``
states and on real text a handful. A state's "deep representative" (the first ancestor that keeps
counts) is found through a hint that is repaired lazily when a clone splits the state it points
to. With that, every count the drafter reads is the exact number of occurrences of an n-gram of
at most ``depth`` tokens.

Layout: flat int32/int64 numpy arrays, so the hot loops are numba functions and the whole
structure saves to a file as it is (see :mod:`promptlookup.drafting.suffix.history`). One state row is
``LEN, LINK, CNT, LAST, HINT, FIRST, OUTDEG`` (LAST: most recent end position, for recency
tie-breaks; FIRST: head of the state's transition list; OUTDEG: transitions other than the
separator). A transition is an edge row ``NEXT, TOK, TO`` plus a slot in an open-addressing hash
table keyed by ``(state, token)``. ``SEP`` (-1) separates documents: contexts never contain it, so
no match crosses a document boundary, and it is never drafted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

SEP = -1
DEFAULT_DEPTH = 32

# state columns
LEN, LINK, CNT, LAST, HINT, FIRST, OUTDEG = range(7)
N_STATE_COLS = 8
# edge columns
E_NEXT, E_TOK, E_TO = range(3)
# meta slots
M_STATES, M_EDGES, M_LASTSTATE, M_POS, M_DEPTH, M_GV, M_GM = range(7)  # GV, GM: a matcher's (v, m)
M_CORPUS = 8  # slots 8..10: a corpus match's (lo, hi, length) while drafting
N_META = 16


class AutomatonTables(NamedTuple):
    """:attr:`SuffixAutomaton.tables`: the arrays as one argument of a kernel outside this module.

    A NamedTuple, so a kernel reads ``local.st`` by name; numba resolves the field at compile time,
    as it did an index into a plain tuple, so the bundle costs nothing per call."""

    st: np.ndarray  # states x N_STATE_COLS (int32): LEN, LINK, CNT, LAST, HINT, FIRST, OUTDEG
    ed: np.ndarray  # edges x 3 (int32): E_NEXT, E_TOK, E_TO
    hk: np.ndarray  # the transition hash table's keys (int64, -1: empty)
    hv: np.ndarray  # ... and values: edge indices (int32)
    meta: np.ndarray  # N_META int64 slots: M_STATES, M_EDGES, M_LASTSTATE, M_POS, M_DEPTH, M_GV, M_GM...

_EMPTY = np.int64(-1)


@njit(cache=True, inline="always")
def _hkey(state, tok):
    return (np.int64(state) << 32) | (np.int64(tok) & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def _hslot(key, mask):
    h = np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)
    return np.int64(h >> np.uint64(20)) & mask


@njit(cache=True)
def _find_edge(hk, hv, state, tok):
    """Edge index of the transition ``(state, tok)``, or -1."""
    mask = len(hk) - 1
    key = _hkey(state, tok)
    i = _hslot(key, mask)
    while True:
        k = hk[i]
        if k == key:
            return hv[i]
        if k == -1:
            return -1
        i = (i + 1) & mask


@njit(cache=True)
def _hash_put(hk, hv, key, edge):
    mask = len(hk) - 1
    i = _hslot(key, mask)
    while hk[i] != -1 and hk[i] != key:
        i = (i + 1) & mask
    hk[i] = key
    hv[i] = edge


@njit(cache=True)
def _add_edge(st, ed, hk, hv, meta, state, tok, to):
    e = meta[M_EDGES]
    meta[M_EDGES] = e + 1
    ed[e, E_NEXT] = st[state, FIRST]
    ed[e, E_TOK] = tok
    ed[e, E_TO] = to
    st[state, FIRST] = e
    if tok != SEP:
        st[state, OUTDEG] += 1
    _hash_put(hk, hv, _hkey(state, tok), e)


@njit(cache=True)
def _rehash(hk, hv, st, ed, n_states):
    hk[:] = -1
    for s in range(n_states):
        e = st[s, FIRST]
        while e >= 0:
            _hash_put(hk, hv, _hkey(s, ed[e, E_TOK]), e)
            e = ed[e, E_NEXT]


@njit(cache=True, inline="always")
def _keeps_counts(st, s, depth):
    # the root keeps counts; any other state when its shortest string has <= depth tokens
    return s == 0 or st[st[s, LINK], LEN] < depth


@njit(cache=True)
def deep_rep(st, s, depth):
    """The first ancestor of ``s`` (itself included) whose counts are kept."""
    if _keeps_counts(st, s, depth):
        return s
    h = st[s, HINT]
    while not _keeps_counts(st, h, depth):  # the hint went stale when a clone split it
        h = st[h, LINK]
    st[s, HINT] = h
    return h


@njit(cache=True)
def _new_state(st, meta, length):
    s = meta[M_STATES]
    meta[M_STATES] = s + 1
    st[s, LEN] = length
    st[s, LINK] = -1
    st[s, CNT] = 0
    st[s, LAST] = -1
    st[s, HINT] = s
    st[s, FIRST] = -1
    st[s, OUTDEG] = 0
    return s


@njit(cache=True)
def _append(st, ed, hk, hv, meta, tok):
    depth = meta[M_DEPTH]
    last = meta[M_LASTSTATE]
    pos = meta[M_POS]
    cur = _new_state(st, meta, st[last, LEN] + 1)
    p = last
    while p != -1:
        if _find_edge(hk, hv, p, tok) >= 0:
            break
        _add_edge(st, ed, hk, hv, meta, p, tok, cur)
        p = st[p, LINK]
    if p == -1:
        st[cur, LINK] = 0
    else:
        q = ed[_find_edge(hk, hv, p, tok), E_TO]
        if st[p, LEN] + 1 == st[q, LEN]:
            st[cur, LINK] = q
        else:
            clone = _new_state(st, meta, st[p, LEN] + 1)
            st[clone, LINK] = st[q, LINK]
            st[clone, CNT] = st[q, CNT]
            st[clone, LAST] = st[q, LAST]
            st[clone, HINT] = st[q, HINT]
            # copy q's transitions in list order (so enumeration order is reproducible)
            e = st[q, FIRST]
            n_copy = 0
            while e >= 0:
                n_copy += 1
                e = ed[e, E_NEXT]
            buf_t = np.empty(n_copy, np.int32)
            buf_to = np.empty(n_copy, np.int32)
            e = st[q, FIRST]
            i = 0
            while e >= 0:
                buf_t[i] = ed[e, E_TOK]
                buf_to[i] = ed[e, E_TO]
                i += 1
                e = ed[e, E_NEXT]
            for j in range(n_copy - 1, -1, -1):
                _add_edge(st, ed, hk, hv, meta, clone, buf_t[j], buf_to[j])
            while p != -1:
                e = _find_edge(hk, hv, p, tok)
                if e < 0 or ed[e, E_TO] != q:
                    break
                ed[e, E_TO] = clone
                p = st[p, LINK]
            st[q, LINK] = clone
            st[cur, LINK] = clone
            if _keeps_counts(st, clone, depth):
                st[clone, HINT] = clone
    if not _keeps_counts(st, cur, depth):
        st[cur, HINT] = deep_rep(st, st[cur, LINK], depth)
    meta[M_LASTSTATE] = cur
    u = deep_rep(st, cur, depth)
    while u != -1:
        st[u, CNT] += 1
        st[u, LAST] = pos
        u = st[u, LINK]
    meta[M_POS] = pos + 1


@njit(cache=True)
def extend_tokens(st, ed, hk, hv, meta, tokens):
    for i in range(len(tokens)):
        _append(st, ed, hk, hv, meta, tokens[i])


@njit(cache=True)
def match_step(st, hk, hv, ed, v, m, tok):
    """Streaming matcher: from state ``v`` matching ``m`` tokens, feed ``tok``; new ``(v, m)``."""
    if tok == SEP:
        return 0, 0
    while True:
        e = _find_edge(hk, hv, v, tok)
        if e >= 0:
            return ed[e, E_TO], m + 1
        if v == 0:
            return 0, 0
        v = st[v, LINK]
        m = st[v, LEN]


class SuffixAutomaton:
    """A growable suffix automaton over int token ids, with depth-capped occurrence counts.

    ``extend`` appends tokens (use :data:`SEP` between documents); the numba kernels in this module
    and in :mod:`promptlookup.drafting.suffix.source` read the arrays directly.
    """

    def __init__(self, depth: int = DEFAULT_DEPTH, capacity: int = 1024) -> None:
        if depth < 1:
            raise ValueError(f"suffix depth must be at least 1, got {depth}")
        self.depth = depth
        self.meta = np.zeros(N_META, dtype=np.int64)
        self.meta[M_DEPTH] = depth
        self._alloc(max(capacity, 16))
        self.clear()

    def _alloc(self, cap_tokens: int) -> None:
        self.st = np.zeros((2 * cap_tokens + 2, N_STATE_COLS), dtype=np.int32)
        self.ed = np.zeros((3 * cap_tokens + 8, 3), dtype=np.int32)
        hcap = 1 << int(np.ceil(np.log2(2 * len(self.ed))))
        self.hk = np.full(hcap, -1, dtype=np.int64)
        self.hv = np.zeros(hcap, dtype=np.int32)
        self.cap_tokens = cap_tokens
        # one bundle for the kernels: a new array means a new bundle, made only here
        self.tables = AutomatonTables(self.st, self.ed, self.hk, self.hv, self.meta)

    def clear(self) -> None:
        self.meta[M_STATES] = 0
        self.meta[M_EDGES] = 0
        self.meta[M_POS] = 0
        self.hk[:] = -1
        root = _new_state(self.st, self.meta, 0)
        self.meta[M_LASTSTATE] = root

    @property
    def n_tokens(self) -> int:
        return int(self.meta[M_POS])

    @property
    def n_states(self) -> int:
        return int(self.meta[M_STATES])

    @property
    def nbytes(self) -> int:
        return self.st.nbytes + self.ed.nbytes + self.hk.nbytes + self.hv.nbytes

    @property
    def bytes_in_use(self) -> int:
        """The bytes written so far: the states and edges made (their arrays are allocated ahead, twice
        what is used after a doubling, and untouched pages cost no memory) and the whole edge hash."""
        return (self.n_states * self.st.strides[0] + int(self.meta[M_EDGES]) * self.ed.strides[0]
                + self.hk.nbytes + self.hv.nbytes)

    def reserve(self, n_tokens: int) -> None:
        """Make room for ``n_tokens`` tokens in all (doubling, so appends stay amortized O(1))."""
        if n_tokens <= self.cap_tokens:
            return
        cap = max(n_tokens, 2 * self.cap_tokens)
        st, ed = self.st, self.ed
        ns, ne = self.n_states, int(self.meta[M_EDGES])
        self._alloc(cap)
        self.st[:ns] = st[:ns]
        self.ed[:ne] = ed[:ne]
        _rehash(self.hk, self.hv, self.st, self.ed, ns)

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        if len(arr) == 0:
            return
        self.reserve(self.n_tokens + len(arr))
        extend_tokens(self.st, self.ed, self.hk, self.hv, self.meta, arr)

    @property
    def last_state(self) -> int:
        return int(self.meta[M_LASTSTATE])

    def match_state(self) -> tuple[int, int]:
        """``(state, length)`` of the longest suffix of the text that also occurred earlier."""
        last = self.last_state
        if last == 0:
            return 0, 0
        link = int(self.st[last, LINK])
        return link, int(self.st[link, LEN])

    @classmethod
    def from_arrays(cls, depth: int, st: np.ndarray, ed: np.ndarray, meta: np.ndarray,
                    cap_tokens: int) -> SuffixAutomaton:
        """Rebuild the wrapper around saved arrays (the hash table is recomputed)."""
        self = cls.__new__(cls)
        self.depth = depth
        self.meta = meta.astype(np.int64).copy()
        self._alloc(max(cap_tokens, 16))
        ns, ne = int(self.meta[M_STATES]), int(self.meta[M_EDGES])
        self.st[:ns] = st[:ns]
        self.ed[:ne] = ed[:ne]
        _rehash(self.hk, self.hv, self.st, self.ed, ns)
        return self
