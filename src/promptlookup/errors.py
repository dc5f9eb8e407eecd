"""One base class for problems with what the user asked for.

Why: the command line prints a user error as one line and exits 2, and must never do that for a
bug. Every error a user can cause (a flag, a file, a model, a cache) derives from :class:`UserError`;
anything else that escapes a command is a bug, and ``main`` shows its traceback.

Most of these classes are also a ``ValueError`` (or ``RuntimeError``) so library callers that catch
the standard type keep working.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with what the user asked for: printed as one line, exit status 2."""


class UsageError(UserError):
    """Flags or settings that do not fit together, found before any model loads."""


class InputError(UserError, ValueError):
    """A file or value the user gave that cannot be used (missing, empty, out of range)."""


class RequestError(InputError):
    """A request that cannot be served as asked (a bad message, a prompt too long, ...).

    ``param`` names the request field at fault, for the server's error object."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def check_prompt_fits(n_prompt: int, n_ctx: int) -> None:
    """The one check that a prompt leaves room to generate: the CLI, the engine, the server and the
    loop all ask it, so "too long" reads the same wherever it is found."""
    if n_prompt >= n_ctx:
        raise RequestError(f"the prompt is {n_prompt} tokens but the context holds {n_ctx}: shorten it or "
                           "load the model with a larger context (-c/--ctx-size, n_ctx=)", "prompt")
