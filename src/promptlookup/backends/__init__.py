"""Model backends behind one small protocol (see :mod:`promptlookup.backends.base`)."""

from promptlookup.backends.base import Backend, BackendError

__all__ = ["Backend", "BackendError"]
