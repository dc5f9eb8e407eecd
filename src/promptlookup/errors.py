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
