"""The corpora one process has opened, by name: shared read-only by every request and slot.

Why leases: a corpus is a read-only mapping every request reads without locks; removing one while
a request drafts from it must not unmap pages under the kernel. :meth:`Corpora.lease` counts the
requests using each corpus; :meth:`Corpora.remove` takes the name away at once (new requests naming
it get a 400) and unmaps the index when the last lease ends (at once when none is held).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promptlookup.corpora.tree import Manifest, check_name, open_corpus
from promptlookup.drafting.suffix.corpus_index import CorpusIndex
from promptlookup.errors import InputError, RequestError

MAX_PER_REQUEST = 8  # corpora one request may name


@dataclass
class Entry:
    name: str
    index: CorpusIndex
    manifest: Manifest | None
    location: str  # the corpus directory or index file
    owned: bool = False  # built by this process into its corpus directory (a remove deletes the files)
    users: int = 0
    removed: bool = False
    on_free: list[Any] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        m = self.manifest
        return {"name": self.name, "tokens": self.index.n_tokens,
                "bytes": Path(self.index.path).stat().st_size if Path(self.index.path).exists() else 0,
                "files": len(m.files) if m is not None else None,
                "source_bytes": m.n_bytes if m is not None else None,
                "built": m.built if m is not None else None, "in_use": self.users}


class Corpora:
    """Named, opened corpora (thread-safe); ``fingerprint``/``n_vocab`` are the model's, checked
    against every index opened."""

    def __init__(self, fingerprint: str | None, n_vocab: int | None, root: Path | None = None,
                 defaults: Sequence[str] = ()) -> None:
        self.fingerprint = fingerprint
        self.n_vocab = n_vocab
        self.root = root
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self.defaults: tuple[str, ...] = ()
        for ref in defaults:
            self.open(ref)
        self.defaults = tuple(self._name_of(r) for r in defaults)

    @staticmethod
    def _name_of(ref: str) -> str:
        return Path(str(ref)).name if "/" in str(ref) else str(ref)

    def open(self, ref: str, name: str | None = None, owned: bool = False, verify: bool = False) -> Entry:
        """Open the corpus ``ref`` (a name under the root, a corpus directory, an index file) and
        register it as ``name`` (default: its own name); a taken name is refused."""
        name = check_name(name or self._name_of(ref))
        with self._lock:
            if name in self._entries:
                raise InputError(f"a corpus named {name!r} is already loaded")
        idx, manifest = open_corpus(ref, self.fingerprint, self.n_vocab, verify=verify, root=self.root)
        entry = Entry(name, idx, manifest, str(ref), owned=owned)
        with self._lock:
            if name in self._entries:
                idx.close()
                raise InputError(f"a corpus named {name!r} is already loaded")
            self._entries[name] = entry
        return entry

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._entries

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def info(self) -> list[dict[str, Any]]:
        with self._lock:
            entries = sorted(self._entries.values(), key=lambda e: e.name)
        return [{**e.info(), "default": e.name in self.defaults} for e in entries]

    def check(self, names: Sequence[str] | None, param: str = "corpora") -> tuple[str, ...]:
        """``names`` checked (None: the defaults): each a loaded corpus, at most :data:`MAX_PER_REQUEST`."""
        if names is None:
            return self.defaults
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise RequestError("corpora must be a list of corpus names", param)
        if len(names) > MAX_PER_REQUEST:
            raise RequestError(f"corpora: at most {MAX_PER_REQUEST} per request, got {len(names)}", param)
        with self._lock:
            for n in names:
                if n not in self._entries:
                    known = ", ".join(sorted(self._entries)) or "none"
                    raise RequestError(f"corpora: no corpus named {n!r} (loaded: {known})", param)
        return tuple(dict.fromkeys(names))

    @contextmanager
    def lease(self, names: Sequence[str] | None) -> Iterator[list[CorpusIndex]]:
        """The indexes of ``names`` (None: the defaults), held open until the block ends."""
        names = self.check(names)
        with self._lock:
            missing = [n for n in names if n not in self._entries]
            if missing:  # removed between check and lease
                raise RequestError(f"corpora: no corpus named {missing[0]!r}", "corpora")
            entries = [self._entries[n] for n in names]
            for e in entries:
                e.users += 1
        try:
            yield [e.index for e in entries]
        finally:
            with self._lock:
                freed = []
                for e in entries:
                    e.users -= 1
                    if e.removed and e.users == 0:
                        freed.append(e)
            for e in freed:
                self._free(e)

    def remove(self, name: str) -> bool:
        """Take ``name`` away now; returns True when its index is unmapped now, False when that waits
        for the requests using it. Unknown: :class:`KeyError`."""
        with self._lock:
            e = self._entries.pop(name)
            e.removed = True
            self.defaults = tuple(d for d in self.defaults if d != name)
            now = e.users == 0
        if now:
            self._free(e)
        return now

    def _free(self, e: Entry) -> None:
        e.index.close()
        if e.owned:
            import shutil

            shutil.rmtree(e.location, ignore_errors=True)
        for fn in e.on_free:
            fn()

    def close(self) -> None:
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for e in entries:
            e.index.close()
