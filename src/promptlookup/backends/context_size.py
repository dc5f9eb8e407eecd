"""The default context size: from the model's training context and the memory, said in one line.

Why not a fixed default: a chat with BFCL's 32 tools is a 4,484-token prompt before its first turn,
which the old default of 4,096 refused, while the models we run were trained on 8,192 (SmolLM2) and
32,768 (Qwen2.5-Coder) positions. So the default is the training context, capped:

- one sequence (generate, bench, curve, an ``Engine``): ``min(training context, 32768)``;
- slots (``serve``, an ``Engine`` with ``parallel > 1``): ``min(training context, 16384)`` each, 16
  slots (``--parallel``'s default), fewer where memory is short.

llama.cpp allocates (and clears) the KV cache of the whole context when the model loads, so memory
is the other bound: the default's KV cache (F16: ``2 * layers * KV heads * head size * 2`` bytes a
position) takes at most :data:`KV_MEMORY_SHARE` of the memory available; the model, the rest of the
machine and the server's own work keep the rest. Where it is short, a server first gives up slots
(down to :data:`MIN_SLOTS`), then context (down to :data:`FLOOR`), then slots again (down to one); a
single sequence gives up context down to :data:`FLOOR`. The default never goes below :data:`FLOOR`
(the old default, which the memory check at load refuses only where it always did).

What a long context costs a short run (``python benchmarks/context_cost.py -m qwen2.5-coder-0.5b
-t 1`` on the shared 2-core development machine, 2026-12-04; both contexts timed in turn in one
process, so the machine's load hits both alike, medians of 5): decode 67.7 ms a token at 4,096 and
66.8 at 32,768, a 256-token prefill 4.13 s and 4.24 s, loading 0.60 s and 0.89 s, and resident
memory after loading 616 MiB and 954 MiB (the 336 MiB of the larger KV cache, which llama.cpp
clears, so touches, at load). llama.cpp attends only over the cells in use (rounded up to 256), so
time does not grow with the context allocated; memory does, which is why the KV cache is held to
the memory share. Flash attention's automatic choice (``flash_attention_default``: on only up to
512 positions a sequence) was already off at 4,096, so the larger default changes nothing there.

:func:`choose_context` is the rule, a pure function of the model's numbers and the memory figure;
:func:`default_context` reads them (the GGUF's metadata, without loading it; ``/proc/meminfo``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SEQUENCE_CAP = 32768  # positions, the default's cap for one sequence
SLOT_CAP = 16384  # positions, the default's cap for each of a server's slots
FLOOR = 4096  # positions: the least the default goes to (the old default), unless the model is shorter
#: --parallel's default on llama.cpp (fewer where their caches take more than KV_MEMORY_SHARE; one on a
#: backend that cannot batch). Why 16: measured on the 2-core development machine with the column matmul
#: (docs/results.md, many users at once, three runs on 2026-12-03), 16 slots served 188.0, 193.0 and 194.8
#: tok/s to 16 clients against 141.4, 159.0 and 131.0 for 4 slots (about 2x one request at a time, against
#: 1.4-1.6x), with a time to first token at p95 of 1.4-1.7 s against 10-12 s; at 4 clients 136.8 / 141.0 /
#: 148.8 against 141.4 / 137.0 / 138.5, and alone level within the passes' spread: no worse where fewer
#: clients come. A slot nobody uses costs only its memory, so the limit is memory.
MAX_SLOTS = 16
MIN_SLOTS = 4  # slots a server keeps before it gives up context below its cap
KV_MEMORY_SHARE = 0.25  # of the memory available, what the default's KV caches may take
STEP = 256  # a context cut for memory is a multiple of this (llama.cpp pads to it anyway)


@dataclass(frozen=True)
class ContextChoice:
    """Positions per sequence, sequences (slots), and the line that says what was chosen and why
    (None where both were given)."""

    n_ctx: int
    parallel: int
    line: str | None = None


def size(n_bytes: float) -> str:
    """``384 MiB``, ``23.4 GiB``: a memory figure as the lines print it."""
    return f"{n_bytes / 2**20:.0f} MiB" if n_bytes < 2**30 else f"{n_bytes / 2**30:.1f} GiB"


def choose_context(train: int | None, per_token: int | None, available: int | None, *,
                   n_ctx: int | None = None, parallel: int | None = None,
                   slots: bool = False) -> ContextChoice:
    """The context (and, with ``slots``, the slot count) to use where the caller did not give both.

    ``train``: the model's training context (None: the file does not say); ``per_token``: KV-cache
    bytes a position (None: unknown); ``available``: bytes of memory available (None: unknown).
    ``n_ctx`` / ``parallel``: what the user gave (kept as given; the load checks them against the
    training context and all of the memory). ``slots``: size a server's slots (else one sequence,
    and ``parallel`` is 1). The rule and its reasons are in the module docstring."""
    cap = min(train or FLOOR, SLOT_CAP if slots else SEQUENCE_CAP)
    floor = min(cap, FLOOR)
    if not slots:
        parallel = 1
    if n_ctx is not None and parallel is not None:
        return ContextChoice(n_ctx, parallel, None)
    budget = int(KV_MEMORY_SHARE * available) if available is not None else None
    if n_ctx is not None:  # a server given -c: the slots that fit (at least one)
        if not per_token or budget is None:
            return ContextChoice(n_ctx, MAX_SLOTS, None)
        n = min(MAX_SLOTS, budget // (n_ctx * per_token))
        if n >= MAX_SLOTS:
            return ContextChoice(n_ctx, MAX_SLOTS, None)
        n = max(1, n)
        return ContextChoice(n_ctx, n, (
            f"--parallel defaults to {n}, not {MAX_SLOTS}: the KV caches of {MAX_SLOTS} x {n_ctx} positions "
            f"would take {MAX_SLOTS * n_ctx * per_token / 2**30:.1f} GiB, more than {KV_MEMORY_SHARE:.0%} "
            f"of the {(available or 0) / 2**30:.1f} GiB of memory available"))
    want = (cap, parallel or MAX_SLOTS)
    if not per_token or budget is None:
        got = want
    elif parallel is not None:  # one sequence, or a server given --parallel: the context that fits
        got = (max(floor, min(cap, budget // (parallel * per_token) // STEP * STEP)), parallel)
    elif budget // (cap * per_token) >= MIN_SLOTS:  # a server: first fewer slots,
        got = (cap, min(MAX_SLOTS, budget // (cap * per_token)))
    elif budget // (MIN_SLOTS * per_token) // STEP * STEP >= floor:  # then less context,
        got = (budget // (MIN_SLOTS * per_token) // STEP * STEP, MIN_SLOTS)
    else:  # then fewer slots again
        got = (floor, max(1, min(MIN_SLOTS, budget // (floor * per_token))))
    return ContextChoice(got[0], got[1], _line(want, got, train, per_token, available, slots))


def _line(want: tuple[int, int], got: tuple[int, int], train: int | None, per_token: int | None,
          available: int | None, slots: bool) -> str:
    def what(n: int, p: int) -> str:
        return f"{n} tokens x {p} slot{'s' * (p != 1)}" if slots else f"{n} tokens"

    if not train:
        origin = "the model file does not give its training context"
    elif want[0] == train:
        origin = "the model's training context"
    else:
        origin = f"the default's {'per-slot ' if slots else ''}cap; the model was trained on {train}"
    caches = "KV caches" if slots else "KV cache"
    if per_token is None:
        return f"context: {what(*got)} ({origin})"
    took = size(got[0] * got[1] * per_token)
    if available is None:
        return f"context: {what(*got)} ({origin}; {caches} {took}; the memory available is not known)"
    if got == want:
        return f"context: {what(*got)} ({origin}; {caches} {took} of the {size(available)} available)"
    if got[0] == want[0]:
        instead = f"{want[1]} slots"
    elif got[1] == want[1]:
        instead = f"{want[0]} tokens"
    else:
        instead = f"{want[0]} x {want[1]}"
    head = f"context: {what(*got)}, not {instead} ({origin})"
    if got[0] * got[1] * per_token <= KV_MEMORY_SHARE * available:
        return (f"{head}, to keep the {caches} at {took}, within a quarter of the {size(available)} of "
                "memory available")
    return (f"{head}: the least the default takes, though its {caches} of {took} take{'' if slots else 's'} "
            f"more than a quarter of the {size(available)} of memory available")


def default_context(backend: str, model: str | os.PathLike[str] | None, *, n_ctx: int | None = None,
                    parallel: int | None = None, slots: bool = False) -> ContextChoice:
    """:func:`choose_context` on ``model``'s GGUF metadata and the memory available now.

    On transformers the cache grows as it fills (nothing is allocated up front) and one sequence is
    decoded at a time: the context is the training context up to :data:`SEQUENCE_CAP` (a model
    directory: the cap, which the backend lowers to the model's ``max_position_embeddings``).
    A model that cannot be resolved raises the :class:`~promptlookup.backends.models.ModelError`
    loading it would."""
    from promptlookup.backends import models

    if backend == "transformers":
        if model is not None and Path(model).is_dir():
            train = None
        else:
            train, _ = models.kv_cache_estimate(models.resolve_model(model))
        n = n_ctx or min(train or SEQUENCE_CAP, SEQUENCE_CAP)
        why = "the model's training context" if n == train else "at most the model's own limit"
        line = f"context: {n} tokens ({why}; transformers grows its cache as it fills)"
        return ContextChoice(n, parallel or 1, None if n_ctx else line)
    train, per_token = models.kv_cache_estimate(models.resolve_model(model))
    return choose_context(train, per_token, models.available_memory(), n_ctx=n_ctx, parallel=parallel,
                          slots=slots)
