"""Model backends behind one declared contract (see :mod:`promptlookup.backends.base`): the loop's
:class:`Decoder` and the engine's :class:`Model`."""

from promptlookup.backends.base import BackendError, Decoder, Model

__all__ = ["BackendError", "Decoder", "Model"]
