"""promptlookup: exact speculative decoding by looking recent tokens up in text already seen.

Token ids come in, a draft source proposes continuations from text it has seen, the speculative
loop verifies every draft in one batched forward on a backend, and telemetry reports whether
speculation paid. Output is always the model's own: a draft token is kept only where it equals
the model's choice. :class:`Engine` is the public API.
"""

__version__ = "0.1.0"

from promptlookup.api import Chunk, Completion, Engine  # noqa: E402 - the public API

__all__ = ["Chunk", "Completion", "Engine", "__version__"]
