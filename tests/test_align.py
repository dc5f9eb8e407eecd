"""The alignment source: following a copy through the writer's edits, exact drafts, exactness."""

from __future__ import annotations

import pytest
from fakes import FakeModel
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.backends.text import TextBackend
from promptlookup.drafting.align.source import MAX_ASTRAY, YOUNG, AlignSource
from promptlookup.drafting.auto.controller import AutoDrafter
from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.drafting.spec import Run, SourceSpec, build_source
from promptlookup.speculate import generate

NL, INDENT = 100, 101  # a line break and the next line's indentation, as a wrapped quote has them
SPACE_DOT, DOT = 50, 51  # " ." in the source, "." as the writer puts it


def _fed(prompt, written):
    s = AlignSource()
    s.reset(prompt)
    s.extend(written)
    return s


def test_no_alignment_drafts_nothing():
    s = _fed([1, 2, 3, 4, 5], [])
    assert s.propose(4).tokens == () and s.alignment is None
    s.extend([9, 9])  # nothing earlier ends like this
    assert s.propose(4).tokens == ()


def test_three_tokens_of_the_prompt_start_an_alignment_and_a_copy_is_followed():
    prompt = [7, 1, 2, 3, 4, 5, 6, 8, 9]
    s = _fed(prompt, [1, 2, 3])  # the most recent earlier "1 2 3" ends at index 4
    assert s.alignment == 4
    d = s.propose(3)
    assert d.tokens == (4, 5, 6) and d.source == "align" and d.match_len == 3
    s.extend([4, 5])
    assert s.propose(8).tokens == (6, 8, 9, 1, 2, 3, 4, 5)  # runs on into the copy itself
    assert s.propose(8).match_len == 5
    assert s.propose(0).tokens == ()


def test_the_most_recent_occurrence_starts_the_alignment():
    s = _fed([1, 2, 3, 10, 1, 2, 3, 20], [1, 2, 3])
    assert s.propose(1).tokens == (20,)


def test_a_token_that_continues_nothing_moves_the_alignment_where_the_last_tokens_occur():
    # A quote asked for by a question that gives its first words: the question's copy of them is
    # the most recent, and the answer parts from it where the document's copy goes on
    doc = [1, 2, 3, 4, 5, 6, 7, 8]
    question = [30, 1, 2, 3, 31, 32]
    s = _fed(doc + question, [1, 2, 3])
    assert s.alignment == len(doc) + 4 and s.propose(2).tokens == (31, 32)  # the question's
    s.extend([4])  # as the document goes on: "2 3 4" occurs there
    assert s.alignment == 4
    d = s.propose(3)
    assert d.tokens == (5, 6, 7) and d.match_len == 3
    # negative control: a token whose last three occur nowhere earlier keeps the alignment, in hope
    s = _fed(doc + question, [1, 2, 3])
    s.extend([40])
    assert s.alignment == len(doc) + 5 and s.propose(2).tokens == ()  # astray, not moved


def test_an_alignment_followed_long_stays_where_a_token_it_cannot_place_occurs_elsewhere():
    # followed YOUNG tokens and more, an odd token is more likely the writer's edit than a move
    copied = list(range(10, 10 + YOUNG + 2))
    elsewhere = [copied[-2], copied[-1], 99, 7]
    s = _fed(elsewhere + [5] + copied + [6, 8], copied)
    at = s.alignment
    assert s.propose(1).tokens == (6,) and s.propose(1).match_len >= YOUNG
    s.extend([99])  # "x y 99" occurs earlier, but the alignment holds on (unsure, no draft)
    assert s.alignment == at + 1 and s.propose(1).tokens == ()
    s.extend([8])  # the copy goes on: 99 is what this writer writes for 6
    assert s.written_for(6) == 99


def test_line_breaks_the_writer_drops_are_skipped_and_left_out_of_later_drafts():
    # the source wraps its lines (NL INDENT); the writer joins them
    source = [1, 2, 3, 4, NL, INDENT, 5, 6, 7, NL, INDENT, 8, 9]
    s = _fed(source, [1, 2, 3, 4])
    assert s.propose(4).tokens == (NL, INDENT, 5, 6)  # nothing learned yet
    s.extend([5])  # NL and INDENT skipped: dropped once, never kept
    assert s.alignment == 7
    assert s.propose(6).tokens == (6, 7, 8, 9, 1, 2)  # the next line break is left out
    assert s.propose(6).match_len == 5


def test_a_token_kept_more_often_than_dropped_stays_in_drafts():
    source = [1, 2, 3, NL, 4, 5, 6, NL, 7, 8, 9, NL, 10, 11, 12]
    s = _fed(source, [1, 2, 3, NL, 4, 5, 6, NL])  # NL kept twice
    s.extend([7, 8, 9, 10])  # then dropped once: 2 > 1, so drafts keep it
    assert s.alignment == 13
    assert s.propose(6).tokens == (11, 12, 1, 2, 3, NL)


def test_a_substitution_is_learned_when_the_next_token_continues_the_source():
    source = [1, 2, 3, SPACE_DOT, 4, 5, 6, SPACE_DOT, 7, 8]
    s = _fed(source, [1, 2, 3])
    assert s.propose(2).tokens == (SPACE_DOT, 4)
    s.extend([DOT])  # written in place of SPACE_DOT: not sure yet, so no draft
    assert s.propose(2).tokens == ()
    s.extend([4])  # the source goes on: DOT is what this writer writes for SPACE_DOT
    assert s.written_for(SPACE_DOT) == DOT
    assert s.propose(4).tokens == (5, 6, DOT, 7)
    s.extend([5, 6, DOT])  # the learned substitution is followed at once
    assert s.alignment == 8


def test_the_alignment_is_lost_after_too_many_tokens_that_continue_nothing():
    source = list(range(1, 40))
    s = _fed(source, [1, 2, 3])
    astray = [90 + i for i in range(MAX_ASTRAY)]
    s.extend(astray)
    assert s.alignment is not None  # still hoping the copy resumes
    s.extend([99])
    assert s.alignment is None
    s.extend([20, 21, 22])  # an earlier "20 21 22": a new alignment
    assert s.propose(2).tokens == (23, 24)


def test_reset_forgets_the_text_and_the_edits():
    source = [1, 2, 3, 4, NL, INDENT, 5, 6]
    s = _fed(source, [1, 2, 3, 4, 5])
    s.reset([1, 2, 3, 4, NL, 5, 6])
    s.extend([1, 2, 3, 4])
    assert s.propose(2).tokens == (NL, 5)


def test_spec_and_auto_weigh_it():
    run = Run(200, lambda: "fp", cost_curve=None)
    src = build_source(SourceSpec.parse("align"), run)
    assert isinstance(src, AlignSource)
    with pytest.raises(ValueError, match="draft"):
        SourceSpec.parse("align:draft=0").check()
    from promptlookup.drafting.auto.source import OPTIONS

    assert OPTIONS["sources"].default == "ngram+lookup+suffix+align"


@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(st.integers(0, 5), min_size=1, max_size=40), n=st.integers(1, 80),
       draft=st.integers(1, 8))
def test_align_is_exact(prompt, n, draft):
    expected = generate(FakeModel(n_vocab=6, window=2), prompt, n).tokens
    assert generate(FakeModel(n_vocab=6, window=2), prompt, n, source=AlignSource(),
                    draft=draft).tokens == expected
    curve = [1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4, 2.6]
    auto = AutoDrafter([NgramSource(min_match=1), AlignSource()], curve)
    assert generate(FakeModel(n_vocab=6, window=2), prompt, n, source=auto, draft=8).tokens == expected


def test_a_rewrapped_quote_is_drafted_in_few_steps():
    # The quote case end to end through the loop: the answer is the source's words without its line
    # breaks. After the first line end, every draft of 8 holds.
    words = list(range(1, 61))
    source = []
    for i, w in enumerate(words):
        source.append(w)
        if i % 6 == 5:
            source += [NL, INDENT]
    prompt = [200, *source, 201, 202]
    answer = words
    backend = TextBackend(prompt + answer)
    gen = generate(backend, prompt, len(answer), source=AlignSource(), draft=8)
    assert gen.tokens == answer
    # two plain steps until the answer's first three tokens anchor it; the first draft runs into the
    # first line end (3 of its 8 hold: NL, INDENT, 7, 8, 9 do not); from then on every draft holds
    assert backend.widths == [1, 1, 9, 9, 9, 9, 9, 9, 8]
    assert (gen.counters.drafted_tokens, gen.counters.accepted_tokens) == (55, 50)
