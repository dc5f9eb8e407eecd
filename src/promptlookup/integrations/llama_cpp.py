"""llama-cpp-python drop-in: ``Llama(model_path=p, draft_model=PromptLookupDraftModel(model_path=p),
logits_all=True)``, or :func:`speculative_llama` that builds exactly that.

Why it fits their interface. ``Llama.generate`` calls its draft model with the whole confirmed token
history on every step (prompt, accepted drafts, the token it just sampled) and nothing else: no
feedback, no request boundary. It verifies the draft in one ``eval`` and rolls the KV cache back
itself. So this class keeps its source's state between calls by comparing the new history with the
last one it saw: a pure append (the usual step, and a chat turn that continues the conversation)
is ``extend`` of the new tokens, which costs microseconds; anything else is a new request:
``reset`` on the new history, which first commits the previous request to the source's in-memory
history (the suffix source's ``commit``). Nothing is written to disk unless :meth:`save` is
called. How many drafted tokens the model accepted is read off the next history (the drafted
tokens it kept), so :meth:`stats` counts acceptance although llama-cpp-python reports none, and
the time between two calls of one request is that step's verify: it is the step's feedback
(``DraftSource.feedback``), so ``auto`` learns the measured cost of each width here too.

The tokenizer and the cost curve. The draft model is built before the ``Llama``, and never sees it,
so files that are checked against the model's tokenizer (``history=FILE``, ``corpus=FILE``) need
``model_path=`` (the same GGUF; its vocabulary alone is loaded, no weights). Without files,
``n_vocab`` is enough; its default covers every common vocabulary, and a token beyond it is an error
that says so. The default source is ``auto``: with ``model_path=`` it starts from that model's
measured verify cost curve, without it from a steep prior
(:func:`~promptlookup.integrations.prior_cost_curve`); either way the measured time between calls
takes over for every width it uses.

``logits_all=True`` is part of the line. With a draft model, llama-cpp-python 0.3.36 keeps every
position's logits (it forces ``_logits_all``) but sizes its score buffer from the ``logits_all``
argument: with the default ``False`` the buffer has ``n_batch`` rows (512), and the first ``eval``
past that row dies with ``ValueError: could not broadcast input array ... into shape (0,)`` (their own
``LlamaPromptLookupDecoding`` too). So the documented line passes ``logits_all=True``, and
:func:`speculative_llama` builds the ``Llama`` that way. Where this class can see the mistake (its
caller is a ``Llama`` whose buffer is short of its context) it says so in one line on its first call,
instead of the crash a few hundred tokens later; a prompt longer than ``n_batch`` dies in
llama-cpp-python's prompt ``eval``, before any draft model is asked.

llama-cpp-python's server: its ``draft_model`` setting is a string that only switches on its own
``LlamaPromptLookupDecoding`` (server/model.py builds that class whatever the string says), so it
cannot load this class by import path; run the server from Python with a ``Llama`` built as above.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from promptlookup.drafting.base import StepFeedback
from promptlookup.drafting.spec import SourceSpec
from promptlookup.errors import UsageError
from promptlookup.integrations import DEFAULT_SOURCE, Drafter, build_spec, draft_length

try:  # the base class when llama-cpp-python is installed, so isinstance checks hold
    from llama_cpp.llama_speculative import LlamaDraftModel as _Base
except ImportError:  # pragma: no cover - the class still works as a plain callable
    _Base = object  # type: ignore[assignment,misc]

DEFAULT_PRED_TOKENS = 8  # auto's widest draft; it drafts that wide only where measured steps say it pays
DEFAULT_N_VOCAB = 1 << 18  # Llama 3 128256, Qwen 151936, Gemma 3 262144


def llama_cost_curve(model_path: str | os.PathLike[str], n_threads: int | None = None) -> Any:
    """The verify cost curve ``auto`` weighs drafts with: the CLI's cached curve for this model file
    and thread count, else measured once (about a second, through a second, mmap-shared load of
    the model) and cached for the next process."""
    from promptlookup.backends.costs import cached_cost_curve, curve_cache_path
    from promptlookup.backends.llama_cpp import LlamaCppBackend, default_threads
    from promptlookup.costcurve import CostCurve, CostCurveError

    threads = n_threads or default_threads()
    path = curve_cache_path(model_path, LlamaCppBackend.name, threads)
    if path.is_file():
        try:
            return CostCurve.load(path)
        except CostCurveError:
            pass  # measured again below
    backend = LlamaCppBackend(model_path, n_ctx=512, n_threads=threads)
    try:
        return cached_cost_curve(backend, refresh=True)
    finally:
        backend.close()


class PromptLookupDraftModel(_Base):  # type: ignore[misc,valid-type]
    """A ``LlamaDraftModel`` that drafts with any promptlookup source.

    ``source`` is a spec as in the CLI and bench (default ``"auto"``; ``"suffix"``, ``"ngram:min=2"``),
    ``num_pred_tokens`` the most tokens drafted per step (default 8, or the spec's ``draft=``),
    ``history`` a suffix history file (loaded now; written by :meth:`save`), ``corpus`` a corpus
    index (``promptlookup index``)."""

    def __init__(self, source: str | SourceSpec = DEFAULT_SOURCE, num_pred_tokens: int | None = None,
                 history: str | os.PathLike[str] | None = None, corpus: str | os.PathLike[str] | None = None,
                 *, model_path: str | os.PathLike[str] | None = None, n_vocab: int | None = None,
                 n_threads: int | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        spec = build_spec(source, None if history is None else str(history),
                          None if corpus is None else str(corpus))
        k = draft_length(spec, num_pred_tokens, DEFAULT_PRED_TOKENS)
        fingerprint = curve = None
        if model_path is not None:
            from promptlookup.build.tokenizers import VocabTokenizer

            vocab = VocabTokenizer(model_path)
            if n_vocab is not None and n_vocab != vocab.n_vocab:
                raise UsageError(f"n_vocab={n_vocab} disagrees with {model_path} ({vocab.n_vocab} tokens)")
            n_vocab = vocab.n_vocab
            fingerprint = vocab.fingerprint

            def curve() -> Any:
                return llama_cost_curve(model_path, n_threads)

        self.drafter = Drafter(spec, k, n_vocab or DEFAULT_N_VOCAB, fingerprint=fingerprint, cost_curve=curve)
        self.num_pred_tokens = k
        self._seen = np.zeros(4096, dtype=np.intc)  # the last history, to tell an append from a new request
        self._n = 0
        self._last_draft: tuple[int, ...] = ()
        self._left_at = 0.0  # when the previous call returned (on ``clock``)
        self._call_s = 0.0  # how long the previous call took
        self._clock = clock  # injected by tests, so that no verdict depends on the machine's load

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> np.ndarray:
        """The draft for the history ``input_ids`` (an empty array: no draft)."""
        entered = self._clock()
        ids = np.asarray(input_ids)
        if ids.ndim != 1:
            raise UsageError(f"a draft model takes one token history (1-D), got shape {ids.shape}")
        n, m = len(ids), self._n
        if n == 0:
            return np.zeros(0, dtype=np.intc)
        d = self.drafter
        append = 0 < m <= n and np.array_equal(ids[:m], self._seen[:m])
        if append:
            if self._last_draft:  # the drafted tokens the model kept open the new part of the history
                got = ids[m : m + len(self._last_draft)]
                same = got == np.asarray(self._last_draft[: len(got)], dtype=ids.dtype)
                d.accepted_tokens += len(got) if same.all() else int(np.argmin(same))
            if n > m:
                d.extend(ids[m:n].tolist())
                # Llama reports no times, but the gap since the last call is its verify of that
                # draft (and its sampling): auto learns what a width costs here from it.
                d.feedback(StepFeedback(fed=1 + len(self._last_draft), confirmed=n - m,
                                        verify_s=entered - self._left_at, draft_s=self._call_s))
        else:  # a new request (once per request, not per step: reading a frame's locals costs)
            _check_caller(sys._getframe(1))
            d.reset(ids.tolist())
        if n > len(self._seen):
            grown = np.zeros(max(2 * len(self._seen), n), dtype=np.intc)
            grown[:m] = self._seen[:m]
            self._seen = grown
        if append:
            self._seen[m:n] = ids[m:n]
        else:
            self._seen[:n] = ids
        self._n = n
        draft = d.propose(self.num_pred_tokens).tokens[: self.num_pred_tokens]
        self._last_draft = draft
        out = np.asarray(draft, dtype=np.intc)
        self._left_at = self._clock()
        self._call_s = self._left_at - entered
        return out

    def commit(self) -> None:
        """Add the current request to the source's in-memory history now (a new request does too)."""
        self.drafter.commit()

    def save(self) -> None:
        """Commit, then write what the source learned to its files (``history=``); call it at exit."""
        self.drafter.save()

    def stats(self) -> dict[str, float]:
        """Requests, calls, drafts, drafted and accepted tokens since construction."""
        return self.drafter.stats()


def _check_caller(frame: Any) -> None:
    """Refuse, in one line, a calling ``Llama`` whose score buffer cannot hold its context (built
    without ``logits_all=True``; see the module docstring)."""
    llama = frame.f_locals.get("self")
    scores, n_ctx = getattr(llama, "scores", None), getattr(llama, "_n_ctx", None)
    if not (type(llama).__module__.startswith("llama_cpp") and isinstance(scores, np.ndarray)
            and isinstance(n_ctx, int)):
        return
    if scores.shape[0] < n_ctx:
        raise UsageError(f"this Llama keeps logits for {scores.shape[0]} positions but its context "
                         f"holds {n_ctx}: with a draft model, build it with logits_all=True "
                         "(llama-cpp-python sizes that buffer from the argument), or use "
                         "promptlookup.integrations.llama_cpp.speculative_llama()")


def speculative_llama(model_path: str | os.PathLike[str] | None = None,
                      source: str | SourceSpec = DEFAULT_SOURCE, *, num_pred_tokens: int | None = None,
                      history: str | os.PathLike[str] | None = None,
                      corpus: str | os.PathLike[str] | None = None, **llama_kwargs: Any) -> Any:
    """A ``llama_cpp.Llama`` drafting with :class:`PromptLookupDraftModel`, built the way
    llama-cpp-python needs it for prompts and answers of any length (``logits_all=True``).

    ``model_path``: a GGUF path or a model name (``"qwen2.5-coder-0.5b"``: ``promptlookup models``),
    by default the bundled SmolLM2; ``source``, ``num_pred_tokens``, ``history`` and
    ``corpus`` go to the draft model (which reads the same GGUF's vocabulary and cost curve); every
    other keyword (``n_ctx``, ``n_threads``, ``verbose``, ...) goes to ``Llama``."""
    import llama_cpp

    from promptlookup.backends.models import resolve_model

    if llama_kwargs.get("logits_all", True) is not True:
        raise UsageError("logits_all=False breaks llama-cpp-python's draft-model path past n_batch "
                         "positions; leave it out")
    if "draft_model" in llama_kwargs:
        raise UsageError("speculative_llama builds the draft model itself: pass source= and its "
                         "settings instead of draft_model=")
    path = str(resolve_model(model_path))
    draft = PromptLookupDraftModel(source, num_pred_tokens, history, corpus, model_path=path,
                                   n_threads=llama_kwargs.get("n_threads"))
    return llama_cpp.Llama(model_path=path, draft_model=draft, **{**llama_kwargs, "logits_all": True})
