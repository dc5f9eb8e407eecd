"""Atomic writes: an interrupted write leaves the old file and no temporary file behind."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from promptlookup.fileio import atomic_write, atomic_write_text


def test_interrupted_write_keeps_old_file(tmp_path):
    target = tmp_path / "cache.bin"
    target.write_bytes(b"old contents")

    def chunks():
        yield b"new "
        raise KeyboardInterrupt  # the process is interrupted half-way

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, chunks())
    assert target.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["cache.bin"]


def test_write_replaces_and_has_ordinary_permissions(tmp_path):
    target = tmp_path / "sub" / "curve.json"
    atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


# -- the one binary header rule -----------------------------------------------------------------
FP = "0123456789abcdef"


class _Err(ValueError):
    pass


def _rule(version: int = 3):
    from promptlookup.fileio import BinaryHeader

    return BinaryHeader(b"PLTESTXX", version, "test file", "QQ", 64, "rebuild it", _Err)


def test_header_layout_is_exact():
    import struct
    import zlib

    head = _rule().pack(7, "abcd", (11, 12), 0xDEADBEEF)
    want = struct.pack("<8sII16sQQI", b"PLTESTXX", 3, 7, b"abcd" + b"\0" * 12, 11, 12, 0xDEADBEEF)
    want += b"\0" * (60 - len(want))
    assert head == want + struct.pack("<I", zlib.crc32(want)) and len(head) == 64
    h = _rule().read(head + b"body", "f")
    assert (h.param, h.fingerprint, h.fields, h.body_crc) == (7, "abcd", (11, 12), 0xDEADBEEF)


def test_header_checks_in_order():
    import struct

    rule = _rule()
    good = rule.pack(1, FP, (0, 0), 0)
    with pytest.raises(_Err, match=r"^f: not a test file \(only 10 bytes, header is 64\)$"):
        rule.read(good[:10], "f")
    with pytest.raises(_Err, match=r"^f: not a test file: bad magic b'PLSTATIC' \(it is a promptlookup st"):
        rule.read(b"PLSTATIC" + good[8:], "f")
    with pytest.raises(_Err, match=r"^f: test file version 2 is not supported \(this reads 3\); rebuild it$"):
        rule.read(_rule(2).pack(1, FP, (0, 0), 0), "f")
    with pytest.raises(_Err, match=r"^f: test file version 4 is not supported \(this reads 3\)$"):
        rule.read(_rule(4).pack(1, FP, (0, 0), 0), "f")
    bad_crc = bytearray(good)
    struct.pack_into("<Q", bad_crc, 32, 5)  # a size changed, the header CRC not recomputed
    with pytest.raises(_Err, match="header is corrupt"):
        rule.read(bytes(bad_crc), "f")
    with pytest.raises(_Err, match="for another tokenizer: built for tokenizer 0123456789abcdef, "
                                   "this one is ff; rebuild it"):
        rule.read(good, "f", fingerprint="ff")
    assert rule.read(rule.pack(1, "", (0, 0), 0), "f").fingerprint == ""
    with pytest.raises(_Err, match="built for tokenizer \\(none\\)"):
        rule.read(rule.pack(1, "", (0, 0), 0), "f", fingerprint="ff")
    with pytest.raises(ValueError, match="at most 16"):
        rule.pack(1, "x" * 17, (0, 0), 0)


def test_header_body_check():
    import zlib

    from promptlookup.fileio import crc32_of

    rule = _rule()
    body = [b"abc", np.arange(5, dtype="<i4")]
    crc = crc32_of(body)
    assert crc == zlib.crc32(b"abc" + np.arange(5, dtype="<i4").tobytes())
    data = rule.pack(0, FP, (0, 0), crc) + b"abc" + np.arange(5, dtype="<i4").tobytes()
    rule.check_body(data, rule.read(data, "f").body_crc, "f")
    with pytest.raises(_Err, match="^f: test file body is corrupt"):
        rule.check_body(data[:-1] + b"\1", crc, "f")


def test_static_cache_header_bytes(tmp_path):
    """The static cache's header is the rule's, byte for byte the documented version-2 layout."""
    import struct
    import zlib

    from promptlookup.drafting.lookup.static_cache import build_static, write_static

    cache = build_static(np.array([1, 1, 2]), np.array([2, 2, 3]), np.array([3, 4, 5]), np.array([1, 2, 1]),
                         8, FP)
    write_static(tmp_path / "a.plc", cache)
    data = (tmp_path / "a.plc").read_bytes()
    head = struct.pack("<8sII16sQQQI", b"PLSTATIC", 2, 2, FP.encode(), 8, 2, 3, zlib.crc32(data[64:]))
    assert data[:64] == head + struct.pack("<I", zlib.crc32(head))


def test_corpus_index_header_bytes(tmp_path):
    import struct
    import zlib

    from promptlookup.drafting.suffix.corpus_index import build_suffix_array, write_index

    tokens = np.array([3, 1, 2, 1, 2], dtype=np.int32)
    size = write_index(tmp_path / "c.plsa", tokens, build_suffix_array(tokens, 4), 4, FP)
    data = (tmp_path / "c.plsa").read_bytes()
    b_off = 128 + 4 * 5 + 4  # tokens, then padding to 8
    head = struct.pack("<8sII16sQQQQQQI", b"PLSUFIDX", 1, 4, FP.encode(), 4, 5, 128, b_off, b_off + 8 * 5,
                       size, zlib.crc32(data[128:]))
    head += b"\0" * 40
    assert len(data) == size and data[:128] == head + struct.pack("<I", zlib.crc32(head))


def test_history_version_1_is_refused_with_what_to_do(tmp_path):
    import struct

    from promptlookup.drafting.suffix.history import History, HistoryFormatError

    h = History(fingerprint="abcd")
    h.add([1, 2, 3])
    h.save(tmp_path / "h.hist")
    old = bytearray((tmp_path / "h.hist").read_bytes())
    struct.pack_into("<I", old, 8, 1)  # what version 1 wrote: version 1, zeros where the header CRC is
    struct.pack_into("<I", old, 92, 0)
    (tmp_path / "old.hist").write_bytes(bytes(old))
    with pytest.raises(HistoryFormatError, match=r"history file version 1 is not supported \(this reads 2\); "
                                                 "delete it: the next run starts a new history"):
        History.load(tmp_path / "old.hist")
