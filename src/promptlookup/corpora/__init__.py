"""Named corpora: source trees and document sets indexed once (``promptlookup index DIR -o NAME``)
and named by a request, the engine or the server for the suffix source to draft from.

- :mod:`.gitignore`: a small ``.gitignore`` matcher (git's rules; no new dependency).
- :mod:`.tree`: walking a tree (ignored and binary files skipped), tokenizing it file by file, and
  re-indexing only the files that changed; the corpus directory (``index.plsa`` + ``manifest.json``).
- :mod:`.registry`: the corpora a process has opened, shared read-only (mmap) by every request, with
  leases so a removed corpus is unmapped only when its last request ends.
"""
