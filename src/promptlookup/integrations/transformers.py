"""transformers drop-in: ``generate(model, input_ids, max_new_tokens=256)`` in place of
``model.generate(input_ids, max_new_tokens=256)``.

It runs promptlookup's loop (:func:`promptlookup.speculate.generate`) on the caller's model and a
cache of the model's own ``DynamicCache`` class, through
:meth:`promptlookup.backends.transformers.TransformersBackend.from_model` (no second copy, threads
and device left alone), and returns what ``model.generate`` returns: one ``LongTensor`` row of
prompt + new tokens, the end-of-generation token included where it stopped on one.

Only the options that matter for one greedy sequence are taken; any other, or a value this loop
cannot honour (a batch, padding, beams, a logits processor), is refused with an error naming it,
never silently ignored. ``do_sample=True`` samples through :mod:`promptlookup.sampling` (see
:func:`_sampler`): speculative equals plain for the same ``seed``.

Why no candidate generator for transformers' own assisted generation: ``generate`` picks its
candidate generator inside the private ``GenerationMixin._get_candidate_generator`` (prompt lookup,
an assistant model or early exit, chosen by generation-config fields), and ``assistant_model=`` must
be a model that is run forward. Plugging ours in means overriding that private method, which can
change in any release, so it is left out.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Any

from promptlookup import speculate
from promptlookup.backends.base import Model
from promptlookup.drafting.base import MAX_DRAFT
from promptlookup.drafting.spec import SourceSpec
from promptlookup.errors import UsageError
from promptlookup.integrations import DEFAULT_SOURCE, Drafter, build_spec, draft_length

DEFAULT_DRAFT = 8  # measured on CPU fp32 SmolLM2: a padded 9-wide verify costs ~1.7 decodes (backend)
# generate options accepted at exactly these values only (each is what the loop already does)
_NEUTRAL: dict[str, Any] = {"use_cache": True, "num_beams": 1, "num_return_sequences": 1,
                            "return_dict_in_generate": False, "output_scores": False,
                            "output_logits": False, "output_attentions": False,
                            "output_hidden_states": False, "repetition_penalty": 1.0,
                            "streamer": None, "generation_config": None, "logits_processor": None,
                            "stopping_criteria": None, "assistant_model": None,
                            "prompt_lookup_num_tokens": None}


_CURVES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class UnsupportedGenerationOption(UsageError, ValueError):
    """A ``model.generate`` option (or value) this drop-in cannot honour."""


def make_drafter(model: Any, source: str | SourceSpec = DEFAULT_SOURCE, draft: int | None = None,
                 history: str | os.PathLike[str] | None = None, corpus: str | os.PathLike[str] | None = None,
                 tokenizer: Any = None) -> Drafter:
    """A source to pass as ``generate(source=...)`` across calls, so a suffix history in memory
    learns from every request (``drafter.save()`` writes a ``history=`` file back)."""
    backend = _backend(model, (), 1 << 30, tokenizer)
    return _drafter(backend, source, draft, history, corpus)


def _backend(model: Any, eos: Sequence[int], n_ctx: int, tokenizer: Any) -> Any:
    from promptlookup.backends.transformers import TransformersBackend

    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "get_output_embeddings"):
        raise UsageError(f"{type(model).__name__} is not a transformers causal LM "
                         "(no config or output layer)")
    if getattr(cfg, "is_encoder_decoder", False):
        raise UsageError(f"{type(model).__name__} is an encoder-decoder model: only decoder-only causal LMs")
    if getattr(cfg, "use_cache", True) is False:
        raise UsageError(f"{type(model).__name__} has config.use_cache=False: speculative decoding needs its "
                         "KV cache (set model.config.use_cache = True)")
    return TransformersBackend.from_model(model, eos, n_ctx=n_ctx, tokenizer=tokenizer)


def _drafter(backend: Model, source: str | SourceSpec, draft: int | None, history: Any,
             corpus: Any) -> Drafter:
    spec = build_spec(source, None if history is None else str(history),
                      None if corpus is None else str(corpus))
    k = draft_length(spec, draft, DEFAULT_DRAFT)
    if k > MAX_DRAFT:
        raise UsageError(f"draft length must be in 1..{MAX_DRAFT} on transformers, got {k}")
    fingerprint = backend.fingerprint if backend.tokenizer is not None else None

    def curve() -> Any:  # auto's verify cost curve: measured once per model object (about a second)
        from promptlookup.backends.costs import measure_cost_curve

        model = backend.model
        if model not in _CURVES:
            _CURVES[model] = measure_cost_curve(backend)
        return _CURVES[model]

    return Drafter(spec, k, backend.n_vocab, fingerprint=fingerprint, cost_curve=curve)


def _sampler(gc: Any, temperature: float | None, top_p: float | None, top_k: int | None,
             seed: int | None) -> Any:
    """``do_sample=True`` as promptlookup's sampler (:mod:`promptlookup.sampling`): temperature, then
    top-k and top-p as transformers defaults them (1.0, 50, 1.0; or the model's generation config),
    no min-p or penalties. Its random stream is keyed by position, so a speculative run emits exactly
    the tokens of a plain run with the same ``seed`` (fp32); it is not torch's random stream, so the
    tokens differ from ``model.generate(do_sample=True)``'s, with the same distribution."""
    from promptlookup.options import RequestOptions

    temp = temperature if temperature is not None else (getattr(gc, "temperature", None) or 1.0)
    if temp <= 0:
        raise UnsupportedGenerationOption(f"temperature={temp!r} with do_sample=True: it must be > 0 "
                                          "(do_sample=False decodes greedily)")
    k = top_k if top_k is not None else getattr(gc, "top_k", None)
    p = top_p if top_p is not None else getattr(gc, "top_p", None)
    return RequestOptions(temperature=float(temp), top_k=50 if k is None else int(k),
                          top_p=1.0 if p is None else float(p), min_p=0.0, seed=seed).sampler()


def _eos_ids(model: Any, eos_token_id: int | Sequence[int] | None) -> list[int]:
    src = model.generation_config.eos_token_id if eos_token_id is None else eos_token_id
    if src is None:
        return []
    return [int(src)] if isinstance(src, int) else [int(t) for t in src]


def generate(model: Any, input_ids: Any, *, max_new_tokens: int | None = None,
             eos_token_id: int | Sequence[int] | None = None, attention_mask: Any = None,
             do_sample: bool | None = None, temperature: float | None = None, top_p: float | None = None,
             top_k: int | None = None, pad_token_id: int | None = None,
             seed: int | None = None, source: str | SourceSpec | Drafter | None = DEFAULT_SOURCE,
             draft: int | None = None,
             history: str | os.PathLike[str] | None = None, corpus: str | os.PathLike[str] | None = None,
             tokenizer: Any = None, **kwargs: Any) -> Any:
    """``model.generate`` for one sequence, speculating with a promptlookup source.

    ``input_ids`` is a ``(1, n)`` (or ``(n,)``) LongTensor; ``attention_mask``, if given, must be all
    ones (one sequence has no padding). ``max_new_tokens``, ``eos_token_id`` default to the model's
    generation config, as in ``model.generate``. ``do_sample``/``temperature``/``top_p``/``top_k`` and
    ``seed`` sample through promptlookup's sampler (see :func:`_sampler`). ``source`` is ``None``
    (plain decoding), a spec (default ``"auto"``, on a cost curve measured once per model object;
    ``"suffix"``, ``"ngram"``) or a :func:`make_drafter` result kept across calls; ``history``/``corpus``
    are suffix files (they need ``tokenizer=``, to check them against it). A ``history`` given here
    is loaded, then saved back after the call, like the CLI's ``--suffix-history``.
    """
    import torch


    for key, value in kwargs.items():
        if key not in _NEUTRAL or value != _NEUTRAL[key]:
            raise UnsupportedGenerationOption(f"generate option {key}={value!r} is not supported by "
                                              "promptlookup.integrations.transformers.generate")
    gc = model.generation_config
    sampler = None
    if gc.do_sample if do_sample is None else do_sample:
        sampler = _sampler(gc, temperature, top_p, top_k, seed)
    else:
        for key, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k), ("seed", seed)):
            if value is not None:
                raise UnsupportedGenerationOption(f"{key}={value!r} only applies with do_sample=True")
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2:
        raise UsageError(f"input_ids must be (batch, length), got shape {tuple(ids.shape)}")
    if ids.shape[0] != 1:
        raise UsageError(f"batch size {ids.shape[0]}: promptlookup speculates on one sequence at a time "
                         "(call generate once per sequence)")
    if ids.shape[1] == 0:
        raise UsageError("input_ids is empty: at least one prompt token is needed")
    if attention_mask is not None:
        mask = torch.as_tensor(attention_mask)
        if tuple(mask.reshape(1, -1).shape) != tuple(ids.shape) or not bool((mask != 0).all()):
            raise UsageError("attention_mask must be all ones for the one sequence (no padding)")
    prompt = [int(t) for t in ids[0].tolist()]
    if max_new_tokens is None:
        max_new_tokens = gc.max_new_tokens if gc.max_new_tokens is not None else gc.max_length - len(prompt)
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    eos = _eos_ids(model, eos_token_id)
    backend = _backend(model, eos, max(len(prompt) + max_new_tokens + 1, 1024), tokenizer)  # room for a curve
    if source is None:  # plain decoding, the baseline
        if history is not None or corpus is not None or draft is not None:
            raise UsageError("history=, corpus= and draft= need a source (source=None decodes plainly)")
        drafter, own = None, False
    elif isinstance(source, Drafter):
        if history is not None or corpus is not None or draft is not None:
            raise UsageError("history=, corpus= and draft= belong to make_drafter when source is a Drafter")
        drafter, own = source, False
    else:
        drafter, own = _drafter(backend, source, draft, history, corpus), True
    out = speculate.generate(backend, prompt, max_new_tokens, source=drafter,
                             draft=drafter.k if drafter is not None else 1, sampler=sampler)
    if drafter is not None:
        drafter.accepted_tokens += out.counters.accepted_tokens
    if own:
        drafter.save()
    new = torch.tensor([out.tokens], dtype=ids.dtype, device=ids.device)
    return torch.cat([ids, new], dim=1)
