"""The shared building blocks of draft sources: the fast Draft builder and the token buffer."""

from __future__ import annotations

import numpy as np
import pytest

from promptlookup.drafting.base import Draft, TokenBuffer, make_draft


@pytest.mark.parametrize("args", [((), "off", 0, None), ((1, 2, 3), "ngram", 3, None),
                                  ((7,), "suffix", 2, {"count": 3.0, "prob": 0.5})])
def test_make_draft_equals_the_plain_draft(args):
    tokens, source, match_len, features = args
    fast = make_draft(tokens, source, match_len, features)
    plain = Draft(tokens=tokens, source=source, match_len=match_len, features=features or {})
    assert fast == plain and repr(fast) == repr(plain) and len(fast) == len(plain)
    assert fast.__dict__ == plain.__dict__ and list(fast.__dict__) == list(plain.__dict__)
    with pytest.raises(AttributeError):  # still frozen
        fast.tokens = ()  # type: ignore[misc]


def test_make_draft_features_are_not_shared():
    a, b = make_draft((), "x"), make_draft((), "x")
    assert a.features == {} and a.features is not b.features


def test_token_buffer_grows_and_keeps_tokens():
    buf = TokenBuffer(capacity=4)
    ref: list[int] = []
    rng = np.random.default_rng(0)
    for _ in range(200):
        chunk = [int(t) for t in rng.integers(0, 1000, size=int(rng.integers(0, 9)))]
        buf._append(chunk if len(chunk) != 3 else np.array(chunk, dtype=np.int64))
        ref += chunk
        assert buf.tokens.tolist() == ref
    buf._room(len(ref) + 50)
    assert len(buf._buf) >= len(ref) + 50 and buf.tokens.tolist() == ref
