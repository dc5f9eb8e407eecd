"""The lookup-stats replay, pinned on a small fixed text for both draft sources."""

from __future__ import annotations

import pytest

from promptlookup.drafting.lookup.cache import DictNgramCache
from promptlookup.drafting.lookup.source import LookupSource, draft_reference
from promptlookup.drafting.ngram.source import NgramSource, ngram_draft_reference
from promptlookup.measure.replay import replay

TEXT = [1, 2, 3] * 5 + [1, 2]  # 17 tokens: two chunks of 8 replayed, one token left over


def test_lookup_replay_counts():
    # Worked by hand in the commit notes: chunk 1 drafts [1, 2] once (both accepted); chunk 2 drafts
    # [1, 2] from the dynamic cache (both accepted), then [1, 2] from the context (one fits the chunk).
    st = replay(TEXT, n_ctx=8, n_draft=2, source_factory=LookupSource)
    assert (st.n_chunks, st.n_predict, st.n_replayed) == (2, 16, 16)
    assert (st.n_drafted, st.n_accept) == (6, 5)
    assert st.accept == pytest.approx(5 / 6)


def test_no_whole_chunk_no_replay():
    st = replay(TEXT[:8], n_ctx=8, n_draft=3, source_factory=LookupSource)  # i_start + n_ctx < n_input
    assert (st.n_chunks, st.n_drafted, st.n_predict) == (0, 0, 8)


def plain_lookup_stats(tokens, n_ctx, n_draft, draft_fn, per_chunk_state):
    """lookup-stats.cpp transliterated with no caching of anything: the replay's reference."""
    n_drafted = n_accept = 0
    i_start = 0
    state = per_chunk_state()
    while i_start + n_ctx < len(tokens):
        chunk = tokens[i_start : i_start + n_ctx]
        out = [chunk[0]]
        while len(out) < n_ctx:
            draft = draft_fn(out, n_draft, state)
            n_drafted += len(draft)
            for tok in draft:
                if len(out) >= n_ctx or chunk[len(out)] != tok:
                    break
                n_accept += 1
                out.append(tok)
            if len(out) < n_ctx:
                out.append(chunk[len(out)])
        state["dynamic"].merge(_context_of(out))
        i_start += n_ctx
    return n_drafted, n_accept


def _context_of(seq):
    c = DictNgramCache()
    c.update(seq)
    return c


def _lookup_ref(out, k, state):
    return draft_reference(out, k, _context_of(out), state["dynamic"], None)


def _ngram_ref(out, k, state):
    return ngram_draft_reference(out, k)


@pytest.mark.parametrize(("n_ctx", "n_draft"), [(8, 2), (16, 3), (32, 8)])
def test_replay_matches_plain_transliteration(n_ctx, n_draft):
    import random

    rng = random.Random(n_ctx)
    text = []
    while len(text) < 300:
        text += rng.choice([[1, 2, 3, 4], [5, 6], [1, 2, 7], [rng.randrange(20)]])
    fresh = lambda: {"dynamic": DictNgramCache()}  # noqa: E731
    st = replay(text, n_ctx, n_draft, LookupSource)
    assert (st.n_drafted, st.n_accept) == plain_lookup_stats(text, n_ctx, n_draft, _lookup_ref, fresh)
    st = replay(text, n_ctx, n_draft, NgramSource)
    assert st.source == "ngram"
    assert (st.n_drafted, st.n_accept) == plain_lookup_stats(text, n_ctx, n_draft, _ngram_ref, fresh)


def test_ngram_replay_counts():
    st = replay(TEXT, n_ctx=8, n_draft=2, source_factory=NgramSource)
    assert (st.n_chunks, st.n_drafted, st.n_accept) == (2, 4, 4)
