"""The llama.cpp backend on the bundled model: decoding, rollback, and the loop's invariants."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_model

from promptlookup.backends.base import BackendError
from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.speculate import generate

pytestmark = [requires_model, pytest.mark.model]

COPY_TEXT = (
    "def area(w, h):\n    return w * h\n\n"
    "def perimeter(w, h):\n    return 2 * (w + h)\n\n"
    "def volume(w, h, d):\n    return w * h * d\n"
)


def copy_prompt(backend) -> list[int]:
    text = f"{COPY_TEXT}\nRepeat the code above unchanged.\n\n{COPY_TEXT[:20]}"
    return backend.tokenize(text)


def test_rollback_then_redecode_gives_same_argmax(real_backend):
    b = real_backend
    ids = b.tokenize("The quick brown fox jumps over the lazy dog. The quick brown")
    first = b.prefill(ids)
    n0 = b.n_past
    a = b.verify([first, 11, 12, 13])
    assert b.n_past == n0 + 4
    b.rollback(n0 + 1)
    assert b.n_past == n0 + 1
    again = b.verify([11, 12, 13])
    assert again == a[1:]  # same positions, same tokens, same cached prefix


def test_every_emitted_token_is_the_argmax_of_its_logits(real_backend):
    b = real_backend
    b.record_logits = True
    try:
        prompt = copy_prompt(b)
        got = generate(b, prompt, 60, source=NgramSource(min_match=2), draft=4)
        last_row = {pos: row for pos, row in b.recorded}  # the last decode of each position wins
    finally:
        b.record_logits = False
        b.recorded.clear()
    assert got.counters.drafted_steps > 0 and got.counters.accepted_tokens > 0
    for j, tok in enumerate(got.tokens):
        row = last_row[len(prompt) + j - 1]
        assert tok == int(np.argmax(row)), f"token {j} is not the argmax of its position's logits"


def test_plain_decoding_never_widens_the_batch(real_backend):
    got = generate(real_backend, real_backend.tokenize("Once upon a time"), 12)
    c = got.counters
    assert c.decodes == 11 and c.drafted_steps == 0 and c.drafted_tokens == 0
    assert c.tokens_per_decode == pytest.approx(12 / 11)


def test_copy_prompt_speculation_accepts_drafts(real_backend):
    prompt = copy_prompt(real_backend)
    c = generate(real_backend, prompt, 64, source=NgramSource(), draft=3).counters
    assert c.accepted_tokens >= 10
    assert c.generated_tokens == 64 or c.decodes < 64


def test_unknown_token_id_is_refused(real_backend):
    with pytest.raises(BackendError, match="outside the vocabulary"):
        real_backend.prefill([1, real_backend.n_vocab + 5])
    with pytest.raises(BackendError, match="outside the vocabulary"):
        real_backend.detokenize([-1])


def test_detokenize_from_its_piece_table_equals_its_plain_twin_and_keeps_long_pieces(real_backend):
    """The fast detokenize (a table of pieces) gives its plain twin's text on real text, on every
    single token, on random ids (split characters, control tokens), with BOS's leading space rule;
    real code comes back whole, deep indentation included (llama-cpp-python's detokenize drops the
    pieces over 32 bytes: a newline and 32 spaces or more)."""
    b = real_backend
    source = "".join(Path(m.__file__).read_text(encoding="utf-8") for m in (json, textwrap))
    ids = b.tokenize(source, add_special=False)
    assert len(ids) > 5000
    assert b.detokenize(ids) == b.detokenize_reference(ids) == source
    for n in (1, 2, 3, 17, 640):
        assert b.detokenize(ids[:n]) == b.detokenize_reference(ids[:n])
    every = range(b.n_vocab)
    assert [b.detokenize([t]) for t in every] == [b.detokenize_reference([t]) for t in every]
    deep = "\n" + " " * 40 + "return x\n"
    assert b.detokenize(b.tokenize(deep, add_special=False)) == deep
    rng = np.random.default_rng(7)
    for _ in range(50):
        some = [int(t) for t in rng.integers(0, b.n_vocab, size=int(rng.integers(1, 40)))]
        assert b.detokenize(some) == b.detokenize_reference(some)
    bos = int(b.metadata["tokenizer.ggml.bos_token_id"])
    space = b.tokenize(" so", add_special=False)
    assert b.detokenize([bos, *space]) == "so" and b.detokenize(space) == " so"
    for seq in ([bos], [], [bos, bos, *space]):
        assert b.detokenize(seq) == b.detokenize_reference(seq)
    for bad in ([-1], [3, b.n_vocab], [b.n_vocab - 1, -2]):
        with pytest.raises(BackendError, match="outside the vocabulary"):
            b.detokenize(bad)


def test_chat_template_renders_the_user_turn(real_backend):
    text = real_backend.chat_prompt("hello there")
    assert "hello there" in text
    assert text.rstrip().endswith("assistant")
    ids = real_backend.tokenize(text, parse_special=True)
    assert len(ids) < len(real_backend.tokenize(text))  # special markers became single tokens


def test_tokenizer_round_trip_and_fingerprint(real_backend):
    text = "x = [i * 2 for i in range(10)]\n"
    assert real_backend.detokenize(real_backend.tokenize(text, add_special=False)) == text
    fp = real_backend.fingerprint()
    assert len(fp) == 16 and fp == real_backend.fingerprint()


def test_every_sampled_token_is_the_samplers_choice_on_its_logits(real_backend):
    """Under sampling with penalties, each emitted token is what the reference sampler picks from
    the last logits llama.cpp computed for its position, with the tokens before it as history; and
    the fast sampler agrees with the reference on real rows, for several settings."""
    from promptlookup.sampling import Sampler, SamplingParams, reference_sample

    b = real_backend
    params = SamplingParams(temp=0.8, top_p=0.95, repeat_penalty=1.1, presence_penalty=0.2,
                            frequency_penalty=0.1)
    b.record_logits = True
    prompt = copy_prompt(b)
    try:
        # the first seed whose sampled text takes drafts (which seed does depends on the build's
        # logits: the fast and the batch-invariant kernels round differently), so that tokens chosen
        # inside accepted drafts are among those checked
        for seed in range(7, 17):
            b.recorded.clear()
            got = generate(b, prompt, 60, source=NgramSource(min_match=2), draft=4,
                           sampler=Sampler(params, seed))
            if got.counters.accepted_tokens > 0:
                break
        last_row = {pos: row for pos, row in b.recorded}
    finally:
        b.record_logits = False
        b.recorded.clear()
    assert got.counters.drafted_steps > 0 and got.counters.accepted_tokens > 0
    seq = prompt + got.tokens
    for j, tok in enumerate(got.tokens):
        n = len(prompt) + j
        assert tok == reference_sample(last_row[n - 1], seq, n, params, seed), f"token {j}"
    settings = [SamplingParams(temp=1.0), SamplingParams(temp=1.5, top_k=0, top_p=0.9, min_p=0.0),
                SamplingParams(temp=0.7, top_k=5, min_p=0.2, repeat_penalty=1.3, repeat_last_n=-1),
                SamplingParams(temp=0.0, repeat_penalty=1.5)]
    for n in range(len(prompt), len(prompt) + 20, 2):
        for params in settings:
            for seed in (0, 1, 2**40):
                assert (Sampler(params, seed).sample(last_row[n - 1], seq, n)
                        == reference_sample(last_row[n - 1], seq, n, params, seed))


def test_the_same_seed_repeats_a_sampled_run(real_backend):
    from promptlookup.sampling import Sampler, SamplingParams

    params = SamplingParams(temp=0.9)
    prompt = copy_prompt(real_backend)
    runs = [generate(real_backend, prompt, 40, source=NgramSource(), draft=3,
                     sampler=Sampler(params, 11)).tokens for _ in range(2)]
    assert runs[0] == runs[1]
    other = generate(real_backend, prompt, 40, sampler=Sampler(SamplingParams(temp=1.5), 12)).tokens
    assert other != runs[0]  # and the sampler really samples


def test_flash_attention_is_on_by_default_only_where_the_build_keeps_rows_invariant_and_short():
    from promptlookup.backends.base import BackendError
    from promptlookup.backends.llama_cpp import flash_attention_default, one_path_flash_attention

    patched = "CPU : AVX2 = 1 | FMA = 1 | OPENMP = 1 | FA_ONE_PATH = 1 | "
    invariant = "CPU : AVX2 = 1 | FMA = 1 | OPENMP = 1 | "
    fast_patched = "CPU : AVX2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | FA_ONE_PATH = 1 | "
    assert [one_path_flash_attention(i) for i in (patched, invariant, fast_patched)] == [True, False, False]
    # set-up's build keeps the repack, patched (REPACK_ONE_ORDER): still invariant
    ours = ("CPU : AVX2 = 1 | OPENMP = 1 | REPACK = 1 | FA_ONE_PATH = 1 | MUL_MAT_COLS = 2 | "
            "REPACK_ONE_ORDER = 1 | ")
    assert one_path_flash_attention(ours) is True
    assert one_path_flash_attention(ours.replace("OPENMP = 1", "LLAMAFILE = 1")) is False
    assert flash_attention_default(patched, 512, {}) is True
    assert flash_attention_default(patched, 513, {}) is False  # past the bound: slower than without
    assert flash_attention_default(invariant, 512, {}) is False
    assert flash_attention_default(invariant, 4096, {"PROMPTLOOKUP_FLASH_ATTENTION": " ON "}) is True
    assert flash_attention_default(patched, 256, {"PROMPTLOOKUP_FLASH_ATTENTION": "off"}) is False
    assert flash_attention_default(patched, 256, {"PROMPTLOOKUP_FLASH_ATTENTION": "auto"}) is True
    assert flash_attention_default(patched, 256, {"PROMPTLOOKUP_FLASH_ATTENTION": ""}) is True
    with pytest.raises(BackendError) as err:
        flash_attention_default(patched, 256, {"PROMPTLOOKUP_FLASH_ATTENTION": "yes"})
    assert str(err.value) == "PROMPTLOOKUP_FLASH_ATTENTION='yes' is not one of auto, on, off"
