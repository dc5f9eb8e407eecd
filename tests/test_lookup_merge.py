"""Merge arithmetic: n-gram caches and cache files of both formats add their counts."""

from __future__ import annotations

import numpy as np

from promptlookup.drafting.lookup.cache import DictNgramCache, NgramCache
from promptlookup.drafting.lookup.llamacpp_file import (
    load_dynamic,
    merge_files,
    read_llamacpp,
    records_from_static,
    save_dynamic,
    write_llamacpp,
)
from promptlookup.drafting.lookup.static_cache import build_static, open_static, write_static

FP = "00112233445566aa"


def test_update_matches_llama_cpp_positions():
    c = NgramCache()
    c.update([5, 6, 5, 6, 7])
    assert c.get((5,)) == {6: 2} and c.get((6,)) == {5: 1, 7: 1}
    assert c.get((5, 6)) == {5: 1, 7: 1} and c.get((6, 5)) == {6: 1}
    assert c.get((5, 6, 5)) == {6: 1} and c.get((6, 5, 6)) == {7: 1}
    assert c.get((5, 6, 5, 6)) == {7: 1}
    assert len(c) == 7 and c.n_entries == 9
    # nnew: only n-grams whose follower is among the last nnew tokens
    d = NgramCache()
    d.update([5, 6, 5, 6], nnew=4)
    d.update([5, 6, 5, 6, 7], nnew=1)
    assert dict(d.items()) == dict(c.items())


def test_fast_and_dict_caches_agree_and_merge():
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 12, 2000).tolist()
    a, b = NgramCache(), DictNgramCache()
    a.update(seq[:1000]), b.update(seq[:1000])
    a2, b2 = NgramCache(), DictNgramCache()
    a2.update(seq[1000:]), b2.update(seq[1000:])
    a.merge(a2), b.merge(b2)
    assert dict(a.items()) == dict(b.items())
    a.add((3, 3), 3, 5)
    assert a.get((3, 3))[3] == b.get((3, 3)).get(3, 0) + 5


def test_merge_arithmetic_cache():
    a, b = NgramCache(), NgramCache()
    a.add((1, 2), 3, 4), a.add((1, 2), 5, 1), a.add((7,), 1, 2)
    b.add((1, 2), 3, 6), b.add((1, 2), 9, 2), b.add((8, 8, 8, 8), 1, 1)
    a.merge(b)
    assert a.get((1, 2)) == {3: 10, 5: 1, 9: 2}
    assert a.get((7,)) == {1: 2} and a.get((8, 8, 8, 8)) == {1: 1}
    assert b.get((1, 2)) == {3: 6, 9: 2}  # the source is unchanged


def test_merge_files_static_and_llamacpp(tmp_path):
    s1 = build_static([1, 1, 2], [2, 2, 3], [3, 4, 0], [5, 1, 2], 8, FP)
    s2 = build_static([1, 2], [2, 2], [3, 0], [2, 7], 8, FP)
    write_static(tmp_path / "a.plc", s1)
    write_llamacpp(tmp_path / "b.lcp", *records_from_static(s2))
    summary = merge_files([str(tmp_path / "a.plc"), str(tmp_path / "b.lcp")], str(tmp_path / "o.plc"), None)
    assert "2-grams" in summary
    out = open_static(tmp_path / "o.plc", fingerprint=FP)
    assert out.get((1, 2)) == {3: 7, 4: 1} and out.get((2, 3)) == {0: 2} and out.get((2, 2)) == {0: 7}
    assert out.key_total.tolist() == [8, 7, 2]
    out.close()
    merge_files([str(tmp_path / "b.lcp"), str(tmp_path / "a.plc")], str(tmp_path / "o.lcp"), None)
    keys, off, tok, cnt = read_llamacpp(tmp_path / "o.lcp")
    assert keys[:, :2].tolist() == [[1, 2], [2, 2], [2, 3]]
    assert tok.tolist() == [3, 4, 0, 0] and cnt.tolist() == [7, 1, 7, 2]


def test_merge_error_names_the_file_at_fault(tmp_path):
    """A static-format file first, then a llama.cpp file holding 3-grams: the error names the latter."""
    import pytest

    from promptlookup.drafting.lookup.static_cache import CacheFormatError

    write_static(tmp_path / "good.plc", build_static([1, 2], [2, 3], [3, 4], [1, 1], 8, FP))
    c = NgramCache()
    c.update([1, 2, 3, 4, 1, 2, 3, 5])  # 1..4-grams
    save_dynamic(tmp_path / "bad.lcp", c)
    with pytest.raises(CacheFormatError, match="bad.lcp: holds n-grams other than 2-grams") as exc:
        merge_files([str(tmp_path / "good.plc"), str(tmp_path / "bad.lcp")], str(tmp_path / "o.plc"),
                    "static")
    assert "good.plc" not in str(exc.value)


def test_dynamic_round_trip(tmp_path):
    c = NgramCache()
    c.update([4, 5, 6, 4, 5, 7])
    path = tmp_path / "dyn.lcp"
    save_dynamic(path, c)
    d = load_dynamic(path)
    assert dict(d.items()) == dict(c.items())
    assert len(load_dynamic(tmp_path / "missing.lcp")) == 0  # as llama.cpp: created at the end
