"""Named corpora: the .gitignore matcher, the tree walk, `promptlookup index DIR -o NAME` (exact counts
on a tiny tree), incremental update equal to a fresh build, the registry's leases, several corpora in
the suffix source, and the engine's output with corpora named equal to plain decoding."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_model

from promptlookup.corpora import gitignore
from promptlookup.corpora.registry import Corpora
from promptlookup.corpora.tree import (
    INDEX_FILE,
    MANIFEST_FILE,
    Skipped,
    build_corpus,
    check_name,
    open_corpus,
    walk,
)
from promptlookup.drafting.base import use_corpora
from promptlookup.drafting.suffix.corpus_index import (
    CorpusIndexError,
    build_suffix_array,
    open_index,
    write_index,
)
from promptlookup.drafting.suffix.source import SuffixSource
from promptlookup.errors import InputError, RequestError


# ----------------------------------------------------------------------------- .gitignore
@pytest.mark.parametrize(("pattern", "path", "is_dir", "expected"), [
    ("*.log", "a.log", False, True),
    ("*.log", "d/e/a.log", False, True),
    ("*.log", "a.logx", False, False),
    ("/build", "build", True, True),
    ("/build", "src/build", True, False),
    ("build/", "build", True, True),
    ("build/", "build", False, False),
    ("build/", "x/build", True, True),
    ("doc/*.txt", "doc/a.txt", False, True),
    ("doc/*.txt", "doc/sub/a.txt", False, False),
    ("doc/*.txt", "x/doc/a.txt", False, False),
    ("**/foo", "foo", False, True),
    ("**/foo", "a/b/foo", False, True),
    ("a/**/b", "a/b", False, True),
    ("a/**/b", "a/x/y/b", False, True),
    ("a/**/b", "c/a/x/b", False, False),
    ("abc/**", "abc/x/y", False, True),
    ("abc/**", "abc", True, False),
    ("\\#file", "#file", False, True),
    ("[abc].py", "a.py", False, True),
    ("[abc].py", "d.py", False, False),
    ("[!a].py", "b.py", False, True),
    ("[!a].py", "a.py", False, False),
    ("?.c", "x.c", False, True),
    ("?.c", "xy.c", False, False),
    ("foo  ", "foo", False, True),
    ("foo\\ ", "foo ", False, True),
    ("a*b", "a/b", False, False),
])
def test_gitignore_pattern(pattern: str, path: str, is_dir: bool, expected: bool) -> None:
    assert gitignore.ignored(gitignore.parse(pattern), path, is_dir) is expected


def test_gitignore_comments_negation_and_nesting() -> None:
    assert gitignore.parse("# comment\n\n   \n") == []
    rules = gitignore.parse("*.log\n!keep.log\n")
    got = [gitignore.ignored(rules, p, False) for p in ("a.log", "keep.log", "d/keep.log")]
    assert got == [True, False, False]
    rules += gitignore.parse("keep.log\n/x\n", "sub")  # sub/.gitignore: later, so it wins below sub
    assert gitignore.ignored(rules, "sub/keep.log", False) is True
    assert gitignore.ignored(rules, "keep.log", False) is False
    assert gitignore.ignored(rules, "sub/x", False) is True
    assert gitignore.ignored(rules, "x", False) is False


# ----------------------------------------------------------------------------- the tree
FILES = {
    ".gitignore": "build/\n*.log\n!keep.log\n",
    "a.py": "def add(a, b):\n    return a + b\n",
    "keep.log": "kept\n",
    "x.log": "dropped\n",
    "build/o.txt": "junk\n",
    "sub/.gitignore": "*.tmp\n",
    "sub/b.py": "x = 1\n",
    "sub/t.tmp": "temp\n",
    ".git/config": "[core]\n",
}


def make_tree(root: Path) -> Path:
    for rel, text in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / "sub" / "c.bin").write_bytes(b"bin\0ary")
    (root / "link.py").symlink_to(root / "a.py")
    return root


def test_walk_skips_ignored_git_and_links(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t")
    sk = Skipped()
    found = walk([root], skipped=sk)
    assert [str(f.path.relative_to(root)) for f in found] == [
        ".gitignore", "a.py", "keep.log", "sub/.gitignore", "sub/b.py", "sub/c.bin"]
    assert sk.as_dict() == {"ignored": 3, "binary": 0, "too_large": 0, "links": 1, "unreadable": 0}
    sk = Skipped()
    assert len(walk([root], max_file_bytes=6, skipped=sk)) == 3  # .gitignore(s) and a.py are longer
    assert sk.too_large == 3


def test_names() -> None:
    assert check_name("stdlib-3.11_x") == "stdlib-3.11_x"
    for bad in ("", "../x", "a/b", ".hidden", "x" * 65, "a b"):
        with pytest.raises(InputError, match="corpus name"):
            check_name(bad)


@pytest.mark.model
@requires_model
def test_index_cli_counts_and_incremental_update(tmp_path: Path, vocab_tokenizer, capsys) -> None:
    from promptlookup.cli import main

    root = make_tree(tmp_path / "t")
    out = tmp_path / "corp"
    assert main(["index", str(root), "-o", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "5 files (5 tokenized); skipped: 3 ignored, 1 binary, 0 too large, 1 links" in err
    m = json.loads((out / MANIFEST_FILE).read_text())
    assert [Path(f["path"]).relative_to(root).as_posix() for f in m["files"]] == [
        ".gitignore", "a.py", "keep.log", "sub/.gitignore", "sub/b.py"]
    expected = [vocab_tokenizer.tokenize((root / f).read_bytes(), add_special=False, parse_special=False)
                for f in (".gitignore", "a.py", "keep.log", "sub/.gitignore", "sub/b.py")]
    assert [f["tokens"] for f in m["files"]] == [len(t) for t in expected]
    idx, _ = open_corpus(out, fingerprint=vocab_tokenizer.fingerprint(), verify=True)
    assert idx.tokens.tolist() == np.concatenate(expected).tolist()
    assert idx.n_tokens == m["n_tokens"] == 35
    idx.close()

    # change one file, add one, remove one: an update tokenizes two, reuses three
    (root / "a.py").write_text("def add(a, b):\n    return b + a\n")
    os.utime(root / "a.py", ns=(1, 1))
    (root / "sub" / "new.md").write_text("# New\n")
    (root / "sub" / "b.py").unlink()
    assert main(["index", "--update", str(out), "--no-progress"]) == 0
    assert "5 files (2 tokenized, 3 reused from the old index, 1 gone)" in capsys.readouterr().err
    fresh = tmp_path / "fresh"
    assert main(["index", str(root), "-o", str(fresh), "--no-progress"]) == 0
    assert (out / INDEX_FILE).read_bytes() == (fresh / INDEX_FILE).read_bytes()
    old, new = (json.loads((d / MANIFEST_FILE).read_text()) for d in (out, fresh))
    assert old["files"] == new["files"] and old["n_tokens"] == new["n_tokens"]


@pytest.mark.model
@requires_model
def test_index_refusals(tmp_path: Path, vocab_tokenizer, capsys, monkeypatch) -> None:
    from promptlookup.cli import main

    monkeypatch.chdir(tmp_path)  # a relative -o lands here

    root = make_tree(tmp_path / "t")
    with pytest.raises(InputError, match="--max-memory 0 MiB"):
        build_corpus([root], tmp_path / "c", vocab_tokenizer, max_memory_mb=0)
    assert not (tmp_path / "c").exists()  # nothing written
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x").write_bytes(b"\0\1")
    with pytest.raises(InputError, match="no text to index"):
        build_corpus([tmp_path / "bin"], tmp_path / "c", vocab_tokenizer)
    assert main(["index", str(root), "-o", "sub/../named/", "--no-progress"]) == 0  # a path is a path
    assert (tmp_path / "named" / INDEX_FILE).is_file()
    assert main(["index", str(root), "-o", "no such name", "--no-progress"]) == 2
    assert "corpus name 'no such name'" in capsys.readouterr().err


@pytest.mark.model
@requires_model
def test_corrupt_corpus_is_refused(tmp_path: Path, vocab_tokenizer) -> None:
    out = tmp_path / "c"
    build_corpus([make_tree(tmp_path / "t")], out, vocab_tokenizer)
    m = json.loads((out / MANIFEST_FILE).read_text())
    m["index_crc"] ^= 1
    (out / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(CorpusIndexError, match="do not match"):
        open_corpus(out)
    (out / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(CorpusIndexError, match="not a usable corpus manifest"):
        open_corpus(out)
    with pytest.raises(CorpusIndexError, match="no corpus 'nope'"):
        open_corpus("nope", root=tmp_path)


# ----------------------------------------------------------------------------- several corpora, leases
def _index(path: Path, tokens: list[int], n_vocab: int = 32):
    t = np.array(tokens, dtype=np.int32)
    write_index(path, t, build_suffix_array(t, n_vocab), n_vocab, "")
    return open_index(path)


def test_source_drafts_from_the_corpora_it_is_given(tmp_path: Path) -> None:
    ctx = list(range(1, 9))
    a = _index(tmp_path / "a.plsa", [*ctx, 9, 10, 11, 12])
    b = _index(tmp_path / "b.plsa", [*ctx, 14, 14, 14, 14])
    longer = _index(tmp_path / "c.plsa", [0, *ctx, 15, 15, 15, 15])
    src = SuffixSource(n_vocab=32, record=False)
    cases = [(None, []), ([a], [9, 10, 11, 12]), ([b], [14, 14, 14, 14]), ([a, b], [9, 10, 11, 12]),
             ([b, a], [14, 14, 14, 14]), ([a, longer], [15, 15, 15, 15]), ([], [])]
    for corpora, draft in cases:
        use_corpora(src, corpora)
        src.reset([0, *ctx])
        assert list(src.propose(4).tokens) == draft, corpora
    with pytest.raises(InputError, match="beyond n_vocab"):
        src.use_corpora([_index(tmp_path / "big.plsa", [1, 2], n_vocab=64)])


def test_registry_leases_defer_a_remove(tmp_path: Path) -> None:
    _index(tmp_path / "one.plsa", [1, 2, 3, 4]).close()
    reg = Corpora(None, 32, root=tmp_path)
    reg.open(str(tmp_path / "one.plsa"), name="one")
    with pytest.raises(InputError, match="already loaded"):
        reg.open(str(tmp_path / "one.plsa"), name="one")
    with pytest.raises(RequestError, match="no corpus named 'two' \\(loaded: one\\)") as exc:
        reg.check(["two"])
    assert exc.value.param == "corpora"
    with reg.lease(["one"]) as (idx,):
        assert reg.remove("one") is False  # deferred: a request drafts from it
        assert idx.n_tokens == 4 and reg.names() == []
    assert idx.n_tokens == 0  # unmapped when the lease ended
    assert reg.check(None) == ()


# ----------------------------------------------------------------------------- the engine
@pytest.mark.model
@requires_model
def test_engine_output_with_corpora_equals_off(tmp_path: Path, real_backend) -> None:
    from promptlookup.api import Engine
    from promptlookup.build.tokenizers import open_tokenizer

    src = tmp_path / "src"
    src.mkdir()
    (src / "ops.py").write_text("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
                                "def mul(a, b):\n    return a * b\n")
    tok = open_tokenizer(real_backend.model_path)
    build_corpus([src], tmp_path / "corpora" / "ops", tok)
    build_corpus([Path(__file__).parent / "fakes.py"], tmp_path / "corpora" / "fakes", tok)
    engine = Engine.from_backend(real_backend, speculate="suffix", corpora=["ops"],
                                 corpus_dir=tmp_path / "corpora")
    engine.corpora.open("fakes")
    prompt = "# ops.py\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):"
    off = engine.generate(prompt, max_tokens=32, temperature=0, speculate="off")
    named = engine.generate(prompt, max_tokens=32, temperature=0)
    both = engine.generate(prompt, max_tokens=32, temperature=0, corpora=["fakes", "ops"])
    none = engine.generate(prompt, max_tokens=32, temperature=0, corpora=[])
    assert named.tokens == both.tokens == none.tokens == off.tokens
    assert named.counters.accepted_tokens > 0
    with pytest.raises(RequestError, match="no corpus named 'nope'"):
        engine.generate(prompt, max_tokens=4, corpora=["nope"])
    assert [c["name"] for c in engine.corpora.info()] == ["fakes", "ops"]
