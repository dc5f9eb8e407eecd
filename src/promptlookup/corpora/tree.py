"""``promptlookup index DIR|FILES -o NAME``: a source tree or document set as a named corpus.

A corpus directory holds ``index.plsa`` (the suffix-array index of
:mod:`promptlookup.drafting.suffix.corpus_index`) and ``manifest.json`` (the sources, every file's
size, mtime and token count in index order, the tokenizer's fingerprint, the index's size and body
CRC). Both are written atomically, the index first; the manifest names the index's CRC, so a crash
between the two leaves a pair that does not match, which opening refuses and the next build redoes.

Files are found by :func:`walk`: directories in sorted order, ``.gitignore`` files honoured
(:mod:`.gitignore`), ``.git`` skipped, symbolic links never followed (a link inside an allowed
root must not reach outside it), binaries (a NUL byte in the first 8 KiB, as git decides) and files
over ``max_file_bytes`` skipped. Each file is tokenized on its own (no BOS, control-token texts
stay text) and the files' tokens are joined in walk order.

Incremental update: the suffix array is one sort over the whole token array, so it is always
rebuilt; what an update saves is the tokenization. A file whose size and mtime match the old
manifest reuses its tokens from the old index (read through its mapping); only new and changed
files are read and tokenized. The result is the same bytes a fresh build writes (tested).

Memory: the tokens (4 bytes each) plus the suffix-array sort's ~48 bytes per token at its peak;
``max_memory`` refuses, as soon as the running token count crosses it, a corpus whose sort would
need more, before anything is written.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from promptlookup.corpora import gitignore
from promptlookup.drafting.suffix.corpus_index import (
    CorpusIndex,
    CorpusIndexError,
    build_suffix_array,
    open_index,
    write_index,
)
from promptlookup.errors import InputError
from promptlookup.fileio import atomic_write_text, cache_dir

INDEX_FILE = "index.plsa"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
BINARY_SNIFF = 8192  # bytes looked at for a NUL (git's rule)
DEFAULT_MAX_FILE_BYTES = 16 << 20  # larger files are data dumps or generated code
SORT_BYTES_PER_TOKEN = 48  # the suffix-array build's peak (docs/suffix.md)
DEFAULT_MAX_MEMORY_MB = 4096


def corpora_dir() -> Path:
    """Where named corpora live: ``$PROMPTLOOKUP_CACHE/corpora`` (default
    ``~/.cache/promptlookup/corpora``)."""
    return cache_dir() / "corpora"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise InputError(f"corpus name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting "
                         "with a letter or digit")
    return name


def corpus_location(ref: str | os.PathLike[str], root: Path | None = None) -> Path:
    """A corpus reference as a path: a bare name is ``root/NAME`` (default :func:`corpora_dir`);
    anything with a path separator (or an existing path) is that path."""
    text = os.fspath(ref)
    if NAME_RE.fullmatch(text) and not Path(text).exists():
        return (root or corpora_dir()) / text
    return Path(text)


# ------------------------------------------------------------------------------------------ walking
@dataclass
class Found:
    path: Path  # absolute
    key: str  # the manifest's name for it: the absolute path
    size: int
    mtime_ns: int


@dataclass
class Skipped:
    ignored: int = 0  # by a .gitignore (files and directories)
    binary: int = 0
    too_large: int = 0
    links: int = 0  # symbolic links (never followed)
    unreadable: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def walk(sources: Sequence[str | os.PathLike[str]], max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
         skipped: Skipped | None = None) -> list[Found]:
    """The files of ``sources`` (directories walked, files taken as given) in index order."""
    sk = skipped if skipped is not None else Skipped()
    out: list[Found] = []
    for src in sources:
        p = Path(src)
        try:
            st = p.lstat()
        except OSError as exc:
            raise InputError(f"{src}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(st.st_mode):
            p = p.resolve()
            st = p.stat()
        if stat.S_ISDIR(st.st_mode):
            _walk_dir(p.absolute(), "", [], out, sk, max_file_bytes)
        elif stat.S_ISREG(st.st_mode):
            if st.st_size > max_file_bytes:
                sk.too_large += 1
            else:
                a = p.absolute()
                out.append(Found(a, str(a), st.st_size, st.st_mtime_ns))
        else:
            raise InputError(f"{src}: not a file or directory")
    seen: set[str] = set()
    unique = []
    for f in out:  # a file named twice (a directory and a file in it) is indexed once
        if f.key not in seen:
            seen.add(f.key)
            unique.append(f)
    return unique


def _walk_dir(root: Path, rel: str, rules: list[gitignore.Rule], out: list[Found], sk: Skipped,
              max_file_bytes: int) -> None:
    here = root / rel if rel else root
    try:
        entries = sorted(os.scandir(here), key=lambda e: e.name)
    except OSError:
        sk.unreadable += 1
        return
    for e in entries:
        if e.name == ".gitignore" and e.is_file(follow_symlinks=False):
            try:
                text = Path(e.path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                sk.unreadable += 1
                continue
            rules = rules + gitignore.parse(text, rel)
    for e in entries:
        r = f"{rel}/{e.name}" if rel else e.name
        if e.is_symlink():
            sk.links += 1
            continue
        try:
            is_dir = e.is_dir(follow_symlinks=False)
            is_file = e.is_file(follow_symlinks=False)
        except OSError:
            sk.unreadable += 1
            continue
        if is_dir and e.name == ".git":
            continue
        if gitignore.ignored(rules, r, is_dir):
            sk.ignored += 1
            continue
        if is_dir:
            _walk_dir(root, r, rules, out, sk, max_file_bytes)
        elif is_file:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                sk.unreadable += 1
                continue
            if st.st_size > max_file_bytes:
                sk.too_large += 1
                continue
            a = Path(e.path)
            out.append(Found(a, str(a), st.st_size, st.st_mtime_ns))


def is_binary(head: bytes) -> bool:
    return b"\0" in head[:BINARY_SNIFF]


# ------------------------------------------------------------------------------------------ manifest
@dataclass
class Manifest:
    sources: list[str]
    fingerprint: str
    n_vocab: int
    n_tokens: int
    n_bytes: int
    index_bytes: int
    index_crc: int
    files: list[dict[str, Any]]  # {"path", "size", "mtime_ns", "tokens"} in index order
    skipped: dict[str, int] = field(default_factory=dict)
    built: str = ""

    def to_json(self) -> str:
        return json.dumps({"format": MANIFEST_FORMAT, **self.__dict__}, indent=1) + "\n"

    @classmethod
    def load(cls, path: Path) -> Manifest:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.pop("format", None) != MANIFEST_FORMAT:
                raise ValueError("unknown format")
            m = cls(**data)
            if not all(isinstance(f, dict) and {"path", "size", "mtime_ns", "tokens"} <= f.keys()
                       for f in m.files):
                raise ValueError("bad file entry")
            if sum(int(f["tokens"]) for f in m.files) != m.n_tokens:
                raise ValueError("file token counts do not add up")
            return m
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise CorpusIndexError(f"{path}: not a usable corpus manifest ({exc})") from None


def open_corpus(ref: str | os.PathLike[str], fingerprint: str | None = None, n_vocab: int | None = None,
                verify: bool = False, root: Path | None = None) -> tuple[CorpusIndex, Manifest | None]:
    """Open a corpus: a name (under ``root``), a corpus directory, or a bare index file."""
    p = corpus_location(ref, root)
    if p.is_dir():
        if not (p / MANIFEST_FILE).exists():
            raise CorpusIndexError(f"{p}: not a corpus directory (no {MANIFEST_FILE}; build it with "
                                   "`promptlookup index`)")
        m = Manifest.load(p / MANIFEST_FILE)
        idx = open_index(p / INDEX_FILE, fingerprint=fingerprint, n_vocab=n_vocab, verify=verify)
        if idx.n_tokens != m.n_tokens or idx.crc != m.index_crc:
            idx.close()
            raise CorpusIndexError(f"{p}: the index and its manifest do not match (an interrupted build?); "
                                   "run `promptlookup index` again")
        return idx, m
    if not p.exists():
        raise CorpusIndexError(f"no corpus {os.fspath(ref)!r} ({p} does not exist)")
    return open_index(p, fingerprint=fingerprint, n_vocab=n_vocab, verify=verify), None


# ------------------------------------------------------------------------------------------ building
@dataclass
class BuildStats:
    files: int = 0
    tokenized: int = 0  # files read and tokenized this time
    reused: int = 0  # files whose tokens came from the old index
    removed: int = 0  # files of the old manifest that are gone
    n_bytes: int = 0
    n_tokens: int = 0
    index_bytes: int = 0
    skipped: Skipped = field(default_factory=Skipped)
    t_tokenize_s: float = 0.0
    t_sort_s: float = 0.0
    t_write_s: float = 0.0
    incremental: bool = False

    def report_lines(self, out: Path) -> list[str]:
        sk = self.skipped
        how = (f"{self.tokenized} tokenized, {self.reused} reused from the old index, {self.removed} gone"
               if self.incremental else f"{self.tokenized} tokenized")
        return [
            f"index: {out}: {self.files} files ({how}); skipped: {sk.ignored} ignored, {sk.binary} binary, "
            f"{sk.too_large} too large, {sk.links} links, {sk.unreadable} unreadable",
            f"index: {self.n_bytes / 1e6:.1f} MB -> {self.n_tokens} tokens -> "
            f"{self.index_bytes / 1e6:.1f} MB; "
            f"tokenize {self.t_tokenize_s:.1f} s, suffix array {self.t_sort_s:.1f} s, "
            f"write {self.t_write_s:.1f} s",
        ]


def _old_tokens(out: Path, fingerprint: str, n_vocab: int) -> tuple[CorpusIndex | None, dict[str, tuple]]:
    """The previous build's index and ``path -> (size, mtime_ns, start, n)``, or (None, {}) when
    there is none usable (missing, another tokenizer, corrupt: the build is then fresh)."""
    try:
        idx, m = open_corpus(out, fingerprint=fingerprint, n_vocab=n_vocab)
    except (CorpusIndexError, OSError):
        return None, {}
    if m is None:
        idx.close()
        return None, {}
    table, start = {}, 0
    for f in m.files:
        n = int(f["tokens"])
        table[f["path"]] = (int(f["size"]), int(f["mtime_ns"]), start, n)
        start += n
    return idx, table


def build_corpus(sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], tokenizer: Any,
                 progress: bool = False, max_memory_mb: int = DEFAULT_MAX_MEMORY_MB,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, rebuild: bool = False) -> BuildStats:
    """Index ``sources`` into the corpus directory ``out`` (created); ``tokenizer`` is an opened
    :func:`promptlookup.build.tokenizers.open_tokenizer`. An existing build there is updated: only
    new and changed files are tokenized (``rebuild``: all of them)."""
    from tqdm import tqdm

    from promptlookup.textin import repair_utf8

    out = Path(out)
    fp = getattr(tokenizer, "base", tokenizer).fingerprint()
    n_vocab = int(tokenizer.n_vocab)
    st = BuildStats()
    t0 = time.perf_counter()
    found = walk(sources, max_file_bytes, st.skipped)
    old, table = (None, {}) if rebuild else _old_tokens(out, fp, n_vocab)
    st.incremental = old is not None
    limit_tokens = max_memory_mb * 2**20 // SORT_BYTES_PER_TOKEN
    parts: list[np.ndarray] = []
    files: list[dict[str, Any]] = []
    total = 0
    bar = tqdm(total=sum(f.size for f in found), unit="B", unit_scale=True, desc="index",
               disable=not progress, file=sys.stderr)
    try:
        for f in found:
            prev = table.get(f.key)
            if old is not None and prev is not None and prev[:2] == (f.size, f.mtime_ns):
                toks = np.array(old.tokens[prev[2] : prev[2] + prev[3]], dtype=np.int32)
                st.reused += 1
            else:
                try:
                    data = f.path.read_bytes()
                except OSError:
                    st.skipped.unreadable += 1
                    bar.update(f.size)
                    continue
                if is_binary(data):
                    st.skipped.binary += 1
                    bar.update(f.size)
                    continue
                data, _ = repair_utf8(data)
                toks = np.asarray(tokenizer.tokenize(data, add_special=False, parse_special=False),
                                  dtype=np.int32)
                st.tokenized += 1
            bar.update(f.size)
            total += len(toks)
            if total > limit_tokens:
                raise InputError(f"the corpus passes {limit_tokens} tokens: its suffix array would need more "
                                 f"than --max-memory {max_memory_mb} MiB (about {SORT_BYTES_PER_TOKEN} bytes "
                                 "a token); index fewer files or raise the bound")
            parts.append(toks)
            files.append({"path": f.key, "size": f.size, "mtime_ns": f.mtime_ns, "tokens": len(toks)})
            st.n_bytes += f.size
    finally:
        bar.close()
        if old is not None:
            st.removed = len(set(table) - {f["path"] for f in files})
    if not total:
        if old is not None:
            old.close()
        raise InputError("no text to index: every file was ignored, binary, empty or unreadable")
    tokens = np.concatenate(parts)
    del parts
    if old is not None:
        old.close()
    t1 = time.perf_counter()
    sa = build_suffix_array(tokens, n_vocab)
    t2 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    st.index_bytes = write_index(out / INDEX_FILE, tokens, sa, n_vocab, fp)
    del sa
    check = open_index(out / INDEX_FILE, fingerprint=fp, n_vocab=n_vocab)
    crc = check.crc
    check.close()
    manifest = Manifest(sources=[str(Path(s).absolute()) for s in sources], fingerprint=fp, n_vocab=n_vocab,
                        n_tokens=int(total), n_bytes=st.n_bytes, index_bytes=st.index_bytes, index_crc=crc,
                        files=files, skipped=st.skipped.as_dict(),
                        built=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    atomic_write_text(out / MANIFEST_FILE, manifest.to_json())
    st.files, st.n_tokens = len(files), int(total)
    st.t_tokenize_s, st.t_sort_s, st.t_write_s = t1 - t0, t2 - t1, time.perf_counter() - t2
    return st


def list_corpora(root: Path | None = None) -> list[tuple[str, Manifest | None, str | None]]:
    """``(name, manifest, error)`` of every corpus directory under ``root`` (default :func:`corpora_dir`)."""
    base = root or corpora_dir()
    out = []
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        if d.is_dir() and NAME_RE.fullmatch(d.name):
            try:
                out.append((d.name, Manifest.load(d / MANIFEST_FILE), None))
            except CorpusIndexError as exc:
                out.append((d.name, None, str(exc)))
    return out
