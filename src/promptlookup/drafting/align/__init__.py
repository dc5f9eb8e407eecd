"""``--align``: follow the place being copied through the writer's systematic edits of it (dropped
line breaks and indentation, rewritten punctuation), and draft the copy with those edits applied."""
