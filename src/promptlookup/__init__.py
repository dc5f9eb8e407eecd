"""promptlookup: exact speculative decoding by looking recent tokens up in text already seen.

Token ids come in, a draft source proposes continuations from text it has seen, the speculative
loop verifies every draft in one batched forward on a backend, and telemetry reports whether
speculation paid. Output is always the model's own: a draft token is kept only where it equals
the model's choice. :class:`Engine` is the public API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Chunk", "Completion", "Engine", "__version__"]

if TYPE_CHECKING:
    from promptlookup.api import Chunk, Completion, Engine


def __getattr__(name: str) -> Any:
    """The public API, imported on first use: ``import promptlookup.llama_build`` (set-up, on a
    Python that has none of promptlookup's dependencies yet) must not load numpy through the API."""
    if name in ("Chunk", "Completion", "Engine"):
        from promptlookup import api

        return getattr(api, name)
    raise AttributeError(f"module 'promptlookup' has no attribute {name!r}")
