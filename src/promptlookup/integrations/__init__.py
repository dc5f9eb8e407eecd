"""Drop-ins for engines people already run: llama-cpp-python's ``draft_model=`` and a transformers
``generate``.

Why a layer of its own: these modules sit on top of the package like an API (they may import
drafting, backends and the loop; nothing imports them), so the engines' import costs and quirks stay
here. Both drop-ins hold a :class:`Drafter`: one source built from a spec through
:mod:`promptlookup.drafting.spec` (the CLI's and bench's vocabulary), kept across requests so a
suffix history learns from every request in the process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from promptlookup.drafting.base import Draft, DraftSource, StepFeedback
from promptlookup.drafting.lookup.source import LONG_LIVED_BUDGET
from promptlookup.drafting.spec import OFF, Run, SourceSpec, SpecError, finish, options_of, source_factory
from promptlookup.errors import UsageError

MAX_PRED_TOKENS = 64  # a longer draft is never accepted in full on a real model; a bound, not a tuning


def build_spec(source: str | SourceSpec, history: str | None = None,
               corpus: str | None = None) -> SourceSpec:
    """``source`` (``"suffix"``, ``"suffix:draft=4"``, ...) with the ``history``/``corpus`` files added
    as its options, refused where the source has no such setting or names another file."""
    spec = source if isinstance(source, SourceSpec) else SourceSpec.parse(source)
    if spec.name == OFF:
        raise SpecError("source 'off' drafts nothing: leave the draft model out instead")
    opts = list(spec.options)
    for key, value in (("history", history), ("corpus", corpus)):
        if value is None:
            continue
        if key not in options_of(spec.name):
            raise SpecError(f"{key}= is a setting of the suffix source (and auto); {spec.label!r} has none")
        written = spec.get(key)
        if written is not None and written != str(value):
            raise SpecError(f"{key}={value!r} disagrees with {spec.label!r}")
        if written is None:
            opts.append((key, str(value)))
    return SourceSpec(spec.name, tuple(opts)).check()


def draft_length(spec: SourceSpec, asked: int | None, default: int) -> int:
    """Tokens per draft: ``asked`` if given (and agreeing with a ``draft=`` in the spec), else the
    spec's ``draft=``, else ``default``."""
    written = spec.get("draft")
    if asked is None:
        return spec.draft if written is not None or spec.name == "auto" else default
    if not 1 <= asked <= MAX_PRED_TOKENS:
        raise UsageError(f"draft length must be in 1..{MAX_PRED_TOKENS}, got {asked}")
    if written is not None and int(written) != asked:
        raise UsageError(f"draft length {asked} disagrees with {spec.label!r}")
    return asked


DEFAULT_SOURCE = "auto"  # drafts where it pays, by the engine's own measured step times (docs/results.md)
# The verify cost curve ``auto`` starts from when none can be measured (llama-cpp-python without
# model_path=): cost of a verify feeding w tokens, in plain decodes, 1 + 0.35 (w - 1). That is about
# the bundled model's measured CPU curve (9 tokens: 3.8 decodes at 2 threads), steeper than any GPU
# one. It only shapes the widths not measured yet: every step's measured time replaces it for the
# width it used and rescales the neighbours, so a steep prior costs upside on a flat machine, never
# the floor on a steep one.
PRIOR_COST_SLOPE = 0.35


def prior_cost_curve() -> Any:
    from promptlookup.costcurve import as_curve
    from promptlookup.drafting.base import MAX_DRAFT

    return as_curve([1.0 + PRIOR_COST_SLOPE * (w - 1) for w in range(1, MAX_DRAFT + 2)],
                    label=f"prior: 1 + {PRIOR_COST_SLOPE} per extra token (no model_path= to measure one)")


class Drafter:
    """One draft source built from a spec, kept across requests, with its counters.

    ``commit()`` adds the current request to the in-memory history (a reset does that too);
    ``save()`` commits and writes what the source learned back to the files its spec names (the
    history file); nothing is written otherwise."""

    def __init__(self, spec: SourceSpec, k: int, n_vocab: int, fingerprint: Callable[[], str] | None = None,
                 cost_curve: Callable[[], Any] | None = None) -> None:
        def no_fingerprint() -> str:
            raise UsageError(f"{spec.label}: its files are checked against the model's tokenizer, "
                             "so the drop-in needs it (model_path= for llama-cpp-python, tokenizer= for "
                             "transformers)")

        self.spec = spec
        self.k = k
        # the source lives as long as the drop-in and learns from every request: lookup's cache is bounded
        self.run = Run(n_vocab, fingerprint or no_fingerprint, cost_curve=cost_curve or prior_cost_curve,
                       lookup_budget=LONG_LIVED_BUDGET)
        self.source: DraftSource = source_factory(spec, self.run)()  # type: ignore[assignment]
        self.requests = 0  # resets: requests started
        self.calls = 0  # proposals asked for
        self.drafts = 0  # proposals that were not empty
        self.drafted_tokens = 0
        self.accepted_tokens = 0  # as far as the caller's next history shows it

    @property
    def name(self) -> str:
        return self.spec.label

    def reset(self, prompt: Sequence[int]) -> None:
        self.requests += 1
        self.source.reset(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        self.source.extend(tokens)

    def propose(self, k: int) -> Draft:
        d = self.source.propose(k)
        self.calls += 1
        if d.tokens:
            self.drafts += 1
            self.drafted_tokens += len(d.tokens)
        return d

    def commit(self) -> None:
        self.source.commit()

    def feedback(self, step: StepFeedback) -> None:
        """Passed on (the transformers drop-in runs our loop, so ``auto`` learns from its steps)."""
        self.source.feedback(step)

    def save(self) -> None:
        finish(self.spec, self.source)

    def stats(self) -> dict[str, float]:
        """Counters since construction; ``acceptance`` is accepted over drafted tokens."""
        acc = self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0
        return {"requests": self.requests, "calls": self.calls, "drafts": self.drafts,
                "drafted_tokens": self.drafted_tokens, "accepted_tokens": self.accepted_tokens,
                "acceptance": acc}
