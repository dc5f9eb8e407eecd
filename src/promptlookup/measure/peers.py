"""Other projects' prompt lookup, run on our prompt ids and our model file, as peers in the bench.

Why: a speedup claim for our loop is only believable beside the engines' own implementations of the
same idea, measured in the same process on the same weights: llama-cpp-python's
``LlamaPromptLookupDecoding`` (a draft model for ``Llama.generate``) and transformers'
``generate(prompt_lookup_num_tokens=...)``. Each returns the generated ids (prompt excluded, an
end-of-generation token included, as in :func:`promptlookup.speculate.generate`), its wall time and
its rate, so the bench can also say whether a peer's output equals plain greedy.

Timing follows our own counters: ``prefill_s`` runs until the first new token exists, ``decode_s`` is
the rest, and ``tok/s`` is generated tokens over ``decode_s``. A setting of 0 draft tokens runs the
same engine's plain greedy path, the peer's own baseline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from promptlookup.backends.base import Model
from promptlookup.errors import InputError
from promptlookup.telemetry import Counters, ResourceProbe


@dataclass
class PeerRun:
    """One peer generation: new ids, time to the first of them, total wall time, forward calls."""

    name: str
    tokens: list[int]
    prefill_s: float
    wall_s: float
    decodes: int  # forward calls after the prompt's
    drafted: int = 0  # draft tokens the peer verified and, of them, accepted (where it reports them)
    accepted: int = 0

    @property
    def decode_s(self) -> float:
        return max(self.wall_s - self.prefill_s, 0.0)

    @property
    def tps(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else 0.0

    def counters(self, prompt_tokens: int) -> Counters:
        """The run in our counters (drafts where the peer reports them; coverage is unknown to us)."""
        return Counters(source=self.name, prompt_tokens=prompt_tokens, generated_tokens=len(self.tokens),
                        decodes=self.decodes, drafted_tokens=self.drafted, accepted_tokens=self.accepted,
                        prefill_s=self.prefill_s, decode_s=self.decode_s)


class LlamaCppPeer:
    """llama-cpp-python's own loop; ``num_pred_tokens > 0`` adds its ``LlamaPromptLookupDecoding``.

    One ``Llama`` serves every setting, so the plain baseline pays what the speculative runs pay:
    ``logits_all=True``, which the draft model needs (without it the score buffer holds ``n_batch``
    rows and a prompt past 512 tokens overflows it).
    """

    def __init__(self, model_path: str | os.PathLike[str], n_ctx: int = 4096, n_threads: int = 2) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self.model_path = Path(model_path)
        self.llama = llama_cpp.Llama(model_path=str(self.model_path), n_ctx=n_ctx, n_threads=n_threads,
                                     n_threads_batch=n_threads, logits_all=True, verbose=False)
        self._vocab = llama_cpp.llama_model_get_vocab(self.llama.model)

    def run(self, prompt: Sequence[int], max_tokens: int, num_pred_tokens: int,
            max_ngram_size: int = 2, draft_model: Any = None, name: str | None = None) -> PeerRun:
        """``draft_model`` (any ``LlamaDraftModel``, e.g. our drop-in) replaces the prompt lookup."""
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        llama = self.llama
        if draft_model is None and num_pred_tokens > 0:
            draft_model = LlamaPromptLookupDecoding(max_ngram_size=max_ngram_size,
                                                    num_pred_tokens=num_pred_tokens)
        llama.draft_model = draft_model
        llama.reset()  # n_tokens = 0: no KV prefix reuse from the previous run
        evals = 0
        original_eval = llama.eval

        def counting_eval(tokens: Sequence[int]) -> None:
            nonlocal evals
            evals += 1
            original_eval(tokens)

        llama.eval = counting_eval  # type: ignore[method-assign]
        out: list[int] = []
        first = 0.0
        t0 = time.perf_counter()
        try:
            for tok in llama.generate(list(prompt), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                      repeat_penalty=1.0):
                if not out:
                    first = time.perf_counter() - t0
                out.append(int(tok))
                if len(out) >= max_tokens or self._lib.llama_vocab_is_eog(self._vocab, int(tok)):
                    break
        finally:
            wall = time.perf_counter() - t0
            del llama.eval
        return PeerRun(name or f"llama-cpp-python pld {num_pred_tokens}", out, first, wall, max(evals - 1, 0))

    def close(self) -> None:
        self.llama.close()


class _FirstTokenTimer:
    """A transformers streamer that notes when the first generated token arrives."""

    def __init__(self) -> None:
        self.puts = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.puts += 1
        if self.puts == 2 and self.first is None:  # the first put is the prompt itself
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_prompt_lookup(model: Any, prompt: Sequence[int], max_tokens: int, num_tokens: int,
                     eos_token_ids: Sequence[int], max_ngram_size: int | None = None) -> PeerRun:
    """transformers' ``generate`` greedy; ``num_tokens > 0`` turns on its prompt lookup."""
    import torch

    calls = 0

    def count(*_: Any) -> None:
        nonlocal calls
        calls += 1

    extra: dict[str, Any] = {}
    if num_tokens > 0:
        extra["prompt_lookup_num_tokens"] = num_tokens
        if max_ngram_size:
            extra["max_matching_ngram_size"] = max_ngram_size
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    timer = _FirstTokenTimer()
    hook = model.register_forward_hook(count)
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=max_tokens, do_sample=False,
                                 temperature=None, top_p=None, top_k=None,
                                 eos_token_id=list(eos_token_ids), pad_token_id=int(eos_token_ids[0]),
                                 streamer=timer, **extra)
        wall = time.perf_counter() - t0
    finally:
        hook.remove()
    first = (timer.first - t0) if timer.first is not None else wall
    tokens = [int(t) for t in out[0, len(prompt):].tolist()]
    return PeerRun(f"transformers pld {num_tokens}", tokens, first, wall, max(calls - 1, 0))


def run_cell(peer: str, setting: int, backend: Model, prompt: Sequence[int], max_tokens: int,
             engines: dict[str, Any], earlier: Sequence[Sequence[int]] = (),
             llama_server: str | os.PathLike[str] | None = None) -> tuple[list[int], Counters, float]:
    """One bench cell: ``peer`` is ``llamacpp``, ``hf`` or ``llama-server``; engines are loaded once
    and kept in ``engines``.

    Returns the tokens, our counters for them, and the wall time. Peers reuse the bench backend's
    model when it is the same engine, and otherwise load the same model file themselves. ``earlier``
    requests of the workload go first where the peer keeps state between requests (llama-server,
    started fresh for each run from the ``llama_server`` program; ``setting`` 1 is its speculation).
    """
    probe = ResourceProbe()
    if peer == "llama-server":
        from promptlookup.measure.llama_server_peer import LlamaServerPeer

        if llama_server is None:
            raise InputError("a peer-ls cell needs llama.cpp's server program: give --llama-server PATH")
        t0 = time.perf_counter()
        answer = LlamaServerPeer(llama_server, _gguf_of(backend, "peer-ls"), backend.n_ctx, backend.n_threads,
                                 speculate=setting > 0).run([*earlier, prompt], max_tokens)
        run = PeerRun(f"llama-server{' --spec-default' if setting else ''}", answer.tokens, answer.prefill_s,
                      answer.prefill_s + answer.decode_s, answer.decodes, answer.drafted, answer.accepted)
        c = run.counters(len(prompt))
        probe.finish(c)  # our process's faults and memory: the server's are its own
        return run.tokens, c, time.perf_counter() - t0
    if peer == "llamacpp":
        eng = engines.get("llamacpp")
        if eng is None:
            eng = engines["llamacpp"] = LlamaCppPeer(_gguf_of(backend, "peer-llamacpp"), n_ctx=backend.n_ctx,
                                                     n_threads=backend.n_threads)
        run = eng.run(prompt, max_tokens, setting)
    elif peer == "hf":
        tb = backend if getattr(backend, "name", "") == "transformers" else engines.get("hf")
        if tb is None:
            from promptlookup.backends.transformers import TransformersBackend

            tb = engines["hf"] = TransformersBackend(backend.model_path, n_ctx=backend.n_ctx,
                                                     n_threads=backend.n_threads)
        eog = sorted(t for t in tb.eog_ids)
        run = hf_prompt_lookup(tb.model, prompt, max_tokens, setting, eog)
    else:
        raise ValueError(f"unknown peer {peer!r}")
    c = run.counters(len(prompt))
    probe.finish(c)
    return run.tokens, c, run.wall_s


def _gguf_of(backend: Model, cell: str) -> Path:
    path = Path(backend.model_path)
    if path.is_dir():
        raise InputError(f"{cell} needs a GGUF file, and the bench model is a directory: {path}")
    return path
