"""A tokenizer fingerprint: files of token ids are only meaningful with the vocabulary that made them.

Cache and index files carry this value; opening one built for another vocabulary is refused
instead of drafting garbage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

# llama-cpp-python's detokenize of one token returns nothing for a piece longer than 32 bytes; the
# fingerprints already written into cache files were computed that way, so every tokenizer hashes so.
PIECE_LIMIT = 32


def fingerprint_pieces(n_vocab: int, pieces: Iterable[bytes]) -> str:
    """SHA-256 over the vocabulary size and every token's bytes, in id order (hex, 16 chars); a
    piece longer than ``PIECE_LIMIT`` bytes counts as empty."""
    h = hashlib.sha256()
    h.update(n_vocab.to_bytes(8, "little"))
    for piece in pieces:
        if len(piece) > PIECE_LIMIT:
            piece = b""
        h.update(len(piece).to_bytes(4, "little"))
        h.update(piece)
    return h.hexdigest()[:16]
