"""The default context: sized from the model's training context and the memory, said in one line."""

from __future__ import annotations

import pytest
from conftest import installed_model_path, requires_model

from promptlookup.backends.context_size import ContextChoice, choose_context, default_context

GiB, MiB = 2**30, 2**20
# (training context, KV-cache bytes a position) as the GGUFs say: SmolLM2-135M 30 layers x 3 KV heads
# x 64, Qwen2.5-Coder 0.5B 24 x 2 x 64, 1.5B 28 x 2 x 128 (2 for K and V, 2 bytes for F16)
SMOL = (8192, 2 * 30 * 3 * 64 * 2)
Q05 = (32768, 2 * 24 * 2 * 64 * 2)
Q15 = (32768, 2 * 28 * 2 * 128 * 2)


def line(*parts: str) -> str:
    return "".join(parts)


@pytest.mark.parametrize("model, available, n_ctx, n, text", [
    # one sequence, plenty of memory: the training context (capped at 32768)
    (SMOL, 24 * GiB, None, 8192,
     "context: 8192 tokens (the model's training context; KV cache 180 MiB of the 24.0 GiB available)"),
    (Q05, 24 * GiB, None, 32768,
     "context: 32768 tokens (the model's training context; KV cache 384 MiB of the 24.0 GiB available)"),
    (Q15, 24 * GiB, None, 32768,
     "context: 32768 tokens (the model's training context; KV cache 896 MiB of the 24.0 GiB available)"),
    ((131072, Q05[1]), 24 * GiB, None, 32768,
     line("context: 32768 tokens (the default's cap; the model was trained on 131072; KV cache 384 MiB ",
          "of the 24.0 GiB available)")),
    ((2048, Q05[1]), 24 * GiB, None, 2048,
     "context: 2048 tokens (the model's training context; KV cache 24 MiB of the 24.0 GiB available)"),
    # 1 GiB: a quarter (256 MiB) holds all of SmolLM2's 8192, 21760 of the 0.5B's, 9216 of the 1.5B's
    (SMOL, 1 * GiB, None, 8192,
     "context: 8192 tokens (the model's training context; KV cache 180 MiB of the 1.0 GiB available)"),
    (Q05, 1 * GiB, None, 21760,
     line("context: 21760 tokens, not 32768 tokens (the model's training context), to keep the KV cache ",
          "at 255 MiB, within a quarter of the 1.0 GiB of memory available")),
    (Q15, 1 * GiB, None, 9216,
     line("context: 9216 tokens, not 32768 tokens (the model's training context), to keep the KV cache ",
          "at 252 MiB, within a quarter of the 1.0 GiB of memory available")),
    # 256 MiB: never below 4096, even where that is more than the quarter
    (Q05, 256 * MiB, None, 5376,
     line("context: 5376 tokens, not 32768 tokens (the model's training context), to keep the KV cache ",
          "at 63 MiB, within a quarter of the 256 MiB of memory available")),
    (SMOL, 256 * MiB, None, 4096,
     line("context: 4096 tokens, not 8192 tokens (the model's training context): the least the default ",
          "takes, though its KV cache of 90 MiB takes more than a quarter of the 256 MiB of memory ",
          "available")),
    # unknowns: no memory figure (not Linux), no training context, no KV shape
    (Q05, None, None, 32768,
     line("context: 32768 tokens (the model's training context; KV cache 384 MiB; the memory available ",
          "is not known)")),
    ((None, Q05[1]), 24 * GiB, None, 4096,
     line("context: 4096 tokens (the model file does not give its training context; KV cache 48 MiB of ",
          "the 24.0 GiB available)")),
    ((32768, None), 24 * GiB, None, 32768, "context: 32768 tokens (the model's training context)"),
    # an explicit -c is kept as given, without a line (the load refuses it above the training context)
    (Q05, 1 * GiB, 40000, 40000, None),
    (SMOL, 24 * GiB, 512, 512, None),
])
def test_one_sequence(model, available, n_ctx, n, text):
    assert choose_context(*model, available, n_ctx=n_ctx) == ContextChoice(n, 1, text)


@pytest.mark.parametrize("model, available, n_ctx, parallel, n, slots, text", [
    # plenty: 16 slots of min(training context, 16384)
    (SMOL, 24 * GiB, None, None, 8192, 16,
     line("context: 8192 tokens x 16 slots (the model's training context; KV caches 2.8 GiB of the ",
          "24.0 GiB available)")),
    (Q05, 24 * GiB, None, None, 16384, 16,
     line("context: 16384 tokens x 16 slots (the default's per-slot cap; the model was trained on 32768; ",
          "KV caches 3.0 GiB of the 24.0 GiB available)")),
    # fewer slots first (13 x 448 MiB fit in 6 GiB) ...
    (Q15, 24 * GiB, None, None, 16384, 13,
     line("context: 16384 tokens x 13 slots, not 16 slots (the default's per-slot cap; the model was ",
          "trained on 32768), to keep the KV caches at 5.7 GiB, within a quarter of the 24.0 GiB of ",
          "memory available")),
    (Q05, 4 * GiB, None, None, 16384, 5,
     line("context: 16384 tokens x 5 slots, not 16 slots (the default's per-slot cap; the model was ",
          "trained on 32768), to keep the KV caches at 960 MiB, within a quarter of the 4.0 GiB of ",
          "memory available")),
    # ... down to 4, then less context ...
    (Q15, 4 * GiB, None, None, 9216, 4,
     line("context: 9216 tokens x 4 slots, not 16384 x 16 (the default's per-slot cap; the model was ",
          "trained on 32768), to keep the KV caches at 1008 MiB, within a quarter of the 4.0 GiB of ",
          "memory available")),
    # ... down to 4096, then fewer slots again, down to one
    (Q15, 1 * GiB, None, None, 4096, 2,
     line("context: 4096 tokens x 2 slots, not 16384 x 16 (the default's per-slot cap; the model was ",
          "trained on 32768), to keep the KV caches at 224 MiB, within a quarter of the 1.0 GiB of ",
          "memory available")),
    (Q15, 256 * MiB, None, None, 4096, 1,
     line("context: 4096 tokens x 1 slot, not 16384 x 16 (the default's per-slot cap; the model was ",
          "trained on 32768): the least the default takes, though its KV caches of 112 MiB take more ",
          "than a quarter of the 256 MiB of memory available")),
    (Q05, None, None, None, 16384, 16,
     line("context: 16384 tokens x 16 slots (the default's per-slot cap; the model was trained on 32768; ",
          "KV caches 3.0 GiB; the memory available is not known)")),
    # --parallel given: the context that fits beside it
    (Q15, 24 * GiB, None, 4, 16384, 4,
     line("context: 16384 tokens x 4 slots (the default's per-slot cap; the model was trained on 32768; ",
          "KV caches 1.8 GiB of the 24.0 GiB available)")),
    (Q15, 1 * GiB, None, 4, 4096, 4,
     line("context: 4096 tokens x 4 slots, not 16384 tokens (the default's per-slot cap; the model was ",
          "trained on 32768): the least the default takes, though its KV caches of 448 MiB take more ",
          "than a quarter of the 1.0 GiB of memory available")),
    # -c given: the slots that fit beside it (as --parallel was sized before)
    (Q15, 24 * GiB, 8192, None, 8192, 16, None),
    (Q15, 4 * GiB, 8192, None, 8192, 4,
     line("--parallel defaults to 4, not 16: the KV caches of 16 x 8192 positions would take 3.5 GiB, ",
          "more than 25% of the 4.0 GiB of memory available")),
    # both given: kept
    (Q15, 256 * MiB, 32768, 2, 32768, 2, None),
])
def test_server_slots(model, available, n_ctx, parallel, n, slots, text):
    choice = choose_context(*model, available, n_ctx=n_ctx, parallel=parallel, slots=True)
    assert choice == ContextChoice(n, slots, text)


@requires_model
def test_the_bundled_gguf_says_8192_positions_of_23040_bytes(monkeypatch):
    from promptlookup.backends import models

    path = models.bundled_model_path()
    assert models.gguf_numbers(path, (".context_length",)) == {"llama.context_length": 8192.0}
    assert models.kv_cache_estimate(path) == SMOL
    monkeypatch.setattr(models, "available_memory", lambda: 24 * GiB)
    assert default_context("llama.cpp", None) == ContextChoice(8192, 1, (
        "context: 8192 tokens (the model's training context; KV cache 180 MiB of the 24.0 GiB available)"))
    assert default_context("llama.cpp", None, n_ctx=1024) == ContextChoice(1024, 1, None)
    assert default_context("transformers", None) == ContextChoice(8192, 1, (
        "context: 8192 tokens (the model's training context; transformers grows its cache as it fills)"))


@pytest.mark.parametrize("name, expected", [("qwen2.5-coder-0.5b", Q05), ("qwen2.5-coder-1.5b", Q15)])
def test_the_qwen_ggufs_say_32768_positions(name, expected):
    from promptlookup.backends import models

    assert models.kv_cache_estimate(installed_model_path(name)) == expected


@requires_model
def test_a_bfcl_sized_prompt_fits_the_default_context():
    """A chat with BFCL's 32 tools is 4,484 tokens before its first turn: the old default of 4096
    refused it (a 400 through serve); the bundled model's default is its training context, 8192.
    (Generating one token after that prompt took 127 s on the shared 2-core machine, 2026-12-04:
    ``Engine(speculate="off", threads=2).generate(ids, max_tokens=1)``, which passed; so the test
    checks the engine's own refusal, not a prefill.)"""
    from promptlookup.api import Engine, RequestError
    from promptlookup.errors import check_prompt_fits

    engine = Engine(speculate="off", threads=1)
    try:
        assert (engine.n_ctx, engine.parallel) == (8192, 1)
        check_prompt_fits(4484, engine.n_ctx)
        with pytest.raises(RequestError, match="^the prompt is 4484 tokens but the context holds 4096: "):
            check_prompt_fits(4484, 4096)
    finally:
        engine.close()
