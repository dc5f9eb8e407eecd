"""``--suffix``: a suffix automaton over the request and earlier ones, plus a corpus suffix array."""
