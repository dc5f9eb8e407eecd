"""The speculative loop: draft, verify in one batch, keep the longest agreeing prefix, roll back.

A drafted token is kept only where it equals the model's own choice at that position (its argmax
when greedy, its sample under :mod:`promptlookup.sampling`); the first mismatch is replaced by the
model's token, so every step confirms at least one token and the output is the model's own output.
Under sampling that is "sample and match": exact in distribution, and token for token equal to plain
sampling with the same seed wherever batched logits equal single-token logits, because the random
number of a position depends only on (seed, position). A step whose source abstains feeds one token:
exactly a plain decode, same batch, no rollback.

After every step it asked the source for, the loop tells the source what that step cost in seconds
and how many tokens it confirmed (:class:`~promptlookup.drafting.base.StepFeedback`): the measured
time is what decides whether drafting paid, and only the loop sees it.

The loop itself (:func:`step_ops`) never calls a forward: it yields each one as a :class:`Forward`
and is sent the model's tokens back. Whoever drives it runs the forward: :func:`steps` on the
decoder it was given, at once (one sequence), or an engine loop in a round with other sequences'
forwards, many loops advanced by one thread. Everything else (drafting, the accept rule, rollback,
the counters) is the same code either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from promptlookup.backends.base import Decoder
from promptlookup.drafting.base import MAX_DRAFT, DraftSource, NoDraft, StepFeedback
from promptlookup.drafting.forced import FORCED, forced_count
from promptlookup.errors import check_prompt_fits
from promptlookup.sampling import Sampler, TokenLogprob
from promptlookup.telemetry import Counters, ResourceProbe


@dataclass(eq=False)
class Forward:
    """A forward the loop needs, yielded by :func:`step_ops` (the driver sends back its result).

    ``kind``: ``"prefill"`` -- the prompt ``ids`` on a cache holding ``ids[:keep]``, the model's
    choice after the last one (a one-token list); ``"verify"`` -- ``ids`` at the next positions, the
    choice after each (:meth:`~promptlookup.backends.base.Decoder.verify`). ``seconds``: set by a
    driver that timed the forward itself (a batch's round, where the loop's own wait would include
    other sequences' work); None: the loop times the span it was suspended."""

    kind: str
    ids: list[int]
    sampler: Sampler | None = None
    keep: int = 0
    seconds: float | None = None

    def run(self, decoder: Decoder) -> list[int]:
        """This forward on ``decoder`` (the one-sequence driver)."""
        if self.kind == "prefill":
            return [decoder.prefill(self.ids, self.sampler, self.keep)]
        return decoder.verify(self.ids, self.sampler)


@dataclass
class Generation:
    """What one run produced: the new token ids (prompt excluded) and its counters."""

    tokens: list[int]
    counters: Counters
    stopped_by: str  # "eos", "max_tokens", "context" or "stop" (the consumer ended it)
    seed: int | None = None  # the sampler's seed (None: no sampler, greedy)
    logprobs: list[TokenLogprob] | None = field(default=None)  # per token, when the sampler records them


def generate(
    backend: Decoder,
    prompt: Sequence[int],
    max_tokens: int,
    source: DraftSource | None = None,
    draft: int = 3,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
    sampler: Sampler | None = None,
    keep: int = 0,
    verify_seconds: Callable[[int], float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Generation:
    """Generation of up to ``max_tokens`` tokens, speculating with ``source``.

    Greedy without a ``sampler`` (the backend's argmax, exactly as before sampling existed); with
    one, every position's token is the sampler's choice from the logits the backend computed.
    ``on_tokens`` sees each step's confirmed tokens; returning True ends the generation there
    (``stopped_by="stop"``: a stop string, a client gone, a time limit). ``keep``: cached prompt
    positions to reuse (:meth:`~promptlookup.backends.base.Decoder.prefill`).

    ``verify_seconds`` (the replay's cost model: seconds of a verify feeding ``n`` tokens) replaces
    the measured time in the source's feedback, and drafting is then charged nothing: a replay's
    "model" costs no real time, and its decisions must not depend on the machine's noise. The
    counters always hold the measured time.

    ``clock`` is what every span is measured with (seconds; injected by tests, which run on a
    simulated clock so that no verdict depends on the machine's load).
    """
    run = steps(backend, prompt, max_tokens, source, draft, sampler, keep, verify_seconds, clock)
    try:
        new = next(run)
        while True:
            new = run.send(bool(on_tokens(new)) if on_tokens else False)
    except StopIteration as done:
        return done.value


def steps(
    backend: Decoder,
    prompt: Sequence[int],
    max_tokens: int,
    source: DraftSource | None = None,
    draft: int = 3,
    sampler: Sampler | None = None,
    keep: int = 0,
    verify_seconds: Callable[[int], float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    draft_limit: Callable[[], int | None] | None = None,
    settled: Callable[[int, int], None] | None = None,
) -> Generator[list[int], bool | None, Generation]:
    """The loop as a generator: yields each step's confirmed tokens (the first one after the
    prefill, then one to ``draft + 1`` per verify) and returns the :class:`Generation`. Sending True
    ends it after the tokens just yielded; time the consumer spends is outside every timed span.
    Streaming consumers (the public API, the server) drive it directly. It runs :func:`step_ops`,
    each forward on ``backend`` as it comes; the arguments are :func:`step_ops`'s.
    """
    ops = step_ops(backend, prompt, max_tokens, source, draft, sampler, keep, verify_seconds, clock,
                   draft_limit, settled)
    try:
        item = next(ops)
        while True:  # a forward runs here, on the decoder; tokens go out and the consumer's answer back
            reply = item.run(backend) if isinstance(item, Forward) else (yield item)
            item = ops.send(reply)
    except StopIteration as done:
        return done.value
    finally:
        ops.close()


def step_ops(
    backend: Decoder,
    prompt: Sequence[int],
    max_tokens: int,
    source: DraftSource | None = None,
    draft: int = 3,
    sampler: Sampler | None = None,
    keep: int = 0,
    verify_seconds: Callable[[int], float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    draft_limit: Callable[[], int | None] | None = None,
    settled: Callable[[int, int], None] | None = None,
) -> Generator[Forward | list[int], Any, Generation]:
    """The loop, with its forwards yielded rather than run: yields a :class:`Forward` (send back its
    result: the model's tokens) or a step's confirmed tokens (send back True to end there), and
    returns the :class:`Generation`. ``backend`` is read (``n_ctx``, ``n_past``, ``is_eog``) and
    rolled back, never decoded on here.

    ``draft_limit``, asked before each step, caps that step's draft (None: no cap); under continuous
    batching it is the batch's price of a drafted token (:mod:`promptlookup.batching.pricing`). A cap
    of 0 makes the step a plain decode without asking the source. ``settled(drafted, accepted)`` is
    told, after each verify that carried a draft, how many drafted tokens it fed and how many of them
    the model kept: the batch pricing learns each sequence's acceptance from it (the count is made
    here, once, where the draft and the model's tokens meet)."""
    source = source or NoDraft()
    if not prompt:
        raise ValueError("the prompt is empty: at least one token is needed to start decoding")
    if not 1 <= draft <= MAX_DRAFT:
        raise ValueError(f"draft length must be in 1..{MAX_DRAFT}, got {draft}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    check_prompt_fits(len(prompt), backend.n_ctx)

    c = Counters(source=source.name, prompt_tokens=len(prompt), draft_max=draft, cached_tokens=keep)
    probe = ResourceProbe()
    perf = clock

    t0 = perf()
    source.reset(prompt)
    c.draft_s += perf() - t0

    if sampler is not None:
        sampler.reset(len(prompt))  # a grammar constrains the positions from here on
    t0 = perf()
    op = Forward("prefill", list(prompt), sampler, keep)
    pending = (yield op)[0]
    c.prefill_s = op.seconds if op.seconds is not None else perf() - t0
    out = [pending]
    stopped_by = "max_tokens"
    stop = yield [pending]
    carried_s = 0.0  # the last feedback's time, charged to the next step's drafting

    while True:
        if stop:
            stopped_by = "stop"
            break
        if backend.is_eog(pending):
            stopped_by = "eos"
            break
        room = min(max_tokens - len(out), backend.n_ctx - backend.n_past)
        if room <= 0:
            stopped_by = "max_tokens" if len(out) >= max_tokens else "context"
            break
        # A step yields at most k + 1 tokens and feeds k + 1: never draft past either limit.
        k = min(draft, room - 1)
        if draft_limit is not None:
            cap = draft_limit()
            if cap is not None:
                k = min(k, cap)

        t0 = perf()
        source.extend([pending])
        proposal = source.propose(k) if k > 0 else None
        step_draft_s = perf() - t0
        drafted = list(proposal.tokens[:k]) if proposal is not None else []

        n_before = backend.n_past
        t0 = perf()
        op = Forward("verify", [pending, *drafted], sampler)
        chosen = yield op
        verify_s = op.seconds if op.seconds is not None else perf() - t0
        c.decode_s += verify_s
        c.decodes += 1

        # chosen[i] is the model's token after feeding position n_before + i; a backend may stop
        # after the first one that rejects its draft, which is as far as this reads.
        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == chosen[accepted]:
            accepted += 1
        new = drafted[:accepted] + [chosen[accepted]]
        # Stop at the first end-of-generation token even inside an accepted draft.
        for i, t in enumerate(new[:-1]):
            if backend.is_eog(t):
                new = new[: i + 1]
                break
        if drafted:
            c.drafted_steps += 1
            c.drafted_tokens += len(drafted)
            c.accepted_tokens += accepted
            forced = proposal.features.get(FORCED) if proposal is not None else None
            if forced:  # accepted tokens that the grammar forced (drafting.forced)
                c.grammar_tokens += forced_count(forced, accepted)
            if settled is not None:
                settled(len(drafted), accepted)
            t0 = perf()
            backend.rollback(n_before + 1 + accepted)
            rollback_s = perf() - t0  # part of what drafting cost: charged with the verify
            verify_s += rollback_s
            c.decode_s += rollback_s

        confirmed = new[:-1]
        if confirmed:
            t0 = perf()
            source.extend(confirmed)
            step_draft_s += perf() - t0
        c.draft_s += step_draft_s
        if proposal is not None:
            t0 = perf()
            if verify_seconds is None:
                step = StepFeedback(1 + len(drafted), len(new), verify_s, step_draft_s + carried_s)
            else:
                step = StepFeedback(1 + len(drafted), len(new), verify_seconds(1 + len(drafted)), 0.0)
            source.feedback(step)
            carried_s = perf() - t0
            c.draft_s += carried_s
        out.extend(new)
        pending = new[-1]
        stop = yield new

    c.generated_tokens = len(out)
    probe.finish(c)
    logprobs = None
    if sampler is not None and sampler.logprobs is not None:
        logprobs = [sampler.recorded[len(prompt) + j] for j in range(len(out))]
    return Generation(tokens=out, counters=c, stopped_by=stopped_by,
                      seed=None if sampler is None else sampler.seed, logprobs=logprobs)
