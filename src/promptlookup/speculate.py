"""The speculative loop: draft, verify in one batch, keep the longest agreeing prefix, roll back.

A drafted token is kept only where it equals the model's own argmax at that position; the first
mismatch is replaced by the model's token, so every step confirms at least one token and the
output is the model's greedy output. A step whose source abstains feeds one token: exactly a plain
decode, same batch, no rollback.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from promptlookup.backends.base import Backend, BackendError
from promptlookup.drafting.base import DraftSource, NoDraft
from promptlookup.telemetry import Counters, ResourceProbe

MAX_DRAFT = 8


@dataclass
class Generation:
    """What one run produced: the new token ids (prompt excluded) and its counters."""

    tokens: list[int]
    counters: Counters
    stopped_by: str  # "eos", "max_tokens" or "context"


def generate(
    backend: Backend,
    prompt: Sequence[int],
    max_tokens: int,
    source: DraftSource | None = None,
    draft: int = 3,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> Generation:
    """Greedy generation of up to ``max_tokens`` tokens, speculating with ``source``."""
    source = source or NoDraft()
    if not prompt:
        raise ValueError("the prompt is empty: at least one token is needed to start decoding")
    if not 1 <= draft <= MAX_DRAFT:
        raise ValueError(f"draft length must be in 1..{MAX_DRAFT}, got {draft}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if len(prompt) >= backend.n_ctx:
        raise BackendError(
            f"prompt is {len(prompt)} tokens, the context holds {backend.n_ctx}: "
            "raise -c or shorten the prompt"
        )

    c = Counters(source=source.name, prompt_tokens=len(prompt), draft_max=draft)
    probe = ResourceProbe()
    perf = time.perf_counter

    t0 = perf()
    source.reset(prompt)
    c.draft_s += perf() - t0

    t0 = perf()
    pending = backend.prefill(prompt)
    c.prefill_s = perf() - t0
    out = [pending]
    stopped_by = "max_tokens"
    if on_tokens:
        on_tokens([pending])

    while True:
        if backend.is_eog(pending):
            stopped_by = "eos"
            break
        room = min(max_tokens - len(out), backend.n_ctx - backend.n_past)
        if room <= 0:
            stopped_by = "max_tokens" if len(out) >= max_tokens else "context"
            break
        # A step yields at most k + 1 tokens and feeds k + 1: never draft past either limit.
        k = min(draft, room - 1)

        t0 = perf()
        source.extend([pending])
        proposal = source.propose(k) if k > 0 else None
        c.draft_s += perf() - t0
        drafted = list(proposal.tokens[:k]) if proposal is not None else []

        n_before = backend.n_past
        t0 = perf()
        argmax = backend.verify([pending, *drafted])
        c.decode_s += perf() - t0
        c.decodes += 1

        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == argmax[accepted]:
            accepted += 1
        new = drafted[:accepted] + [argmax[accepted]]
        # Stop at the first end-of-generation token even inside an accepted draft.
        for i, t in enumerate(new[:-1]):
            if backend.is_eog(t):
                new = new[: i + 1]
                break
        if drafted:
            c.drafted_steps += 1
            c.drafted_tokens += len(drafted)
            c.accepted_tokens += accepted
            backend.rollback(n_before + 1 + accepted)

        confirmed = new[:-1]
        if confirmed:
            t0 = perf()
            source.extend(confirmed)
            c.draft_s += perf() - t0
        out.extend(new)
        pending = new[-1]
        if on_tokens:
            on_tokens(new)

    c.generated_tokens = len(out)
    probe.finish(c)
    return Generation(tokens=out, counters=c, stopped_by=stopped_by)
