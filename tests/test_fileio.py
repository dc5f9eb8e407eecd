"""Atomic writes: an interrupted write leaves the old file and no temporary file behind."""

from __future__ import annotations

import os
import stat

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
