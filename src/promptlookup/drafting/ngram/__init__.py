"""``--ngram``: draft what followed the longest earlier occurrence of the text's last tokens (rule,
reference twin, incremental index, source)."""
