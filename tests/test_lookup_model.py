"""--lookup with the real tokenizer: fast == reference on real tokens, create, stats, generate."""

from __future__ import annotations

import glob
import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from promptlookup.cli import main
from promptlookup.drafting.lookup.cache import DictNgramCache, NgramCache
from promptlookup.drafting.lookup.source import draft_fast, draft_reference
from promptlookup.drafting.lookup.static_cache import build_static, open_static

pytestmark = pytest.mark.model
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def tok(vocab_tokenizer):
    return vocab_tokenizer


def stdlib_text(names: list[str]) -> bytes:
    return b"".join((STDLIB / n).read_bytes() for n in names)


def test_fast_and_reference_draft_the_same_on_real_tokens(tok):
    corpus = tok.tokenize(stdlib_text(["argparse.py", "dataclasses.py"]))
    earlier = tok.tokenize(stdlib_text(["enum.py"]))
    text = tok.tokenize(stdlib_text(["functools.py"]))[:3000].tolist()
    static = build_static(corpus[:-2], corpus[1:-1], corpus[2:], np.ones(len(corpus) - 2, np.int64),
                          tok.n_vocab, tok.fingerprint())
    dyn_f, dyn_r = NgramCache(), DictNgramCache()
    dyn_f.update(earlier), dyn_r.update(earlier.tolist())
    ctx_f, ctx_r = NgramCache(), DictNgramCache()
    drafted = 0
    for i in range(1, len(text)):
        ctx_f.update(text[: i + 1], nnew=1), ctx_r.update(text[: i + 1], nnew=1)
        if i % 3:
            continue
        want = draft_reference(text[: i + 1], 8, ctx_r, dyn_r, static)
        assert draft_fast(text[: i + 1], 8, ctx_f, dyn_f, static) == want, i
        drafted += len(want)
    assert drafted > 1000  # the comparison exercised real drafts


def test_blocks_tokenize_like_the_whole_text(tok):
    from promptlookup.build.create import iter_blocks

    paths = [str(STDLIB / n) for n in ("typing.py", "inspect.py", "textwrap.py")]
    whole = tok.tokenize(b"".join(Path(p).read_bytes() for p in paths))
    parts = [tok.tokenize(b, add_special=(i == 0)) for i, b in enumerate(iter_blocks(paths, block=20000))]
    assert len(parts) > 10
    assert np.concatenate(parts).tolist() == whole.tolist()


def test_fingerprint_matches_the_backend(tok, real_backend):
    assert tok.fingerprint() == real_backend.fingerprint()
    assert tok.n_vocab == real_backend.n_vocab


def test_create_then_stats_cli(tok, tmp_path, capsys):
    names = sorted(glob.glob(str(STDLIB / "email" / "*.py")))
    out = tmp_path / "email.plc"
    assert main(["create", "-f", *names, "-o", str(out), "--no-progress", "-t", "2"]) == 0
    cache = open_static(out, fingerprint=tok.fingerprint())
    whole = tok.tokenize(b"".join(Path(p).read_bytes() for p in names))
    want = build_static(whole[:-2], whole[1:-1], whole[2:], np.ones(len(whole) - 2, np.int64),
                        tok.n_vocab, tok.fingerprint())
    for name in ("first_off", "key_second", "key_draft", "key_total", "key_off", "fol_token", "fol_count"):
        assert np.array_equal(getattr(cache, name), getattr(want, name)), name
    cache.close()
    capsys.readouterr()
    text = str(STDLIB / "json" / "decoder.py")
    assert main(["stats", "-f", text, "--lookup-cache-static", str(out), "-c", "512", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["source"] == "lookup" and st["n_drafted"] > 0 and 0 < st["n_accept"] <= st["n_drafted"]
    assert main(["stats", "-f", text, "--source", "ngram", "-c", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "ngram"


def test_stats_refuses_a_cache_of_another_tokenizer(tok, tmp_path, capsys):
    path = tmp_path / "x.plc"
    from promptlookup.drafting.lookup.static_cache import write_static

    write_static(path, build_static([1], [2], [3], [1], tok.n_vocab, "ffffffffffffffff"))
    text = str(STDLIB / "json" / "decoder.py")
    assert main(["stats", "-f", text, "--lookup-cache-static", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another tokenizer" in err
    path.write_bytes(b"PLSTATIC" + b"\0" * 30)
    assert main(["stats", "-f", text, "--lookup-cache-static", str(path)]) == 2
    assert "header is 64" in capsys.readouterr().err


def test_generate_lookup_is_exact_and_saves_the_dynamic_cache(tmp_path, capsys, real_backend):
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef"
    dyn = tmp_path / "dyn.lcp"
    assert main(["generate", "-p", prompt, "-n", "24", "--json", "--speculate", "off"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["counters"]["source"] == "off" and plain["counters"]["drafted_tokens"] == 0
    assert main(["generate", "-p", prompt, "-n", "24", "--json", "--lookup",
                 "--lookup-cache-dynamic", str(dyn)]) == 0
    looked = json.loads(capsys.readouterr().out)
    assert looked["tokens"] == plain["tokens"]
    assert looked["counters"]["source"] == "lookup" and looked["counters"]["drafted_tokens"] > 0
    from promptlookup.drafting.lookup.llamacpp_file import load_dynamic

    assert len(load_dynamic(dyn)) > 20
    with pytest.raises(SystemExit):
        main(["generate", "-p", "x", "--ngram", "--lookup"])
    assert "not allowed with" in capsys.readouterr().err
