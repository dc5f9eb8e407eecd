"""``promptlookup index``: tokenize a corpus in parallel and write its suffix-array index.

Why a separate step from ``create``: the 2-gram cache only needs counts and streams through the
corpus in bounded memory, while the suffix array needs the whole token array at once (4 bytes per
token, plus the sort's working set). The tokenization is ``create``'s (same blocks, same workers,
same llama.cpp call), so both files see exactly the same tokens of the same corpus.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from promptlookup.build import create as corpus
from promptlookup.build.create import BLOCK
from promptlookup.build.tokenizers import describe_tokenizer, open_tokenizer
from promptlookup.drafting.suffix.corpus_index import build_suffix_array, write_index
from promptlookup.errors import InputError
from promptlookup.textin import check_input_files, replaced_note


@dataclass
class IndexStats:
    n_bytes: int = 0
    n_tokens: int = 0
    file_bytes: int = 0
    t_tokenize_s: float = 0.0
    t_sort_s: float = 0.0
    t_write_s: float = 0.0
    peak_rss_bytes: int = 0
    tokenizer: str = ""
    n_invalid_utf8: int = 0  # invalid UTF-8 sequences replaced by U+FFFD before tokenizing

    def report_lines(self) -> list[str]:
        return [
            f"index: tokens: {self.tokenizer}",
            f"index: {self.n_bytes / 1e6:.1f} MB -> {self.n_tokens} tokens -> {self.file_bytes / 1e6:.1f} MB "
            f"file; tokenize {self.t_tokenize_s:.1f} s, suffix array {self.t_sort_s:.1f} s, "
            f"write {self.t_write_s:.1f} s",
            f"index: peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB",
            *replaced_note(self.n_invalid_utf8, "index"),
        ]


def tokenize_corpus(paths: Sequence[str | os.PathLike[str]], model_path: str | os.PathLike[str],
                    workers: int = 2, progress: bool = True, block: int = BLOCK,
                    tokenizer: str = "memo", counts: dict[str, int] | None = None) -> np.ndarray:
    """The corpus's tokens, as ``create`` tokenizes it (blocks in ``workers`` processes); ``counts``
    (when given) gets ``invalid_utf8``, the invalid UTF-8 sequences replaced (:mod:`promptlookup.textin`)."""
    from tqdm import tqdm

    check_input_files(paths, "corpus file")
    total = sum(Path(p).stat().st_size for p in paths)
    if not total:
        raise InputError("the corpus is empty (0 bytes): nothing to index")
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="tokenize", disable=not progress,
               file=sys.stderr)
    parts: list[np.ndarray] = []
    n_bad = 0

    def absorb(result: tuple[np.ndarray, int], nbytes: int) -> None:
        nonlocal n_bad
        parts.append(result[0])
        n_bad += result[1]
        bar.update(nbytes)

    corpus.map_blocks(paths, block, model_path, tokenizer, workers, absorb, corpus.worker_tokens)
    bar.close()
    if counts is not None:
        counts["invalid_utf8"] = n_bad
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def run_index(paths: Sequence[str], model_path: str | os.PathLike[str], output: str, workers: int = 2,
              progress: bool = True, tokenizer: str = "memo") -> IndexStats:
    """Tokenize ``paths`` (joined), build the suffix array, write it atomically to ``output``."""
    corpus.check_output_path(output)
    check_input_files(paths, "corpus file")
    tok = open_tokenizer(model_path, tokenizer)
    fp = getattr(tok, "base", tok).fingerprint()
    st = IndexStats(n_bytes=sum(Path(p).stat().st_size for p in paths if Path(p).is_file()),
                    tokenizer=describe_tokenizer(tok))
    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    tokens = tokenize_corpus(paths, model_path, workers=workers, progress=progress, tokenizer=tokenizer,
                             counts=counts)
    st.n_invalid_utf8 = counts["invalid_utf8"]
    if not len(tokens):
        raise InputError("the corpus gives no tokens: nothing to index")
    t1 = time.perf_counter()
    sa = build_suffix_array(tokens, tok.n_vocab)
    t2 = time.perf_counter()
    st.file_bytes = write_index(output, tokens, sa, tok.n_vocab, fp)
    st.t_tokenize_s, st.t_sort_s, st.t_write_s = t1 - t0, t2 - t1, time.perf_counter() - t2
    st.n_tokens = len(tokens)
    st.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return st
