"""``promptlookup stats --source suffix --suffix-corpus FILE``: the replay with a corpus index.

Why its own entry: the corpus index is opened once (its open time is the replay's load time, as
the static cache's is for ``--lookup``) and shared by the one source the replay makes; the replay
protocol itself is :func:`promptlookup.replay.replay`, unchanged.
"""

from __future__ import annotations

import time

from promptlookup.replay import ReplayStats, read_text_tokens, replay


def run_stats_suffix(text: str, model_path: str, n_ctx: int, n_draft: int, corpus_path: str | None,
                     verify: bool = False) -> ReplayStats:
    """Replay ``text`` through ``--suffix`` (request + history + the corpus at ``corpus_path``)."""
    from promptlookup.corpus import VocabTokenizer
    from promptlookup.drafting.corpus_index import open_index
    from promptlookup.drafting.history import History
    from promptlookup.drafting.suffix_source import SuffixSource

    tok = VocabTokenizer(model_path)
    tokens, n_bad = read_text_tokens(text, tok)
    fingerprint = tok.fingerprint() if corpus_path else ""
    t0 = time.perf_counter()
    index = (open_index(corpus_path, fingerprint=fingerprint, n_vocab=tok.n_vocab, verify=verify)
             if corpus_path else None)
    t_load = time.perf_counter() - t0
    st = replay(tokens, n_ctx, n_draft,
                lambda: SuffixSource(history=History(), n_vocab=tok.n_vocab, corpus=index), t_load)
    st.n_invalid_utf8 = n_bad
    return st
