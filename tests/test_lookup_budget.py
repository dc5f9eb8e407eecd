"""The lookup dynamic cache an engine keeps per slot has a budget: its counts are halved past it.

llama.cpp's dynamic cache lives for one run; an engine's slot keeps its source for the process's
life and merges every request into it, so without a bound it grows with every token served.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from promptlookup.drafting.base import learned_bytes
from promptlookup.drafting.lookup.cache import DictNgramCache, NgramCache
from promptlookup.drafting.lookup.source import LookupSource, draft_fast, draft_reference


def stdlib_requests(n: int, size: int = 1500) -> list[list[int]]:
    """``n`` requests of real text: the Python installation's sources as byte tokens."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:n]
    assert len(files) == n
    return [list(f.read_bytes()[:size]) for f in files]


def test_halve_keeps_halved_counts_and_forgets_what_reaches_zero():
    for cache in (NgramCache(), DictNgramCache()):
        cache.update([5, 6, 5, 6, 7])  # (5,) -> {6: 2}; the other 8 followers are seen once
        assert len(cache) == 7 and cache.n_entries == 9
        cache.halve()
        assert dict(cache.items()) == {(5,): {6: 1}}
        assert len(cache) == 1 and cache.n_entries == 1
        cache.halve()
        assert dict(cache.items()) == {} and len(cache) == 0 and cache.n_entries == 0


def test_halve_fast_and_reference_agree_on_real_text_and_draft_the_same():
    fast, ref = NgramCache(), DictNgramCache()
    for request in stdlib_requests(6):
        fast.update(request), ref.update(request)
    rounds = 0
    while len(ref):
        fast.halve(), ref.halve()
        rounds += 1
        assert dict(fast.items()) == dict(ref.items())
        assert (len(fast), fast.n_entries) == (len(ref), ref.n_entries)
        # the halved arrays (rebuilt in place) draft as the reference rule does over the same counts
        for tail in stdlib_requests(8)[6:]:
            for end in range(40, 1500, 97):
                seq = tail[:end]
                assert draft_fast(seq, 6, dynamic=fast) == draft_reference(seq, 6, dynamic=ref)
    assert rounds >= 3  # real text has counts far above 2: several halvings before it is empty


def test_bytes_in_use_counts_ngrams_entries_and_the_hash():
    cache = NgramCache()  # room for 1,024 n-grams: a hash of 2,048 int32 slots
    assert cache.bytes_in_use == 8192
    cache.update([5, 6, 5, 6, 7])
    assert cache.bytes_in_use == 36 * 7 + 16 * 9 + 8192 == 8588


@pytest.mark.parametrize("budget, entries", [(None, 9), (9, 9), (8, 1)])
def test_a_commit_past_the_budget_halves_down_to_three_quarters(budget, entries):
    source = LookupSource(budget=budget)
    source.reset([5, 6, 5, 6])
    source.extend([7])
    source.commit()
    assert source.dynamic.n_entries == entries  # 9 fits a budget of 9; over 8 it halves to 1 (<= 6)
    assert source.learned_bytes == source.dynamic.bytes_in_use


def test_the_budget_bounds_the_cache_over_many_varied_requests():
    budget = 4096
    bounded, unbounded = LookupSource(budget=budget), LookupSource()

    def allocated(source: LookupSource) -> int:
        return sum(a.nbytes for a in source.dynamic.tables if isinstance(a, np.ndarray))

    sizes = []
    for request in stdlib_requests(60):
        for source in (bounded, unbounded):
            source.reset(request)
            source.commit()
        assert bounded.dynamic.n_entries <= budget
        sizes.append((allocated(bounded), allocated(unbounded)))
    half, last = sizes[len(sizes) // 2], sizes[-1]
    assert last[0] == half[0]  # the bounded arrays stopped growing by the half-way request
    assert last[1] > half[1] and unbounded.dynamic.n_entries > 10 * budget  # the negative control
    assert bounded.dynamic.n_entries > budget // 4  # what was seen more than once stays


def test_a_budget_below_one_entry_is_refused():
    with pytest.raises(ValueError, match="at least 1 follower entry, got 0"):
        LookupSource(budget=0)


def test_learned_bytes_walks_the_sources_inside_a_source():
    a, b = LookupSource(), LookupSource()
    a.reset([1, 2, 1, 2, 3]), a.commit()
    b.reset([4, 5, 4, 5]), b.commit()
    layer = SimpleNamespace(inner=SimpleNamespace(sources=[a, SimpleNamespace(), b]))
    assert learned_bytes(layer) == a.dynamic.bytes_in_use + b.dynamic.bytes_in_use > 0
    assert learned_bytes(None) == 0 and learned_bytes(SimpleNamespace()) == 0


def test_sources_within_walks_depth_first_and_stops_where_told():
    from promptlookup.drafting.base import sources_within

    c, d = SimpleNamespace(name="c"), SimpleNamespace(name="d")
    b = SimpleNamespace(name="b", inner=d)
    a = SimpleNamespace(name="a", sources=[b, c])
    layer = SimpleNamespace(name="layer", inner=a)
    assert [s.name for s in sources_within(layer)] == ["layer", "a", "b", "d", "c"]
    assert [s.name for s in sources_within(layer, stop=lambda s: s.name == "b")] == ["layer", "a", "b", "c"]
    assert list(sources_within(None)) == []
