"""Summaries that copy: a paper's abstract, introduction and conclusion in, one paragraph out.

The data is ACLSum (the ``aclsum`` package, MIT): ACL Anthology papers split into sentences by
section, each with three reference summaries (its challenge, approach and outcome). A summary of a
paper reuses its phrases (names of methods, datasets, results), which prompt lookup drafts from.
The expected answer is the three reference summaries in that order, one paragraph.

Read from the package's ``dataset/<split>.jsonl`` directly (the package's own loader needs
``sienna``, which nothing else here does).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from real.common import WorkloadError, field, read_jsonl, seeded_pick

SECTIONS = ("abstract", "introduction", "conclusion")
ASPECTS = ("challenge", "approach", "outcome")
INSTRUCTION = ("Summarize the paper below in one paragraph of three to five sentences: the problem it "
               "addresses, its approach, and its outcome.")


@dataclass(frozen=True)
class Bounds:
    max_paper_chars: int = 12000


def paper_text(doc: dict[str, Any], where: str) -> tuple[str, str]:
    """(title, the paper's sections as text), each section's sentences joined by spaces."""
    title = field(doc, "title", str, where)
    sentences = field(doc, "sentences", dict, where)
    parts = []
    for sec in SECTIONS:
        sents = field(sentences, sec, list, f"{where} sentences")
        if not all(isinstance(s, str) for s in sents):
            raise WorkloadError(f"{where}: sentences.{sec} holds a value that is not a string")
        parts.append(f"{sec.capitalize()}:\n{' '.join(sents)}")
    return title, "\n\n".join(parts)


def make_prompt(title: str, body: str) -> str:
    return f"{INSTRUCTION}\n\nTitle: {title}\n\n{body}\n"


def build(dataset: Path, n: int, seed: int, split: str = "test", bounds: Bounds = Bounds()
          ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``n`` papers of ``split`` within ``bounds`` (in id order, then a seeded shuffle)."""
    path = dataset / f"{split}.jsonl"
    if not path.is_file():
        raise WorkloadError(f"{path}: no such file (is the aclsum package installed in the site?)")
    candidates = []
    for i, doc in enumerate(read_jsonl(path), 1):
        where = f"{path}:{i}"
        doc_id = field(doc, "id", str, where)
        title, body = paper_text(doc, where)
        summary = field(doc, "summary", dict, where)
        refs = [field(summary, a, str, f"{where} summary") for a in ASPECTS]
        if len(body) > bounds.max_paper_chars:
            continue
        prompt = make_prompt(title, body)
        expected = " ".join(r.strip() for r in refs)
        candidates.append({"id": doc_id, "workload": "summaries", "prompt": prompt, "expected": expected,
                           "meta": {"split": split, "paper_chars": len(body), "prompt_chars": len(prompt),
                                    "reference_chars": len(expected)}})
    candidates.sort(key=lambda it: it["id"])
    items = seeded_pick(candidates, n, seed)
    if not items:
        raise WorkloadError(f"{path}: no paper within the bounds {asdict(bounds)}")
    settings = {"seed": seed, "n": n, "split": split, "bounds": asdict(bounds), "source": "aclsum==0.1.2",
                "license": "MIT", "candidates": len(candidates)}
    return items, settings
