"""How many requests ``promptlookup serve`` decodes together by default.

A module of its own, without fastapi: the command line's ``serve --help`` and its default are built
for every command, and the web stack is the ``[server]`` extra, imported only when a server starts.
"""

from __future__ import annotations

import os

from promptlookup.backends.context_size import KV_MEMORY_SHARE, MAX_SLOTS, default_context

__all__ = ["DEFAULT_PARALLEL", "KV_MEMORY_SHARE", "default_parallel"]

#: requests decoded together by default on llama.cpp (fewer where their KV caches would take more
#: than KV_MEMORY_SHARE of the memory available; one on a backend that cannot batch): see
#: default_parallel, and backends/context_size.py for how slots and context are sized together
DEFAULT_PARALLEL = MAX_SLOTS


def default_parallel(backend: str, model: str | os.PathLike[str] | None,
                     n_ctx: int) -> tuple[int, str | None]:
    """``--parallel`` when it is not given but ``-c`` is, and a line saying why where it is not the
    default (:func:`~promptlookup.backends.context_size.default_context` sizes both where neither
    is given).

    Why 16: measured on the 2-core development machine with the column matmul (docs/results.md,
    many users at once, three runs on 2026-12-03), 16 slots served 188.0, 193.0 and 194.8 tok/s to
    16 clients against 141.4, 159.0 and 131.0 for 4 slots (about 2x one request at a time, against
    1.4-1.6x), with a time to first token at p95 of 1.4-1.7 s against 10-12 s; at 4 clients 136.8 /
    141.0 / 148.8 against 141.4 / 137.0 / 138.5, and alone level within the passes' spread (one
    request at a time in-process: 105.8 / 100.6 tok/s against 109.7 / 97.5): no worse where fewer
    clients come.
    A slot nobody uses costs only its memory, so the limit is memory: each slot holds ``n_ctx``
    positions of its own, and the default is the most slots, up to 16, whose caches take at most
    :data:`KV_MEMORY_SHARE` of the memory available (the model, the other processes of the machine
    and the server's own work keep the rest). An explicit ``--parallel`` is checked against all of
    it when the model loads. Not on transformers: it decodes one sequence at a time."""
    from promptlookup.backends.models import ModelError

    if backend != "llama.cpp":
        return 1, None
    try:
        choice = default_context(backend, model, n_ctx=n_ctx, slots=True)
    except ModelError:
        return DEFAULT_PARALLEL, None  # the engine names the problem when it loads the model
    return choice.parallel, choice.line
