"""``--ngram``: seed 000's suffix match over the request (rule, reference twin, incremental index, source)."""
