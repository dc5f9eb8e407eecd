"""Corpus text -> tokens -> the cache and index files that draft sources open by mmap."""
