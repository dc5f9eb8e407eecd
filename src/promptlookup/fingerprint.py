"""A tokenizer fingerprint: files of token ids are only meaningful with the vocabulary that made them.

Cache and index files carry this value; opening one built for another vocabulary is refused
instead of drafting garbage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def fingerprint_pieces(n_vocab: int, pieces: Iterable[bytes]) -> str:
    """SHA-256 over the vocabulary size and every token's bytes, in id order (hex, 16 chars)."""
    h = hashlib.sha256()
    h.update(n_vocab.to_bytes(8, "little"))
    for piece in pieces:
        h.update(len(piece).to_bytes(4, "little"))
        h.update(piece)
    return h.hexdigest()[:16]
