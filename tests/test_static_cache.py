"""Our static cache format and llama.cpp's, byte for byte, plus fuzzing of both loaders."""

from __future__ import annotations

import contextlib
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptlookup.drafting.lookup.llamacpp_file import (
    pack_llamacpp,
    parse_llamacpp,
    read_llamacpp,
    records_from_static,
    static_from_records,
    write_llamacpp,
)
from promptlookup.drafting.lookup.static_cache import (
    CacheFormatError,
    build_static,
    check_structure,
    open_static,
    write_static,
)

FP = "00112233445566aa"
# triples (t0, t1, follower, count) over a 4-token vocabulary; (1, 2, 3) twice: counts add
TRIPLES = [(1, 2, 3, 2), (0, 1, 2, 1), (1, 2, 0, 1), (1, 2, 3, 1), (1, 0, 0, 4), (3, 3, 3, 1)]


def tiny():
    t0, t1, y, c = zip(*TRIPLES, strict=True)
    return build_static(t0, t1, y, c, 4, FP)


def expected_static_bytes() -> bytes:
    body = struct.pack(
        "<5I" "4i" "4i" "4I" "5I" "5i" "5I",
        0, 1, 3, 3, 4,  # first_off: t0=0 -> key 0; t0=1 -> keys 1,2; t0=2 -> none; t0=3 -> key 3
        1, 0, 2, 3,  # key_second: (0,1) (1,0) (1,2) (3,3)
        -1, 0, 3, -1,  # key_draft: totals 1 fail (< 2); (1,0) {0: 4} -> 0; (1,2) {0: 1, 3: 3} -> 3 (75 %)
        1, 4, 4, 1,  # key_total
        0, 1, 2, 4, 5,  # key_off
        2, 0, 0, 3, 3,  # fol_token
        1, 4, 1, 3, 1,  # fol_count
    )
    head = struct.pack("<8sII16sQQQI", b"PLSTATIC", 2, 2, FP.encode(), 4, 4, 5, zlib.crc32(body))
    return head + struct.pack("<I", zlib.crc32(head)) + body


def test_static_file_byte_for_byte(tmp_path):
    path = tmp_path / "c.plc"
    size = write_static(path, tiny())
    assert path.read_bytes() == expected_static_bytes()
    assert size == len(expected_static_bytes()) == 64 + 4 * 5 + 16 * 4 + 4 + 8 * 5
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file is gone


def test_static_lookups(tmp_path):
    path = tmp_path / "c.plc"
    write_static(path, tiny())
    c = open_static(path, fingerprint=FP)
    assert c.get((1, 2)) == {0: 1, 3: 3}
    assert c.get((1, 0)) == {0: 4}
    assert c.get((2, 2)) == {} and c.get((0, 0)) == {} and c.get((9, 1)) == {} and c.get((-1, 0)) == {}
    assert c.count(1, 2, 3) == 3 and c.count(1, 2, 1) == 0
    assert check_structure(c) is None
    c.close()


def test_static_lookups_at_the_ends(tmp_path):
    """The first and the last key, and keys missing below, between and above them (and beyond t0)."""
    c = tiny()
    assert c.key_index(0, 1) == 0 and c.key_index(3, 3) == 3  # first and last key
    assert c.key_index(0, 0) == -1 and c.key_index(0, 2) == -1  # below / above t0 = 0's only key
    assert c.key_index(1, 1) == -1 and c.key_index(1, 3) == -1  # between and above t0 = 1's keys
    assert c.key_index(2, 0) == -1  # a first token with no keys
    assert c.key_index(3, 2) == -1 and c.key_index(3, 0) == -1 and c.key_index(3, 4) == -1
    assert c.key_index(4, 0) == -1 and c.key_index(-1, 1) == -1  # outside the vocabulary
    assert c.count(3, 3, 3) == 1 and c.count(3, 3, 2) == 0 and c.count(0, 1, 2) == 1
    assert c.count(0, 1, 1) == 0 and c.count(0, 1, 3) == 0  # followers missing below / above


def test_fallback_drafts_exact():
    """key_draft: the most frequent follower (lowest id among equals) when the key's total is >= 2 and
    it holds >= 50 % of it, else -1."""
    keys = {
        (0, 0): {5: 1},  # total 1 < 2
        (0, 1): {5: 1, 6: 1},  # total 2, 50 %, tie: lowest id
        (0, 2): {6: 3, 2: 3},  # tie at 50 %: lowest id, whatever the insertion order
        (0, 3): {5: 2, 6: 2, 7: 1},  # 40 %
        (1, 0): {7: 2},  # one follower, total 2
        (1, 1): {4: 49, 5: 51},  # 51 %
        (1, 2): {4: 51, 5: 49, 6: 2},  # 51 / 102 = 50 %
        (1, 3): {4: 50, 5: 49, 6: 2},  # 50 / 101 < 50 %
    }
    t0, t1, y, n = [], [], [], []
    for (a, b), part in keys.items():
        for tok, cnt in part.items():
            t0.append(a), t1.append(b), y.append(tok), n.append(cnt)
    c = build_static(t0, t1, y, n, 8, FP)
    assert c.key_draft.tolist() == [-1, 5, 2, -1, 7, 5, 4, -1]
    assert c.key_total.tolist() == [1, 2, 6, 5, 2, 100, 102, 101]
    assert check_structure(c) is None


def test_wrong_fallback_draft_is_caught_by_verify(tmp_path):
    c = tiny()
    c.key_draft = c.key_draft.copy()
    c.key_draft[0] = 2  # key (0, 1) has total 1: it must not draft
    path = tmp_path / "c.plc"
    write_static(path, c)  # the CRC covers the wrong body: only the structure check can tell
    with pytest.raises(CacheFormatError, match="fall-back draft"):
        open_static(path, verify=True)


def test_version_1_file_is_refused_with_a_hint(tmp_path):
    data = bytearray(expected_static_bytes())
    data[8:12] = struct.pack("<I", 1)
    data[60:64] = struct.pack("<I", zlib.crc32(bytes(data[:60])))
    path = tmp_path / "old.plc"
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFormatError, match=r"version 1 is not supported \(this reads 2\); rebuild it "
                                               r"from its corpus with `promptlookup create`"):
        open_static(path)
    data[8:12] = struct.pack("<I", 3)  # a newer file: no hint to rebuild
    data[60:64] = struct.pack("<I", zlib.crc32(bytes(data[:60])))
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFormatError, match=r"version 3 is not supported \(this reads 2\)$"):
        open_static(path)


def test_fingerprint_refused(tmp_path):
    path = tmp_path / "c.plc"
    write_static(path, tiny())
    with pytest.raises(CacheFormatError, match="another tokenizer"):
        open_static(path, fingerprint="ffffffffffffffff")


def test_truncated_and_trailing(tmp_path):
    data = expected_static_bytes()
    path = tmp_path / "c.plc"
    path.write_bytes(data[:-1])
    with pytest.raises(CacheFormatError, match="truncated"):
        open_static(path)
    path.write_bytes(data + b"\0")
    with pytest.raises(CacheFormatError, match="trailing"):
        open_static(path)
    path.write_bytes(data[:10])
    with pytest.raises(CacheFormatError, match="header is 64"):
        open_static(path)


def test_llamacpp_file_byte_for_byte(tmp_path):
    keys, off, tok, cnt = records_from_static(tiny())
    data = pack_llamacpp(keys, off, tok, cnt)
    want = struct.pack(
        "<" + "4ii2i" + "4ii2i" + "4ii4i" + "4ii2i",
        0, 1, -1, -1, 1, 2, 1,
        1, 0, -1, -1, 1, 0, 4,
        1, 2, -1, -1, 2, 0, 1, 3, 3,
        3, 3, -1, -1, 1, 3, 1,
    )
    assert data == want
    path = tmp_path / "c.lcp"
    write_llamacpp(path, keys, off, tok, cnt)
    assert path.read_bytes() == want
    back = static_from_records(read_llamacpp(path, 4), 4, FP)
    assert write_static(tmp_path / "a", back) == write_static(tmp_path / "b", tiny())
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_llamacpp_reads_any_record_and_follower_order():
    rec_a = struct.pack("<4ii4i", 7, 8, 9, -1, 2, 5, 1, 3, 2)  # a 3-gram, followers unsorted
    rec_b = struct.pack("<4ii2i", 4, -1, -1, -1, 1, 6, 9)
    keys, off, tok, cnt = parse_llamacpp(rec_a + rec_b)
    assert keys.tolist() == [[7, 8, 9, -1], [4, -1, -1, -1]]
    assert off.tolist() == [0, 2, 3] and tok.tolist() == [3, 5, 6] and cnt.tolist() == [2, 1, 9]
    with pytest.raises(CacheFormatError, match="other than 2-grams"):
        static_from_records((keys, off, tok, cnt), 10, FP)


@pytest.mark.parametrize(("data", "message"), [
    (struct.pack("<4i", 1, 2, -1, -1), "truncated record header"),
    (struct.pack("<4ii", 1, 2, -1, -1, 0), "count of a record is not positive"),
    (struct.pack("<4ii2i", 1, 2, -1, -1, 2, 1, 1), "truncated follower list"),
    (struct.pack("<4ii2i", 1, 2, -1, -1, 1, 1, 0), "follower count is not positive"),
    (struct.pack("<4ii2i", 1, 2, -1, -1, 1, -3, 1), "negative follower token"),
    (struct.pack("<4ii2i", -1, 2, -1, -1, 1, 1, 1), "no tokens or a negative token"),
    (struct.pack("<4ii2i", 1, -1, 5, -1, 1, 1, 1), "padding"),
    (struct.pack("<4ii4i", 1, 2, -1, -1, 2, 1, 1, 1, 1), "duplicate follower"),
    (struct.pack("<4ii2i", 1, 2, -1, -1, 2**31 - 1, 1, 1), "truncated follower list"),
    (struct.pack("<4ii2i4ii2i", 1, 2, -1, -1, 1, 1, 1, 1, 2, -1, -1, 1, 3, 1), "appears twice"),
    (b"\x01\x02\x03", "whole number"),
])
def test_llamacpp_malformed(data, message):
    with pytest.raises(CacheFormatError, match=message):
        parse_llamacpp(data)


def test_llamacpp_vocabulary_checked():
    with pytest.raises(CacheFormatError, match="outside this model's vocabulary"):
        parse_llamacpp(struct.pack("<4ii2i", 1, 2, -1, -1, 1, 70000, 1), n_vocab=49152)


# -- fuzzing --------------------------------------------------------------------------------
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def mutate(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    b = bytearray(data[: max(0, len(data) - cut)] if cut else data)
    for pos, val in flips:
        if b:
            b[pos % len(b)] ^= val
    return bytes(b)


@FUZZ
@given(cut=st.integers(0, 200), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
                                              max_size=4))
def test_fuzz_static_loader(tmp_path, cut, flips):
    data = mutate(expected_static_bytes(), cut, flips)
    path = tmp_path / "f.plc"
    path.write_bytes(data)
    try:
        c = open_static(path, verify=True)
    except CacheFormatError:
        pass
    else:
        assert data == expected_static_bytes()  # a CRC lets nothing else through
        c.close()
    # unverified (header and size still checked): lookups stay in bounds whatever the body holds
    try:
        c = open_static(path, verify=False)
    except CacheFormatError:
        return
    for a in range(-1, 6):
        for b in range(-1, 6):
            c.get((a, b))
            c.count(a, b, 3)
    c.close()


@FUZZ
@given(cut=st.integers(0, 40), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
                                             max_size=4))
def test_fuzz_llamacpp_loader(cut, flips):
    good = pack_llamacpp(*records_from_static(tiny()))
    data = mutate(good, cut, flips)
    try:
        keys, off, tok, cnt = parse_llamacpp(data)
    except CacheFormatError:
        return
    assert off[0] == 0 and off[-1] == len(tok) == len(cnt) and np.all(np.diff(off) > 0)
    assert np.all(cnt > 0) and np.all(tok >= 0)


@given(st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_fuzz_llamacpp_random_bytes(data):
    with contextlib.suppress(CacheFormatError):
        parse_llamacpp(data)


def test_hostile_static_header_sizes(tmp_path):
    """A header claiming a huge body is refused by the exact-length check before anything is mapped."""
    head = struct.pack("<8sII16sQQQI", b"PLSTATIC", 2, 2, FP.encode(), 2**31 - 1, 2**32 - 1, 2**32 - 1, 0)
    path = tmp_path / "h.plc"
    path.write_bytes(head + struct.pack("<I", zlib.crc32(head)))
    with pytest.raises(CacheFormatError, match="truncated"):
        open_static(path)


def test_body_corruption_opens_fast_and_verify_refuses(tmp_path):
    """The default open checks the header only; the body check is verify_static's (and --verify's)."""
    from promptlookup.drafting.lookup.static_cache import verify_static

    data = bytearray(expected_static_bytes())
    data[-3] ^= 0x40  # a follower count
    path = tmp_path / "c.plc"
    path.write_bytes(bytes(data))
    c = open_static(path, fingerprint=FP)  # header, sizes, header CRC: all fine
    c.get((1, 2))
    c.close()
    with pytest.raises(CacheFormatError, match="checksum"):
        verify_static(path, fingerprint=FP)
    with pytest.raises(CacheFormatError, match="checksum"):
        open_static(path, verify=True)
